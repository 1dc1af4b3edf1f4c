"""Image pair checks that need no processor.

With a processor, `image_mismatch` is decided on the rendered prompt (prefdata.tokenize.vision),
where the model's own placeholder text counts too. Without one (`validate` with no tokenizer), the
`{"type": "image"}` parts are the only placeholders known: a row that has some, in another number
than its images, is flagged; a row with none is left alone (its placeholders may be text).
"""

from __future__ import annotations

from prefdata.core import flags as F
from prefdata.core.records import Pair, TokenizedPair


def image_flags(pair: Pair, tokenized: TokenizedPair | None) -> list[str]:
    """`image_mismatch` of a pair the processor did not see; [] otherwise."""
    if tokenized is not None or not pair.image_parts:
        return []
    return [F.IMAGE_MISMATCH] if pair.image_parts != len(pair.images or ()) else []
