"""Mixtures: a TOML file that names several sources, each with a weight or a row count, and a seed.

    # mix.toml
    seed = 0                        # same seed, same mixture (default 0)
    rows = 10000                    # optional, with weights: the mixture's size (default: the largest
                                    # the sources allow at these shares)
    [[source]]
    name = "hh"                     # the `source` column (default: the file's stem)
    path = "data/hh.jsonl"          # a file, a directory, or a Hub id (org/name:split); relative
    weight = 0.7                    #   paths are read from the mix file's directory
    [[source]]
    name = "uf"
    path = "HuggingFaceH4/ultrafeedback_binarized:train_prefs"
    weight = 0.3

Every source gives a `weight` (a share of the mixture's records; weights need not sum to 1) or
every source gives `rows` (exactly that many records). A source's records are sampled without
replacement before any check: the `k` records whose keys are smallest (prefdata.sets.sampling, keys from
the seed, the source's name and the record's index in the source), so a worker keeps or skips a
record alone and every engine takes the same ones. A source with fewer records than asked is an
error (one line); nothing is upsampled. The records not sampled are not input rows of the mixture:
`records_in` counts the sampled ones (so does `rows_in`, unless a source holds scored completions,
whose records may make several pair rows: prefdata.io.ledger), and the manifest's `mix` section
keeps the ledger per source (available = sampled + not_sampled). Counting the records is one extra
read of each source (a newline scan for JSON lines; a Hub source is streamed twice).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from prefdata.core.errors import PrefdataError
from prefdata.io.chunks import Chunk, RecordSelection, iter_chunks, record_count
from prefdata.io.hub import HubSource, hub_input, iter_hub_chunks, parse_hub_id
from prefdata.io.manifest import sha256_file
from prefdata.io.readers import list_input_files
from prefdata.sets.sampling import TAKE_ALL, keep_mask, sample_base, threshold_of_range

SOURCE_COLUMN = "source"  # the column a mixture adds; an input's own `source` becomes `raw_source`
_TOP_KEYS = {"seed", "rows", "description", "source"}
_SOURCE_KEYS = {"name", "path", "weight", "rows"}


@dataclass(frozen=True)
class MixSource:
    name: str
    path: str  # as the mix file writes it (rows name their file after it)
    location: Path | None  # the file or directory read; None for a Hub source
    hub: HubSource | None
    weight: float | None
    rows: int | None


@dataclass(frozen=True)
class Mix:
    path: Path
    seed: int
    rows: int | None  # the mixture's size, with weights; None: the largest the sources allow
    sources: tuple[MixSource, ...]
    description: str = ""


def is_mix_file(raw: str | Path) -> bool:
    """RAW is a mix file: an existing `.toml` file (read_mix then wants a [[source]] table)."""
    path = Path(raw)
    return path.suffix.lower() == ".toml" and path.is_file()


def read_mix(path: str | Path) -> Mix:
    """The mix file at `path`, checked; any problem is one PrefdataError line naming the file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PrefdataError(f"{path}: not a readable TOML mix file ({exc})") from None

    def fail(message: str) -> PrefdataError:
        return PrefdataError(f"{path}: {message}")

    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (a mix file has {', '.join(sorted(_TOP_KEYS))}; see docs/building.md, 'Mixing sources')")
    tables = data.get("source")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise fail("no [[source]] table: a mix file names its sources in [[source]] tables with path and weight or rows")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise fail(f"seed = {seed!r}: must be an integer")
    total = data.get("rows")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 1):
        raise fail(f"rows = {total!r}: must be a positive integer")
    sources = [_source(path, table, i, fail) for i, table in enumerate(tables, start=1)]
    kinds = {"weight" if s.weight is not None else "rows" for s in sources}
    if len(kinds) > 1:
        raise fail("every source gives a weight, or every source gives rows; this file mixes the two")
    if total is not None and kinds == {"rows"}:
        raise fail("a top-level rows goes with weights; with per-source rows the mixture is their sum")
    _check_unique(sources, fail)
    description = data.get("description", "")
    return Mix(path, seed, total, tuple(sources), str(description))


