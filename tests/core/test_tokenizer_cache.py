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


def test_a_replacement_template_in_one_prepare_does_not_reach_the_next(tmp_path):
    """prepare shares the process's tokenizer unless it replaces the template; a run with
    --chat-template-file renders with its own copy, and the next run without one renders as before."""
    import json

    import datasets

    from prefdata.prepare import prepare

    build_tiny_tokenizer(tmp_path / "tok")
    original = load_pretrained_tokenizer(tmp_path / "tok").chat_template
    (tmp_path / "mine.jinja").write_text("Preamble of mine.\n" + original, encoding="utf-8")
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "Tell me about the sea."}],
                                "chosen": [{"role": "assistant", "content": "It is wide and deep."}],
                                "rejected": [{"role": "assistant", "content": "No."}]}) + "\n", encoding="utf-8")

    def prompt_ids(name, **kwargs):
        prepare(data, tmp_path / name, tokenizer=str(tmp_path / "tok"), progress=False, **kwargs)
        return datasets.load_from_disk(str(tmp_path / name))["prompt_ids"]

    before = prompt_ids("before")
    replaced = prompt_ids("replaced", chat_template_file=str(tmp_path / "mine.jinja"))
    after = prompt_ids("after")
    assert replaced != before and after == before
    assert load_pretrained_tokenizer(tmp_path / "tok", read_only=True).chat_template == original


def test_fingerprints_are_remembered_for_shared_tokenizers_only(tmp_path):
    from prefdata.io.manifest import shared_tokenizer_fingerprint as cached_fingerprint
    from prefdata.io.manifest import tokenizer_fingerprint

    build_tiny_tokenizer(tmp_path / "tok")
    shared = load_pretrained_tokenizer(tmp_path / "tok", read_only=True)
    assert cached_fingerprint(shared) == tokenizer_fingerprint(shared)
    copy = load_pretrained_tokenizer(tmp_path / "tok")
    copy.chat_template = "{{ 'changed' }}"
    assert cached_fingerprint(copy) == tokenizer_fingerprint(copy) != cached_fingerprint(shared)
