"""Per-pair weights and ODPO offsets reach the loss: `dpo_loss(offsets=)` against the formulas, and a
whole optimizer step of `prefdata train` (two micro-batches, every pair layout) against an independent
loss written here in plain torch, pair by pair: Σ w_i·loss_i / Σ w_i, loss_i = -logσ(βΔ_i - δ_i)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
import torch.nn.functional as F

from prefdata.core.errors import PrefdataError
from prefdata.model.losses import dpo_loss
from prefdata.model.pairs import PAIR_LAYOUTS
from prefdata.train.data import load_pairs
from prefdata.train.loop import _accumulate
from prefdata.train.recipe import train
from prefdata.train.step import PairForward, weighted_loss_sum

from tests.train.test_train import CHOSEN, PROMPTS, REJECTED, make_out

BETA = 0.3
WEIGHTS = [0.5, 2.0, 0.0, 1.0, 3.0, 1.5]
OFFSETS = [0.0, 1.0, -0.5, 2.0, 0.25, 0.0]


def _tensors(n: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(n, generator=g) * 20) for _ in range(4)]


@pytest.mark.parametrize("loss", ["sigmoid", "robust", "hinge"])
def test_offsets_shift_the_logit_of_the_loss(loss):
    pc, pr, rc, rr = _tensors()
    offsets = torch.tensor([0.0, 1.0, -2.0, 0.5, 3.0])
    eps = 0.1 if loss == "robust" else 0.0
    got = dpo_loss(pc, pr, rc, rr, loss_type=loss, beta=BETA, label_smoothing=eps, offsets=offsets).losses
    z = BETA * ((pc - rc) - (pr - rr)) - offsets
    want = {"sigmoid": -F.logsigmoid(z),
            "robust": (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps),
            "hinge": torch.relu(1 - z)}[loss]
    torch.testing.assert_close(got, want)
    plain = dpo_loss(pc, pr, rc, rr, loss_type=loss, beta=BETA, label_smoothing=eps).losses
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, loss_type=loss, beta=BETA, label_smoothing=eps,
                                        offsets=torch.zeros(5)).losses, plain)
    # a positive offset asks for a wider margin: the loss grows (never shrinks) with it
    assert bool((got[offsets > 0] >= plain[offsets > 0]).all()) and bool((got[offsets > 0] > plain[offsets > 0]).any())


def test_simpo_offsets_add_to_its_target_margin():
    pc, pr, _, _ = _tensors()
    counts_c, counts_r = torch.tensor([3, 5, 1, 7, 2]), torch.tensor([4, 1, 6, 2, 2])
    offsets = torch.tensor([0.5, 0.0, 1.0, -1.0, 2.0])
    got = dpo_loss(pc, pr, None, None, loss_type="simpo", beta=2.0, simpo_gamma=0.5, chosen_counts=counts_c,
                   rejected_counts=counts_r, offsets=offsets).losses
    want = -F.logsigmoid(2.0 * (pc / counts_c - pr / counts_r) - 0.5 - offsets)
    torch.testing.assert_close(got, want)


def test_ipo_refuses_offsets():
    pc, pr, rc, rr = _tensors()
    with pytest.raises(ValueError, match="ipo"):
        dpo_loss(pc, pr, rc, rr, loss_type="ipo", beta=BETA, chosen_counts=torch.ones(5), rejected_counts=torch.ones(5),
                 offsets=torch.zeros(5))


def test_weighted_loss_sum_is_the_weighted_mean_over_the_step():
    losses = torch.tensor([1.0, 2.0, 4.0])
    assert float(weighted_loss_sum(losses, [1, 1, 1], 3.0)) == pytest.approx(7 / 3)  # weights 1: the plain mean
    assert float(weighted_loss_sum(losses, [2, 0, 6], 8.0)) == pytest.approx((2 + 24) / 8)
    # scaling every weight changes nothing
    assert float(weighted_loss_sum(losses, [20, 0, 60], 80.0)) == pytest.approx((2 + 24) / 8)
    assert float(weighted_loss_sum(losses, [0, 0, 0], 0.0)) == 0.0  # a step of zero weights adds nothing
    # each w / Σ w is taken in float64: scales float32 cannot hold still give the weighted mean and a gradient
    for scale in (3e38, 1e-45):
        leaf = losses.clone().requires_grad_(True)
        total = weighted_loss_sum(leaf, [2 * scale, 0, 6 * scale], 8 * scale)
        total.backward()
        assert float(total.detach()) == pytest.approx((2 + 24) / 8)
        assert leaf.grad.tolist() == pytest.approx([0.25, 0.0, 0.75])


def _with_columns(out: Path, columns: dict[str, list[float]]) -> Path:
    """OUT with extra numeric columns (as `prefdata select --weight-by/--offset-by` writes them)."""
    ds = datasets.load_from_disk(str(out))
    for name, values in columns.items():
        ds = ds.add_column(name, values)
    target = out.parent / (out.name + "-" + "-".join(columns))
    ds.save_to_disk(str(target))
    (target / "manifest.json").write_text((out / "manifest.json").read_text())
    return target


@pytest.fixture(scope="module")
def weighted_out(tmp_path_factory, tiny_model_dir) -> Path:
    pairs = [(p, CHOSEN if i % 2 else REJECTED, REJECTED if i % 2 else CHOSEN + " Also: rest.")
             for i, p in enumerate(PROMPTS[: len(WEIGHTS)])]
    base = make_out(tmp_path_factory.mktemp("weighted") / "out", tiny_model_dir, pairs)
    return _with_columns(base, {"weight": WEIGHTS, "offset": OFFSETS})


def _independent_step_grads(model, data, rows, beta):
    """Plain forward per half, log-softmax, gather, sum over the completion; -logσ(βΔ - δ) per pair;
    Σ w·loss / Σ w over the step; autograd."""
    model.zero_grad(set_to_none=True)
    table = data.dataset[rows]
    total, weight_sum = 0.0, 0.0
    for i, row in enumerate(rows):
        halves = []
        for half in ("chosen", "rejected"):
            prompt, completion = table["prompt_ids"][i], table[f"{half}_ids"][i]
            ids = torch.tensor([prompt + completion])
            logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
            positions = range(max(len(prompt), 1), len(prompt) + len(completion))
            halves.append(sum(logp[t - 1, ids[0, t]] for t in positions))
        delta = (halves[0] - table["ref_chosen_logps"][i]) - (halves[1] - table["ref_rejected_logps"][i])
        loss = -F.logsigmoid(beta * delta - float(data.offsets[row]))
        total = total + float(data.weights[row]) * loss
        weight_sum += float(data.weights[row])
    (total / weight_sum).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", PAIR_LAYOUTS)
def test_a_training_step_equals_the_independent_weighted_offset_loss(weighted_out, tiny_model_dir, layout):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    data = load_pairs(weighted_out, need_refs=True)
    assert data.weights.tolist() == WEIGHTS and data.offsets.tolist() == OFFSETS
    data.use_layout(model, layout)
    fwd = PairForward(model=model, layout=layout, pad_token_id=0, device=torch.device("cpu"),
                      loss_kwargs={"loss_type": "sigmoid", "beta": BETA})
    loop = SimpleNamespace(schedule=SimpleNamespace(rank=0, world_size=1), fwd=fwd, data=data, params=[])
    step = [[0, 1, 2], [3, 4, 5]]  # one optimizer step of two micro-batches (gradient accumulation)
    model.zero_grad(set_to_none=True)
    _accumulate(loop, step)
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    want = _independent_step_grads(model, data, [r for micro in step for r in micro], BETA)
    assert ours.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(ours[name], want[name], rtol=2e-4, atol=2e-6, msg=name)


def test_weights_and_offsets_change_what_is_trained(weighted_out, tiny_model_dir):
    """The same step without the columns gives other gradients: the columns are not ignored."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    data = load_pairs(weighted_out, need_refs=True)
    data.use_layout(model, "right")
    fwd = PairForward(model=model, layout="right", pad_token_id=0, device=torch.device("cpu"),
                      loss_kwargs={"loss_type": "sigmoid", "beta": BETA})
    grads = []
    for weights, offsets in ((data.weights, data.offsets), (None, None)):
        data.weights, data.offsets = weights, offsets
        model.zero_grad(set_to_none=True)
        _accumulate(SimpleNamespace(schedule=SimpleNamespace(rank=0, world_size=1), fwd=fwd, data=data, params=[]),
                    [[0, 1, 2, 3, 4, 5]])
        grads.append(next(p.grad.clone() for p in model.parameters() if p.grad is not None))
    assert not torch.allclose(grads[0], grads[1])


