"""`prefdata refs`: correctness against independent computations and TRL, tokenizer refusal,
non-finite flagging, atomic swap, kill -9 resume, rank split/merge, and the equal-policy check."""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prefdata import refs as R
from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.io.manifest import read_manifest, tokenizer_fingerprint, write_manifest
from prefdata.refs import swap as refs_swap

REPO = Path(__file__).resolve().parents[2]
N_ROWS = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_tokenizer_dir) -> str:
    from prefdata.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("refs-model")
    build_tiny_model(path, tokenizer_dir=tiny_tokenizer_dir, architecture="llama", seed=1)
    return str(path)


def _fingerprint(model_dir: str) -> str:
    # What `prepare --tokenizer MODEL_DIR` records: the tokenizer as loaded from that directory.
    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(model_dir))


def make_out(path: Path, model_dir: str, n: int = N_ROWS, seed: int = 0, columns: dict | None = None) -> Path:
    """A prepared-OUT stand-in: a save_to_disk dataset with the contract's id columns + manifest."""
    rng = random.Random(seed)
    vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
    ids = lambda lo, hi: [rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))]  # noqa: E731
    data = columns or {
        "prompt_ids": [ids(1, 25) for _ in range(n)],
        "chosen_ids": [ids(1, 30) for _ in range(n)],
        "rejected_ids": [ids(1, 30) for _ in range(n)],
    }
    rows = len(data["prompt_ids"])
    data.setdefault("flags", [["near_duplicate"] if i % 5 == 0 else [] for i in range(rows)])
    data.setdefault("source_line", list(range(1, rows + 1)))
    datasets.Dataset.from_dict(data).save_to_disk(str(path))
    write_manifest(path, {
        "tokenizer": {"fingerprint": _fingerprint(model_dir), "pad_token_id": 3},
        "row_accounting": {"rows_in": rows, "rows_out": rows, "rows_dropped": 0, "rows_quarantined": 0},
        "format_version": 1,
    })
    return path


def _plain(model, p, c) -> float:
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    return float(sum(logp[t - 1, ids[0, t]] for t in range(len(p), len(p) + len(c))))


def _refs(out: Path) -> dict[str, np.ndarray]:
    ds = datasets.load_from_disk(str(out))
    return {c: np.asarray(ds[c]) for c in R.REF_COLUMNS}


def test_refs_equal_plain_forward_and_keep_everything_else(tmp_path, model_dir):
    out = make_out(tmp_path / "out", model_dir)
    before = datasets.load_from_disk(str(out)).to_dict()
    result = R.compute_refs(out, model_dir, batch_tokens=300, progress=False, shard_batches=2)
    # auto: padding-free rows of pairs, the prompt shared where that pays
    assert result.rows == N_ROWS and result.non_finite_rows == 0 and result.layout == "shared"
    assert result.shards_total > 1 and result.tokens > 0

    ds = datasets.load_from_disk(str(out))
    assert ds.column_names == list(before) + list(R.REF_COLUMNS)
    assert ds.features["ref_chosen_logps"].dtype == "float32"
    for name, values in before.items():
        assert ds[name] == values  # old columns (flags included) untouched
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for i in range(N_ROWS):
        row = ds[i]
        assert row["ref_chosen_logps"] == pytest.approx(_plain(model, row["prompt_ids"], row["chosen_ids"]), abs=1e-4)
        assert row["ref_rejected_logps"] == pytest.approx(_plain(model, row["prompt_ids"], row["rejected_ids"]), abs=1e-4)
        assert row["chosen_token_count"] == len(row["chosen_ids"])
        assert row["rejected_token_count"] == len(row["rejected_ids"])
        assert math.isfinite(row["ref_chosen_logps"]) and math.isfinite(row["ref_rejected_logps"])

    manifest = read_manifest(out)
    assert manifest["row_accounting"]["rows_in"] == N_ROWS and manifest["format_version"] == 1
    refs = manifest["refs"]
    assert refs["model"]["architecture"] == "LlamaForCausalLM" and refs["model"]["dtype"] == "float32"
    assert list(refs["model"]["weights_sha256"]) == ["model.safetensors"]
    assert refs["tokenizer_fingerprint_checked"] == manifest["tokenizer"]["fingerprint"]
    assert refs["settings"]["batch_tokens"] == 300 and refs["non_finite_rows"] == 0
    assert not (out / R.WORK_DIR).exists()
    leftovers = [p.name for p in out.iterdir() if p.suffix == ".arrow"]
    assert leftovers == R._data_files(out)  # the old data files are gone
    # The manifest lists the data files as they are after the swap, with their rows.
    assert [s["file"] for s in manifest["shards"]] == R._data_files(out)
    assert sum(s["rows"] for s in manifest["shards"]) == manifest["row_accounting"]["rows_out"]


