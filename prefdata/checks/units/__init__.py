"""Every check, one module each: its flag's name, default severity, meaning, hint and where it is raised.

A module of this folder holds one `CHECK = Check(...)`. The rest is made from them, so a flag's words
live in one place: `core/flags.py` (the names and their order), `policies/default.toml`'s `[flags]` and
docs/checks.md's flag table are generated (`python -m prefdata.checks.generated`), and the report legends
(`report.render_common.FLAG_MEANINGS`) and the drop-cause hints (`report.hints`) read `CHECKS`.
tests/checks/test_units.py fails while any of them disagrees, or while a flag is raised in a function
its check does not name. docs/architecture.md, "Adding a check", says how to add one.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Optional

if TYPE_CHECKING:
    from prefdata.checks.policy import Severity
    from prefdata.core.records import Pair, TokenizedPair

# A check that is one function of a pair and its final token ids (None without a tokenizer).
PairTest = Callable[["Pair", Optional["TokenizedPair"]], bool]

# What a user changes to keep the pairs a flag removes, when it is a run's main drop cause (report.hints):
# "length" the length budget (--max-length / --max-prompt-length, worked out from the run's settings),
# "template" the chat template (report.hints.template_advice), "setting" the check's own `setting` and
# `hint`, "data" nothing but the data (or a policy that accepts losing them).
Cause = Literal["data", "length", "template", "setting"]


@dataclass(frozen=True)
class Check:
    """One check. `raised_by`: the functions ("module:function") that add the flag to a pair; where a
    flag is found inside a pipeline step (tokenization, truncation) the step's own function is named."""

    name: str  # the stable flag name that rows, policies and reports carry
    order: int  # its place in flags.ALL_FLAGS: rows list their flags in this order (a new check: the next number)
    severity: Severity  # in the default policy
    meaning: str  # one line: the report legends' words
    raised_by: tuple[str, ...]
    doc: str = ""  # the docs/checks.md table's words, where they say more than `meaning` (Markdown)
    tokens: bool = False  # needs token ids (computed only with a tokenizer, or on pre-tokenized rows)
    cause: Cause = "data"
    setting: str = "max_dropped_share"  # the setting report.hints names (cause "setting"; "data": this one)
    hint: str = ""  # why that setting keeps the pairs (cause "setting"); "data" says the generic words
    rank: int = 5  # on a tie in rows between drop causes, the lower rank is named (it causes the other)
    note: str = ""  # the comment beside it in default.toml
    # A check that is one function of the pair: checks.checker.pair_flags runs it for every pair, in every
    # path (prepare, validate, each engine), so the unit is the whole check. Named in `raised_by` too.
    test: PairTest | None = None

    def advice(self) -> str:
        """The hint's words for cause "setting" and "data" (report.hints.keep_setting)."""
        return self.hint or data_advice(self.name)


def data_advice(flag: str) -> str:
    """What keeps pairs that no setting makes trainable: the data fixed, or the loss accepted."""
    return (f"the pairs themselves are {flag}: fix the data (see dropped.jsonl), or raise max_dropped_share in a "
            "policy if losing them is expected")


def _discover() -> tuple[Check, ...]:
    """Every module of this folder's CHECK, in `order`."""
    found = [importlib.import_module(f"{__name__}.{module.name}").CHECK for module in pkgutil.iter_modules(__path__)]
    return tuple(sorted(found, key=lambda check: check.order))


CHECKS: tuple[Check, ...] = _discover()
BY_NAME: dict[str, Check] = {check.name: check for check in CHECKS}
# (flag, test) of the checks that are one function of a pair: what pair_flags runs for every pair.
PAIR_TESTS: tuple[tuple[str, PairTest], ...] = tuple((check.name, check.test) for check in CHECKS if check.test)