def test_train_runs_on_weighted_data_and_refuses_ipo_offsets(weighted_out, tiny_model_dir, tmp_path):
    result = train(weighted_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=2, save_every=None,
                   lr=1e-3, batch_pairs=3, warmup_ratio=0.0, progress=False, device="cpu")
    assert result.steps == 2
    with pytest.raises(PrefdataError, match="ipo takes no per-pair offsets"):
        train(weighted_out, model=tiny_model_dir, output=tmp_path / "ipo", loss="ipo", max_steps=1, progress=False,
              device="cpu")


@pytest.mark.parametrize("column, value", [
    ("weight", -1.0), ("weight", float("nan")), ("offset", float("inf")),
    # finite, but beyond what float32 training holds: every parameter NaN, zero gradient, loss inf
    ("weight", 1e39), ("weight", 1e-45), ("weight", 3e38), ("weight", 2e9), ("weight", 1e-10), ("offset", 1e39), ("offset", -2e4),
])
def test_bad_weights_or_offsets_are_one_line_naming_the_row(weighted_out, tiny_model_dir, tmp_path, column, value):
    ds = datasets.load_from_disk(str(weighted_out))
    values = list(ds[column])
    values[3] = value
    bad = tmp_path / "bad"
    ds.remove_columns([column]).add_column(column, values).save_to_disk(str(bad))
    (bad / "manifest.json").write_text((weighted_out / "manifest.json").read_text())
    rule = r"weight is a number, 0 or in \[1e-09, 1e\+09\]" if column == "weight" else r"offset is a number in \[-10000, 10000\]"
    with pytest.raises(PrefdataError, match=rf"{rule}: 1 failing, first at synthetic.jsonl:{ds['source_line'][3]}$"):
        load_pairs(bad, need_refs=True)
    with pytest.raises(PrefdataError, match=rule):
        train(bad, model=tiny_model_dir, output=tmp_path / "run", max_steps=1, progress=False, device="cpu")
    assert not (tmp_path / "run").exists()


