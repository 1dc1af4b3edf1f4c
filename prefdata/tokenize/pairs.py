"""Pairs to token ids: chat templates, BOS/EOS, the prompt/completion boundary, then truncation
(prefdata.tokenize.truncate).

What a tokenized pair looks like (TRL's convention, completion ids exclude the prompt):

- Conversational pairs (and string pairs with ``chat_template=True``, as one user turn plus one
  assistant turn) are rendered through the tokenizer's chat template: the prompt once with the
  generation prompt, and prompt + completion for each half. The completion text is the full render
  minus the prompt render. Rendered text is tokenized with ``add_special_tokens=False`` because
  templates that want a BOS emit it themselves (Mistral): no double BOS.
- Plain string pairs: ``prompt_ids = tokenizer(prompt)`` with the tokenizer's own leading special
  tokens (BOS where it adds one); completions are tokenized without special tokens.
- End of turn: a completion ends where the template ends the assistant turn, with what it writes
  there. When the render, trailing whitespace aside, ends in one of the tokenizer's added tokens,
  that token ends the completion and the whitespace after it is dropped (ChatML renders
  ``<|im_end|>\\n``: we keep ``<|im_end|>`` and drop the ``\\n`` that only separates it from a next
  turn); no EOS is appended, whether that token is the EOS (Qwen, Mistral) or not (Llama 3's
  ``<|eot_id|>``); Phi-3's ``<|end|>\\n<|endoftext|>`` (end of turn, then EOS) is kept as rendered.
  EOS is appended only where the completion ends in no such token: plain-string rows and templates
  that end a turn with text. A trailing run of EOS ids is cut to one (`_end_with_one_eos`). TRL
  instead appends a second EOS.
- Pre-tokenized pairs keep their ids unchanged (no EOS added); only truncation applies, which never
  puts a cut completion's end back.

Invariant 2 (the prompt ids are a prefix of prompt+completion ids in both halves, identical across
halves) holds by construction: each half is ``prompt_ids + completion_ids``. Whether that agrees
with tokenizing the joint text is checked separately (``prompt_boundary_mismatch``).
"""

from __future__ import annotations

from array import array
from typing import Any, Sequence

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.reasoning import reasoning_end
from prefdata.core.records import Pair, TokenizedPair
from prefdata.io.manifest import shared_tokenizer_fingerprint
from prefdata.tokenize.render_pairs import _NEEDS_PROCESSOR, PairRendering, _Texts  # _Texts: also tokenize.vision's
from prefdata.tokenize.pieces import HUGE_TEXT_CHARS, count_tokens_before, encode_ids
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.template import template_fingerprint
from prefdata.tokenize.tokenizer import leading_special_ids, load_tokenizer, pick_anchor
from prefdata.tokenize.truncate import truncate_pair
from prefdata.tokenize.turns import Span, fit_mask, token_mask

# Characters of prompt and of completion on each side of the boundary that the boundary check
# re-tokenizes (see `_boundary_mismatches`).
BOUNDARY_WINDOW_CHARS = 48


