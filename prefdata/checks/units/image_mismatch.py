"""The `image_mismatch` check (prefdata.checks.units), and its test for pairs no processor saw.

With a processor, `image_mismatch` is decided on the rendered prompt (prefdata.tokenize.vision),
where the model's own placeholder text counts too. Without one (`validate` with no tokenizer), the
`{"type": "image"}` parts are the only placeholders known: a row that has some, in another number
than its images, is flagged; a row with none is left alone (its placeholders may be text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefdata.checks.units import Check

if TYPE_CHECKING:
    from prefdata.core.records import Pair, TokenizedPair


def mismatched(pair: Pair, tokenized: TokenizedPair | None) -> bool:
    """Whether a pair the processor did not see has image parts in another number than its images."""
    return tokenized is None and bool(pair.image_parts) and pair.image_parts != len(pair.images or ())


CHECK = Check(
    name="image_mismatch",
    order=23,
    severity="error",
    meaning="the prompt's image placeholders and the row's images differ in number",
    doc=(
        "an image pair's placeholders (image parts or the processor's own placeholder text, as rendered) and "
        "its images differ in number"
    ),
    raised_by=("prefdata.checks.units.image_mismatch:mismatched",
               "prefdata.tokenize.vision:VisionPairTokenizer._place_images"),
    note="placeholders and images differ in number: the model would misalign them",
    test=mismatched,
)
