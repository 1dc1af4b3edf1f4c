"""Dataset-wide checks over a stream of pairs: duplicate and conflicting pairs, prompt leakage.

Nothing but 64-bit digests is kept. Each text has its whitespace removed (`text_digest`) and is
hashed on its own with xxh3-64; a pair's key is the xxh3-64 of the three field digests packed as
24 bytes, so no separator can be forged by the text itself and (prompt, rejected, chosen) -- the
swapped key a conflict needs -- costs one more hash, not a re-read. Multi-message completions are
hashed as the same role-marked transcript the text checks compare; pre-tokenized pairs without text
hash their id lists (in a separate hash domain, so ids never collide with text by construction).

Memory: one `digest_table.U64Table` (sorted runs of keys and values, 16 bytes an entry) per key
kind: 32 bytes per distinct pair and prompt -- no Python objects per row.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xxhash

from prefdata.checks.digest_table import U64Table, _stored_keys, first_occurrences  # noqa: F401 (re-exported)
from prefdata.checks.pair import completion_content, ids_mode, squeeze_whitespace
from prefdata.core import flags as F
from prefdata.core.records import Pair

_xxh = xxhash.xxh3_64_intdigest
_IDS_SEED = 0x1D5  # separate hash domain for token id lists
_PACK3 = struct.Struct("<3Q").pack
_LINE_BITS = 40  # packed source: file index above, 1-based line below


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


class DatasetWideChecks:
    """`duplicate_pair` and `conflicting_pair` over a stream of pairs, deterministic in input order.

    - duplicate_pair: the same (prompt, chosen, rejected) -- after whitespace normalization -- was
      observed EARLIER. The first occurrence is never flagged; every later one is.
    - conflicting_pair: (prompt, rejected, chosen) was observed earlier, i.e. an earlier row prefers
      the other completion. Only the later row is flagged (the stream cannot revisit the earlier
      one); `first_line_of(pair, swapped=True)` names it for reports. A pair whose halves are equal
      is its own swap and is never called conflicting (it is `identical`).
    Counters (`rows`, `duplicate_pairs`, `conflicting_pairs`, `duplicate_prompt_rows`,
    `distinct_prompts`) feed the report's dataset-wide section.
    """

    def __init__(self) -> None:
        self._pairs = U64Table()
        self._prompts = U64Table()
        self._file_ids: dict[str, int] = {}
        self._file_names: list[str] = []
        self.rows = 0
        self.duplicate_pairs = 0
        self.conflicting_pairs = 0
        self.duplicate_prompt_rows = 0  # rows whose (normalized) prompt appeared on an earlier row

    def _packed_source(self, pair: Pair) -> int:
        file_id = self._file_ids.get(pair.source_file)
        if file_id is None:
            file_id = self._file_ids[pair.source_file] = len(self._file_names)
            self._file_names.append(pair.source_file)
        return (file_id << _LINE_BITS) | (pair.source_line & ((1 << _LINE_BITS) - 1))

    def _unpack(self, packed: int | None) -> tuple[str, int] | None:
        if packed is None:
            return None
        return self._file_names[packed >> _LINE_BITS], packed & ((1 << _LINE_BITS) - 1)

    def observe(self, pair: Pair) -> list[str]:
        """Record `pair` and return its dataset-wide flags (flags.ALL_FLAGS order)."""
        hp, hc, hr, key = pair_digests_and_key(pair)
        source = self._packed_source(pair)
        self.rows += 1
        found: list[str] = []
        if self._prompts.setdefault(hp, source) is not None:
            self.duplicate_prompt_rows += 1
        if self._pairs.setdefault(key, source) is not None:
            found.append(F.DUPLICATE_PAIR)
            self.duplicate_pairs += 1
        if hc != hr and self._pairs.get(_xxh(_PACK3(hp, hr, hc))) is not None:
            found.append(F.CONFLICTING_PAIR)
            self.conflicting_pairs += 1
        return found

    def observe_digests(
        self,
        source_file: str,
        lines: np.ndarray,
        prompt_keys: np.ndarray,
        pair_keys: np.ndarray,
        swapped_keys: np.ndarray,
        halves_differ: np.ndarray,
        first_prompts: np.ndarray | None = None,
        first_pairs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`observe` for a run of pairs from one file given their digests, vectorized: (duplicate_pair,
        conflicting_pair) masks. `pair_keys`/`swapped_keys` are the pair keys of (prompt, chosen,
        rejected) and (prompt, rejected, chosen); `halves_differ` says chosen digest != rejected
        digest (an equal-halves pair is never conflicting); `first_*`: `first_occurrences` of the
        keys, when the caller has them. Same tables and counters as `observe`."""
        n = len(lines)
        if not n:
            empty = np.zeros(0, dtype=bool)
            return empty, empty
        file_id = self._file_ids.get(source_file)
        if file_id is None:
            file_id = self._file_ids[source_file] = len(self._file_names)
            self._file_names.append(source_file)
        sources = (np.int64(file_id) << np.int64(_LINE_BITS)) | (np.asarray(lines, dtype=np.int64) & ((1 << _LINE_BITS) - 1))
        self.rows += n
        self.duplicate_prompt_rows += int(self._prompts.setdefault_many(prompt_keys, sources, first_prompts).sum())
        duplicate = self._pairs.setdefault_many(pair_keys, sources, first_pairs)
        # observe() looks a row's swap up after storing the row itself: any pair stored before it,
        # in an earlier run or earlier in this one. Stored values are sources, and sources grow in
        # input order (files are numbered as they come), so "earlier" is a smaller first source.
        stored, first_source = self._pairs.get_many(swapped_keys)
        conflicting = halves_differ & stored & (first_source < sources)
        self.duplicate_pairs += int(duplicate.sum())
        self.conflicting_pairs += int(conflicting.sum())
        return duplicate, conflicting

    def observe_many(self, pairs: Iterable[Pair]) -> list[list[str]]:
        return [self.observe(pair) for pair in pairs]

    def first_line_of(self, pair: Pair, *, swapped: bool = False) -> tuple[str, int] | None:
        """(source_file, source_line) of the first observed row with this pair (or its swap)."""
        hp, hc, hr = pair_digests(pair)
        key = _PACK3(hp, hr, hc) if swapped else _PACK3(hp, hc, hr)
        return self._unpack(self._pairs.get(_xxh(key)))

    def first_prompt_line_of(self, pair: Pair) -> tuple[str, int] | None:
        """(source_file, source_line) of the first observed row with this pair's prompt."""
        return self._unpack(self._prompts.get(pair_digests(pair)[0]))

    @property
    def distinct_prompts(self) -> int:
        return len(self._prompts)

    def stats(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "duplicate_pairs": self.duplicate_pairs,
            "conflicting_pairs": self.conflicting_pairs,
            "duplicate_prompt_rows": self.duplicate_prompt_rows,
            "distinct_prompts": self.distinct_prompts,
            "hash_table_bytes": self._pairs.nbytes + self._prompts.nbytes,
        }


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
