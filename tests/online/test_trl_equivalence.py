"""TRL's OnlineDPOTrainer as the oracle for `prefdata online`'s training, step for step.

Both sides get the same policy, reference and generated pairs (TRL's generation is replaced by the
very ids prefdata trained on, its reward by one that marks the first half chosen), and must then do
the same arithmetic: per-pair log-probs (policy and reference), loss, clipped gradients and updated
weights after one step (from a policy that is not the reference, so the loss is not ln 2), and after a
whole two-round run (optimizer and learning-rate schedule continued across rounds, with warmup and
cosine decay), against TRL's one trainer over the same steps.

The prompts have equal token length: TRL's training forward passes no position ids, so a left-padded
prompt would get positions shifted by its padding (generation counts them from the first real token,
as prefdata does everywhere); with no padding both sides see the same positions.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

N, PROMPT_LEN, MAX_NEW = 8, 10, 12
# Prompts whose chat-templated ids all have the same length with the case's tokenizer (35 tokens).
EQUAL_LENGTH_NUMBERS = [10, 11, 12, 13, 14, 16, 17, 18]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict[str, Path]:
    """The learning case's tiny Llama policy, a copy of it moved away (the policy being trained), and
    prompts of equal token length."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefdata.tiny.learning_case import build_learning_case

    work = tmp_path_factory.mktemp("trl-oracle")
    paths = build_learning_case(work / "case", prompts=N)
    model = AutoModelForCausalLM.from_pretrained(str(paths["policy"]), dtype=torch.float32)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.01)
    model.save_pretrained(str(work / "moved"))
    AutoTokenizer.from_pretrained(str(paths["policy"])).save_pretrained(str(work / "moved"))
    prompts = [[{"role": "user", "content": f"Question {i}: tell me about the sea."}] for i in EQUAL_LENGTH_NUMBERS]
    (work / "equal.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return {**paths, "moved": work / "moved", "equal_prompts": work / "equal.jsonl", "work": work}


def _trl_trainer(policy: Path, reference: Path, out: Path, batches: list[dict[str, torch.Tensor]], **config):
    """A TRL OnlineDPOTrainer whose k-th generation returns `batches[k]` (chosen rows first, then the
    rejected rows) and whose reward marks the first half chosen."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(reference), dtype=torch.float32)
    args = OnlineDPOConfig(output_dir=str(out), beta=[0.1], max_new_tokens=MAX_NEW, logging_steps=1,
                           save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, bf16=False,
                           gradient_checkpointing=False, seed=0, **config)
    size = config["per_device_train_batch_size"]

    def first_half_chosen(prompts, completions, **kwargs):
        return [1.0] * size + [0.0] * size

    trainer = OnlineDPOTrainer(model=model, ref_model=ref, reward_funcs=first_half_chosen, args=args,
                               train_dataset=datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * N}),
                               processing_class=AutoTokenizer.from_pretrained(str(policy)))
    trainer.remove_callback(PrinterCallback)
    queue = list(batches)

    def replay(model, prompts, images=None):
        b = queue.pop(0)
        return b["prompt_ids"], torch.ones_like(b["prompt_ids"]), b["completion_ids"], b["completion_mask"], None

    trainer._generate = replay
    return trainer


def _trl_batch(rows: list[dict], pad: int) -> dict[str, torch.Tensor]:
    """TRL's tensors for pairs: chosen completions then rejected ones, right-padded, mask on real tokens."""
    completions = [r["chosen_ids"] for r in rows] + [r["rejected_ids"] for r in rows]
    width = max(len(c) for c in completions)
    return {
        "prompt_ids": torch.tensor([r["prompt_ids"] for r in rows] * 2),
        "completion_ids": torch.tensor([c + [pad] * (width - len(c)) for c in completions]),
        "completion_mask": torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions]),
    }


