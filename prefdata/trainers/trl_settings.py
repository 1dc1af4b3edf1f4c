"""`--trainer trl --trainer-arg NAME=VALUE`: the DPOConfig settings TRL's DPOTrainer reads when it prepares
and collates the data, in DPOConfig's own names, with DPOConfig's own defaults (read from its dataclass
fields, not copied here). Every other name is refused in one line that lists these.

The DPOConfig that TRL's code receives is built by TRL's own `DPOConfig(...)` (its `__post_init__` checks
and resolves the values, e.g. `pad_to_multiple_of="auto"`), with the training-only settings that fail on
a CPU machine (`bf16`) switched off: they change nothing TRL tokenizes.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from prefdata.core.errors import PrefdataError

TESTED_VERSION = "1.16.0"
INSTALL = 'pip install "prefdata[trl]"'

# DPOConfig fields that TRL 1.16's DPOTrainer reads to prepare or collate text pairs (`_prepare_dataset`,
# `DataCollatorForPreference`, the padding-free switch in `__init__`).
READ = ("max_length", "truncation_mode", "padding_free", "pad_to_multiple_of", "pad_token", "dataset_num_proc")
# ... and what each one changes in the ids and masks the loss sees.
EFFECT = {
    "padding_free": "TRL 1.16's DPOTrainer warns and falls back to padding (padding_free=False); the ids are the same",
    "pad_to_multiple_of": "pads the batch only; the padding is outside the attention and loss masks",
    "pad_token": "pads the batch only; the padding is outside the attention and loss masks",
    "dataset_num_proc": "the number of processes TRL's map uses; prefdata runs it in-process (the same ids)",
}
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_NONE = ("none", "null")


def dpo_config_class() -> type:
    try:
        from trl import DPOConfig
    except ImportError as error:
        raise PrefdataError(f"--trainer trl runs TRL's own data preparation, which is not importable ({error}); "
                            f"install it: {INSTALL}") from None
    return DPOConfig


def trl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return "unknown"


def _defaults() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(dpo_config_class()) if f.name in READ}


@dataclass(frozen=True)
class TRLSettings:
    """The --trainer-arg values given (by DPOConfig name); the rest keep DPOConfig's defaults."""

    given_values: dict[str, Any] = field(default_factory=dict)

    def value(self, name: str) -> Any:
        if name in self.given_values:
            return self.given_values[name]
        spec = _defaults()[name]
        return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default  # type: ignore[misc]

    @property
    def max_length(self) -> int | None:
        return self.value("max_length")

    @property
    def truncation_mode(self) -> str:
        return self.value("truncation_mode")

    def flag(self, name: str, value: Any = dataclasses.MISSING) -> str:
        """The setting as a user writes it in DPOConfig(...), e.g. `max_length=64`."""
        value = self.value(name) if value is dataclasses.MISSING else value
        return f"{name}={value!r}"

    def cause(self) -> str:
        """The settings that truncate: max_length, with truncation_mode where it is not the default."""
        if self.truncation_mode == "keep_start":
            return self.flag("max_length")
        return f"{self.flag('max_length')} with {self.flag('truncation_mode')}"

    def given(self) -> list[str]:
        """max_length and truncation_mode always, then every other setting given."""
        return [self.flag(name) for name in READ
                if name in ("max_length", "truncation_mode") or name in self.given_values]

    def with_values(self, **values: Any) -> "TRLSettings":
        return TRLSettings({**self.given_values, **values})

    def dpo_config(self) -> tuple[Any, list[str]]:
        """TRL's own DPOConfig with these values, and the warnings its __post_init__ gives about them
        (e.g. keep_end's deprecation). TRL's ValueError is one line (exit 2)."""
        DPOConfig = dpo_config_class()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                config = DPOConfig(output_dir="prefdata-trl-unused", use_cpu=True, bf16=False, report_to="none",
                                   **self.given_values)
            except (ValueError, TypeError) as error:
                raise PrefdataError(f"--trainer trl: DPOConfig refuses {' '.join(self.given())}: "
                                    f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
        about = [str(w.message) for w in caught
                 if any(f"'{value}'" in str(w.message) or f"`{name}`" in str(w.message)
                        for name, value in self.given_values.items())]
        return config, about


def _parse_value(name: str, text: str, item: str) -> Any:
    text = text.strip().strip("'\"")
    if name == "max_length":
        if text.lower() in _NONE:
            return None
        if not text.isdigit() or int(text) < 1:
            raise PrefdataError(f"--trainer-arg {item!r}: expected a positive integer or None")
        return int(text)
    if name == "truncation_mode":
        choices = _defaults()[name].metadata.get("choices") or ["keep_end", "keep_start"]
        if text not in choices:
            raise PrefdataError(f"--trainer-arg {item!r}: expected one of {', '.join(choices)}")
        return text
    if name == "padding_free":
        if text.lower() not in _BOOLS:
            raise PrefdataError(f"--trainer-arg {item!r}: expected true or false")
        return _BOOLS[text.lower()]
    if name in ("pad_to_multiple_of", "dataset_num_proc"):
        if text.lower() in _NONE:
            return None
        if name == "pad_to_multiple_of" and text == "auto":
            return text
        if not text.isdigit() or int(text) < 1:
            raise PrefdataError(f"--trainer-arg {item!r}: expected a positive integer or None")
        return int(text)
    return None if text.lower() in _NONE else text  # pad_token


def parse_trl_args(items: list[str] | None) -> TRLSettings:
    """`--trainer-arg max_length=1024` (repeatable; a leading `--` is fine; a bare `padding_free` is True).
    A name TRL's data preparation does not read is one line, exit 2, listing the names it reads."""
    known = _defaults()
    values: dict[str, Any] = {}
    for item in items or []:
        name, eq, text = item.strip().removeprefix("--").partition("=")
        name = name.strip()
        if name not in known:
            has = any(f.name == name for f in dataclasses.fields(dpo_config_class()))
            why = (f"{name} is a DPOConfig setting that does not change what TRL's data preparation makes"
                   if has else f"TRL {trl_version()}'s DPOConfig has no {name}")
            raise PrefdataError(f"--trainer-arg {item!r}: {why}; it reads {', '.join(READ)}")
        if not eq and name != "padding_free":
            raise PrefdataError(f"--trainer-arg {item!r}: expected {name}=VALUE")
        values[name] = _parse_value(name, text, item) if eq else True
    return TRLSettings(values)
