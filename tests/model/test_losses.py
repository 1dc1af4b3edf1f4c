"""Each loss against its formula, computed by hand with `math` on made-up log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from prefdata.model.losses import LOSS_TYPES, dpo_loss

# Two pairs: a favourable one (positive margin) and an unfavourable one.
PC = [-10.0, -20.0]  # policy chosen
PR = [-14.0, -18.0]  # policy rejected
RC = [-11.0, -19.0]  # reference chosen
RR = [-12.0, -19.5]  # reference rejected
NC = [4, 10]  # chosen completion token counts
NR = [8, 5]


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def _run(loss_type: str, beta: float, eps: float = 0.0, gamma: float = 0.5):
    return dpo_loss(
        _t(PC), _t(PR), _t(RC), _t(RR),
        loss_type=loss_type, beta=beta, label_smoothing=eps,
        chosen_counts=_t(NC, torch.long), rejected_counts=_t(NR, torch.long), simpo_gamma=gamma,
    )


def _delta(i: int) -> float:
    return (PC[i] - RC[i]) - (PR[i] - RR[i])


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_sigmoid_and_cdpo(eps):
    beta = 0.1
    out = _run("sigmoid", beta, eps)
    for i in range(2):
        d = _delta(i)
        expected = -(1 - eps) * _logsig(beta * d) - eps * _logsig(-beta * d)
        assert out.losses[i].item() == pytest.approx(expected, rel=1e-6)
        assert out.chosen_rewards[i].item() == pytest.approx(beta * (PC[i] - RC[i]), rel=1e-6)
        assert out.rejected_rewards[i].item() == pytest.approx(beta * (PR[i] - RR[i]), rel=1e-6)


def test_ipo_is_length_normalized_like_trl():
    beta = 0.1
    out = _run("ipo", beta)
    for i in range(2):
        avg = (PC[i] - RC[i]) / NC[i] - (PR[i] - RR[i]) / NR[i]
        assert out.losses[i].item() == pytest.approx((avg - 1 / (2 * beta)) ** 2, rel=1e-6)


def test_hinge():
    beta = 0.5
    out = _run("hinge", beta)
    for i in range(2):
        assert out.losses[i].item() == pytest.approx(max(0.0, 1 - beta * _delta(i)), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_robust(eps):
    beta = 0.1
    out = _run("robust", beta, eps)
    for i in range(2):
        d = _delta(i)
        expected = (-(1 - eps) * _logsig(beta * d) + eps * _logsig(-beta * d)) / (1 - 2 * eps)
        assert out.losses[i].item() == pytest.approx(expected, rel=1e-6)


def test_simpo_is_reference_free_and_length_normalized():
    beta, gamma = 2.0, 0.8
    out = dpo_loss(
        _t(PC), _t(PR), None, None, loss_type="simpo", beta=beta, simpo_gamma=gamma,
        chosen_counts=_t(NC, torch.long), rejected_counts=_t(NR, torch.long),
    )
    for i in range(2):
        margin = PC[i] / NC[i] - PR[i] / NR[i] - gamma / beta
        assert out.losses[i].item() == pytest.approx(-_logsig(beta * margin), rel=1e-6)
        assert out.chosen_rewards[i].item() == pytest.approx(beta * PC[i] / NC[i], rel=1e-6)
        assert out.rejected_rewards[i].item() == pytest.approx(beta * PR[i] / NR[i], rel=1e-6)


def test_policy_equal_to_reference_gives_ln2():
    logps = _t([-5.0, -7.0, -3.0])
    out = dpo_loss(logps, logps + 1, logps, logps + 1, loss_type="sigmoid", beta=0.1)
    assert torch.allclose(out.losses, torch.full((3,), math.log(2)))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradients_flow_to_policy_only(loss_type):
    pc = _t(PC).requires_grad_()
    pr = _t(PR).requires_grad_()
    out = dpo_loss(
        pc, pr, _t(RC), _t(RR), loss_type=loss_type, beta=0.1,
        chosen_counts=_t(NC, torch.long), rejected_counts=_t(NR, torch.long),
    )
    out.losses.mean().backward()
    assert pc.grad is not None and torch.isfinite(pc.grad).all()
    assert not out.chosen_rewards.requires_grad


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown loss"):
        dpo_loss(_t(PC), _t(PR), _t(RC), _t(RR), loss_type="kto", beta=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(_t(PC), _t(PR), _t(RC), _t(RR), loss_type="sigmoid", beta=0.1, label_smoothing=0.5)
    with pytest.raises(ValueError, match="reference"):
        dpo_loss(_t(PC), _t(PR), None, None, loss_type="sigmoid", beta=0.1)
    with pytest.raises(ValueError, match="counts"):
        dpo_loss(_t(PC), _t(PR), _t(RC), _t(RR), loss_type="ipo", beta=0.1)
