"""prefdata.sets.scored: each scored-completions shape detected per row, its scores read, its pairs made."""

from __future__ import annotations

import pytest

from prefdata.core.errors import RecordError, UnknownShapeError
from prefdata.core.records import RawRecord
from prefdata.sets.pairing import PairingSettings
from prefdata.sets.scored import is_scored, record_pairs


def made(row, **kw):
    return record_pairs(RawRecord("f.jsonl", 7, value=row), PairingSettings(**kw))


def _uf_completion(model, text, ratings, fine=None, overall=None):
    annotations = {aspect: {"Rating": value, "Rationale": "..."} for aspect, value in ratings.items()}
    return {"model": model, "response": text, "annotations": annotations, "principle": "helpfulness",
            "fine-grained_score": fine, "overall_score": overall, "custom_system_prompt": "", "critique": "ok"}


ULTRAFEEDBACK = {
    "source": "evol_instruct",
    "instruction": "Name a primary colour.",
    "models": ["m0", "m1", "m2", "m3"],
    "correct_answers": ["red"],
    "completions": [
        _uf_completion("m0", "Red.", {"helpfulness": "5", "honesty": "4", "instruction_following": "5", "truthfulness": "5"}, 4.75, 6.0),
        _uf_completion("m1", "Green.", {"helpfulness": "2", "honesty": "N/A", "instruction_following": "3", "truthfulness": "1"}, 2.0, 9.0),
        _uf_completion("m2", "Blue.", {"helpfulness": "4", "honesty": "4", "instruction_following": "4", "truthfulness": "4"}, 4.0, 7.0),
        _uf_completion("m3", "Purple.", {"helpfulness": "1", "honesty": "2", "instruction_following": "1", "truthfulness": "1"}, 1.25, 2.0),
    ],
}


def test_ultrafeedback_raw_mean_of_the_aspect_ratings() -> None:
    result = made(ULTRAFEEDBACK)
    (pair,) = result.pairs
    assert (pair.prompt, pair.chosen, pair.rejected) == ("Name a primary colour.", "Red.", "Purple.")
    assert pair.shape == "scored" and not pair.is_conversational
    extra = pair.extra
    assert extra["reward_chosen"] == 4.75 and extra["reward_rejected"] == 1.25  # mean of the four ratings
    assert (extra["chosen_sample"], extra["rejected_sample"]) == (0, 3)
    assert (extra["chosen_model"], extra["rejected_model"]) == ("m0", "m3")
    assert extra["source"] == "evol_instruct" and extra["models"] == ["m0", "m1", "m2", "m3"]  # pass through
    assert "completions" not in extra and "instruction" not in extra
    assert len(extra["group_id"]) == 16
    summary = result.scored
    assert (summary.completions, summary.scored, summary.pairs, summary.ties, summary.scale) == (4, 4, 1, 0, "score")
    assert summary.margins == [3.5] and summary.used == 2


def test_ultrafeedback_named_aspect_and_summary_scores() -> None:
    (pair,) = made(ULTRAFEEDBACK, rating="honesty").pairs  # "N/A": completion 1 takes no part
    assert pair.extra["reward_chosen"] == 4.0 and pair.extra["rejected_sample"] == 3
    (pair,) = made(ULTRAFEEDBACK, rating="overall_score").pairs  # a completion field, not an annotation
    assert (pair.extra["chosen_sample"], pair.extra["rejected_sample"]) == (1, 3)
    with pytest.raises(RecordError, match="no completion has a rating named 'helpfullness'"):
        made(ULTRAFEEDBACK, rating="helpfullness")
    # Without annotations, UltraFeedback's fine-grained score is the mean.
    bare = {**ULTRAFEEDBACK, "completions": [{k: v for k, v in c.items() if k != "annotations"} for c in ULTRAFEEDBACK["completions"]]}
    assert made(bare).pairs[0].extra["reward_chosen"] == 4.75


def test_generic_completions_with_scores_and_all_pairs() -> None:
    row = {"prompt": "2+2?", "completions": ["4", "5", "four"], "scores": [1.0, 0.0, 1.0], "id": 3}
    result = made(row, strategy="all-pairs")
    assert [(p.chosen, p.rejected) for p in result.pairs] == [("4", "5"), ("four", "5")]
    assert result.scored.ties == 1 and result.scored.pairs == 2
    assert all(p.extra["id"] == 3 and p.extra["group_id"] == result.scored.group_id for p in result.pairs)
    assert "scores" not in result.pairs[0].extra


def test_ranks_lower_is_better_and_keep_rank_columns() -> None:
    row = {"prompt": "p", "completions": ["worst", "best", "middle"], "ranks": [3, 1, 2]}
    (pair,) = made(row).pairs
    assert (pair.chosen, pair.rejected) == ("best", "worst")
    assert pair.extra["rank_chosen"] == 1 and pair.extra["rank_rejected"] == 3 and "reward_chosen" not in pair.extra
    assert made(row, min_margin=2).scored.pairs == 1 and made(row, min_margin=3).scored.reason == "below_margin"


