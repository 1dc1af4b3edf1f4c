"""Parquet and Arrow IPC files: record batches converted to Python a slice at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.records import RawRecord
from prefdata.io.json_decode import one_line

BATCH_ROWS = 1000  # rows converted to Python at a time from Arrow/Parquet
# ...or fewer, so that one slice holds about this much Arrow data: image rows carry their encoded
# images (RLAIF-V's are ~100 KB-1 MB), and 1,000 of them would be up to a GB in the main process.
SLICE_BYTES = 32 << 20


def rows_per_slice(nbytes: int, num_rows: int) -> int:
    """Rows to convert at a time from a batch of `num_rows` rows holding `nbytes` of data."""
    if num_rows <= 0 or nbytes <= 0:
        return BATCH_ROWS
    return max(1, min(BATCH_ROWS, int(SLICE_BYTES * num_rows // nbytes)))


def _iter_batches(batches: Iterator[Any], name: str, label: str) -> Iterator[RawRecord]:
    index = 0
    try:
        for batch in batches:
            step = rows_per_slice(batch.nbytes, batch.num_rows)
            for start in range(0, batch.num_rows, step):
                for row in batch.slice(start, step).to_pylist():
                    index += 1
                    yield RawRecord(name, index, value=row)
    except Exception as exc:  # noqa: BLE001 - a corrupt page must not become a traceback
        yield RawRecord(
            name, index + 1, error=f"unreadable {label} data after row {index} ({one_line(exc)})"
        )


def iter_parquet(file: Path, name: str) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise PrefdataError(f"{file}: cannot open as parquet ({one_line(exc)})") from None
    with parquet:
        # Parquet decodes a whole batch at once: size it from the first row group's data per row.
        meta = parquet.metadata
        group = meta.row_group(0) if meta.num_row_groups else None
        batch_rows = rows_per_slice(group.total_byte_size, group.num_rows) if group is not None else BATCH_ROWS
        yield from _iter_batches(parquet.iter_batches(batch_size=batch_rows), name, "parquet")


def iter_arrow(file: Path, name: str) -> Iterator[RawRecord]:
    """Arrow IPC: the stream format (what `save_to_disk` writes) or the file format."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(file))
        try:
            reader = pa.ipc.open_stream(source)
            batches = iter(reader)
        except pa.ArrowInvalid:
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
    except Exception as exc:  # noqa: BLE001
        raise PrefdataError(f"{file}: cannot open as Arrow ({one_line(exc)})") from None
    with source:
        yield from _iter_batches(batches, name, "Arrow")
