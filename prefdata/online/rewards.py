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

import copy
import importlib.util
import inspect
import math
import numbers
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError, first_line
from prefdata.core.records import Message

Completion = str | list[Message]
DEFAULT_REWARD_TIMEOUT = 300.0  # seconds per reward-function call (--reward-timeout)


class _TimedOut(BaseException):
    """Raised inside user code when its time is up (BaseException: an `except Exception` there keeps
    it from being swallowed)."""


def call_user_code(call: Callable[[], Any], what: str, timeout: float | None) -> Any:
    """`call()`'s result. Whatever user code does instead, raise, `sys.exit(...)` or run past `timeout`
    seconds, is one PrefdataError line naming `what` (exit 2); Ctrl-C stays Ctrl-C."""
    try:
        return _within(call, timeout)
    except KeyboardInterrupt:
        raise
    except _TimedOut:
        raise PrefdataError(f"{what} did not return within {timeout:g} s (--reward-timeout)") from None
    except SystemExit as exc:
        raise PrefdataError(f"{what} called sys.exit({exc.code!r}): a reward function returns its rewards") from None
    except BaseException as exc:  # noqa: BLE001 -- user code may raise anything: one line, no traceback
        raise PrefdataError(f"{what} raised {type(exc).__name__}: {first_line(exc)}") from None


def _within(call: Callable[[], Any], timeout: float | None) -> Any:
    """`call()`, stopped after `timeout` seconds: by SIGALRM in the main thread (the call itself is
    interrupted), else by waiting on a daemon thread that is then left behind."""
    if not timeout:
        return call()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def time_up(signum: int, frame: Any) -> None:
            raise _TimedOut()

        previous = signal.signal(signal.SIGALRM, time_up)
        started = time.monotonic()
        outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer_delay > 0:  # a timer the caller had set keeps running (what is left of it)
                left = max(outer_delay - (time.monotonic() - started), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, outer_interval)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name="prefdata-reward-fn")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise _TimedOut()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


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
    """A Python reward function `NAME` from `FILE.py`, called as TRL calls reward functions, each call
    (and the file's import) within `timeout` seconds (None: no limit)."""

    def __init__(self, spec: str, timeout: float | None = DEFAULT_REWARD_TIMEOUT):
        self.spec, self.timeout = spec, timeout
        self.function = load_reward_function(spec, timeout)

    def __call__(self, prompts: Sequence[str | list[Message]], completions: Sequence[Completion],
                 columns: dict[str, list[Any]] | None = None) -> list[float]:
        # TRL passes message-list completions next to conversational prompts.
        shaped = [
            ([{"role": "assistant", "content": c}] if isinstance(p, list) and isinstance(c, str) else c)
            for p, c in zip(prompts, completions)
        ]
        # Copies: a function that edits its arguments (a prompt it rewrites) must not change what is stored.
        arguments = copy.deepcopy({**(columns or {}), "prompts": list(prompts), "completions": shaped})
        values = call_user_code(lambda: self.function(**arguments), f"--reward-fn {self.spec}", self.timeout)
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


def load_reward_function(spec: str, timeout: float | None = DEFAULT_REWARD_TIMEOUT) -> Callable[..., Any]:
    """`FILE.py:NAME` -> the callable NAME defined in FILE.py (imported within `timeout` seconds)."""
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
    loader = module_spec.loader
    call_user_code(lambda: loader.exec_module(module), f"--reward-fn {spec!r}: importing {path}", timeout)
    function = getattr(module, name, None)
    if not callable(function):
        raise PrefdataError(f"--reward-fn {spec!r}: {path} defines no function {name!r}")
    params = inspect.signature(function).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_kwargs or "prompts" not in params or "completions" not in params:
        raise PrefdataError(f"--reward-fn {spec!r}: must be f(prompts, completions, **kwargs) (TRL's convention)")
    return function
