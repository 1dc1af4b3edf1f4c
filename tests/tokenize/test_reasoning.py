"""Reasoning traces and tool calls: kept, rendered, checked, and stored in OUT as TRL reads them.

Built-in tiny templates (no ../shared needed): `REASONING_TEMPLATE` renders reasoning, tool calls,
tools and a date like Qwen3's; ChatML ignores every field but role/content (a template that loses them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import pytest

from prefdata.core import flags as F
from prefdata.prepare import prepare
from prefdata.tiny import REASONING_TEMPLATE, build_tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


def _call(arguments, name="get_weather"):
    return [{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}]


def _row(chosen, rejected, prompt=PROMPT, **extra):
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **extra}


def _answer(content, **fields):
    return [{"role": "assistant", "content": content, **fields}]


@pytest.fixture(scope="module")
def reasoning_tokenizer(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("reasoning-tokenizer")
    build_tiny_tokenizer(path, chat_template=REASONING_TEMPLATE)
    return str(path)


def _prepare(tmp_path: Path, rows: list[dict], tokenizer: str, name: str = "out", **kwargs):
    raw = tmp_path / f"{name}.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = prepare(raw, tmp_path / name, tokenizer=tokenizer, progress=False, workers=1, **kwargs)
    out = tmp_path / name
    dataset = datasets.load_from_disk(str(out)) if result.rows_out else None
    return result, dataset, out


def _dropped(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "dropped.jsonl").read_text(encoding="utf-8").splitlines()]


def _decode(tokenizer_dir: str, ids) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir).decode(ids)


def test_reasoning_reaches_the_tokens_and_out_keeps_it(tmp_path, reasoning_tokenizer):
    rows = [
        _row(_answer("5", reasoning_content="2 plus 3 is 5"), _answer("6", reasoning_content="2 plus 3 is 6")),
        _row(_answer("4", thinking="two and two make four"), _answer("5", reasoning="two and two make five")),
    ]
    result, dataset, _ = _prepare(tmp_path, rows, reasoning_tokenizer)
    assert result.rows_out == 2 and result.exit_code == 0
    first = _decode(reasoning_tokenizer, dataset[0]["chosen_ids"])
    assert first.startswith("<think>\n2 plus 3 is 5\n</think>\n\n5")
    assert "two and two make five" in _decode(reasoning_tokenizer, dataset[1]["rejected_ids"])
    # One field name in OUT, TRL's: `thinking` and `reasoning` are recorded as reasoning_content.
    assert dataset[1]["chosen"][0]["reasoning_content"] == "two and two make four"
    assert dataset[1]["rejected"][0]["reasoning_content"] == "two and two make five"
    assert all(not flags for flags in dataset["flags"])


def test_a_template_that_ignores_reasoning_is_reasoning_lost(tmp_path, tiny_tokenizer_dir):
    rows = [_row(_answer("5", reasoning_content="2 plus 3 is 5"), _answer("6", reasoning_content="2 plus 3 is 6"))]
    result, _, out = _prepare(tmp_path, rows, tiny_tokenizer_dir)  # ChatML: role and content only
    assert result.exit_code == 1 and result.rows_out == 0
    (dropped,) = _dropped(out)
    assert dropped["flags"] == [F.REASONING_LOST] and dropped["severity"] == "error"
    from prefdata.report.render_text import render_text

    assert "--chat-template-file" in render_text(result.report)  # the terminal line names the fix
    # Inline <think> in the content is text any template renders: nothing is lost.
    inline = [_row(_answer("<think>\nthink a\n</think>\n\nA"), _answer("<think>\nthink b\n</think>\n\nB"))]
    result, dataset, _ = _prepare(tmp_path, inline, tiny_tokenizer_dir, name="inline")
    assert result.rows_out == 1 and "think a" in _decode(tiny_tokenizer_dir, dataset[0]["chosen_ids"])


def test_tool_calls_and_tools_render_and_are_stored_as_trl_reads_them(tmp_path, reasoning_tokenizer):
    rows = [_row(_call({"city": "Paris"}), _answer("I do not know."), tools=TOOLS)]
    result, dataset, _ = _prepare(tmp_path, rows, reasoning_tokenizer)
    assert result.rows_out == 1, result.report["flags"]
    assert dataset[0]["flags"] == []
    chosen = _decode(reasoning_tokenizer, dataset[0]["chosen_ids"])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in chosen  # arguments rendered as an object
    assert "get_weather" in _decode(reasoning_tokenizer, dataset[0]["prompt_ids"])  # the tools list
    call = dataset[0]["chosen"][0]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert json.loads(dataset[0]["tools"]) == TOOLS  # JSON text: TRL's DPOTrainer json.loads a string column


@pytest.mark.parametrize(
    "call",
    [
        _call('{"city": "Paris"'),  # not JSON
        _call({"city": "Paris"}, name="get_time"),  # not in tools
        _call({"town": "Paris"}),  # breaks the schema: "city" is required
        _call({"city": 3}),  # breaks the schema: wrong type
    ],
)
def test_invalid_tool_calls_are_errors(tmp_path, reasoning_tokenizer, call):
    result, _, out = _prepare(tmp_path, [_row(_call({"city": "Rome"}), call, tools=TOOLS)], reasoning_tokenizer)
    assert result.exit_code == 1
    assert F.TOOL_CALL_INVALID in _dropped(out)[0]["flags"]


def test_reasoning_mismatch_and_same_final_answer(tmp_path, reasoning_tokenizer):
    rows = [
        _row(_answer("5", reasoning_content="2 plus 3 is 5"), _answer("5")),  # one half reasons
        _row(_answer("5", reasoning_content="count up"), _answer("5", reasoning_content="add")),  # same answer
        _row(_answer("5", reasoning_content="add"), _answer("5", reasoning_content="   ")),  # empty think block
    ]
    result, dataset, _ = _prepare(tmp_path, rows, reasoning_tokenizer)
    assert result.rows_out == 3 and result.exit_code == 0
    assert dataset["flags"] == [[F.REASONING_MISMATCH], [F.SAME_FINAL_ANSWER], [F.REASONING_MISMATCH]]
    assert result.report["flags"][F.SAME_FINAL_ANSWER]["severity"] == "info"
    assert result.report["warnings"] == 2  # info is kept and reported, but no warning


def test_template_kwargs_and_date_are_applied_and_recorded(tmp_path, reasoning_tokenizer):
    rows = [_row(_answer("Sunny."), _answer("Rainy."), tools=TOOLS)]
    _, plain, out = _prepare(tmp_path, rows, reasoning_tokenizer, name="plain")
    _, off, out_off = _prepare(
        tmp_path, rows, reasoning_tokenizer, name="off", template_kwargs=["enable_thinking=false"],
        template_date="2031-05-06",
    )
    assert "Date: 2026-01-01" in _decode(reasoning_tokenizer, plain[0]["prompt_ids"])  # pinned, not today
    prompt_off = _decode(reasoning_tokenizer, off[0]["prompt_ids"])
    assert "Date: 2031-05-06" in prompt_off and prompt_off.endswith("<think>\n\n</think>\n\n")
    manifest = json.loads((out_off / "manifest.json").read_text())
    assert manifest["config"]["template_kwargs"] == {"enable_thinking": False}
    assert manifest["config"]["template_date"] == "2031-05-06"
    first = json.loads((out / "manifest.json").read_text())
    # Same tokenizer, different rendering: the tokenizer fingerprint stays, the template one moves.
    assert manifest["tokenizer"]["fingerprint"] == first["tokenizer"]["fingerprint"]
    assert manifest["tokenizer"]["template_fingerprint"] != first["tokenizer"]["template_fingerprint"]
    settings = json.loads(off.info.description)["prefdata"]
    assert settings["template_fingerprint"] == manifest["tokenizer"]["template_fingerprint"]


def test_chat_template_file_replaces_the_tokenizers(tmp_path, tiny_tokenizer_dir):
    template = tmp_path / "train.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    rows = [_row(_answer("5", reasoning_content="2 plus 3 is 5"), _answer("6", reasoning_content="2 plus 3 is 6"))]
    result, dataset, out = _prepare(tmp_path, rows, tiny_tokenizer_dir, chat_template_file=template)
    assert result.rows_out == 1 and dataset[0]["flags"] == []  # ChatML alone loses it (test above)
    assert "2 plus 3 is 6" in _decode(tiny_tokenizer_dir, dataset[0]["rejected_ids"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["chat_template_file"] == str(template)
    assert manifest["tokenizer"]["chat_template"] == REASONING_TEMPLATE


def test_loss_on_answer_starts_after_the_think_block(tmp_path, reasoning_tokenizer):
    rows = [_row(_answer("Five.", reasoning_content="2 plus 3 is 5"), _answer("Six."))]
    result, dataset, _ = _prepare(tmp_path, rows, reasoning_tokenizer, loss_on="answer")
    row = dataset[0]
    assert _decode(reasoning_tokenizer, row["chosen_ids"][row["chosen_loss_start"]:]) == "Five.<|im_end|>"
    assert _decode(reasoning_tokenizer, row["chosen_ids"][: row["chosen_loss_start"]]).endswith("</think>\n\n")
    assert row["rejected_loss_start"] == 0
    assert json.loads(dataset.info.description)["prefdata"]["loss_on"] == "answer"


def test_loss_on_answer_with_only_reasoning_left_has_no_completion_tokens(tmp_path, reasoning_tokenizer):
    long_reasoning = " ".join(["step"] * 60)
    rows = [_row(_answer("Five.", reasoning_content=long_reasoning), _answer("Six.", reasoning_content="add"))]
    result, _, out = _prepare(tmp_path, rows, reasoning_tokenizer, loss_on="answer", max_length=40)
    assert F.NO_COMPLETION_TOKENS in _dropped(out)[0]["flags"]


def test_eos_only_where_the_template_ends_the_turn_with_nothing(tmp_path, tiny_tokenizer_dir):
    """A template that ends turns with its own token (not the EOS) gets no EOS appended; one that
    ends them with nothing gets the EOS."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    eos = tokenizer.eos_token_id
    own_end = tmp_path / "own_end.jinja"  # Phi-3-medium style: turns end in a special token that is not EOS
    own_end.write_text(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|endoftext|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    bare = tmp_path / "bare.jinja"
    bare.write_text(
        "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    rows = [_row(_answer("Yes"), _answer("No"))]
    _, own, _ = _prepare(tmp_path, rows, tiny_tokenizer_dir, name="own", chat_template_file=own_end)
    _, plain, _ = _prepare(tmp_path, rows, tiny_tokenizer_dir, name="bare", chat_template_file=bare)
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert own[0]["chosen_ids"][-1] == endoftext and eos not in own[0]["chosen_ids"]
    assert plain[0]["chosen_ids"][-1] == eos


def test_llamafactory_v1_rows(tmp_path, reasoning_tokenizer):
    def message(role, *parts, weight):
        return {"role": role, "content": [{"type": t, "value": v} for t, v in parts], "loss_weight": weight}

    system = message("system", ("tools", json.dumps(TOOLS)), weight=0.0)
    user = message("user", ("text", "Weather in Paris?"), weight=0.0)
    row = {
        "chosen_messages": [system, user, message("assistant", ("reasoning", "look it up"), ("text", "Sunny."), weight=1.0)],
        "rejected_messages": [system, user, message("assistant", ("reasoning", "guess"), ("text", "Rainy."), weight=1.0)],
        "extra_info": "kept",
    }
    result, dataset, _ = _prepare(tmp_path, [row], reasoning_tokenizer)
    assert result.rows_out == 1, result.report
    assert dataset[0]["chosen"][0]["reasoning_content"] == "look it up"
    assert json.loads(dataset[0]["tools"]) == TOOLS
    assert dataset[0]["extra_info"] == "kept"
    assert dataset[0]["loss_weight"] == {"chosen": [0.0, 0.0, 1.0], "rejected": [0.0, 0.0, 1.0]}
    assert "look it up" in _decode(reasoning_tokenizer, dataset[0]["chosen_ids"])


# -- real reasoning tokenizers (../shared) ------------------------------------------------------

R1_TEMPLATE = "deepseek-r1-keep-reasoning"  # bundled (prefdata/templates), found by name


def test_deepseek_r1_drops_the_trace_and_the_docs_template_keeps_it(tmp_path, shared_tokenizer):
    tokenizer = shared_tokenizer("deepseek-r1-distill-qwen")
    rows = [_row(_answer("5", reasoning_content="2 plus 3 is 5."), _answer("6", reasoning_content="2 plus 3 is 6.")),
            _row(_answer("<think>\nIt is Paris.\n</think>\n\nParis"), _answer("<think>\nMaybe Lyon.\n</think>\n\nLyon"))]
    result, _, out = _prepare(tmp_path, rows, tokenizer, name="stock")
    assert result.rows_out == 0 and all(F.REASONING_LOST in d["flags"] for d in _dropped(out))
    # The hint names the bundled template: it was made for this tokenizer's template.
    assert any("--chat-template-file deepseek-r1-keep-reasoning" in h["message"] for h in result.report["hints"])
    result, dataset, _ = _prepare(tmp_path, rows, tokenizer, name="kept", chat_template_file=R1_TEMPLATE)
    assert result.rows_out == 2 and dataset["flags"] == [[], []]
    for row in dataset:
        # The generation prompt opens the think block; the completion is exactly what the model writes.
        assert _decode(tokenizer, row["prompt_ids"]).endswith("<｜Assistant｜><think>\n")
    assert _decode(tokenizer, dataset[0]["chosen_ids"]) == "2 plus 3 is 5.\n</think>\n\n5<｜end▁of▁sentence｜>"


def test_smollm3_date_is_pinned_and_its_ignored_reasoning_is_reported(tmp_path, shared_tokenizer):
    tokenizer = shared_tokenizer("smollm3-3b")
    rows = [_row(_answer("Paris"), _answer("Lyon"))]
    _, dataset, _ = _prepare(tmp_path, rows, tokenizer, name="a", template_date="2026-03-04")
    assert "Today Date: 04 March 2026" in _decode(tokenizer, dataset[0]["prompt_ids"])
    reasoning = [_row(_answer("Paris", reasoning_content="capital"), _answer("Lyon", reasoning_content="guess"))]
    result, _, out = _prepare(tmp_path, reasoning, tokenizer, name="b")
    assert result.exit_code == 1 and _dropped(out)[0]["flags"] == [F.REASONING_LOST]
    # Not DeepSeek-R1's template: no R1 template is offered, the template is named as the cause.
    (hint,) = [h for h in result.report["hints"] if h["flag"] == F.REASONING_LOST]
    assert "deepseek" not in hint["message"] and "template does not render" in hint["message"]


def test_generate_renders_prompts_with_the_same_template_settings(reasoning_tokenizer, tmp_path):
    """`generate` and `prepare` agree on the prompt ids for the same settings."""
    from transformers import AutoTokenizer

    from prefdata.online.generate import render_prompts
    from prefdata.online.prompts import PromptRow
    from prefdata.tokenize.template import TemplateSettings

    settings = TemplateSettings(kwargs={"enable_thinking": False}, date="2031-05-06")
    tokenizer = AutoTokenizer.from_pretrained(reasoning_tokenizer)
    (ids,) = render_prompts(tokenizer, [PromptRow(PROMPT, "p.jsonl", 1)], False, settings)
    _, dataset, _ = _prepare(tmp_path, [_row(_answer("Sunny."), _answer("Rainy."))], reasoning_tokenizer,
                             template_kwargs={"enable_thinking": False}, template_date="2031-05-06")
    assert ids == dataset[0]["prompt_ids"]
    assert tokenizer.decode(ids).endswith("<think>\n\n</think>\n\n")


def test_show_keeps_the_reasoning_outside_the_loss_brackets_with_loss_on_answer(tmp_path, reasoning_tokenizer):
    from prefdata.show import show_row

    rows = [_row(_answer("Five.", reasoning_content="2 plus 3 is 5"), _answer("Six."))]
    _, _, out = _prepare(tmp_path, rows, reasoning_tokenizer, loss_on="answer")
    text = show_row(out, row=0)
    assert "<think>\n2 plus 3 is 5\n</think>\n\n⟦Five.<|im_end|>⟧" in text
    assert "⟦Six.<|im_end|>⟧" in text


@pytest.mark.parametrize("field", ["tool_calls", "tools"])
def test_a_template_that_ignores_tool_calls_or_tools_is_reasoning_lost(tmp_path, tiny_tokenizer_dir, field):
    """ChatML renders role and content only: a tool call, or the row's tools, would vanish silently."""
    if field == "tool_calls":
        rows = [_row(_call({"city": "Paris"}), _answer("I do not know."))]
    else:
        rows = [_row(_answer("Sunny."), _answer("Rainy."), tools=TOOLS)]
    result, _, out = _prepare(tmp_path, rows, tiny_tokenizer_dir)
    assert result.exit_code == 1 and result.rows_out == 0
    assert F.REASONING_LOST in _dropped(out)[0]["flags"]


# -- tool calls the template drops (judged on the completion, not the tools list) ----------------

_CALL_LOOP = (
    "{%- for call in message.tool_calls or [] %}"
    "{{ '\n<tool_call>\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}"
    "{%- endfor %}"
)
# Renders the tools list in the system header but not the assistant's calls: SmolLM3's behaviour.
DROPS_TOOL_CALLS = REASONING_TEMPLATE.replace(_CALL_LOOP, "")
# Renders the function's name but not its arguments.
DROPS_ARGUMENTS = REASONING_TEMPLATE.replace(_CALL_LOOP, "{%- for call in message.tool_calls or [] %}{{ '\n<call ' + call.function.name + '>' }}{%- endfor %}")


def _said_then_called(city="Paris"):
    return [{"role": "assistant", "content": "Let me check.",
             "tool_calls": [{"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]}]


def _only_called(city):
    return [{"role": "assistant", "content": None,
             "tool_calls": [{"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]}]


def _named_then_called():
    """A turn whose own words name the call it makes, function and argument alike."""
    return [{**_said_then_called()[0], "content": "I will use get_weather for Paris."}]


@pytest.mark.parametrize("template", [DROPS_TOOL_CALLS, DROPS_ARGUMENTS], ids=["drops-calls", "drops-arguments"])
def test_a_call_the_completion_does_not_render_is_lost_though_tools_name_it(tmp_path, template):
    assert template != REASONING_TEMPLATE
    path = tmp_path / "tok"
    build_tiny_tokenizer(path, chat_template=template)
    rows = [_row(_said_then_called(), _answer("It is sunny."), tools=TOOLS),
            _row(_only_called("Paris"), _only_called("Lyon"), tools=TOOLS),
            # The call's name and argument are in the completion's text, but not the call.
            _row(_named_then_called(), _answer("It is sunny."), tools=TOOLS)]
    result, _, out = _prepare(tmp_path, rows, str(path))
    assert result.exit_code == 1 and result.rows_out == 0
    assert [F.REASONING_LOST in d["flags"] for d in _dropped(out)] == [True, True, True]


def test_a_template_that_renders_the_calls_keeps_them_unflagged(tmp_path, reasoning_tokenizer):
    rows = [_row(_said_then_called(), _answer("It is sunny."), tools=TOOLS),
            _row(_only_called("Paris"), _only_called("Lyon"), tools=TOOLS),
            _row(_named_then_called(), _answer("It is sunny."), tools=TOOLS)]
    result, dataset, _ = _prepare(tmp_path, rows, reasoning_tokenizer)
    assert result.rows_out == 3 and list(dataset["flags"]) == [[], [], []]


def test_reasoning_the_answer_repeats_is_lost_where_the_template_drops_it(tmp_path, tiny_tokenizer_dir, reasoning_tokenizer):
    """The trace's text is in the completion (the answer says it too), so only rendering the row
    without the trace can tell whether the template kept it."""
    rows = [_row(_answer("It is 5.", reasoning_content="It is 5."), _answer("It is 6.", reasoning_content="It is 6."))]
    result, _, out = _prepare(tmp_path, rows, tiny_tokenizer_dir, name="chatml")  # ChatML drops the field
    assert result.rows_out == 0 and _dropped(out)[0]["flags"] == [F.REASONING_LOST]
    result, dataset, _ = _prepare(tmp_path, rows, reasoning_tokenizer, name="kept")
    assert result.rows_out == 1 and dataset[0]["flags"] == []


# Whether each template in ../shared renders an assistant's tool calls in its completion.
_SHARED_RENDERS_CALLS = {
    "qwen2.5-instruct": True,
    "cogito-v1-preview-qwen-14b": True,
    "mistral-7b-instruct-v0.3": True,
    "smollm3-3b": False,  # tools listed in the system header, calls dropped
    "smollm2-135m-instruct": False,
    "phi-3-mini-4k-instruct": False,
    "deepseek-r1-distill-qwen": False,  # and no tools list
}


@pytest.mark.parametrize("name", sorted(_SHARED_RENDERS_CALLS))
def test_shared_templates_flag_exactly_the_calls_they_drop(tmp_path, shared_tokenizer, name):
    from transformers import AutoTokenizer

    tokenizer_dir = shared_tokenizer(name)
    renders = _SHARED_RENDERS_CALLS[name]
    # Independent of prefdata: does the completion part of the template's own render hold the call?
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    head = tok.apply_chat_template(PROMPT, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    try:
        full = tok.apply_chat_template(PROMPT + _only_called("Lyon"), tools=TOOLS, tokenize=False)
    except Exception:  # DeepSeek-R1's template reads `content` of a call-only turn: give it ""
        full = tok.apply_chat_template(PROMPT + [{**_only_called("Lyon")[0], "content": ""}], tools=TOOLS, tokenize=False)
    assert ("Lyon" in full[len(os.path.commonprefix([head, full])):]) == renders
    rows = [_row(_only_called("Paris"), _only_called("Lyon"), tools=TOOLS)]
    if name != "mistral-7b-instruct-v0.3":  # Mistral's template refuses content beside calls
        rows.append(_row(_said_then_called(), _answer("It is sunny."), tools=TOOLS))
        # The turn names the function and its argument in its own words: still lost where dropped.
        rows.append(_row(_named_then_called(), _answer("It is sunny."), tools=TOOLS))
    result, dataset, out = _prepare(tmp_path, rows, tokenizer_dir)
    if renders:
        assert result.rows_out == len(rows) and all(F.REASONING_LOST not in f for f in dataset["flags"])
    else:
        assert result.rows_out == 0 and all(F.REASONING_LOST in d["flags"] for d in _dropped(out))


def test_a_tool_result_the_template_drops_is_lost(tmp_path):
    """An agent trajectory's tool turn (in the completion) that the template leaves out."""
    template = REASONING_TEMPLATE.replace(
        "{%- else %}{{ '<|im_start|>' + message.role", "{%- elif message.role != 'tool' %}{{ '<|im_start|>' + message.role")
    assert template != REASONING_TEMPLATE
    path = tmp_path / "tok"
    build_tiny_tokenizer(path, chat_template=template)
    result_turn = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18C and sunny"}
    rows = [_row(_only_called("Paris") + [result_turn, *_answer("Sunny, 18C.")], _answer("No idea."), tools=TOOLS)]
    _, _, out = _prepare(tmp_path, rows, str(path), name="drops")
    assert F.REASONING_LOST in _dropped(out)[0]["flags"]
    build_tiny_tokenizer(tmp_path / "keeping-tok", chat_template=REASONING_TEMPLATE)
    _, dataset, _ = _prepare(tmp_path, rows, str(tmp_path / "keeping-tok"), name="keeps")
    assert F.REASONING_LOST not in dataset[0]["flags"]


# -- reasoning and tool turns on every template in ../shared -------------------------------------

# Whether each template in ../shared renders a completion turn's `reasoning_content` (none does:
# inline <think> in the content is another matter) and a tool turn's result (Phi-3 renders the
# system, user and assistant roles only). Each entry is checked against the template's own render.
_SHARED_RENDERS_REASONING = dict.fromkeys(_SHARED_RENDERS_CALLS, False)
_SHARED_RENDERS_TOOL_RESULTS = {**dict.fromkeys(_SHARED_RENDERS_CALLS, True), "phi-3-mini-4k-instruct": False}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18C and sunny"}


def _completion_render(tokenizer, prompt, completion, tools=None) -> str:
    """The template's own render of `completion` after `prompt`, independent of prefdata."""
    head = tokenizer.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(prompt + completion, tools=tools, tokenize=False)
    return full[len(os.path.commonprefix([head, full])):]


def _lost_fields(tokenizer_dir: str, row: dict, chat_template_file: str | None = None) -> list[str]:
    """prefdata's judgement, field by field, for one row."""
    from prefdata.core.records import RawRecord
    from prefdata.io.formats import normalize_record
    from prefdata.tokenize.pairs import PairTokenizer
    from prefdata.tokenize.settings import TokenizeSettings
    from prefdata.tokenize.template import TemplateSettings

    settings = TokenizeSettings(template=TemplateSettings(chat_template_file=chat_template_file))
    return PairTokenizer(tokenizer_dir, settings).lost_fields(normalize_record(RawRecord("row.jsonl", 1, row)))


def _flags_by_line(dataset, out: Path) -> list[list[str]]:
    """Every pair's flags in input order, kept or dropped."""
    flags = {d["source_line"]: d["flags"] for d in _dropped(out)}
    if dataset is not None:
        flags.update(zip(dataset["source_line"], dataset["flags"]))
    return [flags[line] for line in sorted(flags)]


@pytest.mark.parametrize(
    "name, template_file",
    [(name, None) for name in sorted(_SHARED_RENDERS_REASONING)] + [("deepseek-r1-distill-qwen", R1_TEMPLATE)],
)
def test_shared_templates_flag_exactly_the_reasoning_they_drop(tmp_path, shared_tokenizer, name, template_file):
    from transformers import AutoTokenizer

    from prefdata.tokenize.template import read_chat_template

    tokenizer_dir = shared_tokenizer(name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if template_file:
        tokenizer.chat_template = read_chat_template(template_file)
    trace = "Count up from two, three times: three, four, five."
    renders = trace in _completion_render(tokenizer, PROMPT, _answer("5", reasoning_content=trace))
    assert renders == (template_file is not None or _SHARED_RENDERS_REASONING[name])
    rows = [
        _row(_answer("5", reasoning_content=trace), _answer("6", reasoning_content="Guess six.")),
        # The answer repeats the trace word for word: its text is in the completion either way.
        _row(_answer("It is 5.", reasoning_content="It is 5."), _answer("It is 6.", reasoning_content="It is 6.")),
    ]
    for row in rows:
        assert _lost_fields(tokenizer_dir, row, template_file) == ([] if renders else ["reasoning"])
    _, dataset, out = _prepare(tmp_path, rows, tokenizer_dir, chat_template_file=template_file)
    assert [F.REASONING_LOST in flags for flags in _flags_by_line(dataset, out)] == [not renders] * len(rows)


@pytest.mark.parametrize("name", sorted(_SHARED_RENDERS_TOOL_RESULTS))
def test_shared_templates_flag_exactly_the_tool_turns_they_drop(tmp_path, shared_tokenizer, name):
    """A tool turn's result, in the completion (an agent trajectory) and in the prompt (earlier
    turns): `tool_results` is lost exactly where the template leaves the result out; the row is
    flagged when that or its call is lost."""
    from transformers import AutoTokenizer

    tokenizer_dir = shared_tokenizer(name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    called = [{**_only_called("Paris")[0], "content": ""}]  # some templates read a call turn's content
    trajectory = called + [TOOL_RESULT, *_answer("Sunny, 18C.")]
    renders = TOOL_RESULT["content"] in _completion_render(tokenizer, PROMPT, trajectory, TOOLS)
    earlier = tokenizer.apply_chat_template(PROMPT + called + [TOOL_RESULT], tools=TOOLS, tokenize=False,
                                            add_generation_prompt=True)
    assert renders == (TOOL_RESULT["content"] in earlier) == _SHARED_RENDERS_TOOL_RESULTS[name]
    calls_lost = not _SHARED_RENDERS_CALLS[name]
    rows = [
        _row(_only_called("Paris") + [TOOL_RESULT, *_answer("Sunny, 18C.")], _answer("No idea."), tools=TOOLS),
        _row(_answer("Sunny, 18C."), _answer("No idea."), prompt=PROMPT + _only_called("Paris") + [TOOL_RESULT], tools=TOOLS),
    ]
    for row in rows:
        lost = _lost_fields(tokenizer_dir, row)
        assert ("tool_results" in lost) == (not renders), lost
        assert ("tool_calls" in lost) == calls_lost, lost
    _, dataset, out = _prepare(tmp_path, rows, tokenizer_dir)
    assert [F.REASONING_LOST in flags for flags in _flags_by_line(dataset, out)] == [not renders or calls_lost] * 2


def test_smollm3_drops_a_call_its_answer_names(tmp_path, shared_tokenizer):
    """SmolLM3's template drops assistant tool calls. The turn's words name the function and its
    argument, and the system header lists the tool: the call is still lost (was kept, unflagged)."""
    tokenizer = shared_tokenizer("smollm3-3b")
    rows = [_row(_named_then_called(), _answer("It is sunny."), tools=TOOLS)]
    assert _lost_fields(tokenizer, rows[0]) == ["tool_calls"]
    result, _, out = _prepare(tmp_path, rows, tokenizer)
    assert result.rows_out == 0 and F.REASONING_LOST in _dropped(out)[0]["flags"]
