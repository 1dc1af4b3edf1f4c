"""`prefdata prepare`: raw records -> canonical pairs -> token pairs -> checks -> OUT/.

The recipe, top to bottom in `prepare`: check the arguments, load the policy and the tokenizer,
stream the checked rows (`prefdata.ingest.iter_checked_rows`, the core `validate` shares: workers
parse, normalize, tokenize and check chunks; the dataset-wide merge runs here in input order),
write each row to the dataset, dropped.jsonl or quarantine.jsonl, then the reports and, last, the
manifest.
"""

from __future__ import annotations

import hashlib
import json
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import xxhash

from prefdata import FORMAT_VERSION, __version__
from prefdata.checks.merge import DatasetMerge
from prefdata.checks.partitioned import PartitionedMerge
from prefdata.checks.policy import load_policy
from prefdata.engine.local import default_workers
from prefdata.engine.select import check_engine, select_engine
from prefdata.errors import PrefdataError
from prefdata.ingest import iter_checked_rows
from prefdata.io.hub import HubSource, hub_input, parse_hub_id
from prefdata.io.lock import OutLock
from prefdata.io.manifest import sha256_file, write_manifest
from prefdata.io.readers import list_input_files
from prefdata.io.write_errors import write_problem
from prefdata.records import CheckedRow
from prefdata.tokenize.pairs import PairTokenizer, TokenizeSettings

if TYPE_CHECKING:
    from prefdata.checks.policy import Policy
    from prefdata.report.builder import ReportBuilder


@dataclass
class PrepareResult:
    out_dir: str
    rows_in: int
    rows_out: int
    rows_dropped: int
    rows_quarantined: int
    flag_counts: dict[str, int]
    errors: int  # rows with a flag at error severity
    exit_code: int
    report: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    problem: str = ""  # one line when the run kept no pair (exit 1); the CLI prints it


# Output columns prefdata owns; a pass-through column with one of these names is kept as raw_<name>.
_RESERVED = frozenset(
    {"prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids", "flags", "source_file", "source_line"}
    | {"ref_chosen_logps", "ref_rejected_logps", "chosen_token_count", "rejected_token_count"}
    | {"prompt_messages", "chosen_messages", "rejected_messages"}
)


def output_row(row: CheckedRow) -> dict[str, Any]:
    pair, tokenized = row.pair, row.tokenized
    assert pair is not None and tokenized is not None
    # Conversational rows keep TRL's message format, so TRL itself renders their chat template;
    # the writer handles datasets that mix them with string rows.
    conversational = pair.is_conversational and pair.prompt_messages is not None
    out: dict[str, Any] = {
        "prompt": pair.prompt_messages if conversational else pair.prompt,
        "chosen": pair.chosen_messages if conversational else pair.chosen,
        "rejected": pair.rejected_messages if conversational else pair.rejected,
        "prompt_ids": tokenized.prompt_ids,
        "chosen_ids": tokenized.chosen_ids,
        "rejected_ids": tokenized.rejected_ids,
        "flags": row.flags,
        "source_file": row.raw.source_file,
        "source_line": row.raw.source_line,
    }
    for key, value in pair.extra.items():
        out[f"raw_{key}" if key in _RESERVED else key] = value
    return out


def _dropped_record(row: CheckedRow) -> dict[str, Any]:
    pair = row.pair
    assert pair is not None
    record: dict[str, Any] = {
        "source_file": row.raw.source_file,
        "source_line": row.raw.source_line,
        "flags": row.flags,
        "severity": row.severity,
        "prompt": pair.prompt,
        "chosen": pair.chosen,
        "rejected": pair.rejected,
    }
    if pair.extra:
        record["extra"] = pair.extra
    return record


def _quarantine_record(row: CheckedRow) -> dict[str, Any]:
    raw = row.raw.raw_text
    if raw is None and row.raw.value is not None:
        raw = json.dumps(row.raw.value, ensure_ascii=False, default=str)
    return {"source_file": row.raw.source_file, "source_line": row.raw.source_line, "error": row.error, "raw": raw}


_ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
_TEXT_COLUMNS = ("prompt", "chosen", "rejected")


def _row_digest(row: dict[str, Any]) -> bytes:
    """A digest of one output row that does not depend on batching (for the manifest's content hash).

    Id lists are hashed as raw int32 bytes and the three texts as length-prefixed UTF-8: JSON-encoding
    them cost more than everything else in this loop. The remaining (small) fields go in as JSON."""
    digest = xxhash.xxh3_128()  # not a security boundary: a fast, well-mixed 128-bit digest
    for key in _ID_COLUMNS:
        ids = row[key]
        if not (isinstance(ids, array) and ids.typecode == "i"):  # workers send array('i') already
            ids = array("i", ids)
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids)
    for key in _TEXT_COLUMNS:
        text = row[key] if type(row[key]) is str else json.dumps(row[key], ensure_ascii=False)  # messages
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    rest = {k: v for k, v in row.items() if k not in _ID_COLUMNS and k not in _TEXT_COLUMNS}
    digest.update(json.dumps(rest, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))
    return digest.digest()


def prepare(
    raw: str | Path,
    out: str | Path,
    *,
    tokenizer: str,
    max_length: int | None = None,
    max_prompt_length: int | None = None,
    chat_template: bool = False,
    policy: str | Path | None = None,
    overwrite: bool = False,
    batch_size: int = 1000,
    workers: int | None = None,
    progress: bool = True,
    trust_remote_code: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
    partitioned_checks: bool = False,
) -> PrepareResult:
    """Read RAW, tokenize, check, and write OUT/ (dataset, dropped, quarantine, manifest, reports).

    `engine="ray"` runs the per-chunk work on a Ray cluster (`ray_address`, else RAY_ADDRESS, else
    a local Ray) with `workers` actors (default: one per cluster CPU); OUT is the same as the local
    engine's (same content hash). `partitioned_checks`: the dataset-wide checks by hash partitioning
    across the workers in a first pass over the input (see prefdata.checks.partitioned); same OUT."""
    from prefdata.io import writer as W

    started = time.time()
    check_engine(engine)
    workers = _check_numbers(batch_size, workers, engine)
    raw_path, out_path = Path(raw), Path(out)
    hub = parse_hub_id(raw)  # RAW may be a Hub dataset id with a split
    input_files = [] if hub else _input_files(raw_path, out_path)
    loaded_policy = load_policy(policy)
    settings = TokenizeSettings(max_length=max_length, max_prompt_length=max_prompt_length, chat_template=chat_template)
    pair_tokenizer = PairTokenizer(tokenizer, settings, trust_remote_code=trust_remote_code)
    pair_tokenizer.setup()
    config = {
        "raw": str(raw_path),
        "tokenizer": str(tokenizer),
        "max_length": max_length,
        "max_prompt_length": max_prompt_length,
        "chat_template": chat_template,
        "batch_size": batch_size,
        "workers": workers,
        "engine": engine,
        "partitioned_checks": partitioned_checks,
        "trust_remote_code": trust_remote_code,
        "policy": loaded_policy.to_dict(),
    }

    lock = OutLock(out_path, "prepare").acquire()  # one writer per OUT
    try:
        tmp = _staging_dir(out_path, overwrite)  # OUT/.prefdata-staging-PID
        try:
            threshold = loaded_policy.near_duplicate_prompt_threshold
            merge = PartitionedMerge(threshold) if partitioned_checks else DatasetMerge(threshold)
            rows = iter_checked_rows(
                raw_path, policy=loaded_policy, settings=settings, batch_size=batch_size,
                progress=progress, pair_tokenizer=pair_tokenizer, workers=workers, merge=merge,
                engine=select_engine(engine, workers, ray_address),
            )
            written = _write_rows(rows, tmp, loaded_policy, batch_size, _handoff(config, pair_tokenizer))
            written.report.add_near_duplicate_prompts(merge.near_duplicate_clusters(), written.report.location)
            meta = {"input": str(raw_path), "tokenizer": str(tokenizer), "command": "prepare"}
            built = _write_reports(tmp, written.report.build(written.accounting, meta))
            nothing_read = written.accounting["rows_out"] + written.accounting["rows_dropped"] == 0
            if not nothing_read:  # an all-quarantined OUT keeps its files but never looks finished
                manifest = _manifest(written, input_files, config, pair_tokenizer, hub)
                write_manifest(tmp, manifest)  # last: marks OUT finished
            W.publish(tmp, out_path)
        except BaseException as exc:
            W.abandon(tmp, out_path)
            _raise_write_problem(exc, out_path)
            raise
    finally:
        lock.release()
    accounting = written.accounting
    if nothing_read:
        reasons = built.get("quarantine", {}).get("reasons") or [{"reason": "unreadable"}]
        raise PrefdataError(
            f"no record of {raw_path} could be read: all {accounting['rows_in']:,} were quarantined, e.g. "
            f"{reasons[0]['reason']} (every reason in {out_path / 'quarantine.jsonl'})"
        )
    problem = ""
    if accounting["rows_out"] == 0:
        problem = (
            f"no pair kept: all {accounting['rows_dropped']:,} pairs were dropped by the policy "
            f"(see {out_path / 'dropped.jsonl'})"
        )
    return PrepareResult(
        out_dir=str(out_path),
        rows_in=accounting["rows_in"],
        rows_out=accounting["rows_out"],
        rows_dropped=accounting["rows_dropped"],
        rows_quarantined=accounting["rows_quarantined"],
        flag_counts=dict(written.flag_counts),
        errors=written.errors,
        exit_code=1 if written.errors or problem else 0,
        report=built,
        seconds=time.time() - started,
        problem=problem,
    )


