"""Huge texts tokenized a piece at a time (prefdata.tokenize.pieces) get exactly the ids of the whole
text: for the tiny tokenizer always, and for the real ones in ../shared when present (ByteLevel
regexes, SentencePiece Metaspace without splitting). The piece sizes are shrunk here so a text of
~100 K characters crosses dozens of cuts."""

from __future__ import annotations

import random
from array import array

import pytest

from prefdata.core.records import Pair
from prefdata.tokenize import pairs as pairs_module
from prefdata.tokenize import pieces
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.settings import TokenizeSettings

WORDS = ("the a of and to in is it that was for on are with as I his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said an each she which").split()


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(pieces, "PIECE_CHARS", 2048)
    monkeypatch.setattr(pieces, "HUGE_TEXT_CHARS", 8192)
    monkeypatch.setattr(pairs_module, "HUGE_TEXT_CHARS", 8192)


def _prose(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    while sum(map(len, out)) < size:
        sentence = " ".join(rng.choices(WORDS, k=rng.randint(3, 20))).capitalize()
        out.append(sentence + rng.choice(".!?,:") + rng.choice([" ", " ", "\n", "\n\n", "  ", "\t", " 42 "]))
    return "".join(out)[:size]


def _code(size: int, seed: int = 2) -> str:
    rng = random.Random(seed)
    lines = ["def f(x):\n", "    return x + 1  # comment\n", "\n", "    if x  ==  2:\n", "\t\tpass\n",
             'print("héllo wörld 日本語 ✓")\n', "            y = [1, 2, 3]\n"]
    return "".join(rng.choices(lines, k=size // 12))[:size]


TEXTS = {
    "prose": _prose(100_000),
    "code": _code(100_000),
    "no whitespace": "ab12" * 25_000,  # no cut: encoded whole, as before
}


def _tokenizer(path: str) -> PairTokenizer:
    tokenizer = PairTokenizer(path, TokenizeSettings())
    tokenizer.setup()
    return tokenizer


def _check_exact(tokenizer: PairTokenizer) -> None:
    backend = tokenizer._backend
    for anchor in {tokenizer._anchor, ""}:
        for name, text in TEXTS.items():
            for lead in {"", anchor}:
                whole = backend.encode_batch_fast([lead + text], add_special_tokens=False)[0].ids
                got = pieces.encode_huge(backend, lead + text, anchor)
                assert isinstance(got, array) and got.tolist() == whole, (name, anchor, lead)
    cuts = list(pieces.piece_bounds(backend, TEXTS["prose"], tokenizer._anchor))
    assert len(cuts) > 20  # the prose really was cut
    assert len(list(pieces.piece_bounds(backend, TEXTS["no whitespace"], tokenizer._anchor))) == 1


def test_pieces_give_the_ids_of_the_whole_text(small_pieces, tiny_tokenizer_dir):
    _check_exact(_tokenizer(tiny_tokenizer_dir))


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "mistral-7b-instruct-v0.3", "gpt2"])
def test_pieces_give_the_ids_of_the_whole_text_for_real_tokenizers(small_pieces, shared_tokenizer, name):
    _check_exact(_tokenizer(shared_tokenizer(name)))


def test_counting_tokens_before_a_position_matches_the_offsets(small_pieces, tiny_tokenizer_dir):
    tokenizer = _tokenizer(tiny_tokenizer_dir)
    backend, anchor = tokenizer._backend, tokenizer._anchor
    text = anchor + TEXTS["prose"]
    offsets = backend.encode_batch([text], add_special_tokens=False)[0].offsets
    for position in (len(anchor), 5_000, 50_001, len(text) - 3, len(text)):
        expected = sum(1 for start, _ in offsets[1:] if start < position)
        assert pieces.count_tokens_before(backend, text, anchor, position, skip=1) == expected, position


def _pair(chosen: str) -> Pair:
    return Pair(
        source_file="huge.jsonl", source_line=1, prompt="think", chosen="", rejected="",
        prompt_messages=[{"role": "user", "content": "think"}],
        chosen_messages=[{"role": "assistant", "content": "yes", "reasoning_content": chosen}],
        rejected_messages=[{"role": "assistant", "content": "no"}],
    )


@pytest.mark.parametrize("loss_on", ["all", "answer"])
def test_a_huge_completion_tokenizes_as_before(loss_on, monkeypatch, tiny_tokenizer_dir):
    """The same pair through PairTokenizer with pieces and without (thresholds out of reach)."""
    from prefdata.tiny import REASONING_TEMPLATE
    from prefdata.tokenize.template import TemplateSettings

    settings = TokenizeSettings(loss_on=loss_on, template=TemplateSettings(chat_template_text=REASONING_TEMPLATE))
    pair = _pair(TEXTS["prose"])

    def tokenized(huge: int):
        monkeypatch.setattr(pieces, "PIECE_CHARS", 2048)
        monkeypatch.setattr(pieces, "HUGE_TEXT_CHARS", huge)
        monkeypatch.setattr(pairs_module, "HUGE_TEXT_CHARS", huge)
        tokenizer = PairTokenizer(tiny_tokenizer_dir, settings)
        return tokenizer.tokenize_pairs([pair])[0]

    whole, in_pieces = tokenized(10**9), tokenized(8192)
    assert isinstance(in_pieces.chosen_ids, array)
    assert list(in_pieces.chosen_ids) == list(whole.chosen_ids)
    assert list(in_pieces.prompt_ids) == list(whole.prompt_ids)
    assert list(in_pieces.rejected_ids) == list(whole.rejected_ids)
    assert (in_pieces.chosen_loss_start, in_pieces.flags) == (whole.chosen_loss_start, whole.flags)
    if loss_on == "answer":
        assert 0 < in_pieces.chosen_loss_start < len(in_pieces.chosen_ids)
