"""The hand-off to TRL: `prefdata.trl.DPOTrainer` trains on OUT exactly as prefdata wrote it.

Tiny tokenizer and random Qwen2 models built in code, CPU only. The OUT used here has conversational
rows (so the text columns are TRL message lists), a max_length that cuts some completions, and refs.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

import datasets  # noqa: E402
import torch  # noqa: E402

from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.prepare import prepare  # noqa: E402
from prefdata.refs import compute_refs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MAX_LENGTH = 40

_QUESTIONS = [
    ("What is the capital of France?", "The capital of France is Paris.", "It is Berlin."),
    ("Write a short poem about the sea.", "The sea is wide and deep and blue.", "Sea."),
    ("How many legs does a spider have?", "A spider has eight legs.", "A spider has four legs, like a cat."),
    ("Translate good morning to German.", "Guten Morgen.", "Good morning."),
    ("Give me three tips for a healthy day.", "Drink water, sleep well, and take a walk every day.", "Sure!"),
    ("Explain step by step how to add two numbers in Python.", "def add(a, b):\n    return a + b\n", "I can't help."),
]


def _conversational_rows() -> list[dict]:
    rows = []
    for i, (question, good, bad) in enumerate(_QUESTIONS):
        prompt = [{"role": "user", "content": question}]
        if i % 2:
            prompt.insert(0, {"role": "system", "content": "You are a helpful assistant."})
        rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": good}],
                     "rejected": [{"role": "assistant", "content": bad}]})
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_model_dir) -> Path:
    """OUT without refs: conversational rows, max_length 40."""
    root = tmp_path_factory.mktemp("trl")
    raw = _write_jsonl(root / "pairs.jsonl", _conversational_rows())
    out = root / "out"
    prepare(raw, out, tokenizer=tiny_model_dir, max_length=MAX_LENGTH, progress=False, workers=1)
    return out


@pytest.fixture(scope="module")
def with_refs(tmp_path_factory, prepared, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("trl-refs") / "out"
    prepare(prepared.parent / "pairs.jsonl", out, tokenizer=tiny_model_dir, max_length=MAX_LENGTH, progress=False, workers=1)
    compute_refs(out, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    return out


@pytest.fixture(scope="module")
def other_policy_dir(tmp_path_factory, tiny_tokenizer_dir) -> str:
    """A different random policy (another seed) with the same tokenizer files."""
    from prefdata.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("other-policy")
    build_tiny_model(path, tokenizer_dir=tiny_tokenizer_dir, architecture="qwen2", seed=1)
    return str(path)


def _config(tmp_path: Path, **overrides):
    from prefdata.trl import DPOConfig

    settings = dict(
        output_dir=str(tmp_path / "run"), max_length=MAX_LENGTH, per_device_train_batch_size=len(_QUESTIONS),
        max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", learning_rate=1e-6,
        disable_tqdm=True, beta=0.1, seed=0,
    )
    settings.update(overrides)
    return DPOConfig(**settings)


def _files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*"))


def _plain_logps(model_dir: str, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of completion-token log-probs by a plain forward, one sequence at a time (no padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sums = {"chosen": [], "rejected": []}
    with torch.no_grad():
        for row in rows:
            for half in sums:
                ids = torch.tensor([row["prompt_ids"] + row[f"{half}_ids"]])
                logps = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
                targets = ids[0, 1:]
                picked = logps.gather(1, targets[:, None])[:, 0][len(row["prompt_ids"]) - 1 :]
                sums[half].append(picked.sum())
    return torch.stack(sums["chosen"]), torch.stack(sums["rejected"])


# --------------------------------------------------------------------------------------------- training


def test_policy_equal_to_reference_starts_at_ln2_on_stored_refs_without_a_reference_model(with_refs, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    before = _files(with_refs)
    dataset = datasets.load_from_disk(str(with_refs))
    trainer = DPOTrainer(tiny_model_dir, args=_config(tmp_path), train_dataset=dataset, eval_dataset=str(with_refs))
    assert trainer.ref_model is None  # no reference model loaded: the stored refs are the reference
    # The trainer's rows are OUT's ids, not a re-tokenization of the text columns.
    for name in ("prompt_ids", "chosen_ids", "rejected_ids", "ref_chosen_logps", "ref_rejected_logps"):
        assert trainer.train_dataset[name] == dataset[name]
    trainer.train()
    loss = trainer.state.log_history[0]["loss"]
    assert abs(loss - math.log(2)) < 1e-3
    # Evaluation reads the stored refs too (one step at lr 1e-6 barely moves the policy).
    assert abs(trainer.evaluate()["eval_loss"] - math.log(2)) < 1e-3
    assert _files(with_refs) == before  # nothing cached inside OUT


def test_a_different_policy_is_scored_against_the_stored_refs(with_refs, other_policy_dir, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from prefdata.trl import DPOTrainer

    rows = datasets.load_from_disk(str(with_refs)).to_list()
    policy_c, policy_r = _plain_logps(other_policy_dir, rows)
    ref_c = torch.tensor([row["ref_chosen_logps"] for row in rows])
    ref_r = torch.tensor([row["ref_rejected_logps"] for row in rows])
    beta = 1.0  # large enough that two random policies give clearly different losses
    expected = -torch.nn.functional.logsigmoid(beta * ((policy_c - ref_c) - (policy_r - ref_r))).mean().item()
    assert abs(expected - math.log(2)) > 0.03  # the two models really differ: the check below can fail

    trainer = DPOTrainer(  # OUT's path works as well as the loaded dataset
        other_policy_dir, args=_config(tmp_path, beta=beta), train_dataset=str(with_refs),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    )
    assert trainer.ref_model is None
    trainer.train()
    loss = trainer.state.log_history[0]["loss"]
    # TRL's fused log-probs and the plain forward agree to ~1e-4; recomputed refs would give ln 2 (0.09 away).
    assert loss == pytest.approx(expected, abs=2e-3)


def _plain_ld_logps(model_dir: str, rows: list[dict], alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LD-DPO sums by a plain forward: each half's first min(|yc|, |yr|) completion tokens in full,
    the rest times alpha."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = {"chosen": [], "rejected": []}
    with torch.no_grad():
        for row in rows:
            tokens = {}
            for half in out:
                ids = torch.tensor([row["prompt_ids"] + row[f"{half}_ids"]])
                logps = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
                tokens[half] = logps.gather(1, ids[0, 1:, None])[:, 0][len(row["prompt_ids"]) - 1 :]
            k = min(len(tokens["chosen"]), len(tokens["rejected"]))
            for half in out:
                out[half].append(tokens[half][:k].sum() + alpha * tokens[half][k:].sum())
    return torch.stack(out["chosen"]), torch.stack(out["rejected"])


def test_ld_alpha_weighs_the_stored_refs_as_trls_precompute_would(with_refs, other_policy_dir, tiny_model_dir, tmp_path):
    """DPOConfig(ld_alpha): TRL weighs the policy's sums itself; the hand-off gives it refs weighted the
    same way (public + alpha * rest, from the public-length sums `prefdata refs` stored)."""
    from transformers import AutoTokenizer

    from prefdata.trl import DPOTrainer

    alpha, beta = 0.2, 1.0
    rows = datasets.load_from_disk(str(with_refs)).to_list()
    policy_c, policy_r = _plain_ld_logps(other_policy_dir, rows, alpha)
    ref_c, ref_r = _plain_ld_logps(tiny_model_dir, rows, alpha)
    expected = -torch.nn.functional.logsigmoid(beta * ((policy_c - ref_c) - (policy_r - ref_r))).mean().item()
    plain_c, plain_r = _plain_logps(other_policy_dir, rows)
    stored_c = torch.tensor([row["ref_chosen_logps"] for row in rows])
    stored_r = torch.tensor([row["ref_rejected_logps"] for row in rows])
    unweighted = -torch.nn.functional.logsigmoid(beta * ((plain_c - stored_c) - (plain_r - stored_r))).mean().item()
    assert abs(expected - unweighted) > 5e-3  # ld_alpha really changes the loss here: the check below can fail

    trainer = DPOTrainer(other_policy_dir, args=_config(tmp_path, beta=beta, ld_alpha=alpha), train_dataset=str(with_refs),
                         processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    torch.testing.assert_close(torch.tensor(trainer.train_dataset["ref_chosen_logps"]), ref_c, rtol=1e-4, atol=1e-4)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, abs=2e-3)


# --------------------------------------------------------------------------------------------- refusals


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_refuses_a_max_length_other_than_outs_before_loading_anything(with_refs, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError) as error:
        DPOTrainer("/nonexistent/model", args=_config(tmp_path, max_length=32), train_dataset=str(with_refs),
                   processing_class=_tokenizer(tiny_model_dir))
    message = str(error.value)
    assert "max_length=32" in message and f"max_length={MAX_LENGTH}" in message and "\n" not in message


def test_max_length_none_is_accepted_because_the_collator_then_cuts_nothing(with_refs, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    trainer = DPOTrainer(tiny_model_dir, args=_config(tmp_path, max_length=None), train_dataset=str(with_refs))
    assert trainer.args.max_length is None and trainer.ref_model is None


def test_refuses_a_tokenizer_other_than_outs(with_refs, tiny_model_dir, tmp_path):
    from prefdata.io.manifest import tokenizer_fingerprint
    from prefdata.trl import DPOTrainer

    other = _tokenizer(tiny_model_dir)
    other.chat_template = other.chat_template.replace("<|im_end|>", "<|endoftext|>")  # another end of turn
    settings = json.loads(datasets.load_from_disk(str(with_refs)).info.description)["prefdata"]
    with pytest.raises(PrefdataError) as error:
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=str(with_refs), processing_class=other)
    assert tokenizer_fingerprint(other) in str(error.value)
    assert settings["tokenizer_fingerprint"] in str(error.value)


def test_refuses_missing_refs_when_the_loss_needs_them(prepared, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError, match=r"needs reference log-probs.*prefdata refs"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=str(prepared),
                   processing_class=_tokenizer(tiny_model_dir))
    with pytest.raises(PrefdataError, match="cache reference log-probs inside OUT"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path, precompute_ref_log_probs=True),
                   train_dataset=str(prepared), processing_class=_tokenizer(tiny_model_dir), peft_config=object())


def test_refuses_data_prefdata_did_not_prepare(tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    plain = datasets.Dataset.from_list([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}])
    with pytest.raises(PrefdataError, match="not written by `prefdata prepare`"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=plain,
                   processing_class=_tokenizer(tiny_model_dir))


def test_refuses_rows_that_break_outs_schema(with_refs, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    out = datasets.load_from_disk(str(with_refs), keep_in_memory=True)
    columns = out.to_dict()
    columns["chosen_ids"][1] = []  # no loss token, and not flagged `no_completion_tokens`
    broken = datasets.Dataset.from_dict(columns, features=out.features)
    broken.info.description = out.info.description
    with pytest.raises(PrefdataError, match=r"ScoredTokenPairs.*completions_have_tokens_unless_flagged"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=broken,
                   processing_class=_tokenizer(tiny_model_dir))


def test_a_ref_model_can_stand_in_for_missing_refs(prepared, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from prefdata.trl import DPOTrainer

    before = _files(prepared)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = DPOTrainer(tiny_model_dir, ref_model=reference, args=_config(tmp_path), train_dataset=str(prepared))
    trainer.train()
    assert abs(trainer.state.log_history[0]["loss"] - math.log(2)) < 1e-3
    assert _files(prepared) == before


# --------------------------------------------------------------------------------------------- text columns


def test_conversational_rows_keep_trls_message_format_and_plain_trl_renders_the_template(prepared, tiny_model_dir, tmp_path):
    """Plain trl.DPOTrainer re-tokenizes OUT's text columns through the chat template: the same prompt
    ids as prefdata's, and completions that differ only by the '\\n' ChatML puts after <|im_end|>."""
    import trl

    out = datasets.load_from_disk(str(prepared), keep_in_memory=True)  # in memory: TRL's map caches nothing in OUT
    row = out[0]
    assert row["prompt"] == _conversational_rows()[0]["prompt"]
    assert row["chosen"] == _conversational_rows()[0]["chosen"]
    tokenizer = _tokenizer(tiny_model_dir)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    plain = trl.DPOTrainer(tiny_model_dir, args=_config(tmp_path, max_length=None), train_dataset=out,
                           processing_class=tokenizer)
    for ours, theirs in zip(out, plain.train_dataset):
        assert theirs["prompt_ids"] == ours["prompt_ids"]
        for half in ("chosen_ids", "rejected_ids"):
            if ours[half][-1] == tokenizer.eos_token_id:  # not cut by max_length
                assert theirs[half] == ours[half] + newline
            else:
                assert theirs[half][: len(ours[half])] == ours[half]


