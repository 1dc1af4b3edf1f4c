"""`prefdata export OUT DIR --trainer NAME`: OUT's kept pairs in that trainer's own input format, written
by the trainer's export module (prefdata.core.trainer_names.TRAINER_EXPORTS)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.trainer_names import EXPORT_TRAINERS, TRAINER_EXPORTS
from prefdata.settings.commands import ExportSettings
from prefdata.settings.declare import settings_command


@settings_command(ExportSettings)  # settings=ExportSettings(...) or flat keywords: prefdata.settings
def export_for_trainer(out_dir: str | Path, export_dir: str | Path, settings: ExportSettings) -> Any:
    """Write OUT's kept pairs into DIR in `trainer`'s input format, with what it needs to read them;
    the result's `.summary()` says what was written and what the trainer cannot read."""
    if settings.trainer not in EXPORT_TRAINERS:
        raise PrefdataError(f"--trainer must be one of {', '.join(EXPORT_TRAINERS)}, got {settings.trainer!r}")
    module = importlib.import_module(TRAINER_EXPORTS[settings.trainer])
    return module.export(out_dir, export_dir, settings.trainer_args, settings.overwrite)