def test_nemo_rl_context_and_ranked_completion_messages() -> None:
    row = {"context": [{"role": "user", "content": "Pick one"}],
           "completions": [{"rank": 1, "completion": [{"role": "assistant", "content": "second"}]},
                           {"rank": 0, "completion": [{"role": "assistant", "content": "first"}]}]}
    (pair,) = made(row).pairs
    assert pair.is_conversational and pair.prompt_messages == [{"role": "user", "content": "Pick one"}]
    assert pair.chosen_messages == [{"role": "assistant", "content": "first"}]
    assert pair.extra["rank_chosen"] == 0 and pair.extra["rank_rejected"] == 1


def test_distilabel_generations_and_ratings_with_nulls() -> None:
    row = {"instruction": "Say hi", "generations": ["hi", None, "hello", "yo"], "ratings": [3, 5, None, 1],
           "model_names": ["a", "b", "c", "d"]}
    result = made(row)
    (pair,) = result.pairs  # the failed generation and the unrated one take no part
    assert (pair.chosen, pair.rejected) == ("hi", "yo") and pair.extra["model_names"] == ["a", "b", "c", "d"]
    assert result.scored.scored == 2 and result.scored.completions == 4


def test_message_prompt_and_string_completions_render_as_a_conversation() -> None:
    row = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
           "completions": [{"text": "Hello", "score": 2}, {"text": "Go away", "score": -1}]}
    (pair,) = made(row).pairs
    assert pair.chosen_messages == [{"role": "assistant", "content": "Hello"}] and len(pair.prompt_messages) == 2


def test_named_ratings_in_a_scores_list() -> None:
    row = {"prompt": "p", "completions": ["a", "b"], "scores": [{"helpful": 1, "safe": 5}, {"helpful": 4, "safe": 1}]}
    assert made(row).pairs[0].chosen == "a"  # means 3.0 vs 2.5
    assert made(row, rating="helpful").pairs[0].chosen == "b"


def test_unpaired_records_say_why_and_keep_what_they_held() -> None:
    tie = made({"prompt": "p", "completions": ["a", "b"], "scores": [1, 1]})
    assert tie.pairs == [] and tie.scored.reason == "ties" and tie.scored.completion_texts == ["a", "b"]
    assert tie.scored.scores == [1.0, 1.0] and tie.scored.prompt == "p"
    assert made({"prompt": "p", "completions": ["a"], "scores": [1]}).scored.reason == "single_completion"
    assert made({"prompt": "p", "completions": ["a", "b"], "scores": [1, 0.5]}, min_margin=1).scored.reason == "below_margin"


def test_group_id_is_the_content_not_the_place() -> None:
    row = {"prompt": "p", "completions": ["a", "b"], "scores": [1, 0]}
    first = record_pairs(RawRecord("x.jsonl", 1, value=row), PairingSettings()).pairs[0]
    moved = record_pairs(RawRecord("y.jsonl", 99, value=dict(row)), PairingSettings()).pairs[0]
    assert first.extra["group_id"] == moved.extra["group_id"]
    other = record_pairs(RawRecord("x.jsonl", 1, value={**row, "scores": [1, -1]}), PairingSettings()).pairs[0]
    assert other.extra["group_id"] != first.extra["group_id"]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "p", "completions": ["a", "b"], "scores": [1]}, "'scores' must give one value per completion"),
        ({"prompt": "p", "completions": ["a", "b"]}, "'completions\\[0\\]' has no score"),
        ({"completions": ["a", "b"], "scores": [1, 0]}, "without a prompt"),
        ({"prompt": "p", "completions": [], "scores": []}, "'completions' is an empty list"),
        ({"prompt": "p", "completions": ["a", "b"], "scores": ["high", 0]}, "'scores\\[0\\]' is not a number"),
        ({"prompt": "p", "completions": [{"score": 1}, {"text": "b", "score": 0}]}, "has no text"),
        ({"prompt": 3, "completions": ["a", "b"], "scores": [1, 0]}, "field 'prompt' must be"),
    ],
)
def test_malformed_scored_rows_are_one_line_errors(row, message) -> None:
    with pytest.raises(RecordError, match=message):
        made(row)


def test_detection_is_per_row_and_leaves_other_shapes_alone() -> None:
    assert is_scored({"prompt": "p", "completions": ["a"], "scores": [1]})
    assert not is_scored({"prompt": "p", "chosen": "a", "rejected": "b", "completions": ["x"]})  # a pair wins
    assert not is_scored({"prompt": "p", "completion": "a", "label": True})  # KTO
    assert made({"prompt": "p", "chosen": "a", "rejected": "b"}).scored is None
    with pytest.raises(UnknownShapeError):
        made({"prompt": "p", "completion": "a", "label": True})
