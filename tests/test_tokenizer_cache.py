"""A tokenizer loaded once per process: each caller gets its own copy, and a directory whose files
changed is loaded afresh (prefdata online loads the policy's tokenizer in every stage of every round)."""

from __future__ import annotations

import time

from prefdata.core.tokenizer_cache import load_pretrained_tokenizer
from prefdata.tiny import build_tiny_tokenizer


def test_each_call_gets_its_own_copy_and_changes_do_not_leak(tmp_path):
    build_tiny_tokenizer(tmp_path / "tok")
    first = load_pretrained_tokenizer(tmp_path / "tok")
    original = first.chat_template
    first.chat_template = "{{ 'changed' }}"
    first.padding_side = "left" if first.padding_side == "right" else "right"
    second = load_pretrained_tokenizer(tmp_path / "tok")
    assert second is not first
    assert second.chat_template == original
    assert second.padding_side != first.padding_side
    assert second("hello world")["input_ids"] == first("hello world")["input_ids"]


def test_a_tokenizer_saved_again_into_the_directory_is_reloaded(tmp_path):
    build_tiny_tokenizer(tmp_path / "tok")
    tokenizer = load_pretrained_tokenizer(tmp_path / "tok")
    tokenizer.chat_template = "{{ 'saved again' }}"
    time.sleep(0.01)  # a distinct modification time even on coarse clocks
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    assert load_pretrained_tokenizer(tmp_path / "tok").chat_template == "{{ 'saved again' }}"


def test_read_only_callers_share_the_cached_tokenizer_and_others_still_get_copies(tmp_path):
    build_tiny_tokenizer(tmp_path / "tok")
    load_pretrained_tokenizer(tmp_path / "tok")
    shared = load_pretrained_tokenizer(tmp_path / "tok", read_only=True)
    assert shared is load_pretrained_tokenizer(tmp_path / "tok", read_only=True)
    assert load_pretrained_tokenizer(tmp_path / "tok") is not shared
