"""`--loss-on answer` on the model side: with `chosen_loss_start`/`rejected_loss_start` in OUT, refs
sum and count only the answer tokens, train scores the policy on the same tokens, and the TRL hand-off
refuses in one line. The OUT is a real prepared one with the two columns added, as prepare writes them.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

from prefdata.core.errors import PrefdataError
from prefdata.core.schema import check_out
from prefdata.io.handoff import describe, read_settings
from prefdata.io.manifest import read_manifest, write_manifest
from prefdata.prepare import prepare
from prefdata.refs import compute_refs

ROWS = [
    ("What is 2 + 2?", "<think>\nTwo and two make four.\n</think>\n\nThe answer is 4.", "<think>\nMaybe five?\n</think>\n\n5."),
    ("Name a colour.", "<think>\nThe sky is blue.\n</think>\n\nBlue.", "<think>\nHmm.\n</think>\n\nI do not know."),
    ("Capital of France?", "<think>\nIt is Paris, on the Seine.\n</think>\n\nParis.", "Berlin."),
    ("Say hello.", "Hello!", "<think>\nShould I?\n</think>\n\nNo."),
    ("Count to three.", "<think>\nOne, two, three.\n</think>\n\n1, 2, 3.", "<think>\nOne, three.\n</think>\n\n1, 3."),
    ("Is water wet?", "<think>\nWater makes things wet.\n</think>\n\nYes.", "<think>\nNo idea.\n</think>\n\nNo."),
]


def _raw(path: Path) -> Path:
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in ROWS]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _starts(ids: list[list[int]], salt: int) -> list[int]:
    """Loss starts that cut a varying share of each completion: 0 on one row, all of it on none."""
    return [0 if i == 3 else max(0, len(c) - 2 - (i + salt) % 3) for i, c in enumerate(ids)]


def add_loss_starts(out: Path) -> tuple[list[int], list[int]]:
    """Turn a prepared OUT into what `prepare --loss-on answer` writes: the two int32 columns, and
    `loss_on: "answer"` in the DatasetInfo settings and the manifest config (stand-in until prepare does)."""
    dataset = datasets.load_from_disk(str(out))
    chosen = _starts(dataset["chosen_ids"], 0)
    rejected = _starts(dataset["rejected_ids"], 1)
    dataset = dataset.add_column("chosen_loss_start", chosen).add_column("rejected_loss_start", rejected)
    dataset = dataset.cast_column("chosen_loss_start", datasets.Value("int32"))
    dataset = dataset.cast_column("rejected_loss_start", datasets.Value("int32"))
    dataset.info.description = describe({**(read_settings(dataset.info.description) or {}), "loss_on": "answer"})
    staged = out.parent / (out.name + ".staged")
    dataset.save_to_disk(str(staged))
    manifest = read_manifest(out)
    manifest.setdefault("config", {})["loss_on"] = "answer"
    for name in [p.name for p in out.iterdir() if p.suffix == ".arrow" or p.name in ("dataset_info.json", "state.json")]:
        (out / name).unlink()
    for path in staged.iterdir():
        shutil.move(str(path), str(out / path.name))
    staged.rmdir()
    write_manifest(out, manifest)
    return chosen, rejected


@pytest.fixture(scope="module")
def answer_out(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("loss-on-answer")
    out = root / "out"
    prepare(_raw(root / "pairs.jsonl"), out, tokenizer=tiny_model_dir, progress=False, workers=1)
    add_loss_starts(out)
    check_out(out)  # what prepare --loss-on answer will write passes OUT's full contract
    return out


@pytest.fixture(scope="module")
def answer_refs(tmp_path_factory, answer_out, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("loss-on-answer-refs") / "out"
    shutil.copytree(answer_out, out)
    compute_refs(out, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    return out


def _plain_from(model, prompt: list[int], completion: list[int], start: int) -> tuple[float, int]:
    """Plain forward over prompt + the whole completion, log-softmax, gather, sum over completion
    positions >= start."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    positions = range(len(prompt) + start, len(prompt) + len(completion))
    return float(sum(logp[t - 1, ids[0, t]] for t in positions)), len(positions)


