"""prefdata.tokenize.locate: where a partial render ends in the full render when a template renders it
differently once later messages follow; and only then (anything else is None, for the caller to flag)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from prefdata.tokenize.locate import common_prefix, locate_end, outside_special, with_blocks_added

SPECIALS = ("<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "</s>")


def test_a_block_the_partial_render_adds_is_skipped():
    # Qwen3: the turn as the last one has an empty think block the full render lacks.
    turn = "<|im_start|>assistant\n<think>\n\n</think>\n\nCalling.<|im_end|>\n"
    full = "<|im_start|>assistant\nCalling.<|im_end|>\n<|im_start|>user\nresult<|im_end|>\n"
    assert full[: locate_end(turn, full, SPECIALS)] == "<|im_start|>assistant\nCalling.<|im_end|>\n"


def test_text_that_differs_otherwise_is_not_located():
    turn = "<|im_start|>assistant\nCALLING.<|im_end|>\n"
    full = "<|im_start|>assistant\nCalling.<|im_end|>\n<|im_start|>user\nresult<|im_end|>\n"
    assert locate_end(turn, full, SPECIALS) is None
    assert locate_end("no special here", "no special there", SPECIALS) is None


def test_blocks_moved_out_of_the_prompt_are_found_when_allowed():
    # Mistral: the system text (and tools) go to the last user turn once a later one follows.
    prompt = "<s>[TOOLS]t[/TOOLS][INST] Be brief.\n\nHi[/INST]"
    full = "<s>[INST] Hi[/INST]Hello</s>[TOOLS]t[/TOOLS][INST] Be brief.\n\nBye[/INST]Bye</s>"
    assert locate_end(prompt, full, SPECIALS) is None  # two blocks: more than one
    assert full[: locate_end(prompt, full, SPECIALS, blocks=3)] == "<s>[INST] Hi[/INST]"
    assert not with_blocks_added("<s>[INST] Ho[/INST]", "<s>[INST] Hi[/INST]", 3)  # a change, not an insertion


def test_a_cut_never_falls_inside_a_special_token():
    text = "<s>[INST] Hi[/INST]"
    assert outside_special(text, text.index("[/INST]") + 3, SPECIALS) == text.index("[/INST]")
    assert outside_special(text, text.index("Hi"), SPECIALS) == text.index("Hi")


@given(st.text("ab<|>", max_size=30), st.text("ab<|>", max_size=30))
def test_common_prefix_matches_the_standard_library(a, b):
    assert common_prefix(a, b) == len(os.path.commonprefix([a, b]))


@given(st.text("abc\n", min_size=1, max_size=40), st.lists(st.tuples(st.integers(0, 40), st.text("xyz", min_size=1,
                                                                                                     max_size=8)),
                                                          max_size=3))
def test_any_text_with_up_to_three_blocks_inserted_is_recognised(text, inserts):
    render = text
    for at, block in sorted(inserts, reverse=True):
        at = min(at, len(render))
        render = render[:at] + block + render[at:]
    assert with_blocks_added(render, text, 3)
