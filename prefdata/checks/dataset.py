"""The digests of the dataset-wide checks (duplicate and conflicting pairs: prefdata.checks.partitioned),
and prompt leakage between datasets.

Nothing but 64-bit digests is kept. Each text has its whitespace removed (`text_digest`) and is
hashed on its own with xxh3-64; a pair's key is the xxh3-64 of the three field digests packed as
24 bytes, so no separator can be forged by the text itself and (prompt, rejected, chosen) -- the
swapped key a conflict needs -- costs one more hash, not a re-read. Multi-message completions are
hashed as the same role-marked transcript the text checks compare; pre-tokenized pairs without text
hash their id lists (in a separate hash domain, so ids never collide with text by construction).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xxhash

from prefdata.checks.pair import completion_content, ids_mode, squeeze_whitespace
from prefdata.core.records import Pair

_xxh = xxhash.xxh3_64_intdigest
_IDS_SEED = 0x1D5  # separate hash domain for token id lists
_PACK3 = struct.Struct("<3Q").pack


def text_digest(text: str) -> int:
    """64-bit digest of `text` with all whitespace removed (the key of every dataset-wide text check).

    Equal after `normalize_whitespace` implies equal digest. Removing whitespace instead of collapsing
    it is ~5x cheaper per row; it also merges texts that differ only where one has a space and the
    other none ("a b" vs "ab"), which real preference data does not separate.
    """
    return _xxh(squeeze_whitespace(text))


def ids_digest(ids: Sequence[int]) -> int:
    """64-bit digest of a token id list (pre-tokenized pairs)."""
    return _xxh(array("q", ids).tobytes(), _IDS_SEED)


def pair_digests(pair: Pair) -> tuple[int, int, int]:
    """(prompt, chosen, rejected) digests of one pair; see the module doc for what is hashed."""
    if pair.chosen_ids is not None and ids_mode(pair):
        return (
            ids_digest(pair.prompt_ids or []),
            ids_digest(pair.chosen_ids or []),
            ids_digest(pair.rejected_ids or []),
        )
    if pair.chosen_messages is None and pair.rejected_messages is None:
        chosen, rejected = pair.chosen, pair.rejected
    else:
        chosen, rejected = completion_content(pair, "chosen")[0], completion_content(pair, "rejected")[0]
    if pair.image_data:  # image pairs: the same text over other images is another prompt
        return _image_keys(pair.prompt, pair.image_data, chosen, rejected)
    return _text_keys(pair.prompt, chosen, rejected)[:3]


def _image_keys(prompt: str, images: Sequence[Any], chosen: str, rejected: str) -> tuple[int, int, int]:
    """Digests of an image pair: the prompt's key is its text's digest with each image's content
    digest (prefdata.io.images.LoadedImage.digest, of the bytes), in order."""
    hp, hc, hr = _text_keys(prompt, chosen, rejected)[:3]
    return _xxh(struct.pack(f"<{len(images) + 1}Q", hp, *(image.digest for image in images))), hc, hr


def pair_digests_and_key(pair: Pair) -> tuple[int, int, int, int]:
    """`pair_digests(pair)` and the pair key built from them, in one call."""
    if pair.chosen_ids is None and pair.chosen_messages is None and pair.rejected_messages is None \
            and not pair.image_data:  # image pairs of string rows (a prepared OUT re-checked): their images count
        return _text_keys(pair.prompt, pair.chosen, pair.rejected)
    digests = pair_digests(pair)
    return (*digests, _xxh(_PACK3(*digests)))


# The checks and the report digest the same row back to back: the last triple of strings is
# remembered (holding the strings, so identity cannot be reused by other objects).
_LAST_KEYS: list[Any] = [None, None, None, None]


def _text_keys(prompt: str, chosen: str, rejected: str) -> tuple[int, int, int, int]:
    last = _LAST_KEYS
    if last[0] is prompt and last[1] is chosen and last[2] is rejected:
        return last[3]
    hp, hc, hr = _xxh(squeeze_whitespace(prompt)), _xxh(squeeze_whitespace(chosen)), _xxh(squeeze_whitespace(rejected))
    keys = (hp, hc, hr, _xxh(_PACK3(hp, hc, hr)))
    last[:] = (prompt, chosen, rejected, keys)
    return keys


class PromptLeakIndex:
    """Digests of the prompts of another dataset (e.g. the eval split), for `prompt_leak`.

    Prompts match after whitespace normalization; an empty prompt never matches. Entries are str
    (text) or sequences of ints (pre-tokenized prompt ids). Stored as one sorted uint64 array.
    """

    def __init__(self, prompts: Iterable[str | Sequence[int]]) -> None:
        digests = array("Q")
        for prompt in prompts:
            digest = _prompt_digest(prompt)
            if digest is not None:
                digests.append(digest)
        self._digests = np.unique(np.frombuffer(digests, dtype=np.uint64)) if digests else np.zeros(0, np.uint64)

    def __len__(self) -> int:
        return int(self._digests.size)

    def contains(self, prompt: str | Sequence[int]) -> bool:
        digest = _prompt_digest(prompt)
        if digest is None or not self._digests.size:
            return False
        i = int(np.searchsorted(self._digests, np.uint64(digest)))
        return i < self._digests.size and int(self._digests[i]) == digest

    def contains_pair(self, pair: Pair) -> bool:
        """Whether `pair`'s prompt leaks (its prompt ids when it is pre-tokenized without text)."""
        return self.contains(pair.prompt_ids or [] if ids_mode(pair) else pair.prompt)


def _prompt_digest(prompt: str | Sequence[int]) -> int | None:
    if isinstance(prompt, str):
        return None if not prompt or prompt.isspace() else text_digest(prompt)
    return ids_digest(prompt) if len(prompt) else None