def test_mixed_string_and_conversational_rows_store_strings_plus_message_columns(tmp_path, tiny_model_dir):
    rows = _conversational_rows()[:2] + [{"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No."}]
    raw = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    contents = []
    for batch_size in (1, 100):  # the message/string parts meet in one dataset either way
        out = tmp_path / f"out-{batch_size}"
        prepare(raw, out, tokenizer=tiny_model_dir, batch_size=batch_size, progress=False, workers=1)
        dataset = datasets.load_from_disk(str(out))
        contents.append(dataset.to_list())
        assert json.loads(dataset.info.description)["prefdata"]["text_columns"] == "mixed"
    assert contents[0] == contents[1]
    first, string_row = contents[0][0], contents[0][2]
    assert first["prompt"] == "user: What is the capital of France?"
    assert first["prompt_messages"] == rows[0]["prompt"] and first["chosen_messages"] == rows[0]["chosen"]
    assert string_row["prompt"] == "Say hi." and string_row["prompt_messages"] is None


def test_polars_line_of_the_docs_reads_out_after_prepare_and_after_refs(prepared, with_refs):
    """docs/trl.md's polars line (docs/formats.md's too) must keep working when `refs` rewrites the data files."""
    import glob
    import re

    import polars as pl

    docs = (REPO / "docs" / "trl.md").read_text(encoding="utf-8")
    docs_line = next(line.strip() for line in docs.splitlines() if "pl.read_ipc_stream" in line)
    readme = (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    readme_line = re.search(r"`(pl\.concat\(\[pl\.read_ipc_stream[^`]*)`", readme).group(1)
    for out, line in ((prepared, docs_line), (with_refs, docs_line), (prepared, readme_line), (with_refs, readme_line)):
        frame = eval(line.replace('"out/', f'"{out}/'), {"glob": glob, "pl": pl})  # noqa: S307 - our own docs
        expected = datasets.load_from_disk(str(out))
        assert frame.columns == expected.column_names
        assert frame["chosen_ids"].to_list() == expected["chosen_ids"]
        assert ("ref_chosen_logps" in frame.columns) == (out == with_refs)


# --------------------------------------------------------------------------------------------- TRL itself


def test_trl_internals_the_hand_off_relies_on():
    """A TRL upgrade that changes any of these breaks here, loudly, instead of training silently on
    re-tokenized data or recomputed refs. The training tests above check the behaviour end to end."""
    import trl
    from trl.trainer import dpo_trainer

    from prefdata.trl import DPOTrainer

    assert list(inspect.signature(trl.DPOTrainer._prepare_dataset).parameters) == [
        "self", "dataset", "processing_class", "args", "dataset_name"]
    assert list(inspect.signature(trl.DPOTrainer._precompute_ref_logps).parameters) == [
        "self", "dataset", "name", "batch_size"]
    assert callable(dpo_trainer.hash_module) and callable(dpo_trainer.get_config_model_id)
    ours = inspect.signature(DPOTrainer.__init__).parameters
    theirs = inspect.signature(trl.DPOTrainer.__init__).parameters
    assert list(ours) == list(theirs)  # the same constructor
    source = inspect.getsource(trl.DPOTrainer._compute_loss)
    assert 'inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]' in source
    collator = dpo_trainer.DataCollatorForPreference(pad_token_id=0)
    batch = collator([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3],
                       "ref_chosen_logps": -1.0, "ref_rejected_logps": -2.0}])
    assert batch["ref_chosen_logps"].tolist() == [-1.0] and batch["ref_rejected_logps"].tolist() == [-2.0]
    for field in ("max_length", "precompute_ref_log_probs", "loss_type", "ld_alpha"):
        assert hasattr(trl.DPOConfig, "__dataclass_fields__") and field in trl.DPOConfig.__dataclass_fields__


def test_without_trl_the_module_says_so_in_one_line():
    code = "import sys; sys.modules['trl'] = None\nimport prefdata.trl"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert result.returncode != 0
    assert 'ImportError: prefdata.trl needs TRL: pip install "prefdata[trl]"' in result.stderr.strip().splitlines()[-1]