def _source(mix_path: Path, table: dict[str, Any], index: int, fail: Any) -> MixSource:
    where = f"[[source]] #{index}"
    unknown = sorted(set(table) - _SOURCE_KEYS)
    if unknown:
        raise fail(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_SOURCE_KEYS))})")
    written = table.get("path")
    if not isinstance(written, str) or not written:
        raise fail(f"{where}: needs path = \"FILE, DIRECTORY or org/name:split\"")
    location = Path(written) if Path(written).is_absolute() else mix_path.parent / written
    hub = None if location.exists() else parse_hub_id(written)
    if hub is None and not location.exists():
        raise fail(f"{where}: {written}: no such file or directory (relative paths are read from the mix file's directory)")
    name = table.get("name", hub.repo.rsplit("/", 1)[-1] if hub else _stem(location))
    if not isinstance(name, str) or not name.strip():
        raise fail(f"{where}: name must be a non-empty string")
    weight, rows = table.get("weight"), table.get("rows")
    if (weight is None) == (rows is None):
        raise fail(f"{where} ({name}): give weight = SHARE or rows = N, one of the two")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                               or not math.isfinite(weight) or weight <= 0):
        raise fail(f"{where} ({name}): weight = {weight!r}: must be a number > 0")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise fail(f"{where} ({name}): rows = {rows!r}: must be a positive integer")
    return MixSource(name, written, None if hub else location, hub,
                     float(weight) if weight is not None else None, rows)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet", ".arrow"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _check_unique(sources: list[MixSource], fail: Any) -> None:
    names: set[str] = set()
    places: dict[str, str] = {}
    for source in sources:
        if source.name in names:
            raise fail(f"two sources are named {source.name!r}; names must differ (they fill the source column)")
        names.add(source.name)
        place = source.hub.name if source.hub else str(source.location.resolve())  # type: ignore[union-attr]
        if place in places:
            raise fail(f"sources {places[place]!r} and {source.name!r} read the same input {source.path}")
        places[place] = source.name


# --------------------------------------------------------------------------------------- planning


@dataclass
class SourcePlan:
    """One source's sample: how many records it has and takes, and the key threshold that takes them."""

    source: MixSource
    available: int
    sampled: int
    base: int
    threshold: int
    chunk_records: list[int] = field(default_factory=list)  # records per chunk, in reading order

    @property
    def share(self) -> float | None:
        return self.source.weight


@dataclass
class MixPlan:
    """A mixture ready to read: `chunks` yields every source's chunks, each with its RecordSelection."""

    mix: Mix
    sources: list[SourcePlan]
    max_lines: int
    max_bytes: int

    @property
    def rows_sampled(self) -> int:
        return sum(s.sampled for s in self.sources)

    def chunks(self) -> Iterator[Chunk]:
        for plan in self.sources:
            counts = plan.chunk_records
            first = seen = 0
            for chunk in _source_chunks(plan.source, self.max_lines, self.max_bytes):
                if seen >= len(counts):
                    raise PrefdataError(f"{plan.source.path} changed while it was read (source {plan.source.name!r})")
                chunk.selection = RecordSelection(plan.source.name, plan.base, plan.threshold, first)
                first += counts[seen]
                seen += 1
                yield chunk
            if seen != len(counts):
                raise PrefdataError(f"{plan.source.path} changed while it was read (source {plan.source.name!r})")

    def file_sources(self) -> dict[str, str]:
        """The `source_file` of each input file -> the name of its source (for the report)."""
        names: dict[str, str] = {}
        for plan in self.sources:
            for file_name in _file_names(plan.source):
                names[file_name] = plan.source.name
        return names

    def inputs(self) -> list[dict[str, Any]]:
        """The manifest's `inputs`: each file (size, sha256) or Hub split, with its source."""
        entries: list[dict[str, Any]] = [
            {"path": str(self.mix.path), "bytes": self.mix.path.stat().st_size, "sha256": sha256_file(self.mix.path),
             "role": "mix file"}
        ]
        for plan in self.sources:
            source = plan.source
            if source.hub is not None:
                entries.append({**hub_input(source.hub), "source": source.name})
                continue
            for file in list_input_files(source.location):  # type: ignore[arg-type]
                entries.append({"path": str(file), "bytes": file.stat().st_size, "sha256": sha256_file(file),
                                "source": source.name})
        return entries

    def record(self) -> dict[str, Any]:
        """The manifest's `mix` section: the settings and the ledger of what was sampled."""
        total_weight = sum(s.source.weight or 0.0 for s in self.sources)
        available = sum(s.available for s in self.sources)
        return {
            "file": str(self.mix.path),
            "seed": self.mix.seed,
            "rows": self.mix.rows,
            "sampling": "without replacement, before the checks: the records whose keys mix64(base + index) "
                        "are smallest (prefdata.sets.sampling; base = xxh3_64(seed, name))",
            "rows_available": available,
            "rows_sampled": self.rows_sampled,
            "rows_not_sampled": available - self.rows_sampled,
            "ledger": "records_in (and rows_in, where every record is one row: not for scored completions) counts "
                      "the sampled records only; per source available = sampled + not_sampled. "
                      "Records not sampled are not input rows of this OUT (they stay in their source; the seed "
                      "and the thresholds here select the same records again).",
            "sources": [
                {
                    "name": s.source.name, "path": s.source.path, "hub": s.source.hub.name if s.source.hub else None,
                    "weight": s.source.weight, "rows": s.source.rows,
                    "share": round(s.source.weight / total_weight, 6) if s.source.weight else None,
                    "available": s.available, "sampled": s.sampled, "not_sampled": s.available - s.sampled,
                    "threshold": s.threshold,
                }
                for s in self.sources
            ],
        }


