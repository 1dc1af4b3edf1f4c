"""`prefdata train --ld-alpha` (LD-DPO) end to end: `prefdata refs` stores the reference's
public-length sums, train weighs policy and reference alike (step 1 at ln 2, logps/* the weighted
sums), records ld_alpha in train_config.json and the resume keys, and refuses what it cannot do."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from prefdata.core.errors import PrefdataError
from prefdata.train.recipe import train

FAST = dict(lr=3e-3, batch_pairs=4, warmup_ratio=0.0, progress=False, device="cpu", shuffle=False)


@pytest.fixture(scope="module")
def scored_out(tmp_path_factory, tiny_model_dir) -> Path:
    """prepare + refs on pairs whose halves differ in length (so the public length matters)."""
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs

    root = tmp_path_factory.mktemp("ld")
    raw = root / "pairs.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"Question {i}: name a colour."}],
             "chosen": [{"role": "assistant", "content": "Blue. " * (1 + i % 5)}],
             "rejected": [{"role": "assistant", "content": "I do not know any colours at all, sorry. " * (1 + i % 3)}]}
            for i in range(12)]
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = root / "out"
    prepare(raw, out, tokenizer=tiny_model_dir, workers=1, progress=False)
    compute_refs(out, model=tiny_model_dir, device="cpu", progress=False)
    return out


def _metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_refs_store_the_public_length_sums(scored_out, tiny_model_dir) -> None:
    import datasets
    from transformers import AutoModelForCausalLM

    from prefdata.model.pairs import pair_logps

    ds = datasets.load_from_disk(str(scored_out))
    manifest = json.loads((scored_out / "manifest.json").read_text())
    assert {"ref_chosen_public_logps", "ref_rejected_public_logps"} <= set(manifest["refs"]["columns"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = pair_logps(model, ds["prompt_ids"], ds["chosen_ids"], ds["rejected_ids"], "right", 0, public=True)
    np.testing.assert_allclose(ds["ref_chosen_public_logps"], out.chosen_public.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ds["ref_rejected_public_logps"], out.rejected_public.numpy(), rtol=1e-5, atol=1e-5)
    # the shorter half's public sum is its whole sum; the longer half's is not
    counts_c, counts_r = np.array(ds["chosen_token_count"]), np.array(ds["rejected_token_count"])
    shorter_c = counts_c <= counts_r
    np.testing.assert_allclose(np.array(ds["ref_chosen_public_logps"])[shorter_c], np.array(ds["ref_chosen_logps"])[shorter_c], rtol=1e-6)
    assert (np.array(ds["ref_rejected_public_logps"])[counts_r > counts_c] > np.array(ds["ref_rejected_logps"])[counts_r > counts_c]).all()


def test_step_one_is_ln2_and_logs_the_weighted_sums(scored_out, tiny_model_dir, tmp_path) -> None:
    import datasets

    alpha = 0.3
    train(scored_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=3, save_every=None, ld_alpha=alpha,
          batch_tokens=None, **FAST)
    lines = _metrics(tmp_path / "run")
    assert lines[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference, weighted alike
    ds = datasets.load_from_disk(str(scored_out)).select(range(4))  # the first batch (no shuffle, 4 pairs)
    full, public = np.array(ds["ref_chosen_logps"]), np.array(ds["ref_chosen_public_logps"])
    assert lines[0]["logps/chosen"] == pytest.approx(float(np.mean(public + alpha * (full - public))), rel=1e-4)
    config = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert config["ld_alpha"] == alpha
    assert lines[1]["loss"] < math.log(2)  # it trains


def test_alpha_one_is_plain_dpo_and_alpha_zero_is_not(scored_out, tiny_model_dir, tmp_path) -> None:
    runs = {}
    for name, alpha in (("plain", None), ("one", 1.0), ("zero", 0.0)):
        train(scored_out, model=tiny_model_dir, output=tmp_path / name, max_steps=3, save_every=None, ld_alpha=alpha, **FAST)
        runs[name] = _metrics(tmp_path / name)
    for a, b in zip(runs["plain"], runs["one"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
        assert b["logps/rejected"] == pytest.approx(a["logps/rejected"], rel=1e-5)
    assert runs["zero"][0]["logps/rejected"] > runs["plain"][0]["logps/rejected"] + 1.0  # the long tails are gone
    assert runs["zero"][2]["loss"] != pytest.approx(runs["plain"][2]["loss"], rel=1e-4)


def test_resume_refuses_a_changed_ld_alpha(scored_out, tiny_model_dir, tmp_path) -> None:
    output = tmp_path / "run"
    train(scored_out, model=tiny_model_dir, output=output, max_steps=2, save_every=1, ld_alpha=0.5, **FAST)
    with pytest.raises(PrefdataError, match="settings changed.*ld_alpha"):
        train(scored_out, model=tiny_model_dir, output=output, max_steps=2, save_every=1, resume=True, ld_alpha=0.4, **FAST)
    result = train(scored_out, model=tiny_model_dir, output=output, max_steps=2, save_every=1, resume=True, ld_alpha=0.5, **FAST)
    assert result.resumed_from_step is not None and result.steps == 2


def test_refusals_are_one_line(scored_out, tiny_model_dir, tmp_path) -> None:
    import datasets

    old = tmp_path / "old"  # refs from before --ld-alpha: no public-length columns
    ds = datasets.load_from_disk(str(scored_out)).remove_columns(["ref_chosen_public_logps", "ref_rejected_public_logps"])
    ds.save_to_disk(str(old))
    (old / "manifest.json").write_text((scored_out / "manifest.json").read_text())
    with pytest.raises(PrefdataError, match="predate --ld-alpha.*prefdata refs") as excinfo:
        train(old, model=tiny_model_dir, output=tmp_path / "a", max_steps=1, ld_alpha=0.5, **FAST)
    assert "\n" not in str(excinfo.value)
    assert train(old, model=tiny_model_dir, output=tmp_path / "b", max_steps=1, save_every=None, **FAST).steps == 1
    with pytest.raises(PrefdataError, match=r"--ld-alpha must be in \[0, 1\]"):
        train(scored_out, model=tiny_model_dir, output=tmp_path / "c", max_steps=1, ld_alpha=1.5, **FAST)
    with pytest.raises(PrefdataError, match="not defined for --loss simpo"):
        train(scored_out, model=tiny_model_dir, output=tmp_path / "d", max_steps=1, ld_alpha=0.5, loss="simpo", **FAST)


def test_cli_ld_alpha_reaches_train(monkeypatch) -> None:
    from prefdata import cli

    captured = {}

    def fake_train(out_dir, **settings):
        captured.update(settings)
        raise PrefdataError("stop here")

    monkeypatch.setattr("prefdata.train.recipe.train", fake_train)
    assert cli.main(["train", "OUT", "--model", "m", "--output", "o", "--ld-alpha", "0.25"]) == 2
    assert captured["ld_alpha"] == 0.25