def test_refs_sum_and_count_only_the_answer_tokens(answer_refs, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    rows = datasets.load_from_disk(str(answer_refs))
    assert len(rows) == len(ROWS)
    cut = 0
    for row in rows:
        for half in ("chosen", "rejected"):
            start = row[f"{half}_loss_start"]
            expected, count = _plain_from(model, row["prompt_ids"], row[f"{half}_ids"], start)
            assert row[f"ref_{half}_logps"] == pytest.approx(expected, abs=1e-4)
            assert row[f"{half}_token_count"] == count == len(row[f"{half}_ids"]) - start
            cut += start
    assert cut > 0 and rows[3]["chosen_loss_start"] == 0  # some tokens were cut, one half kept whole
    settings = read_manifest(answer_refs)["refs"]["settings"]
    assert settings["loss_on"] == "answer"
    check_out(answer_refs)  # the counts match the contract's rule with loss starts


def test_refs_without_the_columns_are_unchanged(tmp_path, answer_out, tiny_model_dir):
    """The same ids without loss starts give whole-completion sums: the columns are what changes them."""
    plain = tmp_path / "plain"
    prepare(answer_out.parent / "pairs.jsonl", plain, tokenizer=tiny_model_dir, progress=False, workers=1)
    compute_refs(plain, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    rows = datasets.load_from_disk(str(plain))
    assert "chosen_loss_start" not in rows.column_names
    assert rows["chosen_token_count"] == [len(ids) for ids in rows["chosen_ids"]]
    assert read_manifest(plain)["refs"]["settings"]["loss_on"] == "all"


def test_one_loss_start_column_alone_is_refused(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    prepare(_raw(tmp_path / "pairs.jsonl"), out, tokenizer=tiny_model_dir, progress=False, workers=1)
    dataset = datasets.load_from_disk(str(out))
    dataset = dataset.add_column("chosen_loss_start", [0] * len(dataset))
    dataset.save_to_disk(str(tmp_path / "half"))
    shutil.copy(out / "manifest.json", tmp_path / "half" / "manifest.json")
    with pytest.raises(PrefdataError, match="loss_starts") as error:
        compute_refs(tmp_path / "half", tiny_model_dir, device="cpu", progress=False)
    assert "\n" not in str(error.value)


FAST = dict(lr=3e-3, batch_pairs=3, warmup_ratio=0.0, progress=False, device="cpu", save_every=None)


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_train_scores_the_policy_on_the_answer_tokens(answer_refs, tiny_model_dir, tmp_path, loss):
    """Policy = reference: the policy log-probs cover the same answer tokens as the stored refs, so
    the first step sits exactly at the zero-margin loss (a whole-completion policy sum would not)."""
    from prefdata.train.recipe import train

    output = tmp_path / "run"
    result = train(answer_refs, model=tiny_model_dir, output=output, loss=loss, max_steps=2, shuffle=False, **FAST)
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert result.steps == 2 and all(math.isfinite(m["loss"]) for m in lines)
    assert lines[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    if loss == "sigmoid":
        assert lines[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert json.loads((output / "train_config.json").read_text())["loss_on"] == "answer"


def test_train_policy_logps_use_the_loss_starts(answer_refs, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from prefdata.train.data import load_pairs
    from prefdata.train.step import PairForward, forward_pairs

    data = load_pairs(answer_refs, need_refs=True)
    assert data.loss_on_answer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fwd = PairForward(model=model, layout="right", pad_token_id=0, device=torch.device("cpu"),
                      loss_kwargs={"loss_type": "sigmoid", "beta": 0.1})
    with torch.no_grad():
        _, logps, _ = forward_pairs(fwd, data, data.rows)
    rows = datasets.load_from_disk(str(answer_refs))
    np.testing.assert_allclose(logps.chosen.numpy(), np.asarray(rows["ref_chosen_logps"]), atol=1e-4)
    assert logps.rejected_counts.tolist() == rows["rejected_token_count"]


def test_train_refuses_refs_computed_over_other_tokens(answer_out, tiny_model_dir, tmp_path):
    """Refs computed before the loss starts were added summed the whole completion: refused in one line."""
    from prefdata.train.recipe import train

    out = tmp_path / "out"
    prepare(answer_out.parent / "pairs.jsonl", out, tokenizer=tiny_model_dir, progress=False, workers=1)
    compute_refs(out, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    manifest = read_manifest(out)
    add_loss_starts(out)  # keeps the refs columns, which now disagree with the rows
    write_manifest(out, {**read_manifest(out), "refs": manifest["refs"]})
    with pytest.raises(PrefdataError, match=r"loss on 'all'.*'answer'.*prefdata refs") as error:
        train(out, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, **FAST)
    assert "\n" not in str(error.value)


def test_trl_hand_off_refuses_loss_on_answer_in_one_line(answer_refs, tiny_model_dir, tmp_path):
    pytest.importorskip("trl")
    from transformers import AutoTokenizer

    from prefdata.trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=str(tmp_path / "run"), max_length=None, report_to=[], use_cpu=True, max_steps=1)
    with pytest.raises(PrefdataError) as error:
        DPOTrainer("/nonexistent/model", args=args, train_dataset=str(answer_refs),
                   processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    message = str(error.value)
    assert "--loss-on answer" in message and "prefdata train" in message and "--loss-on all" in message
    assert "\n" not in message
    # The settings alone say so too: dropping the columns does not slip past the check.
    dropped = datasets.load_from_disk(str(answer_refs)).remove_columns(["chosen_loss_start", "rejected_loss_start"])
    with pytest.raises(PrefdataError, match="--loss-on answer"):
        DPOTrainer("/nonexistent/model", args=args, train_dataset=dropped,
                   processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))


def test_prepare_loss_on_answer_then_refs_and_train_end_to_end(tmp_path, tiny_model_dir):
    """The columns as `prepare --loss-on answer` writes them (no stand-in): refs and train take them,
    and the loss starts sit right after each reasoning block."""
    from transformers import AutoTokenizer

    from prefdata.train.recipe import train

    out = tmp_path / "out"
    result = prepare(_raw(tmp_path / "raw.jsonl"), out, tokenizer=tiny_model_dir, progress=False, workers=1, loss_on="answer")
    assert result.exit_code == 0 and result.rows_out == len(ROWS)
    dataset = datasets.load_from_disk(str(out))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for row in dataset:
        cut = row["chosen_loss_start"]
        assert (cut > 0) == row["chosen"].startswith("<think>")
        assert not tokenizer.decode(row["chosen_ids"][cut:]).startswith(("<think>", "\n"))
    assert read_settings(dataset.info.description)["loss_on"] == "answer"
    compute_refs(out, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    check_out(out)
    run = train(out, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, shuffle=False, **FAST)
    assert run.steps == 1
