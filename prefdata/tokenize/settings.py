"""How pairs are tokenized and truncated (`TokenizeSettings`), checked once when made."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefdata.core.errors import PrefdataError
from prefdata.io.images import ImageAccess
from prefdata.tokenize.template import TemplateSettings
from prefdata.tokenize.turns import TRAIN_TURNS

LOSS_ON = ("all", "answer")


@dataclass
class TokenizeSettings:
    """How pairs are tokenized and truncated.

    max_length: prompt + completion, per half. max_prompt_length: the prompt alone.
    chat_template: render plain-string rows through the chat template (one user + one assistant turn).
    template: template variables, a replacement template and the pinned date (tokenize.template).
    loss_on: "all" completion tokens, or only the "answer" (a leading reasoning block stays in the
    sequence, out of the loss: TokenizedPair.*_loss_start).
    train_turns: in completions that hold turns the model did not write (agent trajectories, multi-turn
    transcripts), "all" assistant turns are in the loss or only the "last" (TokenizedPair.*_loss_mask).
    """

    max_length: int | None = None
    max_prompt_length: int | None = None
    chat_template: bool = False
    template: TemplateSettings = field(default_factory=TemplateSettings)
    loss_on: str = "all"
    train_turns: str = "all"
    images: ImageAccess = field(default_factory=ImageAccess)  # where image paths may be read from

    def __post_init__(self) -> None:
        if self.loss_on not in LOSS_ON:
            raise PrefdataError(f"--loss-on must be one of {', '.join(LOSS_ON)}, got {self.loss_on!r}")
        if self.train_turns not in TRAIN_TURNS:
            raise PrefdataError(f"--train-turns must be one of {', '.join(TRAIN_TURNS)}, got {self.train_turns!r}")
        for name in ("max_length", "max_prompt_length"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise PrefdataError(f"{name} must be a positive integer, got {value!r}")
        if (
            self.max_length is not None
            and self.max_prompt_length is not None
            and self.max_prompt_length >= self.max_length
        ):
            raise PrefdataError(
                f"max_prompt_length ({self.max_prompt_length}) must be smaller than max_length "
                f"({self.max_length}) so that completions keep at least one token"
            )
