"""`prefdata prepare`: raw records -> canonical pairs -> token pairs -> checks -> OUT/.

The recipe, top to bottom in `prepare`: check the arguments, load the policy and the tokenizer,
then one of two write paths. Either this process writes every row (prefdata.prepare.written): it
streams the checked rows (`prefdata.checks.stream.iter_checked_rows`, the core `validate` shares: workers
parse, normalize, tokenize and check chunks; the dataset-wide merge runs here in input order) into
the dataset, dropped.jsonl or quarantine.jsonl. Or the workers write the shards themselves
(`worker_writes`, prefdata.prepare.shards). Then the reports and, last, the manifest.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata import FORMAT_VERSION, __version__
from prefdata.checks.merge import DatasetMerge
from prefdata.checks.partitioned import PartitionedMerge
from prefdata.checks.policy import Policy, load_policy
from prefdata.checks.stage import CheckChunk
from prefdata.checks.stream import iter_checked_rows, plan_input_mix
from prefdata.core.errors import PrefdataError
from prefdata.engine.local import default_workers
from prefdata.engine.select import check_engine, select_engine
from prefdata.io.hub import HubSource, hub_input, parse_hub_id
from prefdata.io.images import ImageAccess, image_access
from prefdata.io.lock import OutLock
from prefdata.io.manifest import recorded_tokenizer_path, sha256_file, write_manifest
from prefdata.io.out_dir import abandon, prepare_output_dir, publish, refuse_inputs_inside
from prefdata.io.readers import list_input_files
from prefdata.io.rows import output_row  # noqa: F401  (prefdata.prepare.output_row: public since 0.1)
from prefdata.io.write_errors import write_problem
from prefdata.prepare.written import Written, write_rows
from prefdata.report.builder import ReportBuilder
from prefdata.report.hints import dropped_share_problem, nothing_read_problem
from prefdata.report.sections import build_report
from prefdata.trainers.run import check_trainer_arguments, trainer_section
from prefdata.sets.balance import check_target
from prefdata.sets.decontaminate import DEFAULT_NGRAM, BenchmarkIndex, load_benchmarks
from prefdata.sets.mix import MixPlan, is_mix_file
from prefdata.sets.pairing import DEFAULT_TOP_K, PairingSettings
from prefdata.settings.commands import PrepareSettings
from prefdata.settings.declare import takes_settings
from prefdata.templates import bundled_templates_for
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.select import select_pair_tokenizer
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE, TemplateSettings, parse_template_kwargs


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
    problem: str = ""  # one line when the run kept no pair or dropped too many (exit 1); the CLI prints it


@takes_settings(PrepareSettings)  # or settings=PrepareSettings(...): prefdata.settings
def prepare(
    raw: str | Path,
    out: str | Path,
    *,
    tokenizer: str | None = None,
    processor: str | None = None,
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
    worker_writes: bool | None = None,
    template_kwargs: dict[str, Any] | list[str] | None = None,
    chat_template_file: str | Path | None = None,
    template_date: str = DEFAULT_TEMPLATE_DATE,
    loss_on: str = "all",
    train_turns: str = "all",
    pairing: str = "best-worst",
    pairing_seed: int = 0,
    min_score_margin: float = 0.0,
    rating: str = "mean",
    top_k: int = DEFAULT_TOP_K,
    decontaminate_against: str | Path | list[str | Path] | None = None,
    decontaminate_field: str | list[str] | None = None,
    decontaminate_ngram: int = DEFAULT_NGRAM,
    decontaminate_completions: bool = False,
    balance_length: float | None = None,
    seed: int | None = None,
    allowed_image_root: str | Path | list[str | Path] | None = None,
    trainer: str | None = None,
    trainer_args: list[str] | None = None,
    trainer_python: str | None = None,
) -> PrepareResult:
    """Read RAW, tokenize, check, and write OUT/ (dataset, dropped, quarantine, manifest, reports).

    Each setting is documented where it is declared, `prefdata.settings.commands.PrepareSettings`
    (the same text as `prefdata prepare --help` and docs/cli.md); `settings=PrepareSettings(...)` may
    stand for the keywords. How they combine: `balance_length` needs the two-pass write, so it turns
    `worker_writes` on (refusing an explicit False); `worker_writes` (default: on with Ray) implies
    `partitioned_checks`; `seed` defaults to the mix file's seed, else 0. RAW may be a file, a
    directory, a Hub id (`org/name:split`) or a mix file (prefdata.sets.mix). Every engine and worker
    count gives the same OUT (same content hash).
    Image paths in rows are read only under the input file's directory (a directory input: that
    directory) or an `allowed_image_root`; anything else, and an image above the policy's
    `max_image_pixels`, is quarantined naming the path (prefdata.io.images).
    `trainer`: also run RAW's rows through that trainer's own preprocessing (prefdata.trainers) into the
    report's `trainer` section; its findings at error severity make the run exit 1 (OUT is written)."""
    started = time.time()
    check_engine(engine)
    workers = _check_numbers(batch_size, workers, engine)
    balance_length, worker_writes, partitioned_checks = _write_path(balance_length, worker_writes, partitioned_checks,
                                                                    engine)
    raw_path, out_path = Path(raw), Path(out)
    mix = plan_input_mix(raw_path) if is_mix_file(raw_path) else None  # RAW may be a mix file
    hub = None if mix else parse_hub_id(raw)  # RAW may be a Hub dataset id with a split
    input_files = [] if hub else _input_files(raw_path, out_path, mix)
    # Writing OUT replaces what it holds: no file this run reads may live there (--overwrite would delete it).
    refuse_inputs_inside(out_path, [raw_path, *input_files, policy, tokenizer, processor, chat_template_file,
                                    *_paths(decontaminate_against), *_paths(allowed_image_root)])
    seed = seed if seed is not None else (mix.mix.seed if mix else 0)
    trainer_settings = check_trainer_arguments(trainer, trainer_args, trainer_python, tokenizer, False,
                                               trainer is None or (mix is None and hub is None))
    loaded_policy = load_policy(policy)
    benchmarks = load_benchmarks(decontaminate_against, ngram=decontaminate_ngram, fields=decontaminate_field,
                                 completions=decontaminate_completions)
    index = benchmarks[0] if benchmarks else None
    template = TemplateSettings(kwargs=parse_template_kwargs(template_kwargs), date=template_date,
                                chat_template_file=str(chat_template_file) if chat_template_file else None)
    settings = TokenizeSettings(max_length=max_length, max_prompt_length=max_prompt_length, chat_template=chat_template,
                                template=template, loss_on=loss_on, train_turns=train_turns,
                                images=_image_access(raw_path, hub, mix, allowed_image_root, loaded_policy))
    pairing_settings = PairingSettings(pairing, pairing_seed, min_score_margin, rating, top_k,
                                       loaded_policy.max_pairs_per_record, loaded_policy.above_max_pairs)
    pair_tokenizer = _pair_tokenizer(tokenizer, processor, settings, trust_remote_code)
    tokenizer = tokenizer or processor
    config = _config(raw_path, tokenizer, processor, settings, pairing_settings, loaded_policy, benchmarks,
                     batch_size=batch_size, workers=workers, engine=engine, partitioned_checks=partitioned_checks,
                     worker_writes=worker_writes, trust_remote_code=trust_remote_code,
                     balance_length=balance_length, seed=seed)

    lock = OutLock(out_path, "prepare").acquire()  # one writer per OUT
    try:
        tmp = _staging_dir(out_path, overwrite)  # OUT/.prefdata-staging-PID
        try:
            report = _report_builder(loaded_policy, mix)
            balance = (balance_length, seed) if balance_length is not None else None
            if worker_writes:
                written = _write_with_workers(mix or raw_path, hub, input_files, tmp, pair_tokenizer, settings,
                                              loaded_policy, workers, engine, ray_address, batch_size, progress, config,
                                              report, balance, index, pairing_settings)
            else:
                written = _write_in_main(mix or raw_path, tmp, pair_tokenizer, settings, loaded_policy, workers, engine,
                                         ray_address, batch_size, progress, config, report, partitioned_checks, index,
                                         pairing_settings)
            if benchmarks is not None:
                written.report.benchmarks = benchmarks[1]
            meta = {
                "input": str(raw_path), "tokenizer": str(tokenizer), "command": "prepare",
                "settings": {"max_length": max_length, "max_prompt_length": max_prompt_length, "chat_template": chat_template,
                             "chat_template_file": str(chat_template_file) if chat_template_file else None},
                "tokenizer_chat_template": bool(pair_tokenizer.tokenizer.chat_template),
                # Bundled templates a reasoning_lost hint may name: those made for this tokenizer's template.
                "bundled_templates": bundled_templates_for(pair_tokenizer.tokenizer.chat_template),
            }
            built = build_report(written.report, written.accounting, meta)
            if trainer_settings is not None:  # what the trainer's own preprocessing makes of RAW's rows
                built["trainer"] = trainer_section(raw_path, trainer_settings, str(tokenizer), trust_remote_code,
                                                   pair_tokenizer, loaded_policy)
                if built["trainer"]["errors"]:
                    built["status"] = "fail"
            built = _write_reports(tmp, built)
            nothing_read = written.accounting["rows_out"] + written.accounting["rows_dropped"] == 0
            if not nothing_read:  # an all-quarantined OUT keeps its files but never looks finished
                manifest = _manifest(written, input_files, config, pair_tokenizer, hub, mix)
                write_manifest(tmp, manifest)  # last: marks OUT finished
            publish(tmp, out_path)
        except BaseException as exc:
            abandon(tmp, out_path)
            _raise_write_problem(exc, out_path)
            raise
    finally:
        lock.release()
    if nothing_read:
        raise PrefdataError(nothing_read_problem(built, raw_path, str(out_path / "quarantine.jsonl")))
    return _result(written, built, out_path, time.time() - started)