def _staging_dir(out_path: Path, overwrite: bool) -> Path:
    from prefdata.io import writer as W

    try:
        return W.prepare_output_dir(out_path, overwrite)
    except BaseException as exc:
        _raise_write_problem(exc, out_path)
        raise


def _raise_write_problem(exc: BaseException, out_path: Path) -> None:
    """Disk full, quota, read-only OUT: one line naming the path instead of a traceback."""
    failed_write = write_problem(exc, out_path) if isinstance(exc, OSError) else None
    if failed_write is not None:
        raise failed_write from None


def _handoff(config: dict[str, Any], pair_tokenizer: PairTokenizer) -> dict[str, Any]:
    """Settings that travel inside the dataset (its DatasetInfo, prefdata.io.handoff), so that
    `load_from_disk` alone is enough for the TRL hand-off's checks."""
    tok = pair_tokenizer.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return {
        "format_version": FORMAT_VERSION, "prefdata_version": __version__, "max_length": config["max_length"],
        "max_prompt_length": config["max_prompt_length"], "chat_template": config["chat_template"],
        "tokenizer_path": config["tokenizer"], "tokenizer_fingerprint": pair_tokenizer.fingerprint(),
        "pad_token_id": pad_id if pad_id is not None else 0, "eos_token_id": tok.eos_token_id,
    }


def _check_numbers(batch_size: int, workers: int | None, engine: str = "local") -> int:
    """The number of workers to use, after checking the numbers given."""
    if batch_size < 1:
        raise PrefdataError("--batch-size must be at least 1")
    if workers is None:
        return default_workers() if engine == "local" else 0  # 0: one Ray actor per cluster CPU
    if workers < 1:
        raise PrefdataError("--workers must be at least 1")
    return workers


def _input_files(raw_path: Path, out_path: Path) -> list[Path]:
    input_files = list_input_files(raw_path)  # raises on a missing path / nothing readable
    if out_path.resolve() == raw_path.resolve() or raw_path.resolve() in out_path.resolve().parents:
        raise PrefdataError(f"OUT ({out_path}) must not be inside the input ({raw_path})")
    return input_files


