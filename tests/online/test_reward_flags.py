"""The scoring columns' flags (`checks.reward`), on their own and through a prepared OUT/."""

from __future__ import annotations

import json
import math

import pytest

from prefdata.checks.pair import text_flags
from prefdata.checks.policy import load_policy
from prefdata.checks.reward import column_flags
from prefdata.core import flags as F
from prefdata.core.records import Pair

POLICY = load_policy()


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({"reward_chosen": 1.0, "reward_rejected": 1.0, "chosen_sample": 0}, [F.TIED_REWARD]),
        ({"reward_chosen": 1.0, "reward_rejected": 1.0}, []),  # offline data: a tie is no generated-pair tie
        ({"reward_chosen": 2, "reward_rejected": 1, "chosen_sample": 3}, []),
        ({"reward_chosen": 0.0, "reward_rejected": 1.5}, [F.REWARD_DISAGREES]),
        ({"reward_chosen": 0.0, "reward_rejected": 1.0}, []),  # exactly the margin: not more than it
        ({"reward_chosen": None, "reward_rejected": 3.0}, []),
        ({"reward_chosen": math.nan, "reward_rejected": 3.0, "chosen_sample": 0}, []),
        ({"reward_chosen": True, "reward_rejected": 3.0}, []),  # a boolean is no reward
        ({"reward_chosen": "1", "reward_rejected": "1", "chosen_sample": 0}, []),
        ({"chosen_finished": True, "rejected_finished": False}, [F.COMPLETION_TRUNCATED]),
        ({"chosen_finished": None, "rejected_finished": 0}, []),  # only an explicit false
    ],
)
def test_column_flags(extra, expected):
    assert column_flags(extra, POLICY) == expected


def test_text_flags_merge_in_flag_order():
    pair = Pair("f", 1, "p", "same", "same", extra={"reward_chosen": 1, "reward_rejected": 1, "chosen_sample": 0,
                                                   "rejected_finished": False})
    assert text_flags(pair, POLICY) == [F.IDENTICAL, F.COMPLETION_TRUNCATED, F.TIED_REWARD]


def test_validate_of_a_prepared_out_keeps_reward_disagrees(tmp_path, tiny_model_dir):
    from prefdata.prepare import prepare
    from prefdata.validate.command import validate

    raw = tmp_path / "scored.jsonl"
    raw.write_text(
        json.dumps({"prompt": "Q", "chosen": "good answer", "rejected": "bad", "reward_chosen": -2.0,
                    "reward_rejected": 1.0}) + "\n"
        + json.dumps({"prompt": "R", "chosen": "fine", "rejected": "worse", "reward_chosen": 1.0,
                      "reward_rejected": 0.0}) + "\n"
    )
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_model_dir, workers=1, progress=False)
    assert result.rows_out == 2 and result.flag_counts == {F.REWARD_DISAGREES: 1}
    report = validate(str(tmp_path / "out"), progress=False, format="json", output=str(tmp_path / "r.json")).report
    assert report["flags"][F.REWARD_DISAGREES]["count"] == 1