def test_layouts_give_the_same_refs(tmp_path, model_dir):
    values = {}
    for layout in ("right", "left", "packed", "blocks", "shared"):
        out = make_out(tmp_path / layout, model_dir)
        result = R.compute_refs(out, model_dir, batch_tokens=400, progress=False, layout=layout)
        assert result.layout == layout
        values[layout] = _refs(out)
    assert read_manifest(out)["refs"]["settings"]["prefix_sharing"]["shared_pairs"] > 0
    for layout in ("left", "packed", "blocks", "shared"):
        for name in R.REF_COLUMNS:
            np.testing.assert_allclose(values[layout][name], values["right"][name], atol=1e-4, rtol=0)


def test_rerun_replaces_refs_and_is_identical(tmp_path, model_dir):
    out = make_out(tmp_path / "out", model_dir)
    R.compute_refs(out, model_dir, batch_tokens=500, progress=False)
    first = _refs(out)
    result = R.compute_refs(out, model_dir, batch_tokens=500, progress=False, recompute=True)
    assert result.tokens > 0 and not result.already_computed_at
    ds = datasets.load_from_disk(str(out))
    assert ds.column_names.count("ref_chosen_logps") == 1
    for name in R.REF_COLUMNS:
        np.testing.assert_array_equal(_refs(out)[name], first[name])