def _sampled_pairs(policy: Path, out: Path) -> Path:
    """N pairs as `prefdata online` writes them: 2 samples per prompt from the policy (some cut off
    at the token limit, some ending with EOS at different places), rewards without ties, best vs worst."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefdata.online.decode import sample
    from prefdata.online.pairs import make_pairs

    tok = AutoTokenizer.from_pretrained(str(policy))
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(100, 5000, (N, PROMPT_LEN), generator=generator)
    completions = sample(model, prompt_ids.repeat(2, 1), torch.ones(2 * N, PROMPT_LEN, dtype=torch.long),
                         max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, stop_ids=[tok.eos_token_id],
                         pad_id=tok.pad_token_id, generator=generator).tolist()
    for row, cut in [(0, 3), (3, 7), (N + 1, 5), (N + 5, 11), (2, 0)]:  # finished samples, one of them empty
        completions[row] = completions[row][:cut] + [tok.eos_token_id]
    rng = random.Random(0)
    samples = []
    for k in range(2):
        for p in range(N):
            ids = completions[k * N + p]
            ids = ids[: ids.index(tok.eos_token_id) + 1] if tok.eos_token_id in ids else ids
            samples.append({"prompt": tok.decode(prompt_ids[p]), "source_file": "x", "source_line": p + 1, "sample": k,
                            "completion": tok.decode(ids, skip_special_tokens=True) or "-",
                            "finished": tok.eos_token_id in ids, "prompt_ids": prompt_ids[p].tolist(),
                            "completion_ids": ids, "reward": rng.random()})
    pairs, _ = make_pairs(samples)
    path = out / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return path


def test_one_step_equals_trl_online_dpo_step(case, tmp_path, monkeypatch):
    import datasets
    from transformers import AutoModelForCausalLM, TrainerCallback

    import prefdata.train.loop as loop
    from prefdata.model.pairs import pair_logps
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs
    from prefdata.train import train

    lr = 1e-2
    pairs_file = _sampled_pairs(case["policy"], tmp_path)
    prepared = prepare(pairs_file, tmp_path / "out", tokenizer=str(case["policy"]), workers=1, progress=False)
    assert prepared.rows_out == N  # every pair trains (TRL drops none)
    compute_refs(tmp_path / "out", model=str(case["policy"]), device="cpu", progress=False)
    rows = list(datasets.load_from_disk(str(tmp_path / "out")))
    assert sum(len(r["chosen_ids"]) < MAX_NEW or len(r["rejected_ids"]) < MAX_NEW for r in rows) >= 3

    ours_grads: list[torch.Tensor] = []
    real_clip = loop.clip_gradients

    def record(params, max_grad_norm):
        norm = real_clip(params, max_grad_norm)
        ours_grads.extend(p.grad.detach().clone() for p in params)
        return norm

    monkeypatch.setattr(loop, "clip_gradients", record)
    result = train(tmp_path / "out", model=case["moved"], output=tmp_path / "ours", lr=lr, batch_pairs=N, epochs=1,
                   warmup_ratio=0.0, lr_schedule="constant", max_grad_norm=1.0, device="cpu", progress=False,
                   save_every=None)
    ours_metrics = json.loads(result.metrics_path.read_text().splitlines()[0])

    pad = AutoModelForCausalLM.from_pretrained(str(case["policy"])).config.pad_token_id
    batch = _trl_batch(rows, pad)
    trainer = _trl_trainer(case["moved"], case["policy"], tmp_path / "trl", [batch], per_device_train_batch_size=N,
                           max_steps=1, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                           max_grad_norm=1.0)
    # TRL's own per-pair log-probs (its _forward, masked sums) before the step.
    moved = AutoModelForCausalLM.from_pretrained(str(case["moved"]), dtype=torch.float32)
    with torch.no_grad():
        trl_logps = {}
        for name, model in (("policy", moved), ("ref", trainer.ref_model)):
            per_token = trainer._forward(model, batch["prompt_ids"], torch.ones_like(batch["prompt_ids"]),
                                         batch["completion_ids"], batch["completion_mask"])
            trl_logps[name] = (per_token * batch["completion_mask"]).sum(1)
        ours_policy = pair_logps(moved, [r["prompt_ids"] for r in rows], [r["chosen_ids"] for r in rows],
                                 [r["rejected_ids"] for r in rows], "right", pad)
    ours_ref = torch.tensor([r["ref_chosen_logps"] for r in rows] + [r["ref_rejected_logps"] for r in rows])
    torch.testing.assert_close(torch.cat([ours_policy.chosen, ours_policy.rejected]), trl_logps["policy"],
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours_ref, trl_logps["ref"], rtol=1e-5, atol=1e-4)

    trl_grads: list[torch.Tensor] = []

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            trl_grads.extend(p.grad.detach().clone() for p in trainer.model.parameters())

    trainer.add_callback(Grads())
    trainer.train()
    trl_log = next(line for line in trainer.state.log_history if "loss" in line)
    assert abs(ours_metrics["loss"] - 0.6931) > 1e-3  # the policy is not the reference: a real loss
    assert ours_metrics["loss"] == pytest.approx(trl_log["loss"], abs=6e-5)  # TRL logs it to 4 places
    assert ours_metrics["rewards/margins"] == pytest.approx(trl_log["rewards/margins"], abs=1e-5)
    assert ours_metrics["grad_norm"] == pytest.approx(trl_log["grad_norm"], rel=1e-4)
    assert len(ours_grads) == len(trl_grads)
    for ours, theirs in zip(ours_grads, trl_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-6)
    _assert_same_weights(tmp_path / "ours", trainer.model, lr)


def _assert_same_weights(ours_dir: Path, trl_model, lr: float, steps: int = 1) -> None:
    """Equal within float noise. Adam's step is about lr x sign(g) where g is tiny, so a parameter
    whose gradient is float noise may move by up to lr either way: those stay under a small share."""
    from transformers import AutoModelForCausalLM

    ours = AutoModelForCausalLM.from_pretrained(str(ours_dir), dtype=torch.float32).state_dict()
    theirs = trl_model.state_dict()
    for name, value in ours.items():
        diff = (value - theirs[name]).abs()
        assert diff.max() <= 2 * lr * steps, name
        assert (diff > 1e-3 * lr).float().mean() < 0.01, name


def test_a_two_round_run_equals_trl_over_the_same_steps(case, tmp_path):
    """Rounds continue one optimizer and one schedule (warmup, cosine decay over the whole run,
    clipping): `prefdata online`'s final policy is TRL's after the same steps on the same pairs."""
    import datasets
    from transformers import AutoModelForCausalLM

    from prefdata.online.rounds import run_online
    from prefdata.train.data import epoch_batches, load_pairs

    lr, rounds, per_step = 2e-2, 2, N // 2
    out = tmp_path / "run"
    result = run_online(case["equal_prompts"], model=case["policy"], output=out, reward_fn=str(case["reward_fn"]),
                        rounds=rounds, prompts_per_round=N, samples=2, max_new_tokens=MAX_NEW, batch_pairs=per_step,
                        lr=lr, lr_schedule="cosine", warmup_ratio=0.25, seed=0, device="cpu", progress=False)
    assert all(line["pairs_kept"] == N for line in result.rounds)
    pad = AutoModelForCausalLM.from_pretrained(str(case["policy"])).config.pad_token_id
    batches = []
    for r in range(1, rounds + 1):
        rows = list(datasets.load_from_disk(str(out / f"round-{r}" / "pairs")))
        data = load_pairs(out / f"round-{r}" / "pairs", need_refs=True)
        # The round's batches in the order prefdata trained them (its seed for round r is seed + r).
        for batch in epoch_batches(data, 0, r, per_step, None, 1):
            batches.append(_trl_batch([rows[i] for i in batch], pad))
    assert len({b["prompt_ids"].shape[1] for b in batches}) == 1  # equal prompt lengths: no padding
    trainer = _trl_trainer(case["policy"], case["policy"], tmp_path / "trl", batches,
                           per_device_train_batch_size=per_step, max_steps=len(batches), learning_rate=lr,
                           lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=1.0)
    trainer.train()
    trl_lrs = [line["learning_rate"] for line in trainer.state.log_history if "learning_rate" in line]
    ours_lrs = [json.loads(line)["lr"] for r in range(1, rounds + 1)
                for line in (out / f"round-{r}" / "policy" / "metrics.jsonl").read_text().splitlines()
                if '"lr"' in line]
    assert ours_lrs == pytest.approx(trl_lrs, abs=1e-9)
    _assert_same_weights(out / "policy", trainer.model, lr, steps=len(batches))