def test_the_bounds_themselves_train(weighted_out, tiny_model_dir, tmp_path):
    """0, 1e-9, 1e9 and offsets of ±1e4 are accepted and train to finite parameters."""
    ds = datasets.load_from_disk(str(weighted_out))
    ds = ds.remove_columns(["weight", "offset"]).add_column("weight", [0.0, 1e-9, 1e9, 1e9, 1e-9, 1.0])
    ds = ds.add_column("offset", [1e4, -1e4, 0.0, 1e4, -1e4, 0.5])
    edge = tmp_path / "edge"
    ds.save_to_disk(str(edge))
    (edge / "manifest.json").write_text((weighted_out / "manifest.json").read_text())
    result = train(edge, model=tiny_model_dir, output=tmp_path / "run", max_steps=2, save_every=None, lr=1e-3,
                   batch_pairs=3, warmup_ratio=0.0, progress=False, device="cpu")
    assert result.steps == 2 and math.isfinite(result.last_metrics["loss"])


def test_a_string_weight_is_named_at_its_own_row(weighted_out, tmp_path):
    """A weight column of text (a raw file's mixed values) fails on the first value that is no number."""
    ds = datasets.load_from_disk(str(weighted_out))
    values = [str(w) for w in ds["weight"]]
    values[3] = '"abc"'
    bad = tmp_path / "bad"
    ds.remove_columns(["weight"]).add_column("weight", values).save_to_disk(str(bad))
    (bad / "manifest.json").write_text((weighted_out / "manifest.json").read_text())
    with pytest.raises(PrefdataError, match=rf"1 failing, first at synthetic.jsonl:{ds['source_line'][3]}$"):
        load_pairs(bad, need_refs=True)


