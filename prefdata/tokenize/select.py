"""The tokenize stage a command's `--tokenizer` or `--processor` asks for.

A processor (image pairs, prefdata.tokenize.vision) carries its own tokenizer, so the two flags
exclude each other: given both, it is not clear which tokenizer the user meant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefdata.core.errors import PrefdataError
from prefdata.tokenize.settings import TokenizeSettings

if TYPE_CHECKING:  # imported when a tokenizer is loaded: text-only validate starts without it
    from prefdata.tokenize.pairs import PairTokenizer

BOTH_GIVEN = "--tokenizer and --processor exclude each other: give --processor PATH for image pairs (it holds its tokenizer), else --tokenizer PATH"


def select_pair_tokenizer(tokenizer: str | None, processor: str | None, settings: TokenizeSettings,
                          trust_remote_code: bool = False) -> PairTokenizer | None:
    """A loaded PairTokenizer (a VisionPairTokenizer for a processor), or None when neither is given."""
    if tokenizer and processor:
        raise PrefdataError(BOTH_GIVEN)
    if not (tokenizer or processor):
        return None
    from prefdata.tokenize.pairs import PairTokenizer

    if processor:
        from prefdata.tokenize.vision import VisionPairTokenizer

        pair_tokenizer: PairTokenizer = VisionPairTokenizer(str(processor), settings, trust_remote_code)
    elif tokenizer:
        pair_tokenizer = PairTokenizer(str(tokenizer), settings, trust_remote_code=trust_remote_code)
    else:
        return None
    pair_tokenizer.setup()
    return pair_tokenizer