class PairTokenizer(PairRendering):
    """Tokenizes batches of pairs. Picklable before and after `setup()` (the tokenizer is reloaded
    in each worker process), so a pipeline can ship it to worker processes."""

    reads_images = False  # rows with images need a processor (prefdata.tokenize.vision)

    def __init__(self, tokenizer_path: str, settings: TokenizeSettings, trust_remote_code: bool = False):
        self.tokenizer_path = str(tokenizer_path)
        self.settings = settings
        self.trust_remote_code = trust_remote_code
        self.tokenizer: Any = None
        self._backend: Any = None
        self._eos_id: int | None = None
        self._prefix_ids: list[int] = []
        self._special_strings: tuple[str, ...] = ()
        self._anchor = ""
        self._fingerprint = ""
        self._render_kwargs: dict[str, Any] = {}
        self._day: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "tokenizer_path": self.tokenizer_path,
            "settings": self.settings,
            "trust_remote_code": self.trust_remote_code,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["tokenizer_path"], state["settings"], state["trust_remote_code"])

    def setup(self) -> None:
        """Load the tokenizer and derive what tokenizing needs (idempotent)."""
        if self.tokenizer is not None:
            return
        tokenizer = self._load_tokenizer()
        if tokenizer.eos_token_id is None:
            raise PrefdataError(f"tokenizer at {self.tokenizer_path} has no EOS token; completions need one")
        # The tokenizer's own fingerprint (its template included) is what refs and train compare with
        # a model's tokenizer; a replacement template is part of `template_fingerprint` instead. Taken
        # here only before a replacement; otherwise when first asked (`validate` never asks: ~0.2 s).
        template = self.settings.template
        if template.chat_template_text is not None:
            self._fingerprint = shared_tokenizer_fingerprint(tokenizer)
            tokenizer.chat_template = template.chat_template_text
        if self.settings.chat_template and not tokenizer.chat_template:
            raise PrefdataError(
                f"--chat-template was given but the tokenizer at {self.tokenizer_path} has no chat template"
            )
        self.tokenizer = tokenizer
        self._backend = tokenizer._tokenizer  # the Rust tokenizer: batched, no Python per-token work
        self._eos_id = int(tokenizer.eos_token_id)
        self._prefix_ids = leading_special_ids(tokenizer)
        self._special_strings = tuple(sorted(tokenizer.get_added_vocab(), key=len, reverse=True))
        self._anchor = pick_anchor(tokenizer)
        self._render_kwargs = template.render_kwargs()
        self._day = template.day()

    def _load_tokenizer(self) -> Any:
        # Only a replacement template changes the tokenizer (setup): otherwise the cached one is shared.
        return load_tokenizer(self.tokenizer_path, self.trust_remote_code,
                              read_only=self.settings.template.chat_template_text is None)

    def fingerprint(self) -> str:
        self.setup()
        if not self._fingerprint:  # the tokenizer is unchanged since loading (setup)
            self._fingerprint = shared_tokenizer_fingerprint(self.tokenizer)  # once for the process's shared one
        return self._fingerprint

    def template_fingerprint(self) -> str:
        """The tokenizer, the template in effect, its variables and the pinned date, in one hash."""
        return template_fingerprint(self.fingerprint(), self.tokenizer.chat_template, self.settings.template)

    @property
    def eos_token_id(self) -> int:
        self.setup()
        assert self._eos_id is not None
        return self._eos_id

    def tokenize_pairs(self, pairs: list[Pair]) -> list[TokenizedPair]:
        """Tokenize a batch; same order. Raises the first row's RecordError if a row cannot be
        rendered (use `tokenize_pairs_or_errors` to keep going)."""
        results = self.tokenize_pairs_or_errors(pairs)
        for result in results:
            if isinstance(result, RecordError):
                raise result
        return results  # type: ignore[return-value]

    def tokenize_pairs_or_errors(self, pairs: list[Pair]) -> list[TokenizedPair | RecordError]:
        """Like `tokenize_pairs`, but a row whose chat template fails to render yields a
        RecordError (one line, for quarantine) in its place instead of stopping the batch."""
        self.setup()
        results: list[TokenizedPair | RecordError | None] = [None] * len(pairs)
        text_rows: list[int] = []
        texts: list[_Texts] = []
        templated: list[int] = []
        for index, pair in enumerate(pairs):
            if pair.is_pretokenized:
                tokenized = truncate_pair(
                    pair.prompt_ids or [], pair.chosen_ids or [], pair.rejected_ids or [],
                    self.settings, self._eos_id,
                )
                if pair.chosen_loss_mask is not None and pair.rejected_loss_mask is not None:
                    # The given masks, cut with the completions (truncation cuts them from the right).
                    tokenized.chosen_loss_mask = list(pair.chosen_loss_mask[: len(tokenized.chosen_ids)])
                    tokenized.rejected_loss_mask = list(pair.rejected_loss_mask[: len(tokenized.rejected_ids)])
                    _flag_untrained(tokenized)
                results[index] = tokenized
            elif pair.images is not None and not self.reads_images:
                results[index] = RecordError(_NEEDS_PROCESSOR)
            elif pair.is_conversational or self.settings.chat_template:
                templated.append(index)
            else:
                plain = self._plain_texts(pair)
                if isinstance(plain, RecordError):
                    results[index] = plain
                else:
                    text_rows.append(index)
                    texts.append(plain)

        if templated:
            rendered = self._render_rows([pairs[i] for i in templated])
            for index, item in zip(templated, rendered):
                if isinstance(item, RecordError):
                    results[index] = item
                else:
                    text_rows.append(index)
                    texts.append(item)

        for index, tokenized in zip(text_rows, self._tokenize_texts(texts)):
            results[index] = tokenized
        return results  # type: ignore[return-value]

    # -- rendering ---------------------------------------------------------------------------

    # -- tokenizing --------------------------------------------------------------------------

    def _tokenize_texts(self, rows: list[_Texts]) -> list[TokenizedPair]:
        if not rows:
            return []
        n = len(rows)
        # One batched Rust call for every text of the batch; each text is tokenized exactly once
        # (the prompt once per row, shared by both halves). No offsets are needed: encode_batch_fast.
        # A huge text is encoded a piece at a time into an array('i') (tokenize.pieces).
        chosen_texts, chosen_drop = self._completion_texts(rows, "chosen")
        rejected_texts, rejected_drop = self._completion_texts(rows, "rejected")
        all_texts = [r.prompt for r in rows] + chosen_texts + rejected_texts
        ids = encode_ids(self._backend, all_texts, self._anchor)
        starts = self._answer_starts(rows) if self.settings.loss_on == "answer" else None
        masks = self._turn_masks(rows, ids, n)

        mismatch = self._boundary_mismatches(rows)
        eos = self._eos_id
        prefix = self._prefix_ids
        out: list[TokenizedPair] = []
        for i, row in enumerate(rows):
            prompt = _take(ids, i, 0)
            prompt = _concat(prefix, prompt) if row.prompt_prefix_ids and prefix else prompt
            chosen = _take(ids, n + i, chosen_drop[i])
            rejected = _take(ids, 2 * n + i, rejected_drop[i])
            chosen = _end_with_one_eos(chosen, eos, append=not row.chosen_ends_turn)
            rejected = _end_with_one_eos(rejected, eos, append=not row.rejected_ends_turn)
            spans = self._image_spans(prompt, row) if row.images else None
            tokenized = truncate_pair(prompt, chosen, rejected, self.settings, eos, spans)
            tokenized.image_tokens = row.image_tokens
            if starts is not None:
                _set_loss_starts(tokenized, *starts[i])
            if i in masks:
                _set_loss_masks(tokenized, *masks[i], row)
            if mismatch[i]:
                tokenized.flags.insert(0, F.PROMPT_BOUNDARY_MISMATCH)
            tokenized.flags[:0] = row.flags
            out.append(tokenized)
        return out

    def _turn_masks(self, rows: list[_Texts], ids: list[Sequence[int]], n: int) -> dict[int, tuple[list[int], list[int]]]:
        """Per row with turn spans: each half's loss mask over its completion ids as tokenized (before
        the EOS handling and truncation that `_set_loss_masks` applies). Only those completions are
        tokenized again, with offsets; a huge one counts the tokens before each span edge instead."""
        anchor = self._anchor
        jobs: list[tuple[int, int, str, int, list[Span]]] = []  # (row, half, text, anchor chars, spans)
        for i, row in enumerate(rows):
            if row.chosen_spans is None and row.rejected_spans is None:
                continue
            for half, text, spans in ((0, row.chosen, row.chosen_spans), (1, row.rejected, row.rejected_spans)):
                lead = anchor if (anchor and row.prompt) else ""
                jobs.append((i, half, lead + text, len(lead), [(0, len(text))] if spans is None else spans))
        out: dict[int, list[list[int]]] = {}
        small = [job for job in jobs if len(job[2]) < HUGE_TEXT_CHARS]
        encodings = self._backend.encode_batch([job[2] for job in small], add_special_tokens=False) if small else []
        for (i, half, _text, skip, spans), encoding in zip(small, encodings):
            offsets = encoding.offsets[1:] if skip else encoding.offsets
            out.setdefault(i, [[], []])[half] = token_mask(offsets, spans, skip)
        for i, half, text, skip, spans in (job for job in jobs if len(job[2]) >= HUGE_TEXT_CHARS):
            total = len(ids[(1 + half) * n + i]) - (1 if skip else 0)  # the anchor's id is still there
            edges = [count_tokens_before(self._backend, text, anchor, skip + edge, 1 if skip else 0)
                     for span in spans for edge in span]
            mask = [0] * total
            for start, stop in zip(edges[::2], edges[1::2]):
                mask[start:stop] = [1] * (stop - start)
            out.setdefault(i, [[], []])[half] = mask
        return {i: (pair[0], pair[1]) for i, pair in out.items()}

    def _image_spans(self, prompt_ids: Sequence[int], row: _Texts) -> list[tuple[int, int]]:
        """[start, end) of each image's tokens in the prompt (prefdata.tokenize.vision)."""
        return []

    def _answer_starts(self, rows: list[_Texts]) -> list[tuple[int, int]]:
        """For --loss-on answer: per row, how many completion tokens of each half belong to its
        leading reasoning block. Only completions holding one are tokenized again, with offsets,
        because a reasoning prefix tokenized alone can split differently at its end."""
        anchor = self._anchor
        jobs: list[tuple[int, int, str, int, int]] = []  # (row, half, text, skip chars, answer char)
        for i, row in enumerate(rows):
            for half, text in enumerate((row.chosen, row.rejected)):
                end = reasoning_end(text)
                if end:
                    lead = anchor if (anchor and row.prompt) else ""
                    jobs.append((i, half, lead + text, len(lead), len(lead) + end))
        starts = [[0, 0] for _ in rows]
        # A huge completion is counted a piece at a time: offsets for all of it cost ~300 bytes a character.
        for i, half, text, skip, answer in [job for job in jobs if len(job[2]) >= HUGE_TEXT_CHARS]:
            starts[i][half] = count_tokens_before(self._backend, text, self._anchor, answer, 1 if skip else 0)
        jobs = [job for job in jobs if len(job[2]) < HUGE_TEXT_CHARS]
        if jobs:
            encodings = self._backend.encode_batch([job[2] for job in jobs], add_special_tokens=False)
            for (i, half, _text, skip, answer), encoding in zip(jobs, encodings):
                offsets = encoding.offsets
                first = 1 if skip else 0  # the anchor's own token
                count = 0
                for start, _end in offsets[first:]:
                    if start >= answer:
                        break
                    count += 1
                starts[i][half] = count
        return [(c, r) for c, r in starts]

    def _completion_texts(self, rows: list[_Texts], half: str) -> tuple[list[str], list[int]]:
        """Completion texts to tokenize, each behind the anchor token when the row has a prompt.

        A completion never starts its sequence: it follows the prompt. Tokenized on its own, it
        would get start-of-text treatment (SentencePiece/Metaspace tokenizers such as Mistral and
        Phi-3 prepend '▁': 'Hi' becomes '▁Hi', which the joint text never produces). Putting a
        special token in front splits the text there, so the completion is tokenized exactly as in
        the middle of a text; the anchor's id is then dropped (returned count).
        """
        anchor = self._anchor
        texts: list[str] = []
        drop: list[int] = []
        for row in rows:
            text = getattr(row, half)
            if anchor and row.prompt:
                texts.append(anchor + text)
                drop.append(1)
            else:
                texts.append(text)
                drop.append(0)
        return texts, drop

    def _boundary_mismatches(self, rows: list[_Texts]) -> list[bool]:
        """Does tokenizing prompt+completion as one text differ from prompt_ids + completion_ids?

        Trade-off: re-tokenizing every joint text would double the cost of tokenizing. Instead we
        re-tokenize a window of BOUNDARY_WINDOW_CHARS characters on each side of the boundary:
        tok(p + c) vs tok(p) + tok(c) (c behind the anchor, as tokenized for real), where p is the
        end of the prompt and c the start of the completion. The window's artificial edges affect
        both sides of that comparison alike, so only the boundary itself can make them differ. This
        is exact unless a single pre-token (or, for split-free SentencePiece BPE, a merge chain)
        longer than the window straddles the boundary. Cost: five short texts per row in one batched
        call, about 12% of tokenizing the rows themselves (measured on UltraFeedback rows, Qwen2.5).
        A window text met before in the batch is tokenized once: the pairs of one record of scored
        completions share their prompt's window and each completion's.
        """
        w = BOUNDARY_WINDOW_CHARS
        anchor = self._anchor
        slot: dict[str, int] = {}  # distinct window text -> its place in the batched call
        places: list[int] = []
        for row in rows:
            p = row.prompt[-w:]
            c_chosen, c_rejected = row.chosen[:w], row.rejected[:w]
            lead = anchor if (anchor and row.prompt) else ""
            for text in (p, lead + c_chosen, lead + c_rejected, p + c_chosen, p + c_rejected):
                places.append(slot.setdefault(text, len(slot)))
        encodings = self._backend.encode_batch_fast(list(slot), add_special_tokens=False)
        result: list[bool] = []
        for i, row in enumerate(rows):
            p, c, r, pc, pr = (encodings[k].ids for k in places[5 * i : 5 * i + 5])
            if anchor and row.prompt:
                c, r = c[1:], r[1:]
            result.append(pc != p + c or pr != p + r)
        return result






