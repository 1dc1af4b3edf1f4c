"""Parquet and Arrow IPC files: record batches converted to Python a slice at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefdata.errors import PrefdataError
from prefdata.io.json_decode import _one_line
from prefdata.records import RawRecord

BATCH_ROWS = 1000  # rows converted to Python at a time from Arrow/Parquet


def _iter_batches(batches: Iterator[Any], name: str, label: str) -> Iterator[RawRecord]:
    index = 0
    try:
        for batch in batches:
            for start in range(0, batch.num_rows, BATCH_ROWS):
                for row in batch.slice(start, BATCH_ROWS).to_pylist():
                    index += 1
                    yield RawRecord(name, index, value=row)
    except Exception as exc:  # noqa: BLE001 - a corrupt page must not become a traceback
        yield RawRecord(
            name, index + 1, error=f"unreadable {label} data after row {index} ({_one_line(exc)})"
        )


def _iter_parquet(file: Path, name: str) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise PrefdataError(f"{file}: cannot open as parquet ({_one_line(exc)})") from None
    with parquet:
        yield from _iter_batches(parquet.iter_batches(batch_size=BATCH_ROWS), name, "parquet")


def _iter_arrow(file: Path, name: str) -> Iterator[RawRecord]:
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
        raise PrefdataError(f"{file}: cannot open as Arrow ({_one_line(exc)})") from None
    with source:
        yield from _iter_batches(batches, name, "Arrow")
