"""Per-pair offsets and weights at the TRL hand-off: an `offset` column reaches TRL 1.16's loss exactly
(checked against -logσ(βΔ - δ) by a plain forward per pair), and what TRL cannot take (differing
weights, offsets under a loss that reads more than βΔ, offsets without stored refs) is one line."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import datasets  # noqa: E402
import torch  # noqa: E402

from prefdata.core.errors import PrefdataError  # noqa: E402
from tests.trl_handoff.test_trl import _config, _plain_logps, other_policy_dir, prepared, with_refs  # noqa: E402,F401

OFFSETS = [0.0, 1.5, -1.0, 3.0, 0.5, 2.0]


def _with(path, **columns) -> datasets.Dataset:
    dataset = datasets.load_from_disk(str(path))
    for name, values in columns.items():
        dataset = dataset.add_column(name, values[: dataset.num_rows])
    return dataset


def test_offsets_reach_trls_loss_exactly(with_refs, other_policy_dir, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from prefdata.trl import DPOTrainer

    dataset = _with(with_refs, offset=OFFSETS)
    rows = dataset.to_list()
    offsets = torch.tensor([row["offset"] for row in rows])
    policy_c, policy_r = _plain_logps(other_policy_dir, rows)
    ref_c = torch.tensor([row["ref_chosen_logps"] for row in rows])
    ref_r = torch.tensor([row["ref_rejected_logps"] for row in rows])
    beta = 1.0
    logits = beta * ((policy_c - ref_c) - (policy_r - ref_r))
    expected = -torch.nn.functional.logsigmoid(logits - offsets).mean().item()
    without = -torch.nn.functional.logsigmoid(logits).mean().item()
    assert abs(expected - without) > 0.1  # the offsets really change the loss: the check below can fail

    trainer = DPOTrainer(other_policy_dir, args=_config(tmp_path, beta=beta), train_dataset=dataset,
                         processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, abs=2e-3)
    # OUT on disk is untouched: the shift lives in the trainer's in-memory copy only
    assert datasets.load_from_disk(str(with_refs))["ref_chosen_logps"] == dataset["ref_chosen_logps"]


def test_differing_weights_are_refused_in_one_line(with_refs, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError, match=r"per-pair weights .* `prefdata train`"):
        DPOTrainer(tiny_model_dir, args=_config(tmp_path), train_dataset=_with(with_refs, weight=[1.0, 2.0] * 3))


def test_a_constant_weight_changes_nothing_and_is_accepted(with_refs, tiny_model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    trainer = DPOTrainer(tiny_model_dir, args=_config(tmp_path), train_dataset=_with(with_refs, weight=[2.0] * 6))
    assert trainer.ref_model is None


@pytest.mark.parametrize("overrides, why", [
    ({"loss_type": ["ipo"]}, "does not read the log-ratios"),
    ({"f_divergence_type": "js_divergence"}, "f_divergence_type"),
])
def test_offsets_trl_cannot_apply_are_refused(with_refs, tiny_model_dir, tmp_path, overrides, why):
    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError, match=why):
        DPOTrainer(tiny_model_dir, args=_config(tmp_path, **overrides), train_dataset=_with(with_refs, offset=OFFSETS))


def test_offsets_without_stored_refs_are_refused(prepared, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError, match="stored reference log-probs"):
        DPOTrainer(tiny_model_dir, ref_model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                   args=_config(tmp_path), train_dataset=_with(prepared, offset=OFFSETS))


def test_offsets_beside_a_non_finite_ref_row_shift_the_kept_rows_and_write_nothing(with_refs, tiny_model_dir, tmp_path):
    """A row with a non-finite ref is left out (as `prefdata train` does); the offsets of the rows kept
    shift their own refs (the columns were read unfiltered and misaligned), and nothing is cached into
    the directory the dataset was loaded from (a dataset with an indices mapping was flattened there)."""
    import math

    from transformers import AutoTokenizer

    from prefdata.trl import DPOTrainer

    dataset = _with(with_refs, offset=OFFSETS)
    refs = list(dataset["ref_chosen_logps"])
    refs[1] = math.nan
    saved = tmp_path / "saved"
    dataset.remove_columns("ref_chosen_logps").add_column(
        "ref_chosen_logps", refs, feature=datasets.Value("float32")).save_to_disk(str(saved))
    before = sorted(p.name for p in saved.iterdir())
    loaded = datasets.load_from_disk(str(saved))
    beta = 2.0
    trainer = DPOTrainer(tiny_model_dir, args=_config(tmp_path / "run", beta=beta), train_dataset=loaded,
                         processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    kept = [i for i in range(loaded.num_rows) if i != 1]
    assert trainer.train_dataset.num_rows == len(kept)
    assert trainer.train_dataset["ref_chosen_logps"] == pytest.approx(
        [refs[i] + OFFSETS[i] / beta for i in kept], rel=1e-6)
    assert sorted(p.name for p in saved.iterdir()) == before
