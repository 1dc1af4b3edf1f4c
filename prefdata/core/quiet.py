"""Third-party noise off while a prefdata command runs quietly.

transformers ("Loading weights", "Writing model shards", advisory warnings), datasets ("Saving the
dataset") and huggingface_hub draw their own progress bars and log warnings that prefdata's
`--no-progress` does not reach. `quiet_libraries` turns them off for the duration of a command when
prefdata's own bars are off or stderr is not a terminal, unless PREFDATA_DEBUG is set.

Libraries not yet imported read environment variables at import (cheap: nothing is imported here);
libraries already imported (a Python caller's) are switched by their own toggles, and both are put
back afterwards.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# Read by the libraries when they are imported (transformers takes its bar default from the hub's).
_ENV = {
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def wants_quiet(progress: bool | None) -> bool:
    """Quiet when prefdata's own bars are off (`--no-progress`) or stderr is not a terminal."""
    if os.environ.get("PREFDATA_DEBUG"):
        return False
    return progress is False or not sys.stderr.isatty()


def bar_disable(enabled: bool) -> bool | None:
    """tqdm's `disable` for every prefdata bar: off when asked (`--no-progress`), else None, tqdm's own
    test: no bar when its stream is not a terminal, so a redirected stderr or a CI log gets no bar
    redraws (prepare and validate always did this; refs, train and online now do too)."""
    return None if enabled else True


@contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """Hide transformers/datasets/huggingface_hub bars and warnings inside the block when `quiet`."""
    if not quiet:
        yield
        return
    saved_env = {name: os.environ.get(name) for name in _ENV}
    for name, value in _ENV.items():
        os.environ.setdefault(name, value)  # a value the user set wins
    restore = [_silence_imported(name) for name in ("transformers", "datasets", "huggingface_hub")]
    try:
        yield
    finally:
        for undo in restore:
            undo()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _silence_imported(module: str) -> Callable[[], None]:
    """Switch off an already imported library's bars (and transformers' warnings); returns the undo."""
    if module not in sys.modules:
        return lambda: None
    if module == "transformers":
        from transformers.utils import logging as tf_logging

        bars, verbosity = tf_logging.is_progress_bar_enabled(), tf_logging.get_verbosity()
        tf_logging.disable_progress_bar()
        tf_logging.set_verbosity_error()

        def undo_transformers() -> None:
            tf_logging.set_verbosity(verbosity)
            if bars:
                tf_logging.enable_progress_bar()

        return undo_transformers
    if module == "datasets":
        import datasets

        return _toggle(datasets.is_progress_bar_enabled(), datasets.disable_progress_bars, datasets.enable_progress_bars)
    from huggingface_hub import utils as hub_utils

    return _toggle(not hub_utils.are_progress_bars_disabled(), hub_utils.disable_progress_bars,
                   hub_utils.enable_progress_bars)


def _toggle(enabled: bool, disable: Callable[[], Any], enable: Callable[[], Any]) -> Callable[[], None]:
    disable()
    return (lambda: enable()) if enabled else (lambda: None)
