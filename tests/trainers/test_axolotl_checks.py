"""prefdata's checks on what axolotl trains on (axolotl_checks.py), on axolotl outcomes written out here in the
shape the worker returns them: no axolotl install needed. test_axolotl_findings.py runs the real thing."""

from __future__ import annotations

import pytest

from prefdata.trainers.axolotl import AxolotlOutcome, AxolotlPair, AxolotlRuns, parse_axolotl_args
from prefdata.trainers.axolotl_checks import axolotl_findings
from prefdata.trainers.common import TrainerHalf


@pytest.fixture
def tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def _pair(tokenizer, prompt: str, chosen: str, rejected: str, texts: tuple[str, str]) -> AxolotlPair:
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c = tokenizer(chosen, add_special_tokens=False)["input_ids"]
    r = tokenizer(rejected, add_special_tokens=False)["input_ids"]
    return AxolotlPair(prompt_len=len(p), chosen=TrainerHalf(p + c, [0] * len(p) + [1] * len(c)),
                       rejected=TrainerHalf(p + r, [0] * len(p) + [1] * len(r)), prompt_text=prompt,
                       chosen_text=texts[0], rejected_text=texts[1])


def _runs(main: dict, full: dict, dropped: list[int] = ()) -> AxolotlRuns:
    return AxolotlRuns("0.19.0", "1.9.0", AxolotlOutcome(main, list(dropped)), AxolotlOutcome(full, []))


def test_halves_made_identical_by_axolotls_rstrip_are_identical_with_its_strategy_as_cause(tokenizer):
    settings = parse_axolotl_args(["datasets.0.type=chat_template.default"])
    row = {"prompt": "Hi", "chosen": "Same answer.\n", "rejected": "Same answer."}
    pair = _pair(tokenizer, "Hi", "Same answer.", "Same answer.", ("Same answer.", "Same answer."))
    [finding] = axolotl_findings(_runs({0: pair}, {0: pair}), settings, tokenizer, [row])
    assert finding.flag == "identical" and "rstrips each response, axolotl #3824" in finding.cause
    assert finding.fix.startswith("no axolotl setting")
    # the row's own halves equal: the row itself is the cause
    [same] = axolotl_findings(_runs({0: pair}, {0: pair}), settings, tokenizer, [{**row, "chosen": "Same answer."}])
    assert same.flag == "identical" and same.cause.startswith("the row itself")


def test_a_response_str_find_cannot_find_is_a_boundary_finding(tokenizer):
    settings = parse_axolotl_args(["datasets.0.type=chat_template.default"])
    row = {"prompt": "Hi", "chosen": "Hello there!  ", "rejected": "No."}
    # a template that trims the response: find() is -1 and axolotl keeps the render's last character
    pair = _pair(tokenizer, "Hi", ">", "No.", (">", "No."))
    flags = {f.flag: f for f in axolotl_findings(_runs({0: pair}, {0: pair}), settings, tokenizer, [row])}
    found = flags["prompt_boundary_mismatch"]
    assert found.detail.startswith("chosen: str.find did not find the response") and "'>'" in found.detail


def test_a_row_dropped_for_its_length_names_the_sequence_len_that_keeps_it(tokenizer):
    settings = parse_axolotl_args(["sequence_len=8"])
    row = {"prompt": "Hi there", "chosen": "a long answer here", "rejected": "no"}
    whole = _pair(tokenizer, "Hi there", "a long answer here", "no", ("a long answer here", "no"))
    [finding] = axolotl_findings(_runs({}, {0: whole}, [0]), settings, tokenizer, [row])
    need = max(len(whole.chosen.ids), len(whole.rejected.ids))
    assert finding.flag == "no_completion_tokens" and finding.fix == need + 1
    assert finding.cause == "sequence_len: 8 (excess_length_strategy: drop)"
