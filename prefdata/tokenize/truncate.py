"""Truncation of one tokenized pair: the prompt from the left, completions from the right, an image
never cut, and the flags that say what was lost. Pure; pre-tokenized rows go through it too."""

from __future__ import annotations

from array import array
from typing import Sequence

from prefdata.core import flags as F
from prefdata.core.records import TokenizedPair
from prefdata.tokenize.settings import TokenizeSettings


def truncate_pair(
    prompt_ids: Sequence[int],
    chosen_ids: Sequence[int],
    rejected_ids: Sequence[int],
    settings: TokenizeSettings,
    eos_token_id: int | None = None,
    image_spans: Sequence[tuple[int, int]] | None = None,
) -> TokenizedPair:
    """Truncate one pair and set the truncation flags. Pure; also used for pre-tokenized rows.

    `image_spans`: [start, end) of each image's expanded tokens in the prompt ids (image pairs).
    A left cut that would reach into one leaves the whole pair uncut instead (every image stays fully
    visible next to its placeholder; the pair is longer than max_length) and flags only
    `image_truncated` (dropped by default): TRL-style truncation would train it half-visible.

    The prompt is cut from the LEFT (its end, with the assistant turn header, survives), first to
    max_prompt_length, then to max_length. Completions are cut from the RIGHT so that
    prompt + completion <= max_length. Both halves keep the very same prompt ids.

    A prompt that alone fills max_length keeps max_length tokens and leaves 0 completion tokens:
    the pair is flagged `no_completion_tokens` (dropped by the default policy) rather than cut to a
    1-token completion, which would carry almost no preference signal. Every half that lost tokens
    from its end (its EOS first) is flagged `completion_truncated`.

    eos_token_id is what the completions end with when untruncated; truncation never re-appends it
    (the trainer must see that the answer was cut, not a fake end).
    """
    del eos_token_id  # documented above; the flags only depend on what was cut
    prompt, chosen, rejected = _own_ids(prompt_ids), _own_ids(chosen_ids), _own_ids(rejected_ids)
    lens_full = (len(prompt), len(chosen), len(rejected))
    result_flags: list[str] = []

    prompt_limit = settings.max_prompt_length
    if settings.max_length is not None:
        prompt_limit = settings.max_length if prompt_limit is None else min(prompt_limit, settings.max_length)
    if prompt_limit is not None and len(prompt) > prompt_limit:
        cut = len(prompt) - prompt_limit
        if image_spans and any(start < cut for start, _end in image_spans):
            # Left whole: a pair that cannot fit without cutting an image is not cut at all.
            return TokenizedPair(prompt, chosen, rejected, *lens_full, flags=[F.IMAGE_TRUNCATED])
        prompt = prompt[cut:]

    if settings.max_length is not None:
        budget = settings.max_length - len(prompt)
        if len(chosen) > budget or len(rejected) > budget:
            result_flags.append(F.COMPLETION_TRUNCATED)
            chosen_cut, rejected_cut = chosen[:budget], rejected[:budget]
            if chosen_cut == rejected_cut and chosen != rejected:
                result_flags.append(F.IDENTICAL_AFTER_TRUNCATION)
            chosen, rejected = chosen_cut, rejected_cut

    if not chosen or not rejected:
        result_flags.append(F.NO_COMPLETION_TOKENS)

    return TokenizedPair(
        prompt_ids=prompt,
        chosen_ids=chosen,
        rejected_ids=rejected,
        prompt_len_full=lens_full[0],
        chosen_len_full=lens_full[1],
        rejected_len_full=lens_full[2],
        flags=result_flags,
    )


def _own_ids(ids: Sequence[int]) -> Sequence[int]:
    """The ids as the pair keeps them: a copy as a list, or an array('i') taken as it is (a huge
    text's ids, which the tokenizer made for this pair: as Python ints they would cost 9x the
    memory, and a copy would be one more of the largest thing the run holds)."""
    return ids if isinstance(ids, array) else list(ids)
