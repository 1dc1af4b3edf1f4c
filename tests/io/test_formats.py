"""Normalizing every input shape into a Pair; one-line RecordErrors for everything else."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.core import flags
from prefdata.core.errors import RecordError, UnknownShapeError
from prefdata.core.records import RawRecord
from prefdata.io.formats import normalize_record, split_hh
from prefdata.io.readers import iter_raw_records


def _pair(value):
    return normalize_record(RawRecord("f.jsonl", 7, value=value))


def _error(value) -> str:
    with pytest.raises(RecordError) as info:
        _pair(value)
    message = str(info.value)
    assert message and "\n" not in message
    return message


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


# --- shapes ------------------------------------------------------------------------------------


def test_explicit_strings_pass_extra_columns_through():
    pair = _pair({"prompt": "P", "chosen": "C", "rejected": "R", "id": 3, "meta": {"s": [1]}})
    assert (pair.prompt, pair.chosen, pair.rejected) == ("P", "C", "R")
    assert pair.shape == "explicit"
    assert pair.extra == {"id": 3, "meta": {"s": [1]}}
    assert not pair.is_conversational and pair.flags == []
    assert (pair.source_file, pair.source_line) == ("f.jsonl", 7)


def test_explicit_empty_strings_are_kept_for_the_checks():
    pair = _pair({"prompt": "", "chosen": "", "rejected": "R"})
    assert (pair.prompt, pair.chosen) == ("", "")


def test_conversational_trl():
    pair = _pair(
        {
            "prompt": [{"role": "system", "content": "S"}, user("Q")],
            "chosen": [assistant("A")],
            "rejected": [{"role": "assistant", "content": "B", "weight": 1}],
        }
    )
    assert pair.shape == "conversational"
    assert pair.prompt == "system: S\n\nuser: Q"
    assert (pair.chosen, pair.rejected) == ("A", "B")
    assert pair.prompt_messages == [{"role": "system", "content": "S"}, user("Q")]
    assert pair.rejected_messages == [assistant("B")]  # only role/content kept
    assert pair.is_conversational


def test_conversational_prompt_with_string_completions():
    pair = _pair({"prompt": [user("Q")], "chosen": "A", "rejected": "B"})
    assert pair.chosen_messages == [assistant("A")]
    assert pair.shape == "conversational"


def test_conversational_prompt_repeated_in_completions_is_kept_once():
    pair = _pair(
        {
            "prompt": [user("Q")],
            "chosen": [user("Q"), assistant("A")],
            "rejected": [user("Q"), assistant("B")],
        }
    )
    assert pair.prompt_messages == [user("Q")]
    assert (pair.chosen_messages, pair.rejected_messages) == ([assistant("A")], [assistant("B")])


def test_openai_content_parts_are_joined():
    pair = _pair(
        {
            "prompt": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "chosen": [assistant("A")],
            "rejected": [assistant("B")],
        }
    )
    assert pair.prompt_messages == [user("ab")]


def test_conversational_implicit_ultrafeedback_binarized():
    pair = _pair(
        {
            "prompt": "Q",
            "prompt_id": "x1",
            "chosen": [user("Q"), assistant("A")],
            "rejected": [user("Q"), assistant("B")],
            "score_chosen": 8.0,
        }
    )
    assert pair.shape == "conversational_implicit"
    assert pair.prompt_messages == [user("Q")]
    assert pair.chosen_messages == [assistant("A")]
    assert pair.rejected_messages == [assistant("B")]
    assert (pair.prompt, pair.chosen, pair.rejected) == ("user: Q", "A", "B")
    assert pair.extra == {"prompt_id": "x1", "score_chosen": 8.0}
    assert pair.flags == []


def test_conversational_implicit_multi_turn_shared_prefix():
    pair = _pair(
        {
            "chosen": [user("Q1"), assistant("A1"), user("Q2"), assistant("A2")],
            "rejected": [user("Q1"), assistant("A1"), user("Q2"), assistant("B2")],
        }
    )
    assert [m["content"] for m in pair.prompt_messages] == ["Q1", "A1", "Q2"]
    assert pair.flags == []


def test_conversational_implicit_diverging_at_a_user_turn_is_flagged_not_moved_back():
    pair = _pair(
        {
            "chosen": [user("Q1"), assistant("A1"), user("Q2"), assistant("A2")],
            "rejected": [user("Q1"), assistant("A1"), user("other"), assistant("B2")],
        }
    )
    # Split where they differ (a user turn): the halves answer different questions, not a model decision.
    assert pair.prompt_messages == [user("Q1"), assistant("A1")]
    assert pair.chosen == "user: Q2\n\nassistant: A2"
    assert pair.flags == [flags.DIVERGES_AT_NON_MODEL_TURN]


def test_conversational_implicit_identical_lists_split_at_last_assistant_turn():
    pair = _pair({"chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), assistant("A")]})
    assert pair.prompt_messages == [user("Q")]
    assert pair.chosen == pair.rejected == "A"


def test_completions_only_lists_use_the_prompt_string():
    pair = _pair({"prompt": "Q", "chosen": [assistant("A")], "rejected": [assistant("B")]})
    assert pair.prompt_messages == [user("Q")]
    assert pair.shape == "conversational"


def test_sharegpt_llamafactory_with_system_and_aliases():
    pair = _pair(
        {
            "conversations": [
                {"from": "human", "value": "Q1"},
                {"from": "gpt", "value": "A1"},
                {"from": "function_call", "value": '{"name": "f"}'},
                {"from": "observation", "value": "42"},
                {"from": "human", "value": "Q2"},
            ],
            "chosen": {"from": "gpt", "value": "good"},
            "rejected": {"from": "gpt", "value": "bad"},
            "system": "Be nice.",
            "tools": "[]",
        }
    )
    assert pair.shape == "sharegpt"
    assert [m["role"] for m in pair.prompt_messages] == [
        "system", "user", "assistant", "assistant", "tool", "user",
    ]  # fmt: skip
    assert pair.prompt_messages[0] == {"role": "system", "content": "Be nice."}
    assert (pair.chosen, pair.rejected) == ("good", "bad")
    assert pair.extra == {} and pair.tools is None  # "tools" is read (an empty list renders nothing)


def test_openai_azure_dpo():
    pair = _pair(
        {
            "input": {"messages": [{"role": "system", "content": "S"}, user("Q")], "tools": []},
            "preferred_output": [assistant("A")],
            "non_preferred_output": [assistant("B")],
            "id": "r1",
        }
    )
    assert pair.shape == "openai"
    assert pair.prompt == "system: S\n\nuser: Q"
    assert (pair.chosen, pair.rejected) == ("A", "B")
    assert pair.extra == {"id": "r1"}


def test_pretokenized():
    pair = _pair({"prompt_ids": [1, 2], "chosen_ids": [3, 4], "rejected_ids": [5], "k": 1})
    assert pair.shape == "pretokenized" and pair.is_pretokenized
    assert (pair.prompt_ids, pair.chosen_ids, pair.rejected_ids) == ([1, 2], [3, 4], [5])
    assert (pair.prompt, pair.chosen, pair.rejected) == ("", "", "")
    assert pair.extra == {"k": 1}


def test_pretokenized_keeps_text_columns_as_text():
    pair = _pair({"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3], "chosen": "c"})
    assert pair.chosen == "c"
    assert "chosen" not in pair.extra


def test_alpaca_llamafactory():
    pair = _pair({"instruction": "Do it", "input": "ctx", "chosen": "A", "rejected": "B"})
    assert pair.shape == "alpaca"
    assert pair.prompt == "Do it\nctx"


def test_shape_is_detected_per_row_not_from_the_first_row():
    rows = [
        {"prompt": "P", "chosen": "C", "rejected": "R"},
        {"chosen": "\n\nHuman: hi\n\nAssistant: a", "rejected": "\n\nHuman: hi\n\nAssistant: b"},
        {"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]},
        {"input": {"messages": [user("Q")]}, "preferred_output": [assistant("A")], "non_preferred_output": [assistant("B")]},
    ]
    assert [_pair(row).shape for row in rows] == ["explicit", "hh", "pretokenized", "openai"]


# --- HH-RLHF splitting ---------------------------------------------------------------------------


def test_hh_split_at_last_assistant_marker():
    chosen = "\n\nHuman: What is 2+2?\n\nAssistant: Four."
    rejected = "\n\nHuman: What is 2+2?\n\nAssistant: Five."
    pair = _pair({"chosen": chosen, "rejected": rejected, "id": 1})
    assert pair.shape == "hh"
    assert pair.prompt == "\n\nHuman: What is 2+2?\n\nAssistant:"
    assert (pair.chosen, pair.rejected) == (" Four.", " Five.")
    assert pair.prompt + pair.chosen == chosen and pair.prompt + pair.rejected == rejected
    assert pair.extra == {"id": 1} and pair.flags == []


def test_hh_shared_prefix_ending_inside_a_word_never_cuts_mid_word():
    chosen = "\n\nHuman: Name a pet.\n\nAssistant: The cat sleeps."
    rejected = "\n\nHuman: Name a pet.\n\nAssistant: The car drives."
    prompt, c, r, multi = split_hh(chosen, rejected)
    assert prompt.endswith("\n\nAssistant:")
    assert (c, r) == (" The cat sleeps.", " The car drives.")
    assert not multi


def test_hh_multi_turn_shared_history():
    history = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Tell a joke."
    prompt, c, r, multi = split_hh(history + "\n\nAssistant: Knock knock.", history + "\n\nAssistant: No.")
    assert prompt == history + "\n\nAssistant:"
    assert (c, r, multi) == (" Knock knock.", " No.", False)


def test_hh_divergence_before_last_assistant_turn_is_flagged():
    chosen = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Joke?\n\nAssistant: Sure."
    rejected = "\n\nHuman: Hi\n\nAssistant: Go away.\n\nHuman: Joke?\n\nAssistant: No."
    pair = _pair({"chosen": chosen, "rejected": rejected})
    assert pair.prompt == "\n\nHuman: Hi\n\nAssistant:"
    assert pair.chosen == " Hello!\n\nHuman: Joke?\n\nAssistant: Sure."
    assert pair.flags == [flags.MULTI_TURN_COMPLETION]


def test_hh_completion_that_is_a_prefix_of_the_other():
    prompt, c, r, _ = split_hh("\n\nHuman: Q\n\nAssistant: Hi", "\n\nHuman: Q\n\nAssistant: Hi there")
    assert (prompt, c, r) == ("\n\nHuman: Q\n\nAssistant:", " Hi", " Hi there")


def test_hh_identical_transcripts_split_at_last_marker():
    text = "\n\nHuman: Q\n\nAssistant: A"
    prompt, c, r, _ = split_hh(text, text)
    assert (prompt, c, r) == ("\n\nHuman: Q\n\nAssistant:", " A", " A")


def test_hh_without_shared_assistant_turn_is_a_record_error():
    message = _error({"chosen": "\n\nHuman: A\n\nAssistant: x", "rejected": "\n\nHuman: B\n\nAssistant: y"})
    assert "Assistant" in message


def test_hh_marker_split_by_divergence_is_not_used():
    # The shared part ends inside the marker: the previous full marker is the cut.
    chosen = "\n\nHuman: Q\n\nAssistant: A\n\nHuman: R\n\nAssistant: B"
    rejected = "\n\nHuman: Q\n\nAssistant: A\n\nHuman: R\n\nAssist"
    prompt, _, _, multi = split_hh(chosen, rejected)
    assert prompt == "\n\nHuman: Q\n\nAssistant:"
    assert multi


def test_string_pair_without_prompt_or_transcript_is_an_error():
    assert "missing field 'prompt'" in _error({"chosen": "a", "rejected": "b"})


# --- bad records -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"prompt": "P", "chosen": None, "rejected": "R"}, "'chosen'"),
        ({"prompt": "P", "chosen": "C", "rejected": 5}, "'rejected'"),
        ({"prompt": 5, "chosen": "C", "rejected": "R"}, "'prompt'"),
        ({"prompt": None, "chosen": "C", "rejected": "R"}, "'prompt'"),
        ({"prompt": "P", "chosen": "C"}, "missing field 'rejected'"),
        ({"prompt": "P", "rejected": "R"}, "missing field 'chosen'"),
        ({"prompt": [], "chosen": [assistant("A")], "rejected": [assistant("B")]}, "empty list"),
        ({"prompt": [{"content": "x"}], "chosen": "A", "rejected": "B"}, "no role"),
        ({"prompt": [{"role": "user"}], "chosen": "A", "rejected": "B"}, "no content"),
        ({"prompt": [{"role": "narrator", "content": "x"}], "chosen": "A", "rejected": "B"}, "unknown role 'narrator'"),
        ({"prompt": [user(None)], "chosen": "A", "rejected": "B"}, "'prompt[0].content' is null"),
        ({"prompt": [user(3)], "chosen": "A", "rejected": "B"}, "'prompt[0].content'"),
        ({"prompt": ["hi"], "chosen": "A", "rejected": "B"}, "'prompt[0]'"),
        ({"prompt": [user("Q")], "chosen": [user("A")], "rejected": "B"}, "'chosen' has no assistant"),
        ({"prompt": [user("Q")], "chosen": "A", "rejected": []}, "'rejected' is an empty list"),
        ({"prompt": [{"role": "user", "content": [{"type": "image_url"}]}], "chosen": "A", "rejected": "B"}, "image_url"),
        ({"chosen": [user("Q"), assistant("A")], "rejected": [user("X"), assistant("B")]}, "share no"),
        ({"prompt": "P", "chosen": "C", "rejected": [assistant("B")]}, "mix"),
        ({"conversations": [], "chosen": {"from": "gpt", "value": "a"}, "rejected": {"from": "gpt", "value": "b"}}, "'conversations'"),
        ({"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "a"}}, "missing field 'rejected'"),
        ({"input": {"messages": [user("Q")]}, "preferred_output": [assistant("A")]}, "non_preferred_output"),
        ({"input": "Q", "preferred_output": [assistant("A")], "non_preferred_output": [assistant("B")]}, "'input'"),
        ({"prompt_ids": [1], "chosen_ids": [2, -1], "rejected_ids": [3]}, "'chosen_ids[1]'"),
        ({"prompt_ids": [1], "chosen_ids": [2, True], "rejected_ids": [3]}, "'chosen_ids[1]'"),
        ({"prompt_ids": [1], "chosen_ids": "2 3", "rejected_ids": [3]}, "'chosen_ids'"),
        ({"chosen_ids": [2], "rejected_ids": [3]}, "missing field 'prompt_ids'"),
    ],
)
def test_bad_records_name_the_problem(value, expected):
    assert expected in _error(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"prompt": "P", "choosen": "C", "rejected": "R"}, "missing field 'chosen' (the record has 'choosen': a typo?)"),
        ({"prompt": "P", "chosen": "C", "rejectd": "R"}, "missing field 'rejected' (the record has 'rejectd': a typo?)"),
        ({"promt": "P", "chosen": "C", "rejected": "R"}, "missing field 'prompt' (the record has 'promt': a typo?)"),
        ({"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "a"},
          "rejcted": {"from": "gpt", "value": "b"}}, "missing field 'rejected' (the record has 'rejcted': a typo?)"),
        ({"input": {"messages": [user("Q")]}, "preferred_output": [assistant("A")],
          "non_prefered_output": [assistant("B")]}, "(the record has 'non_prefered_output': a typo?)"),
        ({"prompt_id": [1], "chosen_ids": [2], "rejected_ids": [3]}, "missing field 'prompt_ids' (the record has 'prompt_id': a typo?)"),
        # Nothing near: the plain line, no guess.
        ({"prompt": "P", "chosen": "C", "answer": "R"}, "missing field 'rejected'"),
    ],
)
def test_a_missing_field_names_the_key_that_looks_like_its_typo(value, expected):
    error = _error(value)
    assert expected in error and (error.count("typo") == ("typo" in expected)), error


def test_a_record_with_both_halves_misspelled_is_unknown_shape_naming_them():
    with pytest.raises(UnknownShapeError, match=r"a typo\? 'choosen' for 'chosen', 'rejectd' for 'rejected'"):
        _pair({"prompt": "P", "choosen": "C", "rejectd": "R"})


@pytest.mark.parametrize(
    "value",
    [
        {"messages": [user("Q"), assistant("A")], "label": True},  # KTO
        {"prompt": "Q", "completion": "A", "label": False},  # TRL unpaired
        {"messages": [user("Q"), assistant("A")]},  # SFT
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},  # SFT
        {"prompt": "only a prompt"},
        {},
    ],
)
def test_valid_objects_without_preference_shape_are_unknown_shape(value):
    with pytest.raises(UnknownShapeError):
        _pair(value)


def test_reader_errors_and_non_objects_are_record_errors():
    with pytest.raises(RecordError, match="invalid JSON"):
        normalize_record(RawRecord("f", 1, error="invalid JSON: x", raw_text="{"))
    with pytest.raises(RecordError):
        normalize_record(RawRecord("f", 1, value=[1, 2]))


# --- real data ---------------------------------------------------------------------------------


def _normalize_file(path):
    return [normalize_record(record) for record in iter_raw_records(path)]


def test_real_ultrafeedback_sample(shared_data):
    pairs = _normalize_file(shared_data("ultrafeedback-sample/train.jsonl"))
    assert len(pairs) == 1000 and {p.shape for p in pairs} == {"explicit"}
    assert set(pairs[0].extra) == {"source_index", "metadata"}
    assert sum(p.chosen == p.rejected for p in pairs) >= 1  # known identical pairs survive to the checks
    assert sum(p.chosen == "" for p in pairs) == 1


def test_real_llamafactory_sharegpt(shared_data):
    pairs = _normalize_file(shared_data("llamafactory-demo/dpo_en_demo.json"))
    assert len(pairs) == 300 and {p.shape for p in pairs} == {"sharegpt"}
    assert any(p.prompt_messages[0]["role"] == "system" for p in pairs)
    assert any(len(p.prompt_messages) > 2 for p in pairs)  # multi-turn prompts
    assert all(p.prompt_messages[-1]["role"] == "user" for p in pairs)


def test_real_orca_openai(shared_data):
    pairs = _normalize_file(shared_data("orca-dpo-pairs/validation.jsonl"))
    assert len(pairs) == 284 and {p.shape for p in pairs} == {"openai"}
    assert all(p.prompt_messages[0]["role"] == "system" for p in pairs)
    assert pairs[-1].source_line == 284


def test_real_kto_rows_are_all_unknown_shape(shared_data):
    records = list(iter_raw_records(shared_data("llamafactory-demo/kto_en_demo.json")))
    assert len(records) == 300
    for record in records:
        with pytest.raises(UnknownShapeError, match="KTO"):
            normalize_record(record)


# --- property: never any other exception -----------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(
    [
        "prompt", "chosen", "rejected", "conversations", "system", "input", "messages",
        "preferred_output", "non_preferred_output", "prompt_ids", "chosen_ids", "rejected_ids",
        "instruction", "label", "role", "content", "from", "value", "text", "type",
    ]
)  # fmt: skip
_roles = st.sampled_from(["user", "assistant", "system", "human", "gpt", "tool", "narrator", "", "USER"])
_message = st.fixed_dictionaries(
    {},
    optional={
        "role": _roles | _json,
        "from": _roles,
        "content": st.text(max_size=20) | _json,
        "value": st.text(max_size=20),
    },
)
_hh_text = st.lists(
    st.sampled_from(["\n\nHuman:", "\n\nAssistant:", " hi", " there", "x", "\n\nAssist"]), max_size=8
).map("".join)
_field = (
    _json
    | _hh_text
    | st.lists(_message, max_size=4)
    | _message
    | st.lists(st.integers(min_value=-2, max_value=2**32), max_size=4)
)
_random_records = st.dictionaries(_keys | st.text(max_size=6), _field, max_size=6) | _json

_VALID_ROWS = [
    {"prompt": "P", "chosen": "C", "rejected": "R"},
    {"prompt": [user("Q")], "chosen": [assistant("A")], "rejected": [assistant("B")]},
    {"chosen": "\n\nHuman: q\n\nAssistant: a", "rejected": "\n\nHuman: q\n\nAssistant: b"},
    {"prompt": "Q", "chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), assistant("B")]},
    {
        "conversations": [{"from": "human", "value": "q"}],
        "chosen": {"from": "gpt", "value": "a"},
        "rejected": {"from": "gpt", "value": "b"},
        "system": "s",
    },
    {
        "input": {"messages": [user("Q")]},
        "preferred_output": [assistant("A")],
        "non_preferred_output": [assistant("B")],
    },
    {"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]},
    {"instruction": "I", "input": "", "chosen": "C", "rejected": "R"},
]


@st.composite
def _mutated_rows(draw):
    """A valid row of a random shape with a few fields (top-level or nested) replaced or removed."""
    row = json.loads(json.dumps(draw(st.sampled_from(_VALID_ROWS))))
    for _ in range(draw(st.integers(0, 3))):
        target, key = row, draw(st.sampled_from(sorted(row))) if row else None
        while key is not None and isinstance(target[key], (dict, list)) and target[key] and draw(st.booleans()):
            target = target[key]
            key = draw(st.sampled_from(sorted(target))) if isinstance(target, dict) else draw(
                st.integers(0, len(target) - 1)
            )
        if key is None:
            break
        if draw(st.booleans()) and isinstance(target, dict):
            del target[key]
        else:
            target[key] = draw(_field)
    return row


_records = _mutated_rows() | _random_records


@settings(max_examples=250, deadline=None)
@given(_records)
def test_normalize_never_raises_anything_but_record_error(value):
    try:
        pair = _pair(value)
    except RecordError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(pair.prompt, str) and isinstance(pair.chosen, str) and isinstance(pair.rejected, str)
    json.dumps(pair.extra)  # pass-through values stay what they were (JSON-able)
    if pair.is_conversational:
        for messages in (pair.prompt_messages, pair.chosen_messages, pair.rejected_messages):
            assert messages and all(set(m) == {"role", "content"} for m in messages)
            assert all(m["role"] in {"system", "user", "assistant", "tool"} for m in messages)
        assert any(m["role"] == "assistant" for m in pair.chosen_messages)


def test_tool_calls_given_as_json_text_nested_too_deep_are_a_record_error_naming_the_field():
    """`tool_calls` (or `tools`) given as JSON text are decoded here: nesting past the limit costs the
    record only, named by its field, instead of a RecursionError in a later stage."""
    deep_calls = "[" * 500 + "]" * 500
    message = _error({"prompt": [user("Weather?")],
                      "chosen": [{"role": "assistant", "content": "", "tool_calls": deep_calls}],
                      "rejected": [assistant("No.")]})
    assert "nesting too deep" in message and "tool_calls" in message