def test_prepare_quarantines_weights_and_offsets_float32_training_cannot_hold(tmp_path, tiny_model_dir):
    import json

    from prefdata.prepare import prepare

    bad = {3: ("weight", 1e39), 4: ("weight", 1e-45), 5: ("offset", 1e39), 6: ("weight", "abc"), 7: ("weight", None),
           8: ("offset", -20000.0), 9: ("weight", True)}
    rows = []
    for line in range(1, 11):
        row = {"prompt": f"Question {line}?", "chosen": "A good answer.", "rejected": "No.", "weight": 1.0, "offset": 0.0}
        if line in bad:
            row[bad[line][0]] = bad[line][1]
        rows.append(row)
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prepare(raw, tmp_path / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    quarantined = [json.loads(line) for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert {q["source_line"]: q["error"].split()[0] for q in quarantined} == {k: v[0] for k, v in bad.items()}
    assert all("\n" not in q["error"] for q in quarantined)
    assert "float32" in next(q["error"] for q in quarantined if q["source_line"] == 3)
    data = load_pairs(tmp_path / "out", need_refs=False)
    assert data.weights.tolist() == [1.0, 1.0, 1.0]


def test_weight_and_offset_given_in_the_raw_data_pass_through_prepare_to_train(tmp_path, tiny_model_dir):
    import json

    from prefdata.prepare import prepare

    rows = [{"prompt": f"Question {i}?", "chosen": "A good answer.", "rejected": "No.", "weight": [1, 0.5, 2][i % 3],
             "offset": [0.0, 1.0, -0.5][i % 3]} for i in range(6)]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prepare(raw, tmp_path / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    data = load_pairs(tmp_path / "out", need_refs=False)
    assert data.weights.tolist() == [r["weight"] for r in rows]
    assert data.offsets.tolist() == [r["offset"] for r in rows]
    assert data.weights_of([1, 2]) == [0.5, 2.0]


def test_a_stalled_run_with_offsets_is_recognised_at_its_own_zero_margin_loss(weighted_out, tiny_model_dir, tmp_path):
    """With offsets a pair's loss at zero margin is -logσ(-δ), not ln 2: a run that cannot move the
    policy (lr 0, policy = reference) sits at their mean over the step's pairs, and the stall detector
    says so; it compared with ln 2 before and stayed silent."""
    import math

    result = train(weighted_out, model=tiny_model_dir, output=tmp_path / "run", max_steps=2, stall_steps=2,
                   save_every=None, lr=0.0, batch_pairs=3, warmup_ratio=0.0, progress=False, device="cpu")
    (event,) = result.stall_events
    expected = sum(math.log1p(math.exp(d)) for d in OFFSETS) / len(OFFSETS)  # -logσ(-δ) = softplus(δ)
    assert abs(expected - math.log(2)) > 0.1
    assert event["zero_margin_loss"] == pytest.approx(expected, abs=1e-5)
    assert event["loss"] == pytest.approx(expected, abs=1e-3)


def test_prepare_quarantines_a_scored_record_whose_weight_float32_cannot_hold(tmp_path, tiny_model_dir):
    import json

    from prefdata.prepare import prepare

    rows = [{"prompt": f"Question {i}?", "completions": ["A good answer.", "No.", "Maybe so."], "scores": [3, 1, 2],
             "weight": [1.0, 1e39, 0.5][i]} for i in range(3)]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prepare(raw, tmp_path / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    (quarantined,) = [json.loads(line) for line in (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert quarantined["source_line"] == 2 and quarantined["error"].startswith("weight 1e+39 is outside")
    assert sorted(set(load_pairs(tmp_path / "out", need_refs=False).weights.tolist())) == [0.5, 1.0]


def test_the_bound_is_stated_whichever_model_was_validated_first():
    """pandera drops a check's own name in a subclass validated after its parent: the words stay."""
    import polars as pl

    from prefdata.core.schema import check_frame

    base = {"prompt_ids": [[1]] * 3, "chosen_ids": [[2]] * 3, "rejected_ids": [[3]] * 3, "source_file": ["r"] * 3,
            "source_line": [1, 2, 3]}
    refs = {"ref_chosen_logps": [-1.0] * 3, "ref_rejected_logps": [-1.0] * 3}
    check_frame(pl.DataFrame(base), "OUT", tokens_only=True)
    for columns in ({"weight": [1.0, -1.0, 1.0]}, {**refs, "weight": [1.0, -1.0, 1.0]}):
        with pytest.raises(PrefdataError, match=r"weight is a number, 0 or in \[1e-09, 1e\+09\]: 1 failing, first at r:2"):
            check_frame(pl.DataFrame({**base, **columns}), "OUT", tokens_only=True)