def _take(ids: list[Sequence[int]], index: int, drop: int) -> Sequence[int]:
    """ids[index] without its first `drop` ids (an anchor's). A huge text's array('i') is cut in
    place and its slot emptied, so that no second copy of it lives while the batch is finished."""
    taken = ids[index]
    if isinstance(taken, array):
        ids[index] = ()
        del taken[:drop]
        return taken
    return taken[drop:] if drop else taken


def _concat(head: Sequence[int], tail: Sequence[int]) -> Sequence[int]:
    """head + tail, an array('i') when either is one (a huge text's ids: tokenize.pieces)."""
    if isinstance(head, array) or isinstance(tail, array):
        joined = array("i", head)
        joined.extend(tail)
        return joined
    return list(head) + list(tail)


def _end_with_one_eos(ids: Sequence[int], eos: int | None, append: bool = True) -> Sequence[int]:
    """The completion ends once: a text that itself ends in the literal end token (twice or more)
    keeps one, so the trainer never learns a double end; EOS is appended when missing unless the
    template already ended the turn with its own end-of-turn token (`append=False`)."""
    if eos is None:
        return ids
    end = len(ids)
    while end >= 2 and ids[end - 1] == eos and ids[end - 2] == eos:
        end -= 1
    if end < len(ids):
        return ids[:end]
    if not append or (ids and ids[-1] == eos):
        return ids
    if isinstance(ids, array):  # a huge text's ids, made for this pair: grown in place, not copied
        ids.append(eos)
        return ids
    return ids + [eos]