def _result(written: Written, built: dict[str, Any], out_path: Path, seconds: float) -> PrepareResult:
    """The run's result; `problem` says why a run that wrote OUT still failed (nothing kept, too many dropped)."""
    accounting = written.accounting
    problem = ""
    if accounting["rows_out"] == 0 and accounting["pairs_made"] == 0:
        problem = (
            f"no pair made: none of the {accounting['records_unpaired']:,} records of scored completions had two "
            f"completions far enough apart (--min-score-margin; the reasons are in {out_path / 'dropped.jsonl'})"
        )
    elif accounting["rows_out"] == 0:
        problem = (
            f"no pair kept: all {accounting['pairs_dropped']:,} pairs were dropped by the policy "
            f"(see {out_path / 'dropped.jsonl'})"
        )
    problem = dropped_share_problem(built, problem)  # too many pairs dropped: fail, naming the cause
    return PrepareResult(
        out_dir=str(out_path),
        rows_in=accounting["rows_in"],
        rows_out=accounting["rows_out"],
        rows_dropped=accounting["rows_dropped"],
        rows_quarantined=accounting["rows_quarantined"],
        flag_counts=dict(written.flag_counts),
        errors=written.errors,
        exit_code=1 if written.errors or problem or built.get("trainer", {}).get("errors") else 0,
        report=built,
        seconds=seconds,
        problem=problem,
    )


