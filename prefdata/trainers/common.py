"""What every trainer adapter returns (prefdata.core.trainer_names lists the adapters): the trainer's
pairs as it will train on them, and prefdata's findings on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainerHalf:
    """One half as the trainer feeds it to its loss: the full ids (prompt + response) and the loss mask."""

    ids: list[int]
    loss_mask: list[int]  # 1 where the token's log-prob counts in the trainer's DPO loss

    @property
    def trained(self) -> list[int]:
        return [t for t, m in zip(self.ids, self.loss_mask) if m]


@dataclass
class TrainerPair:
    """A pair as the trainer trains on it. Adapters may return their own classes with these attributes
    (`prompt_len`, `chosen`/`rejected` with `.ids` and `.trained`)."""

    prompt_len: int  # tokens before the chosen half's first trained position, as the trainer counts them
    chosen: TrainerHalf
    rejected: TrainerHalf


@dataclass
class TrainerFinding:
    flag: str  # a prefdata flag name: its severity comes from the check policy
    row: int  # position of the row in the input
    detail: str
    cause: str  # the trainer setting behind it, as typed to the trainer
    fix: int | str  # an int: the smallest length setting that avoids it (TrainerRun.length_fix); a str: what does, in words


@dataclass
class TrainerRun:
    """One trainer's preprocessing of the rows, and prefdata's checks on it."""

    trainer: str
    version: str  # the trainer's installed version
    tested_version: str  # the version prefdata's tests run
    settings: list[str]  # the settings in effect, as the user types them to the trainer
    rows: int
    pairs: dict[int, Any]  # row position -> TrainerPair (or an adapter's class with the same attributes)
    dropped: int  # rows the trainer drops
    findings: list[TrainerFinding]
    tokenizer: Any  # decodes the trainer's ids (the comparison shows tokens)
    length_fix: str = "{}"  # how an int `fix` reads as a setting, e.g. "--data.max_len {}"
    notes: list[str] = field(default_factory=list)  # what the run could not see or do, in words
