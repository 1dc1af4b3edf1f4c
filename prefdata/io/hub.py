"""RAW as a Hugging Face Hub dataset id with a split: `org/name:train_prefs` (or `org/name@REV:split`).

Rows stream through `datasets.load_dataset(..., streaming=True)`, so nothing is downloaded in full
before reading starts; image columns come as their encoded bytes (the workers decode them). As
`datasets` does, a local directory named `org/name` is read in place of the Hub repository (tests
use one laid out like a Hub dataset repo). The manifest records the id, the split and the revision
that was read.
"""

from __future__ import annotations

import re
from contextlib import contextmanager, nullcontext
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


# What a local data file's name ends with: `data/train.jsonl:train` is a path, never a Hub repository.
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".csv", ".tsv", ".txt", ".gz", ".zst", ".bz2", ".xz")
PROBE_TIMEOUT_S = 10.0


def parse_hub_id(raw: str | Path) -> HubSource | None:
    """The Hub source RAW names, or None when RAW is a path: an existing path always wins, and so does
    one that looks like a file path (its name ends like a data file, or its first part is a local
    directory without the repository in it), which then reads as a path that is not found."""
    text = str(raw)
    if Path(text).exists():
        return None
    match = _HUB_ID.match(text)
    if match is None or _looks_like_a_path(match["repo"]):
        return None
    return HubSource(match["repo"], match["split"], match["revision"])


def _looks_like_a_path(repo: str) -> bool:
    owner = repo.split("/", 1)[0]
    local_owner = Path(owner).is_dir() and not Path(repo).is_dir()  # a local `org/name` repo stays a Hub id
    return repo.lower().endswith(_FILE_SUFFIXES) or local_owner


def _hub_unreachable(source: HubSource) -> str | None:
    """Why the Hub cannot be reached (one probe, no retries, a short timeout), or None when it answers
    (whatever it answers: a missing or gated repository is then load_dataset's one line to give)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        HfApi().dataset_info(source.repo, revision=source.revision, timeout=PROBE_TIMEOUT_S)
    except HfHubHTTPError:
        return None
    except Exception as exc:  # noqa: BLE001 - no network, DNS, proxy, timeout: all say the same to the user
        return f"{type(exc).__name__}: {first_line(exc)}"
    return None


@contextmanager
def _offline() -> Iterator[None]:
    """The libraries' offline mode for the block: the local cache only, no retries (a run without network
    used to retry for half a minute, printing a dozen lines, before its one-line error)."""
    import datasets.config
    import huggingface_hub.constants

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _open(source: HubSource) -> Any:
    import datasets
    import datasets.config

    local = Path(source.repo).is_dir() or datasets.config.HF_HUB_OFFLINE
    unreachable = None if local else _hub_unreachable(source)
    try:
        with _offline() if unreachable else nullcontext():
            dataset = datasets.load_dataset(source.repo, split=source.split, revision=source.revision, streaming=True)
        # Image columns stay encoded ({"bytes", "path"}, as Parquet holds them): the workers decode them.
        return dataset.decode(False)
    except Exception as exc:  # noqa: BLE001 - datasets/hub raise many types; the user needs one line
        if unreachable:
            raise PrefdataError(f"cannot read the Hub dataset {source.name}: the Hub cannot be reached ({unreachable}) "
                                "and the split is not in the local cache") from None
        raise PrefdataError(f"cannot read the Hub dataset {source.name}: {first_line(exc)}") from None


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