def test_a_second_refs_with_the_same_model_says_so_and_stops(tmp_path, model_dir, capsys):
    from prefdata.cli import main

    out = make_out(tmp_path / "out", model_dir)
    assert main(["refs", str(out), "--model", model_dir, "--no-progress", "--batch-tokens", "500"]) == 0
    files = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    # Another batch size only reorders the arithmetic: still the same refs, nothing recomputed.
    assert main(["refs", str(out), "--model", model_dir, "--no-progress", "--batch-tokens", "300"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "already holds reference log-probs" in lines[0] and "--recompute" in lines[0]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == files  # OUT untouched
    # --recompute computes them again (and replaces the data files).
    assert main(["refs", str(out), "--model", model_dir, "--no-progress", "--recompute"]) == 0
    assert "already holds" not in capsys.readouterr().out
    assert read_manifest(out)["refs"]["settings"]["batch_tokens"] == 16384
    # Another dtype gives other values: computed, not skipped.
    result = R.compute_refs(out, model_dir, dtype="bfloat16", device="cpu", progress=False)
    assert not result.already_computed_at and read_manifest(out)["refs"]["model"]["dtype"] == "bfloat16"


def test_tokenizer_mismatch_is_refused(tmp_path, model_dir, capsys):
    out = make_out(tmp_path / "out", model_dir)
    manifest = read_manifest(out)
    manifest["tokenizer"]["fingerprint"] = "sha256:" + "0" * 64
    write_manifest(out, manifest)
    with pytest.raises(PrefdataError, match="differs from the one OUT was prepared with") as info:
        R.compute_refs(out, model_dir, progress=False)
    assert "\n" not in str(info.value)
    assert "ref_chosen_logps" not in datasets.load_from_disk(str(out)).column_names
    # The CLI says it in one line and exits 2.
    from prefdata.cli import main

    assert main(["refs", str(out), "--model", model_dir, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "differs from the one OUT was prepared with" in err and "Traceback" not in err


def test_non_finite_values_are_flagged_not_hidden(tmp_path, tiny_tokenizer_dir):
    from prefdata.tiny import build_tiny_model

    model_path = tmp_path / "model"
    model = build_tiny_model(model_path, tokenizer_dir=tiny_tokenizer_dir, architecture="qwen2")
    poison = model.config.vocab_size - 1
    model.config.tie_word_embeddings = False  # poison the input embedding only, not the output head
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.clone())
        model.model.embed_tokens.weight[poison] = float("inf")
    model.save_pretrained(str(model_path))
    out = make_out(tmp_path / "out", str(model_path), n=6)
    ds = datasets.load_from_disk(str(out)).to_dict()
    ds["chosen_ids"][2] = ds["chosen_ids"][2] + [poison, 5]  # row 2's chosen half sees the poisoned token
    shutil.rmtree(out)
    make_out(out, str(model_path), columns=ds)

    result = R.compute_refs(out, str(model_path), batch_tokens=200, progress=False)
    assert result.non_finite_rows == 1
    rows = datasets.load_from_disk(str(out))
    assert not math.isfinite(rows[2]["ref_chosen_logps"])
    assert rows[2]["flags"] == [F.NON_FINITE_REF_LOGPS]
    assert [i for i in range(6) if F.NON_FINITE_REF_LOGPS in rows[i]["flags"]] == [2]
    assert rows[0]["flags"] == ["near_duplicate"]
    assert read_manifest(out)["refs"]["non_finite_rows"] == 1
    assert "1 rows flagged non_finite_ref_logps" in result.summary()


def _run_killed(out: Path, model_dir: str, kill_after: int) -> subprocess.CompletedProcess:
    code = (
        "from prefdata.refs import compute_refs; "
        f"compute_refs({str(out)!r}, {model_dir!r}, batch_tokens=200, progress=False, shard_batches=1)"
    )
    env = {**os.environ, R.KILL_AFTER_SHARDS_ENV: str(kill_after), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_resume_after_kill_9_equals_uninterrupted_run(tmp_path, model_dir):
    whole = make_out(tmp_path / "whole", model_dir)
    R.compute_refs(whole, model_dir, batch_tokens=200, progress=False, shard_batches=1)

    out = make_out(tmp_path / "killed", model_dir)
    proc = _run_killed(out, model_dir, kill_after=3)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    shards = sorted((out / R.WORK_DIR).glob("*/shard-*.npz"))
    assert len(shards) == 3
    assert "ref_chosen_logps" not in datasets.load_from_disk(str(out)).column_names  # nothing half-written
    assert "refs" not in read_manifest(out)

    result = R.compute_refs(out, model_dir, batch_tokens=200, progress=False, shard_batches=1)
    assert result.shards_resumed == 3 and result.shards_total > 3
    for name in R.REF_COLUMNS:
        np.testing.assert_array_equal(_refs(out)[name], _refs(whole)[name])


def test_kill_between_swap_renames_is_finished_by_the_next_run(tmp_path, model_dir, monkeypatch):
    out = make_out(tmp_path / "out", model_dir)

    def killed(where):  # the journal and new data files are in place; the renames never happened
        if (where / R.WORK_DIR / R.SWAP_JOURNAL).is_file():
            raise KeyboardInterrupt

    monkeypatch.setattr(refs_swap, "_finish_swap", killed)
    with pytest.raises(KeyboardInterrupt):
        R.compute_refs(out, model_dir, batch_tokens=300, progress=False)
    assert (out / R.WORK_DIR / R.SWAP_JOURNAL).is_file()
    monkeypatch.undo()
    assert "ref_chosen_logps" not in datasets.load_from_disk(str(out)).column_names  # still the old dataset
    result = R.compute_refs(out, model_dir, batch_tokens=300, progress=False)
    assert result.shards_resumed == result.shards_total  # nothing recomputed
    assert "ref_chosen_logps" in datasets.load_from_disk(str(out)).column_names
    assert sorted(p.name for p in out.glob("*.arrow")) == sorted(R._data_files(out))


def test_rank_split_and_merge(tmp_path, model_dir):
    for world in (1, 2, 3, 5):
        taken = sorted(s for r in range(world) for s in R.shards_for_rank(11, r, world))
        assert taken == list(range(11))
    single = make_out(tmp_path / "single", model_dir)
    R.compute_refs(single, model_dir, batch_tokens=200, progress=False, shard_batches=1)
    out = make_out(tmp_path / "ranks", model_dir)
    other = R.compute_refs(out, model_dir, batch_tokens=200, progress=False, shard_batches=1, rank=1, world_size=2)
    assert not other.merged and "ref_chosen_logps" not in datasets.load_from_disk(str(out)).column_names
    main = R.compute_refs(out, model_dir, batch_tokens=200, progress=False, shard_batches=1, rank=0, world_size=2)
    assert main.merged and main.shards_resumed == 0
    for name in R.REF_COLUMNS:
        np.testing.assert_array_equal(_refs(out)[name], _refs(single)[name])


def test_merge_refuses_missing_shards(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    R.save_shard(R.shard_path(work, 0), R.ShardValues(
        np.array([0, 1]), np.zeros(2, np.float32), np.zeros(2, np.float32), np.ones(2, np.int64), np.ones(2, np.int64),
        np.zeros(2, np.float32), np.zeros(2, np.float32)))
    with pytest.raises(PrefdataError, match="shard 1 is missing"):
        R.merge_shards(work, 2, 3)
    with pytest.raises(PrefdataError, match="do not cover 1 rows"):
        R.merge_shards(work, 1, 3)


def test_equal_policy_gives_zero_logits_and_ln2_loss(tmp_path, model_dir):
    """The policy computed the way refs computes (its layout and batch plan) equals the stored
    reference bit for bit: zero logits, loss exactly ln 2."""
    from prefdata.model.logprobs import plan_packed_batches
    from prefdata.model.losses import dpo_loss
    from prefdata.model.pairs import pair_logps
    from prefdata.refs.compute import batch_costs

    out = make_out(tmp_path / "out", model_dir)
    R.compute_refs(out, model_dir, batch_tokens=300, progress=False)
    layout = read_manifest(out)["refs"]["settings"]["layout"]
    ds = datasets.load_from_disk(str(out))
    policy = AutoModelForCausalLM.from_pretrained(model_dir).eval()  # policy == reference
    lens = {c: np.array([len(x) for x in ds[c]]) for c in ("prompt_ids", "chosen_ids", "rejected_ids")}
    costs, padding_free, _ = batch_costs(policy, layout, lens)
    assert padding_free
    for rows in plan_packed_batches(costs, 300):
        part = ds[rows]
        with torch.no_grad():
            logps = pair_logps(policy, part["prompt_ids"], part["chosen_ids"], part["rejected_ids"], layout, 3)
        n = len(rows)
        ref_c = torch.tensor(part["ref_chosen_logps"], dtype=torch.float32)
        ref_r = torch.tensor(part["ref_rejected_logps"], dtype=torch.float32)
        logits = (logps.chosen - ref_c) - (logps.rejected - ref_r)
        assert torch.equal(logits, torch.zeros(n))
        losses = dpo_loss(logps.chosen, logps.rejected, ref_c, ref_r, loss_type="sigmoid", beta=0.1).losses
        assert torch.equal(losses, torch.full((n,), math.log(2), dtype=torch.float32))


def test_matches_trl_precompute_ref_log_probs(tmp_path, model_dir):
    """TRL's DPOTrainer(precompute_ref_log_probs=True) tokenizes text itself; we feed its token ids
    (so tokenization agrees by construction) into an OUT and compare the stored reference log-probs."""
    trl = pytest.importorskip("trl")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    texts = datasets.Dataset.from_dict({
        "prompt": ["What is the capital of France?", "Write a short poem about the sea.", "def add(a, b):"] * 3,
        "chosen": [" The capital of France is Paris.", " The sea is wide and deep and blue.", "\n    return a + b\n"] * 3,
        "rejected": [" I'm sorry, I can't help with that.", " No.", " pass"] * 3,
    })
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "trl"), precompute_ref_log_probs=True, per_device_train_batch_size=4,
        max_length=None, report_to=[], use_cpu=True, bf16=False, dataset_num_proc=None,
    )
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=texts, processing_class=tok)
    theirs = trainer.train_dataset
    out = make_out(tmp_path / "out", model_dir, columns={c: theirs[c] for c in ("prompt_ids", "chosen_ids", "rejected_ids")})
    R.compute_refs(out, model_dir, batch_tokens=256, progress=False)
    ours = datasets.load_from_disk(str(out))
    np.testing.assert_allclose(ours["ref_chosen_logps"], theirs["ref_chosen_logps"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(ours["ref_rejected_logps"], theirs["ref_rejected_logps"], atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_refs_on_gpu_bf16_close_to_cpu_fp32(tmp_path, model_dir):
    cpu = make_out(tmp_path / "cpu", model_dir)
    gpu = make_out(tmp_path / "gpu", model_dir)
    R.compute_refs(cpu, model_dir, device="cpu", progress=False)
    result = R.compute_refs(gpu, model_dir, device="cuda", progress=False)
    assert result.dtype == "bfloat16" and result.device.startswith("cuda")
    np.testing.assert_allclose(_refs(gpu)["ref_chosen_logps"], _refs(cpu)["ref_chosen_logps"], atol=1.0, rtol=0.05)


def test_new_weights_saved_into_the_same_directory_are_not_taken_for_the_held_refs(tmp_path, tiny_tokenizer_dir):
    """The model's fingerprint is remembered per process while its files stay as they were (online
    rounds check the same reference every round); weights saved again into the directory are hashed
    afresh, so refs computes instead of saying OUT already holds them."""
    from prefdata.tiny import build_tiny_model

    model = tmp_path / "model"
    build_tiny_model(model, tokenizer_dir=tiny_tokenizer_dir, architecture="llama", seed=1)
    out = make_out(tmp_path / "out", str(model))
    R.compute_refs(out, str(model), batch_tokens=500, progress=False)
    assert R.compute_refs(out, str(model), batch_tokens=500, progress=False).already_computed_at
    first = _refs(out)
    build_tiny_model(model, tokenizer_dir=tiny_tokenizer_dir, architecture="llama", seed=2)
    result = R.compute_refs(out, str(model), batch_tokens=500, progress=False)
    assert not result.already_computed_at and result.tokens > 0
    assert not np.array_equal(_refs(out)["ref_chosen_logps"], first["ref_chosen_logps"])


def test_refs_cut_into_several_data_files_load_as_one_dataset_in_row_order(tmp_path, model_dir, monkeypatch):
    """The swapped-in dataset is cut into files of at most ~500 MB, as `datasets.save_to_disk` cuts:
    every row once, in order, with the features and the manifest's shard list to match."""
    whole = make_out(tmp_path / "whole", model_dir)
    R.compute_refs(whole, model_dir, batch_tokens=500, progress=False)
    monkeypatch.setattr(refs_swap, "_MAX_FILE_BYTES", 200)  # a few rows per file
    cut = make_out(tmp_path / "cut", model_dir)
    R.compute_refs(cut, model_dir, batch_tokens=500, progress=False)
    shards = read_manifest(cut)["shards"]
    assert len(shards) > 3 and sum(s["rows"] for s in shards) == N_ROWS
    assert sorted(p.name for p in cut.glob("*.arrow")) == sorted(s["file"] for s in shards)
    a, b = datasets.load_from_disk(str(whole)), datasets.load_from_disk(str(cut))
    assert a.features == b.features
    assert a.to_list() == b.to_list()
