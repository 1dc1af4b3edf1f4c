"""RAW as a Hugging Face Hub dataset id with a split: `org/name:train_prefs` (or `org/name@REV:split`).

Rows stream through `datasets.load_dataset(..., streaming=True)`, so nothing is downloaded in full
before reading starts; image columns come as their encoded bytes (the workers decode them). As
`datasets` does, a local directory named `org/name` is read in place of the Hub repository (tests
use one laid out like a Hub dataset repo). The manifest records the id, the split and the revision
that was read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from prefdata.core.errors import PrefdataError, first_line
from prefdata.core.records import RawRecord
from prefdata.io.chunks import RecordsChunk

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?:(?P<split>[\w.-]+)$")


@dataclass(frozen=True)
class HubSource:
    repo: str
    split: str
    revision: str | None = None

    @property
    def name(self) -> str:
        """What rows carry as `source_file`."""
        return f"{self.repo}:{self.split}"


def parse_hub_id(raw: str | Path) -> HubSource | None:
    """The Hub source RAW names, or None when RAW is a path (an existing path always wins)."""
    text = str(raw)
    if Path(text).exists():
        return None
    match = _HUB_ID.match(text)
    if match is None:
        return None
    return HubSource(match["repo"], match["split"], match["revision"])


def _open(source: HubSource) -> Any:
    import datasets

    try:
        dataset = datasets.load_dataset(source.repo, split=source.split, revision=source.revision, streaming=True)
        # Image columns stay encoded ({"bytes", "path"}, as Parquet holds them): the workers decode them.
        return dataset.decode(False)
    except Exception as exc:  # noqa: BLE001 - datasets/hub raise many types; the user needs one line
        first = first_line(exc)
        raise PrefdataError(f"cannot read the Hub dataset {source.name}: {first}") from None


def iter_hub_records(source: HubSource) -> Iterator[RawRecord]:
    """Every row of the split as a RawRecord (`source_line` = 1-based row index), streamed."""
    count = 0
    for count, row in enumerate(_open(source), start=1):
        yield RawRecord(source.name, count, value=dict(row))
    if count == 0:
        raise PrefdataError(f"{source.name}: the split holds no rows (nothing to read)")


def iter_hub_chunks(source: HubSource, max_lines: int) -> Iterator[RecordsChunk]:
    """The split's rows as the engine's work units (chunks of records read here, like Parquet)."""
    batch: list[RawRecord] = []
    for record in iter_hub_records(source):
        batch.append(record)
        if len(batch) >= max_lines:
            yield RecordsChunk(source.name, batch)
            batch = []
    if batch:
        yield RecordsChunk(source.name, batch)


def hub_input(source: HubSource) -> dict[str, Any]:
    """The manifest's `inputs` entry: the id, the split and the revision read (a commit sha when the
    Hub answers; a local directory records its path instead)."""
    entry: dict[str, Any] = {"hub_id": source.repo, "split": source.split, "revision": source.revision}
    local = Path(source.repo)
    if local.is_dir():
        entry["local_path"] = str(local.resolve())
        return entry
    try:
        from huggingface_hub import HfApi

        entry["revision"] = HfApi().dataset_info(source.repo, revision=source.revision).sha
    except Exception:  # noqa: BLE001 - offline: keep the revision that was asked for
        pass
    return entry