def _config(raw_path: Path, tokenizer: str | None, processor: str | None, settings: TokenizeSettings,
            pairing: PairingSettings, policy: Policy, benchmarks: Any, **run: Any) -> dict[str, Any]:
    """The effective config the manifest records (and the hand-off reads)."""
    config = {
        "raw": str(raw_path),
        "tokenizer": str(tokenizer),
        "processor": str(processor) if processor else None,
        "max_length": settings.max_length,
        "max_prompt_length": settings.max_prompt_length,
        "chat_template": settings.chat_template,
        **settings.template.record(),
        "loss_on": settings.loss_on,
        "train_turns": settings.train_turns,
        **pairing.record(),
        "batch_size": run["batch_size"],
        "workers": run["workers"],
        "engine": run["engine"],
        "partitioned_checks": run["partitioned_checks"],
        "worker_writes": run["worker_writes"],
        "trust_remote_code": run["trust_remote_code"],
        "policy": policy.to_dict(),
        "balance_length": run["balance_length"],
        "seed": run["seed"],
        **({"allowed_image_root": list(settings.images.allowed_roots)} if settings.images.allowed_roots else {}),
    }
    if benchmarks is not None:
        config["decontaminate"] = benchmarks[1].settings()
    return config


def _write_path(balance_length: float | None, worker_writes: bool | None, partitioned_checks: bool,
                engine: str) -> tuple[float | None, bool, bool]:
    """(balance target, worker writes, partitioned checks) as they combine: `balance_length` needs the
    two-pass write (the subsample needs the whole set's counts: decided between the two passes);
    worker writes default to on with Ray; a worker writes a row once its flags are known, so worker
    writes partition the dataset-wide checks."""
    if balance_length is not None:
        balance_length = check_target(balance_length)
        if worker_writes is False:
            raise PrefdataError("--balance-length needs the two-pass write: leave out --no-worker-writes")
        worker_writes = True
    worker_writes = engine == "ray" if worker_writes is None else worker_writes
    return balance_length, worker_writes, partitioned_checks or worker_writes


