"""An agent trajectory prepared from the command line with Qwen3's chat template (issue 40 item 1).

Qwen3's template gives the last assistant turn an empty think block and earlier ones none, so a turn
renders differently once a later turn follows. The first model turn after the split (text and a tool
call) must still be in the loss in both halves, in OUT's mask columns and in `prefdata show`, and the
row must carry no flag about its masks. Qwen3's vocabulary is Qwen2.5's: ../shared's Qwen2.5 tokenizer with the
template in tests/fixtures/qwen3_chat_template.jinja is a Qwen3 tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from prefdata.cli import main
from prefdata.show import LOSS_CLOSE, LOSS_OPEN, show_row

QWEN3_TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_chat_template.jinja"
TOOLS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}} for name in ("get_weather", "get_time")]


def _turns(first_text: str, name: str, result: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": first_text, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": name, "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "assistant", "content": answer}]


ROW = {"tools": TOOLS,
       "chosen": _turns("Let me check the weather.", "get_weather", "14C, cloudy", "It is 14C and cloudy."),
       "rejected": _turns("Let me look at the clock.", "get_time", "14:02", "It is two o'clock.")}


def test_prepare_trains_every_model_turn_of_a_qwen3_trajectory(tmp_path, shared_tokenizer):
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code = main(["prepare", str(raw), str(out), "--tokenizer", shared_tokenizer("qwen2.5-instruct"),
                 "--chat-template-file", str(QWEN3_TEMPLATE), "--no-progress"])
    assert code == 0
    row = datasets.load_from_disk(str(out))[0]
    assert not {"turn_renders_differently", "no_trained_tokens", "prompt_boundary_mismatch"} & set(row["flags"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared_tokenizer("qwen2.5-instruct"))
    for half, first, name, result, answer in (
            ("chosen", "Let me check the weather.", "get_weather", "14C, cloudy", "It is 14C and cloudy."),
            ("rejected", "Let me look at the clock.", "get_time", "14:02", "It is two o'clock.")):
        ids, mask = row[f"{half}_ids"], row[f"{half}_loss_mask"]
        assert len(mask) == len(ids)
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        # The first turn (its text, its tool call, its end of turn) and the answer are trained...
        assert trained.startswith(first) and f'"name": "{name}"' in trained and "</tool_call><|im_end|>" in trained
        assert trained.endswith(answer + "<|im_end|>")
        # ...the tool result and the role headers are not.
        assert result in untrained and result not in trained and "<|im_start|>" not in trained

    shown = show_row(out, row=0)
    chosen = shown.split("--- chosen")[1].split("--- rejected")[0].split("\n", 1)[1]  # past the legend line
    inside = [part.split(LOSS_CLOSE)[0] for part in chosen.split(LOSS_OPEN)[1:]]
    assert len(inside) == 2 and inside[0].startswith("Let me check the weather.") and "get_weather" in inside[0]
    assert inside[1].endswith("It is 14C and cloudy.<|im_end|>")


@pytest.fixture(autouse=True)
def _needs_the_template():
    if not QWEN3_TEMPLATE.is_file():
        pytest.skip("tests/fixtures/qwen3_chat_template.jinja is missing")