def sampled_positions(selection: RecordSelection, count: int) -> list[int]:
    """Which of a chunk's `count` records the mixture samples (their positions in the chunk): each
    decided alone, from the selection's base and threshold and the record's index in its source."""
    import numpy as np

    return np.flatnonzero(keep_mask(selection.base, selection.threshold, selection.first, count)).tolist()


def plan_mix(mix: Mix, max_lines: int, max_bytes: int) -> MixPlan:
    """Count every source's records (chunk by chunk, as the pass that reads them will cut them),
    decide how many each gives, and the key threshold that takes exactly those."""
    counts = {s.name: [record_count(c) for c in _source_chunks(s, max_lines, max_bytes)] for s in mix.sources}
    available = {name: sum(c) for name, c in counts.items()}
    wanted = _sample_sizes(mix, available)
    plans = []
    for source in mix.sources:
        n, k = available[source.name], wanted[source.name]
        base = sample_base(mix.seed, source.name)
        threshold = TAKE_ALL if k >= n else threshold_of_range(base, n, k)
        plans.append(SourcePlan(source, n, k, base, threshold, counts[source.name]))
    return MixPlan(mix, plans, max_lines, max_bytes)


def _sample_sizes(mix: Mix, available: dict[str, int]) -> dict[str, int]:
    """Records each source gives: its rows; or its weight's share of `mix.rows`, else of the largest
    total every source can fill at these shares (largest remainders: the sizes sum to the total)."""
    sources = mix.sources
    for source in sources:
        if available[source.name] == 0:
            raise PrefdataError(f"{mix.path}: source {source.name!r} ({source.path}) has no records")
    if sources[0].rows is not None:
        for source in sources:
            if source.rows > available[source.name]:  # type: ignore[operator]
                raise PrefdataError(
                    f"{mix.path}: source {source.name!r} has {available[source.name]:,} records, fewer than its "
                    f"rows = {source.rows:,} (nothing is upsampled; lower rows)"
                )
        return {s.name: s.rows for s in sources}  # type: ignore[misc]
    total_weight = sum(s.weight for s in sources)  # type: ignore[misc]
    shares = {s.name: s.weight / total_weight for s in sources}  # type: ignore[operator]
    total = mix.rows
    if total is None:
        total = min(math.floor(available[name] / share + 1e-9) for name, share in shares.items())
    exact = {name: total * share for name, share in shares.items()}
    sizes = {name: math.floor(value + 1e-9) for name, value in exact.items()}
    # The rest, one record each, to the largest remainders (ties: the order of the file).
    order = sorted(shares, key=lambda name: -(exact[name] - sizes[name]))
    for name in order[: total - sum(sizes.values())]:
        sizes[name] += 1
    for source in sources:
        if sizes[source.name] > available[source.name]:
            raise PrefdataError(
                f"{mix.path}: source {source.name!r} has {available[source.name]:,} records, fewer than the "
                f"{sizes[source.name]:,} its weight asks of rows = {total:,} (nothing is upsampled; lower rows, "
                "or leave it out to take the largest mixture the sources allow)"
            )
    return sizes


def _source_chunks(source: MixSource, max_lines: int, max_bytes: int) -> Iterator[Chunk]:
    if source.hub is not None:
        return iter_hub_chunks(source.hub, max_lines)
    return iter_chunks(source.location, max_lines=max_lines, max_bytes=max_bytes, label=source.path)  # type: ignore[arg-type]


def _file_names(source: MixSource) -> list[str]:
    """The `source_file` names of the source's rows (as iter_chunks names them)."""
    if source.hub is not None:
        return [source.hub.name]
    root = source.location
    assert root is not None
    if not root.is_dir():
        return [source.path]
    return [f"{source.path.rstrip('/')}/{file.relative_to(root).as_posix()}" for file in list_input_files(root)]