def _set_loss_masks(tokenized: TokenizedPair, chosen_mask: list[int], rejected_mask: list[int], row: _Texts) -> None:
    """Each half's loss mask fitted to its final ids (an appended EOS belongs to the completion's last
    turn; truncation cuts the mask with the ids); a half left with no trained token: `no_trained_tokens`."""
    tokenized.chosen_loss_mask = fit_mask(chosen_mask, len(tokenized.chosen_ids), row.chosen_tail)
    tokenized.rejected_loss_mask = fit_mask(rejected_mask, len(tokenized.rejected_ids), row.rejected_tail)
    _flag_untrained(tokenized)


def _flag_untrained(tokenized: TokenizedPair) -> None:
    """`no_trained_tokens` when a half's loss mask has no 1 past its loss start."""
    for mask, start in ((tokenized.chosen_loss_mask, tokenized.chosen_loss_start),
                        (tokenized.rejected_loss_mask, tokenized.rejected_loss_start)):
        if mask is not None and not any(mask[start or 0 :]) and F.NO_TRAINED_TOKENS not in tokenized.flags:
            tokenized.flags.append(F.NO_TRAINED_TOKENS)


def _set_loss_starts(tokenized: TokenizedPair, chosen_start: int, rejected_start: int) -> None:
    """Record the reasoning tokens kept out of the loss (clamped to what truncation left); a half
    left with no answer token has nothing to learn from: `no_completion_tokens`."""
    tokenized.chosen_loss_start = min(chosen_start, len(tokenized.chosen_ids))
    tokenized.rejected_loss_start = min(rejected_start, len(tokenized.rejected_ids))
    if (
        tokenized.chosen_loss_start == len(tokenized.chosen_ids)
        or tokenized.rejected_loss_start == len(tokenized.rejected_ids)
    ) and F.NO_COMPLETION_TOKENS not in tokenized.flags:
        tokenized.flags.append(F.NO_COMPLETION_TOKENS)