def _write_in_main(
    raw_path: Path | MixPlan, tmp: Path, pair_tokenizer: PairTokenizer, settings: TokenizeSettings, policy: Policy,
    workers: int, engine: str, ray_address: str | None, batch_size: int, progress: bool, config: dict[str, Any],
    report: ReportBuilder, partitioned_checks: bool, benchmarks: BenchmarkIndex | None, pairing: PairingSettings,
) -> Written:
    """This process writes every row (prefdata.prepare.written) of the checked-row stream, whose
    workers parse, normalize, tokenize and check chunks; the dataset-wide merge runs here."""
    threshold = policy.near_duplicate_prompt_threshold
    merge = PartitionedMerge(threshold) if partitioned_checks else DatasetMerge(threshold)
    rows = iter_checked_rows(
        raw_path, policy=policy, settings=settings, batch_size=batch_size,
        progress=progress, pair_tokenizer=pair_tokenizer, workers=workers, merge=merge,
        engine=select_engine(engine, workers, ray_address), benchmarks=benchmarks, pairing=pairing,
    )
    written = write_rows(rows, tmp, policy, batch_size, _handoff(config, pair_tokenizer), report)
    written.report.add_near_duplicate_prompts(merge.near_duplicate_clusters(), written.report.location)
    return written


def _write_with_workers(
    raw_path: Path | MixPlan, hub: HubSource | None, input_files: list[Path], tmp: Path, pair_tokenizer: PairTokenizer,
    settings: TokenizeSettings, policy: Policy, workers: int, engine: str, ray_address: str | None, batch_size: int,
    progress: bool, config: dict[str, Any], report: ReportBuilder, balance: tuple[float, int] | None,
    benchmarks: BenchmarkIndex | None = None, pairing: PairingSettings | None = None,
) -> Written:
    """The workers write the shards (prefdata.prepare.shards), on Ray or in local worker processes."""
    from prefdata.checks import stream
    from prefdata.engine.local import LocalEngine
    from prefdata.prepare import shards

    runner = select_engine(engine, workers, ray_address) or LocalEngine(workers)
    shard_bytes = shards.SHARD_BYTES  # a Hub split: its record chunks are grouped by count
    if not hub:
        input_bytes = sum(path.stat().st_size for path in input_files)
        shard_bytes = shards.shard_bytes_for(input_bytes, getattr(runner, "workers", 1), stream.CHUNK_BYTES)
    return shards.write_with_workers(
        stream.input_chunks(raw_path), tmp,
        check=CheckChunk(pair_tokenizer, settings, policy, benchmarks=benchmarks, pairing=pairing or PairingSettings()),
        policy=policy, engine=runner,
        shard_bytes=shard_bytes, batch_size=batch_size, handoff=_handoff(config, pair_tokenizer),
        input_name=str(raw_path.mix.path if isinstance(raw_path, MixPlan) else raw_path), progress=progress,
        report=report, balance=balance,
    )


