"""prefdata train on CPU with the tiny random Qwen2 model: it learns, it notices stalls, it resumes
exactly, it refuses data it must not train on, and what it saves loads back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from prefdata.core.errors import PrefdataError
from prefdata.io.manifest import tokenizer_fingerprint, write_manifest
from prefdata.train.recipe import train
from prefdata.train.stall import StallDetector, TrainingStalled

PROMPTS = [f"Question {i}: what should I do about {topic}?" for i, topic in enumerate(
    ["the sea", "a cat", "German", "numbers", "code", "sleep", "water", "a walk", "spiders", "Paris",
     "poems", "foxes", "dogs", "tips", "France", "tools"])]
CHOSEN = "Sure! Here are three tips: drink water, sleep well."
REJECTED = "I'm sorry, I can't help with that."


def _tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def make_out(path: Path, model_dir: str, pairs: list[tuple[str, str, str]], *, refs: bool = True,
             flags: list[list[str]] | None = None, flag_counts: dict[str, int] | None = None,
             tokenizer_fp: str | None = None) -> Path:
    """A prepared OUT/ as prepare (+ refs) would write it: ids, flags, ref log-probs of `model_dir`."""
    import datasets
    from transformers import AutoModelForCausalLM

    from prefdata.model.logprobs import sequence_logps
    from prefdata.tokenize.masks import build_pair_batch

    tok = _tokenizer(model_dir)
    eos = tok.eos_token_id
    prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
                  for p, _, _ in pairs]
    prompt_ids = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompt_ids]
    chosen_ids = [tok(c, add_special_tokens=False)["input_ids"] + [eos] for _, c, _ in pairs]
    rejected_ids = [tok(r, add_special_tokens=False)["input_ids"] + [eos] for _, _, r in pairs]
    columns = {
        "prompt_ids": prompt_ids, "chosen_ids": chosen_ids, "rejected_ids": rejected_ids,
        "prompt": [p for p, _, _ in pairs], "chosen": [c for _, c, _ in pairs], "rejected": [r for _, _, r in pairs],
        "flags": flags or [[] for _ in pairs],
        "source_file": ["synthetic.jsonl"] * len(pairs), "source_line": list(range(1, len(pairs) + 1)),
    }
    if refs:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():
            batch = build_pair_batch(prompt_ids, chosen_ids, rejected_ids, "right", tok.pad_token_id)
            logps, counts = sequence_logps(model, batch)
        n = len(pairs)
        columns.update({
            "ref_chosen_logps": logps[:n].tolist(), "ref_rejected_logps": logps[n:].tolist(),
            "chosen_token_count": counts[:n].tolist(), "rejected_token_count": counts[n:].tolist(),
        })
    ds = datasets.Dataset.from_dict(columns)
    if refs:
        ds = ds.cast_column("ref_chosen_logps", datasets.Value("float32")).cast_column("ref_rejected_logps", datasets.Value("float32"))
    ds.save_to_disk(str(path))
    write_manifest(path, {
        "tokenizer": {"fingerprint": tokenizer_fp or tokenizer_fingerprint(tok), "pad_token_id": tok.pad_token_id},
        "flag_counts": flag_counts or {},
    })
    return path


def _metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def learnable_out(tmp_path_factory, tiny_model_dir) -> Path:
    pairs = [(p, CHOSEN, REJECTED) for p in PROMPTS]
    return make_out(tmp_path_factory.mktemp("learnable"), tiny_model_dir, pairs)


FAST = dict(lr=3e-3, batch_pairs=4, warmup_ratio=0.0, progress=False, device="cpu")


@pytest.mark.parametrize("seed,lr", [(0, 3e-3), (1, 3e-3), (2, 3e-3), (0, 1e-2), (1, 1e-3)])
def test_loss_falls_below_ln2_and_accuracy_rises(learnable_out, tiny_model_dir, tmp_path, seed, lr):
    """Holds at every seed (data order) and learning rate tried, not at one tuned point."""
    output = tmp_path / "run"
    result = train(learnable_out, model=tiny_model_dir, output=output, max_steps=16, save_every=None,
                   **(FAST | dict(lr=lr, seed=seed)))
    lines = [m for m in _metrics(output) if "loss" in m]
    assert len(lines) == 16 and result.steps == 16
    expected_keys = {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                     "logps/chosen", "logps/rejected", "grad_norm", "lr", "tokens_per_s", "step", "epoch"}
    assert expected_keys <= set(lines[0])
    # The policy starts equal to the reference: zero margins, loss exactly ln 2.
    assert lines[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert lines[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    last = lines[-4:]
    assert max(m["loss"] for m in last) < math.log(2) - 0.1
    assert min(m["rewards/accuracies"] for m in last) == 1.0
    assert all(m["rewards/margins"] > 0 for m in last)
    assert not result.stall_events


def test_saved_model_loads_with_transformers(learnable_out, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    output = tmp_path / "run"
    train(learnable_out, model=tiny_model_dir, output=output, max_steps=2, save_every=None, **FAST)
    model = AutoModelForCausalLM.from_pretrained(str(output))
    tok = AutoTokenizer.from_pretrained(str(output))
    assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(_tokenizer(tiny_model_dir))
    ids = torch.tensor([tok("Hello there")["input_ids"]])
    assert torch.isfinite(model(ids).logits).all()
    # It trained: the weights moved away from the initial model.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))


def test_identical_pairs_forced_through_trigger_the_stall_detector(tmp_path, tiny_model_dir, capsys):
    pairs = [(p, CHOSEN, CHOSEN) for p in PROMPTS[:8]]
    out = make_out(tmp_path / "out", tiny_model_dir, pairs, flags=[["identical"]] * 8, flag_counts={"identical": 8})
    output = tmp_path / "run"
    result = train(out, model=tiny_model_dir, output=output, max_steps=6, stall_steps=4, save_every=None, **FAST)
    events = [m for m in _metrics(output) if m.get("event") == "stall"]
    assert len(events) == 1 and result.stall_events
    event = events[0]
    assert event["step"] == 4 and event["identical_pairs"] == 8
    assert event["flag_counts"] == {"identical": 8}
    assert any("identical" in cause for cause in event["likely_causes"])
    err = capsys.readouterr().err
    assert "training stalled" in err and "identical=8" in err

    with pytest.raises(TrainingStalled) as excinfo:
        train(out, model=tiny_model_dir, output=tmp_path / "run2", max_steps=4, stall_steps=4, save_every=None,
              fail_on_stall=True, **FAST)
    assert excinfo.value.exit_code == 1 and "\n" not in str(excinfo.value)


def test_learning_rate_zero_stalls_with_zero_margins(learnable_out, tiny_model_dir, tmp_path):
    result = train(learnable_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=3, stall_steps=3,
                   save_every=None, **(FAST | {"lr": 0.0}))
    assert len(result.stall_events) == 1
    assert any("learning rate is 0" in c for c in result.stall_events[0]["likely_causes"])


def _final_weights(output: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(output / "model.safetensors"))


def test_resume_after_interruption_gives_the_same_weights(learnable_out, tiny_model_dir, tmp_path, monkeypatch):
    import prefdata.train.step as train_module

    settings = dict(max_steps=6, grad_accum=2, save_every=2, **FAST)
    straight = tmp_path / "straight"
    train(learnable_out, model=tiny_model_dir, output=straight, **settings)

    # Crash in the first micro-batch of step 4 (forward number 7 with 2 micro-batches per step):
    # the newest checkpoint is the one after step 2.
    real = train_module.pair_logps
    calls = {"n": 0}

    def crashing(model, *args):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("simulated crash")
        return real(model, *args)

    monkeypatch.setattr(train_module, "pair_logps", crashing)
    interrupted = tmp_path / "interrupted"
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(learnable_out, model=tiny_model_dir, output=interrupted, **settings)
    assert (interrupted / "checkpoints" / "step-00000002").is_dir()
    assert not (interrupted / "model.safetensors").exists()
    monkeypatch.setattr(train_module, "pair_logps", real)

    with pytest.raises(PrefdataError, match="--resume"):
        train(learnable_out, model=tiny_model_dir, output=interrupted, **settings)
    result = train(learnable_out, model=tiny_model_dir, output=interrupted, resume=True, **settings)
    assert result.resumed_from_step == 2 and result.steps == 6

    a, b = _final_weights(straight), _final_weights(interrupted)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # metrics.jsonl of the resumed run has each step exactly once, equal to the straight run's.
    steps_a = [m for m in _metrics(straight) if "loss" in m]
    steps_b = [m for m in _metrics(interrupted) if "loss" in m]
    assert [m["step"] for m in steps_b] == list(range(1, 7))
    assert [m["loss"] for m in steps_a] == [m["loss"] for m in steps_b]


def test_keyboard_interrupt_saves_a_checkpoint_that_resumes_exactly(learnable_out, tiny_model_dir, tmp_path, monkeypatch):
    import prefdata.train.step as train_module

    settings = dict(max_steps=4, save_every=None, **FAST)
    straight = tmp_path / "straight"
    train(learnable_out, model=tiny_model_dir, output=straight, **settings)

    real = train_module.pair_logps
    calls = {"n": 0}

    def interrupted_at_third(model, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(model, *args)

    monkeypatch.setattr(train_module, "pair_logps", interrupted_at_third)
    output = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        train(learnable_out, model=tiny_model_dir, output=output, **settings)
    monkeypatch.setattr(train_module, "pair_logps", real)
    result = train(learnable_out, model=tiny_model_dir, output=output, resume=True, **settings)
    assert result.resumed_from_step == 2
    a, b = _final_weights(straight), _final_weights(output)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_changed_settings(learnable_out, tiny_model_dir, tmp_path):
    output = tmp_path / "run"
    train(learnable_out, model=tiny_model_dir, output=output, max_steps=2, save_every=1, **FAST)
    with pytest.raises(PrefdataError, match="settings changed.*beta"):
        train(learnable_out, model=tiny_model_dir, output=output, max_steps=2, save_every=1, resume=True,
              beta=0.5, **FAST)


def test_refuses_data_without_reference_logps(tmp_path, tiny_model_dir):
    out = make_out(tmp_path / "out", tiny_model_dir, [(p, CHOSEN, REJECTED) for p in PROMPTS[:4]], refs=False)
    with pytest.raises(PrefdataError, match="has no reference log-probs: run `prefdata refs") as excinfo:
        train(out, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, **FAST)
    assert "\n" not in str(excinfo.value)
    # SimPO is reference-free: the same data trains.
    result = train(out, model=tiny_model_dir, output=tmp_path / "simpo", loss="simpo", beta=2.0, max_steps=2,
                   save_every=None, **FAST)
    assert result.steps == 2


def test_refuses_a_tokenizer_that_differs_from_the_manifest(tmp_path, tiny_model_dir):
    out = make_out(tmp_path / "out", tiny_model_dir, [(p, CHOSEN, REJECTED) for p in PROMPTS[:4]],
                   tokenizer_fp="sha256:" + "0" * 64)
    with pytest.raises(PrefdataError, match="tokenizer .* differs from the one"):
        train(out, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, **FAST)


def test_rows_with_non_finite_refs_are_skipped(tmp_path, tiny_model_dir):
    pairs = [(p, CHOSEN, REJECTED) for p in PROMPTS[:6]]
    flags = [[], ["non_finite_ref_logps"], [], [], [], []]
    out = make_out(tmp_path / "out", tiny_model_dir, pairs, flags=flags)
    import datasets

    ds = datasets.load_from_disk(str(out))
    refs = list(ds["ref_chosen_logps"])
    refs[3] = float("nan")  # not flagged, still never trained on
    ds = ds.remove_columns("ref_chosen_logps").add_column("ref_chosen_logps", refs)
    ds.save_to_disk(str(tmp_path / "out2"))
    (tmp_path / "out2" / "manifest.json").write_text((out / "manifest.json").read_text())
    output = tmp_path / "run"
    train(tmp_path / "out2", model=tiny_model_dir, output=output, max_steps=2, save_every=None,
          **(FAST | {"batch_pairs": 8}))
    config = json.loads((output / "train_config.json").read_text())
    assert config["train_pairs"] == 4 and config["skipped_non_finite_refs"] == 2
    assert all(math.isfinite(m["loss"]) for m in _metrics(output) if "loss" in m)


def test_token_budget_batches_and_eval(learnable_out, tiny_model_dir, tmp_path):
    output = tmp_path / "run"
    result = train(learnable_out, model=tiny_model_dir, output=output, epochs=1, batch_tokens=256,
                   eval_dir=learnable_out, eval_every=2, save_every=None, **FAST)
    lines = _metrics(output)
    evals = [m for m in lines if "eval/loss" in m]
    assert len(evals) >= 2 and result.eval_metrics is not None
    assert {"eval/rewards/accuracies", "eval/rewards/margins", "eval/logps/chosen"} <= set(result.eval_metrics)
    assert result.epochs == pytest.approx(1.0)


@pytest.mark.parametrize("loss", ["ipo", "hinge", "robust"])
def test_other_losses_train(learnable_out, tiny_model_dir, tmp_path, loss):
    label_smoothing = 0.1 if loss == "robust" else 0.0
    result = train(learnable_out, model=tiny_model_dir, output=tmp_path / loss, loss=loss, max_steps=3,
                   label_smoothing=label_smoothing, save_every=None, **FAST)
    assert math.isfinite(result.last_metrics["loss"])


def test_lora_without_peft_is_one_clear_line(learnable_out, tiny_model_dir, tmp_path):
    try:
        import peft  # noqa: F401

        pytest.skip("peft is installed")
    except ImportError:
        pass
    with pytest.raises(PrefdataError, match="peft"):
        train(learnable_out, model=tiny_model_dir, output=tmp_path / "run", lora=True, max_steps=1, **FAST)


def test_stall_detector_unit():
    detector = StallDetector(steps=3, flag_counts={"identical_after_truncation": 5})
    ln2 = math.log(2)
    assert detector.update(1, ln2, 0.0, 0.1, 1e-5) is None
    assert detector.update(2, ln2 + 5e-4, 1e-5, 0.1, 1e-5) is None
    event = detector.update(3, ln2, 0.0, 0.1, 1e-5)
    assert event is not None and event["event"] == "stall" and event["stalled_steps"] == 3
    assert "identical_after_truncation=5" in event["message"]
    assert detector.update(4, ln2, 0.0, 0.1, 1e-5) is None  # reported once per stall
    assert detector.update(5, 0.5, 0.3, 0.1, 1e-5) is None  # learning again: the count resets
    # Zero gradient counts as stalled whatever the loss.
    detector = StallDetector(steps=2)
    detector.update(1, 0.3, 0.5, 0.0, 1e-5)
    event = detector.update(2, 0.3, 0.5, 0.0, 1e-5)
    assert event is not None and any("gradient is zero" in c for c in event["likely_causes"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_on_gpu_bf16(learnable_out, tiny_model_dir, tmp_path):
    result = train(learnable_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=8, save_every=None,
                   **(FAST | {"device": "cuda"}))
    assert result.last_metrics["loss"] < math.log(2)


def test_metrics_carry_trl_names_and_sharing_is_recorded(learnable_out, tiny_model_dir, tmp_path):
    output = tmp_path / "run"
    train(learnable_out, model=tiny_model_dir, output=output, max_steps=3, save_every=None, **FAST)
    lines = [m for m in _metrics(output) if "loss" in m]
    for line in lines:
        assert line["learning_rate"] == line["lr"]
        assert math.isfinite(line["logits/chosen"]) and math.isfinite(line["logits/rejected"])
    # num_tokens: prompt twice + both completions of every pair seen so far (TRL's count)
    per_step = [m["num_tokens"] for m in lines]
    assert per_step[0] > 0 and all(b > a for a, b in zip(per_step, per_step[1:]))
    config = json.loads((output / "train_config.json").read_text())
    assert config["layout"] == "shared" and config["prefix_sharing"]["pairs"] == 16
    assert config["prefix_sharing"]["shared_pairs"] > 0
    # The step-0 loss with policy == reference is ln 2 (float32), whatever the layout.
    assert lines[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_shared_layout_trains_like_padded_layout(learnable_out, tiny_model_dir, tmp_path):
    runs = {}
    for layout in ("right", "shared"):
        train(learnable_out, model=tiny_model_dir, output=tmp_path / layout, max_steps=4, save_every=None,
              layout=layout, **FAST)
        runs[layout] = [m for m in _metrics(tmp_path / layout) if "loss" in m]
    for a, b in zip(runs["right"], runs["shared"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        assert b["num_tokens"] == a["num_tokens"]


def test_no_shuffle_keeps_the_data_order(learnable_out, tiny_model_dir, tmp_path, monkeypatch):
    import prefdata.train.step as step_module

    seen: list[list[int]] = []
    real = step_module.forward_pairs

    def recording(fwd, data, rows):
        seen.append(list(rows))
        return real(fwd, data, rows)

    monkeypatch.setattr("prefdata.train.loop.forward_pairs", recording)
    train(learnable_out, model=tiny_model_dir, output=tmp_path / "ordered", max_steps=2, save_every=None,
          shuffle=False, **FAST)
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7]]
    seen.clear()
    train(learnable_out, model=tiny_model_dir, output=tmp_path / "shuffled", max_steps=2, save_every=None, **FAST)
    assert seen != [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_cli_no_shuffle_flag_reaches_train(monkeypatch):
    from prefdata import cli

    captured = {}

    def fake_train(out_dir, **settings):
        captured.update(settings)
        raise PrefdataError("stop here")

    monkeypatch.setattr("prefdata.train.recipe.train", fake_train)
    assert cli.main(["train", "OUT", "--model", "m", "--output", "o", "--no-shuffle"]) == 2
    assert captured["shuffle"] is False
    captured.clear()
    cli.main(["train", "OUT", "--model", "m", "--output", "o"])
    assert "shuffle" not in captured  # the API default (True) applies


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).state_dict()


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_runs_that_continue_the_optimizer_train_as_one_run(tmp_path, tiny_model_dir, schedule):
    """Online rounds call train once per round: with the optimizer and schedule state carried from
    one call to the next, 2 + 2 steps equal 4 steps of one run (weights and learning rates)."""
    out = make_out(tmp_path / "out", tiny_model_dir, [(p, CHOSEN, REJECTED) for p in PROMPTS[:4]])
    common = dict(FAST, shuffle=False, save_every=None, lr_schedule=schedule, schedule_steps=4)  # 1 batch = all pairs
    train(out, model=tiny_model_dir, output=tmp_path / "whole", max_steps=4, **common)
    train(out, model=tiny_model_dir, output=tmp_path / "first", max_steps=2, save_optimizer=True, **common)
    assert (tmp_path / "first" / "optimizer" / "optimizer.pt").is_file()
    train(out, model=tmp_path / "first", output=tmp_path / "second", max_steps=2, optimizer_from=tmp_path / "first",
          **common)
    whole, continued = _weights(tmp_path / "whole"), _weights(tmp_path / "second")
    assert all(torch.allclose(whole[k], continued[k], atol=1e-6, rtol=0) for k in whole)
    lrs = [m["lr"] for m in _metrics(tmp_path / "whole") if "loss" in m]
    assert [m["lr"] for m in _metrics(tmp_path / "second") if "loss" in m] == pytest.approx(lrs[2:])
    assert lrs[0] == pytest.approx(3e-3) and lrs[3] < lrs[2] < lrs[0]  # one decay over the 4 steps

    # Without the carried state the second call is a fresh run (new Adam moments, lr back at its peak).
    train(out, model=tmp_path / "first", output=tmp_path / "restarted", max_steps=2, **common)
    restarted = _weights(tmp_path / "restarted")
    assert not all(torch.allclose(whole[k], restarted[k], atol=1e-6, rtol=0) for k in whole)


def test_continuing_needs_a_saved_optimizer_state(tmp_path, learnable_out, tiny_model_dir):
    with pytest.raises(PrefdataError, match="no saved optimizer state"):
        train(learnable_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, save_every=None,
              optimizer_from=tmp_path, **FAST)
    with pytest.raises(PrefdataError, match="--lr-schedule"):
        train(learnable_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, lr_schedule="step", **FAST)


def test_schedules_decay_to_zero_at_the_planned_end_and_stay_there():
    from prefdata.train.lr_schedule import lr_factor

    for kind in ("cosine", "linear"):
        values = [lr_factor(step, kind=kind, warmup_steps=2, total_steps=10) for step in range(14)]
        assert values[:3] == [0.0, 0.5, 1.0] and values[10] == pytest.approx(0.0, abs=1e-12)
        assert all(a >= b for a, b in zip(values[2:], values[3:]))  # never turns back up past the end
    assert [lr_factor(s, kind="constant", warmup_steps=0, total_steps=3) for s in range(5)] == [1.0] * 5


def test_warmup_never_spends_a_short_run_at_lr_zero():
    from prefdata.train.recipe import warmup_steps_for

    # README's shape: 100 pairs, 8 per micro-batch, 4 micro-batches per step -> 4 steps.
    assert warmup_steps_for(0.1, 4) == 0 and warmup_steps_for(0.1, 10) == 0 and warmup_steps_for(0.1, 19) == 0
    assert warmup_steps_for(0.1, 20) == 2 and warmup_steps_for(0.1, 1000) == 100
    assert warmup_steps_for(0.5, 4) == 2 and warmup_steps_for(0.0, 1000) == 0


def test_a_short_run_that_learned_nothing_says_why(learnable_out, tiny_model_dir, tmp_path, capsys):
    """README's old example: a few steps at lr 5e-7 end at 0.6931; fewer steps than --stall-steps,
    so the per-step detector never fires; the end of the run reports it, naming the learning rate."""
    output = tmp_path / "run"
    result = train(learnable_out, model=tiny_model_dir, output=output, max_steps=4, save_every=None,
                   **(FAST | {"lr": 5e-7, "warmup_ratio": 0.1}))
    lines = [m for m in _metrics(output) if "loss" in m]
    assert lines[0]["lr"] == pytest.approx(5e-7)  # no warmup step at lr 0
    (event,) = result.stall_events
    assert event["short_run"] and event["stalled_steps"] == 4
    assert "the run is short: 4 optimizer steps at a learning rate of at most 5e-07" in event["likely_causes"][0]
    assert "training learned nothing: in all 4 steps" in capsys.readouterr().err
    assert [m for m in _metrics(output) if m.get("event") == "stall"]
    with pytest.raises(TrainingStalled):
        train(learnable_out, model=tiny_model_dir, output=tmp_path / "run2", max_steps=4, save_every=None,
              fail_on_stall=True, **(FAST | {"lr": 5e-7}))


def test_a_short_run_that_learns_is_not_reported(learnable_out, tiny_model_dir, tmp_path):
    result = train(learnable_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=4, save_every=None, **FAST)
    assert not result.stall_events