@dataclass
class _Written:
    """What writing the rows left behind: the report so far, the counts, the content hash."""

    report: ReportBuilder
    accounting: dict[str, int]
    flag_counts: Counter[str]
    errors: int  # rows with a flag at error severity
    content_hash: str
    columns: list[str]
    json_columns: list[str]
    text_columns: Any  # how the text columns are stored (strings, messages, or both): io.writer


def _write_rows(
    rows: Iterable[CheckedRow], tmp: Path, policy: Policy, batch_size: int, handoff: dict[str, Any]
) -> _Written:
    """Every row to exactly one of the dataset, dropped.jsonl and quarantine.jsonl, and to the report."""
    from prefdata.io import writer as W
    from prefdata.report.builder import ReportBuilder

    dataset = W.DatasetWriter(tmp)
    dropped = W.JsonlWriter(tmp / "dropped.jsonl")
    quarantine = W.JsonlWriter(tmp / "quarantine.jsonl")
    report = ReportBuilder(policy)
    flag_counts: Counter[str] = Counter()
    content = hashlib.blake2b(digest_size=16)
    errors = rows_in = 0
    pending: list[dict[str, Any]] = []
    for row in rows:
        rows_in += 1
        report.add(row)
        flag_counts.update(row.flags)
        errors += row.severity == "error"
        if row.outcome == "quarantined":
            quarantine.write(_quarantine_record(row))
        elif row.outcome == "dropped":
            dropped.write(_dropped_record(row))
        else:
            out_row = output_row(row)
            content.update(_row_digest(out_row))
            pending.append(out_row)
            if len(pending) >= batch_size:
                dataset.write_rows(pending)
                pending = []
    dataset.write_rows(pending)
    dropped.close()
    quarantine.close()
    fingerprint = content.hexdigest()
    schema = dataset.finish(fingerprint, {**handoff, "content_hash": fingerprint})
    accounting = {
        "rows_in": rows_in,
        "rows_out": dataset.rows,
        "rows_dropped": dropped.count,
        "rows_quarantined": quarantine.count,
    }
    # Invariant 5: every record lands in exactly one place.
    assert rows_in == dataset.rows + dropped.count + quarantine.count, accounting
    return _Written(
        report, accounting, flag_counts, errors, fingerprint, schema.names, sorted(dataset.json_columns),
        dataset.text_columns,
    )


def _write_reports(tmp: Path, built: dict[str, Any]) -> dict[str, Any]:
    from prefdata.report.render_html import render_html
    from prefdata.report.render_markdown import render_markdown

    with open(tmp / "report.json", "w", encoding="utf-8") as handle:  # streamed: no whole-report string
        json.dump(built, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
    (tmp / "report.md").write_text(render_markdown(built), encoding="utf-8")
    (tmp / "report.html").write_text(render_html(built), encoding="utf-8")
    return built


def _manifest(
    written: _Written, input_files: list[Path], config: dict[str, Any], pair_tokenizer: PairTokenizer,
    hub: HubSource | None,
) -> dict[str, Any]:
    tok = pair_tokenizer.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return {
        "format_version": FORMAT_VERSION,
        "prefdata_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": [hub_input(hub)] if hub else [
            {"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in input_files
        ],
        "config": config,
        "tokenizer": {
            "path": config["tokenizer"],
            "fingerprint": pair_tokenizer.fingerprint(),
            "class": type(tok).__name__,
            "pad_token_id": pad_id if pad_id is not None else 0,
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
        },
        "row_accounting": written.accounting,
        "flag_counts": dict(sorted(written.flag_counts.items())),
        "errors": written.errors,
        "content_hash": written.content_hash,
        "columns": written.columns,
        "json_columns": written.json_columns,
        "text_columns": written.text_columns,
        "files": ["dropped.jsonl", "quarantine.jsonl", "report.json", "report.md", "report.html"],
    }
