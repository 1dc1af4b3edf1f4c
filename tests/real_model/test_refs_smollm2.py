"""`prefdata refs` on a real model: SmolLM2-135M-Instruct (float32) on real UltraFeedback pairs,
prepared with its chat template as a user would, against an independent forward and TRL's precompute.

The model comes from `make smollm2` (tests skip with one line without it). Eight pairs at
--max-length 256 keep the CPU time to a minute or two."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prefdata.io.manifest import read_manifest

N_PAIRS = 8
MAX_LENGTH, MAX_PROMPT_LENGTH = 256, 128  # prompts cut from the left so that every pair keeps completion tokens
RTOL = 1e-4

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "prefdata", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.fixture(scope="module")
def with_refs(tmp_path_factory, smollm2_dir, shared_data) -> Path:
    """N_PAIRS real UltraFeedback pairs through `prefdata prepare --chat-template` and `prefdata refs`."""
    tmp = tmp_path_factory.mktemp("smollm2-refs")
    lines = shared_data("ultrafeedback-sample/train.jsonl").read_text().splitlines()[:N_PAIRS]
    raw = tmp / "uf.jsonl"
    raw.write_text("\n".join(lines) + "\n")
    out = tmp / "out"
    _cli("prepare", str(raw), str(out), "--tokenizer", smollm2_dir, "--chat-template", "--max-length", str(MAX_LENGTH),
         "--max-prompt-length", str(MAX_PROMPT_LENGTH), "--no-progress")
    _cli("refs", str(out), "--model", smollm2_dir, "--no-progress")
    return out


def _plain_logps(model, prompt: list[int], completion: list[int]) -> float:
    """One pair's completion log-prob from a plain forward of the full sequence: float32
    log-softmax, the next token's entry, summed over the completion tokens."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()[0]
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return float(logp[len(prompt) - 1:].sum())


def test_refs_on_smollm2_equal_an_independent_forward(with_refs, smollm2_dir):
    ds = datasets.load_from_disk(str(with_refs))
    assert len(ds) == N_PAIRS  # every pair kept: the prompt budget leaves completion tokens
    manifest = read_manifest(with_refs)
    model_info = manifest["refs"]["model"]
    assert model_info["architecture"] == "LlamaForCausalLM" and model_info["dtype"] == "float32"
    assert manifest["refs"]["non_finite_rows"] == 0

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for row in ds:
        assert len(row["prompt_ids"]) + max(len(row["chosen_ids"]), len(row["rejected_ids"])) <= MAX_LENGTH
        for side in ("chosen", "rejected"):
            theirs = _plain_logps(model, row["prompt_ids"], row[f"{side}_ids"])
            assert theirs < 0 and row[f"{side}_token_count"] == len(row[f"{side}_ids"])
            assert row[f"ref_{side}_logps"] == pytest.approx(theirs, rel=RTOL), (side, row["source_line"])


def test_refs_on_smollm2_equal_trls_precompute_on_the_same_ids(with_refs, smollm2_dir, tmp_path):
    """TRL 1.16's own precompute path (`DPOTrainer._precompute_ref_logps`, its collator and its
    `compute_ref_log_probs`) run over the ids prepare wrote, batched and right-padded as TRL batches."""
    trl = pytest.importorskip("trl")
    ours = datasets.load_from_disk(str(with_refs))
    ids = datasets.Dataset.from_dict({c: ours[c] for c in ("prompt_ids", "chosen_ids", "rejected_ids")})
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    # A one-row text dataset only to construct the trainer (TRL tokenizes what it is given); the
    # comparison runs TRL's precompute on prepare's ids. max_length=None: TRL's collator cuts nothing.
    stub = datasets.Dataset.from_dict({"prompt": ["Hi"], "chosen": [" Hello."], "rejected": [" No."]})
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "trl"), precompute_ref_log_probs=True, per_device_train_batch_size=4,
        max_length=None, report_to=[], use_cpu=True, bf16=False, dataset_num_proc=None,
    )
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=stub, processing_class=tok)
    theirs = trainer._precompute_ref_logps(ids, "smollm2", 4)
    np.testing.assert_allclose(ours["ref_chosen_logps"], theirs["ref_chosen_logps"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(ours["ref_rejected_logps"], theirs["ref_rejected_logps"], rtol=RTOL, atol=0)
