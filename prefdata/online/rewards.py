"""Scorers: a reward model (sequence classification, its own tokenizer and chat template) or a
reward function following TRL's convention `f(prompts, completions, **kwargs) -> list[float]`.

Both take prompts as given (a string or a message list) and completions (a string, or a message
list for offline conversational pairs), and return one float per row (NaN: no reward).

Reward model, TRL's convention: the conversation (prompt messages, or a string prompt as one user
turn, then the completion as assistant turn(s)) is rendered with the reward model's chat template
(`apply_chat_template(messages, tokenize=False)`) and tokenized without special tokens; the score is
the model's single output logit. A reward tokenizer without a chat template scores prompt +
completion as plain text, as TRL does for string prompts.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.records import Message

Completion = str | list[Message]


def as_messages(prompt: str | list[Message], completion: Completion) -> list[Message]:
    head = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    tail = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
    return [*head, *tail]


def _plain(value: str | list[Message]) -> str:
    if isinstance(value, str):
        return value
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in value)


class RewardModelScorer:
    """Scores conversations with a local sequence-classification model with one output."""

    def __init__(self, path: str | Path, *, device: str = "auto", batch_size: int = 8, trust_remote_code: bool = False):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from prefdata.online.generate import resolve_device

        if not Path(path).is_dir():
            raise PrefdataError(f"--reward-model {path} is not a local model directory")
        if batch_size < 1:
            raise PrefdataError("--batch-size must be at least 1")
        self.device = resolve_device(device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                str(path), dtype=torch.bfloat16 if self.device.startswith("cuda") else torch.float32,
                trust_remote_code=trust_remote_code,
            )
        except (OSError, ValueError) as exc:
            raise PrefdataError(f"cannot load a reward model from {path}: {str(exc).splitlines()[0]}") from None
        if self.model.config.num_labels != 1:
            raise PrefdataError(f"--reward-model {path} has {self.model.config.num_labels} outputs; a reward model has 1")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        if self.model.config.pad_token_id is None:  # the model finds each row's last token by its pad id
            self.model.config.pad_token_id = self.pad_id
        self.model.to(self.device).eval()
        self.batch_size = batch_size

    def texts(self, prompts: Sequence[str | list[Message]], completions: Sequence[Completion]) -> list[str]:
        """What the reward model reads, one text per row."""
        if not self.tokenizer.chat_template:
            return [_plain(p) + _plain(c) for p, c in zip(prompts, completions)]
        conversations = [as_messages(p, c) for p, c in zip(prompts, completions)]
        return list(self.tokenizer.apply_chat_template(conversations, tokenize=False))

    def __call__(self, prompts: Sequence[str | list[Message]], completions: Sequence[Completion],
                 columns: dict[str, list[Any]] | None = None) -> list[float]:
        import torch

        ids = self.tokenizer(self.texts(prompts, completions), add_special_tokens=False)["input_ids"]
        scores = [math.nan] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch: less padding
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            width = max(len(ids[i]) for i in rows)
            batch = torch.tensor([ids[i] + [self.pad_id] * (width - len(ids[i])) for i in rows], device=self.device)
            mask = torch.tensor([[1] * len(ids[i]) + [0] * (width - len(ids[i])) for i in rows], device=self.device)
            with torch.inference_mode():
                logits = self.model(input_ids=batch, attention_mask=mask).logits[:, 0].float().tolist()
            for i, value in zip(rows, logits):
                scores[i] = value
        return scores


class RewardFunctionScorer:
    """A Python reward function `NAME` from `FILE.py`, called as TRL calls reward functions."""

    def __init__(self, spec: str):
        self.function = load_reward_function(spec)
        self.spec = spec

    def __call__(self, prompts: Sequence[str | list[Message]], completions: Sequence[Completion],
                 columns: dict[str, list[Any]] | None = None) -> list[float]:
        # TRL passes message-list completions next to conversational prompts.
        shaped = [
            ([{"role": "assistant", "content": c}] if isinstance(p, list) and isinstance(c, str) else c)
            for p, c in zip(prompts, completions)
        ]
        try:
            values = self.function(prompts=list(prompts), completions=shaped, **(columns or {}))
        except Exception as exc:  # noqa: BLE001 -- user code may raise anything: one line, no traceback
            raise PrefdataError(f"--reward-fn {self.spec} raised {type(exc).__name__}: {exc}") from None
        if not isinstance(values, (list, tuple)) or len(values) != len(prompts):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            raise PrefdataError(f"--reward-fn {self.spec} must return a list of {len(prompts)} floats, got {got}")
        out: list[float] = []
        for value in values:
            if value is None:  # TRL: None means "no reward for this one"
                out.append(math.nan)
            elif isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's scalars are Real
                raise PrefdataError(f"--reward-fn {self.spec} returned {type(value).__name__}, not a number")
            else:
                try:
                    out.append(float(value))
                except OverflowError:  # an int beyond any float is no reward, as NaN is
                    out.append(math.nan)
        return out


def load_reward_function(spec: str) -> Callable[..., Any]:
    """`FILE.py:NAME` -> the callable NAME defined in FILE.py."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise PrefdataError(f"--reward-fn {spec!r}: expected FILE.py:NAME")
    path = Path(path_text)
    if not path.is_file():
        raise PrefdataError(f"--reward-fn {spec!r}: no such file {path}")
    module_spec = importlib.util.spec_from_file_location(f"prefdata_reward_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise PrefdataError(f"--reward-fn {spec!r}: cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 -- user code may raise anything: one line, no traceback
        raise PrefdataError(f"--reward-fn {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise PrefdataError(f"--reward-fn {spec!r}: {path} defines no function {name!r}")
    params = inspect.signature(function).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_kwargs or "prompts" not in params or "completions" not in params:
        raise PrefdataError(f"--reward-fn {spec!r}: must be f(prompts, completions, **kwargs) (TRL's convention)")
    return function