def _pair_tokenizer(tokenizer: str | None, processor: str | None, settings: TokenizeSettings,
                    trust_remote_code: bool) -> PairTokenizer:
    """The tokenizer stage: a plain tokenizer, or a processor for image pairs (tokenize.vision)."""
    if not tokenizer and not processor:
        raise PrefdataError("give one of --tokenizer PATH and --processor PATH (a processor for image pairs)")
    pair_tokenizer = select_pair_tokenizer(tokenizer, processor, settings, trust_remote_code)
    assert pair_tokenizer is not None
    return pair_tokenizer


def _report_builder(policy: Policy, mix: MixPlan | None) -> ReportBuilder:
    """The report's builder; for a mixture, with each file's source and the mix's own numbers."""
    if mix is None:
        return ReportBuilder(policy)
    report = ReportBuilder(policy, sources=mix.file_sources())
    report.source_plans = {entry["name"]: entry for entry in mix.record()["sources"]}
    return report


def _paths(value: str | Path | list[str | Path] | None) -> list[str | Path]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def _staging_dir(out_path: Path, overwrite: bool) -> Path:

    try:
        return prepare_output_dir(out_path, overwrite)
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
        "template_fingerprint": pair_tokenizer.template_fingerprint(), "loss_on": config["loss_on"],
        "template_kwargs": config["template_kwargs"], "template_date": config["template_date"],
        "chat_template_file": config["chat_template_file"],
        "chat_template_sha256": config["chat_template_sha256"],
        # A replacement template travels with the data, so the TRL hand-off saves it with the model.
        "chat_template_text": tok.chat_template if config["chat_template_file"] else None,
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


def _image_access(raw_path: Path, hub: HubSource | None, mix: MixPlan | None, allowed_image_root: Any,
                  policy: Policy) -> ImageAccess:
    """Where image paths in RAW's rows may be read from: the input's own directory (none for a Hub
    dataset), the roots the user allowed; images above the policy's max_image_pixels are refused."""
    data = None if hub else (raw_path.parent if mix else raw_path)
    return image_access(data, mix is not None, allowed_image_root, policy.max_image_pixels)


def _input_files(raw_path: Path, out_path: Path, mix: MixPlan | None = None) -> list[Path]:
    """The data files read (a mixture's path sources' files), after checking OUT is not among them."""
    roots = [s.source.location for s in mix.sources if s.source.location is not None] if mix else [raw_path]
    input_files: list[Path] = []
    for root in roots:
        input_files += list_input_files(root)  # raises on a missing path / nothing readable
        if out_path.resolve() == root.resolve() or root.resolve() in out_path.resolve().parents:
            raise PrefdataError(f"OUT ({out_path}) must not be inside the input ({root})")
    return input_files


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
    written: Written, input_files: list[Path], config: dict[str, Any], pair_tokenizer: PairTokenizer,
    hub: HubSource | None, mix: MixPlan | None = None,
) -> dict[str, Any]:
    tok = pair_tokenizer.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return {
        "format_version": FORMAT_VERSION,
        "prefdata_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": mix.inputs() if mix else [hub_input(hub)] if hub else [
            {"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in input_files
        ],
        "config": config,
        "tokenizer": {
            "path": recorded_tokenizer_path(config["tokenizer"]),
            "fingerprint": pair_tokenizer.fingerprint(),
            "template_fingerprint": pair_tokenizer.template_fingerprint(),
            "chat_template": tok.chat_template if config["chat_template_file"] else None,
            "class": type(tok).__name__,
            "pad_token_id": pad_id if pad_id is not None else 0,
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
        },
        **({"processor": pair_tokenizer.processor_record()} if hasattr(pair_tokenizer, "processor_record") else {}),
        "row_accounting": written.accounting,
        "flag_counts": dict(sorted(written.flag_counts.items())),
        "errors": written.errors,
        "content_hash": written.content_hash,
        "columns": written.columns,
        "json_columns": written.json_columns,
        "text_columns": written.text_columns,
        "shards": written.shards,
        "files": ["dropped.jsonl", "quarantine.jsonl", "report.json", "report.md", "report.html"],
        # A mixture's ledger: per source available = sampled + not_sampled; records_in = the sampled.
        **({"mix": mix.record()} if mix else {}),
    }
