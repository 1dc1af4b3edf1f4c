"""validate --trainer axolotl's findings: each names the row, what axolotl 0.19.0's own preprocessing does to it
(run in .venv-axolotl), the config key that causes it as it reads in the YAML, and what avoids it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.validate.command import validate

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-axolotl" / "bin" / "python"
needs_venv = pytest.mark.skipif(not PYTHON.is_file(), reason="no .venv-axolotl (bash scripts/trainer-venv.sh axolotl)")

SYSTEM = "smollm2-135m-instruct"  # ChatML with a default system prompt ("You are a helpful AI assistant ...")


@needs_venv
def test_findings_under_axolotl_name_the_setting_and_the_fix(shared_dir, tmp_path):
    tokenizer = str(shared_dir / "assets/tokenizers" / SYSTEM)
    rows = [{"prompt": "Say a letter.", "chosen": "B is my letter.", "rejected": "A"},  # "A" first found in "AI"
            {"prompt": "Good afternoon.", "chosen": "The weather is nice today and the sun is out.",
             "rejected": "The weather is nice today and the sun is gone."},
            {"prompt": "Hi", "chosen": "Same.", "rejected": "Same."}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = tmp_path / "axolotl.yaml"
    config.write_text("rl: dpo\nchat_template: tokenizer_default\nsequence_len: 2048\ndatasets:\n  - path: pairs.jsonl\n"
                      "    type: chat_template.default\n    field_messages: prompt\n", encoding="utf-8")
    # truncate: axolotl cuts each response to sequence_len - prompt tokens; this length cuts the weather pair's
    # halves right before "out"/"gone"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    prompt = tok.apply_chat_template([{"role": "user", "content": rows[1]["prompt"]}], add_generation_prompt=True,
                                     tokenize=False)
    length = len(tok(prompt, add_special_tokens=False)["input_ids"]) + len(
        tok("The weather is nice today and the sun is", add_special_tokens=False)["input_ids"])
    result = validate(path, tokenizer=tokenizer, progress=False, trainer="axolotl", trainer_python=str(PYTHON),
                      trainer_args=[f"config={config}", f"sequence_len={length}", "excess_length_strategy=truncate"])
    section = result.report["trainer"]
    groups = {g["flag"]: g for g in section["findings"]}
    misplaced = groups["prompt_boundary_mismatch"]
    assert misplaced["examples"][0]["source_line"] == 1 and "dummy_message" in misplaced["examples"][0]["detail"]
    assert misplaced["cause"] == ["datasets[0].type: chat_template.default (it finds the response with str.find "
                                  "in a render that starts with the template's system prompt)"]
    same = groups["identical_after_truncation"]
    assert same["examples"][0]["source_line"] == 2 and same["cause"] == [f"sequence_len: {length} (excess_length_strategy: truncate)"]
    assert groups["identical"]["examples"][0]["source_line"] == 3  # the row itself
    fix = int(same["fix"][0].removeprefix("sequence_len: "))
    assert "under axolotl" in result.rendered and fix > length
    # and at the length it names, axolotl keeps the weather pair's halves apart
    again = validate(path, tokenizer=tokenizer, progress=False, trainer="axolotl", trainer_python=str(PYTHON),
                     trainer_args=[f"config={config}", f"sequence_len={fix}", "excess_length_strategy=truncate"])
    assert "identical_after_truncation" not in {g["flag"] for g in again.report["trainer"]["findings"]}
    assert section["version"] == "0.19.0"
