"""`prefdata prepare`: raw records -> canonical pairs -> token pairs -> checks -> OUT/.

The recipe, top to bottom in `prepare`: check the arguments, load the policy and the tokenizer,
then one write path on every engine and worker count (prefdata.pipeline.shards): the workers check
groups of chunks, the dataset-wide checks run by hash partitioning, and the workers write each
group's shard (one worker: all of it in this process). Then the reports and, last, the manifest.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata import FORMAT_VERSION, __version__
from prefdata.checks.policy import Policy, load_policy
from prefdata.checks.stage import CheckChunk
from prefdata.checks.stream import plan_input_mix, workers_for
from prefdata.core.errors import PrefdataError
from prefdata.engine.select import check_engine, select_engine
from prefdata.io.hub import HubSource, hub_input, parse_hub_id
from prefdata.io.images import ImageAccess, image_access
from prefdata.io.lock import OutLock
from prefdata.io.manifest import recorded_tokenizer_path, sha256_file, write_manifest
from prefdata.io.out_dir import abandon, prepare_output_dir, publish, refuse_inputs_inside
from prefdata.io.readers import list_input_files
from prefdata.io.rows import output_row  # noqa: F401  (prefdata.prepare.output_row: public since 0.1)
from prefdata.io.write_errors import write_problem
from prefdata.pipeline.shards import Written
from prefdata.report.builder import ReportBuilder
from prefdata.report.hints import dropped_share_problem, nothing_read_problem
from prefdata.report.sections import build_report
from prefdata.trainers.run import check_trainer_arguments, trainer_section
from prefdata.sets.balance import check_target
from prefdata.sets.decontaminate import BenchmarkIndex, load_benchmarks
from prefdata.sets.mix import MixPlan, is_mix_file
from prefdata.sets.pairing import PairingSettings
from prefdata.settings.commands import PrepareSettings
from prefdata.settings.declare import settings_command
from prefdata.templates import bundled_templates_for
from prefdata.tokenize.pairs import PairTokenizer
from prefdata.tokenize.select import select_pair_tokenizer
from prefdata.tokenize.settings import TokenizeSettings
from prefdata.tokenize.template import TemplateSettings, parse_template_kwargs


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


@settings_command(PrepareSettings)  # settings=PrepareSettings(...) or flat keywords: prefdata.settings
def prepare(raw: str | Path, out: str | Path, settings: PrepareSettings) -> PrepareResult:
    """Read RAW, tokenize, check, and write OUT/ (dataset, dropped, quarantine, manifest, reports).

    Each setting is documented where it is declared, `prefdata.settings.commands.PrepareSettings`
    (the same text as `prefdata prepare --help` and docs/cli.md); pass `settings=PrepareSettings(...)`,
    flat keywords (`tokenizer="tok"`), or both. The workers write OUT's shards on every engine
    (one worker: this process), and the dataset-wide checks are hash-partitioned
    (prefdata.checks.partitioned); `seed` defaults to the mix file's seed, else 0. RAW may be a file, a
    directory, a Hub id (`org/name:split`) or a mix file (prefdata.sets.mix). Every engine and worker
    count gives the same OUT (same content hash).
    Image paths in rows are read only under the input file's directory (a directory input: that
    directory) or an `allowed_image_root`; anything else, and an image above the policy's
    `max_image_pixels`, is quarantined naming the path (prefdata.io.images).
    `trainer`: also run RAW's rows through that trainer's own preprocessing (prefdata.trainers) into the
    report's `trainer` section; its findings at error severity make the run exit 1 (OUT is written)."""
    started = time.time()
    run = _plan(raw, out, settings)
    lock = OutLock(run.out_path, "prepare").acquire()  # one writer per OUT
    try:
        tmp = _staging_dir(run.out_path, settings.overwrite)  # OUT/.prefdata-staging-PID
        try:
            written, built = _write(tmp, run, settings)
            nothing_read = written.accounting["rows_out"] + written.accounting["rows_dropped"] == 0
            if not nothing_read:  # an all-quarantined OUT keeps its files but never looks finished
                manifest = _manifest(written, run.input_files, run.config, run.pair_tokenizer, run.hub, run.mix)
                write_manifest(tmp, manifest)  # last: marks OUT finished
            publish(tmp, run.out_path)
        except BaseException as exc:
            abandon(tmp, run.out_path)
            _raise_write_problem(exc, run.out_path)
            raise
    finally:
        lock.release()
    if nothing_read:
        raise PrefdataError(nothing_read_problem(built, run.raw_path, str(run.out_path / "quarantine.jsonl")))
    return _result(written, built, run.out_path, time.time() - started)


@dataclass
class _Run:
    """What prepare decided before writing: the input and OUT, the workers and the balance, the loaded policy, benchmarks and tokenizer, and the config OUT records."""

    raw_path: Path
    out_path: Path
    mix: MixPlan | None
    hub: HubSource | None
    input_files: list[Path]
    workers: int
    balance: tuple[float, int] | None  # (target, seed) of --balance-length
    trainer: Any  # the --trainer settings, or None
    policy: Policy
    benchmarks: Any  # (BenchmarkIndex, its report) or None
    tokenize: TokenizeSettings
    pairing: PairingSettings
    pair_tokenizer: PairTokenizer
    tokenizer: str | None  # the tokenizer's path, or the processor's
    config: dict[str, Any]

    @property
    def input(self) -> Path | MixPlan:
        return self.mix or self.raw_path

    @property
    def index(self) -> BenchmarkIndex | None:
        return self.benchmarks[0] if self.benchmarks else None


def _plan(raw: str | Path, out: str | Path, s: PrepareSettings) -> _Run:
    """The arguments checked (the first problem is the one reported) and what they load."""
    check_engine(s.engine)
    _check_numbers(s.batch_size, s.workers)
    balance_length = check_target(s.balance_length) if s.balance_length is not None else None
    raw_path, out_path = Path(raw), Path(out)
    mix = plan_input_mix(raw_path) if is_mix_file(raw_path) else None  # RAW may be a mix file
    hub = None if mix else parse_hub_id(raw)  # RAW may be a Hub dataset id with a split
    workers = workers_for(mix or raw_path, s.workers, s.engine)
    input_files = [] if hub else _input_files(raw_path, out_path, mix)
    # Writing OUT replaces what it holds: no file this run reads may live there (--overwrite would delete it).
    refuse_inputs_inside(out_path, [raw_path, *input_files, s.policy, s.tokenizer, s.processor, s.chat_template_file,
                                    *_paths(s.decontaminate_against), *_paths(s.allowed_image_root)])
    seed = s.seed if s.seed is not None else (mix.mix.seed if mix else 0)
    trainer_settings = check_trainer_arguments(s.trainer, s.trainer_args, s.trainer_python, s.tokenizer, False,
                                               s.trainer is None or (mix is None and hub is None))
    loaded_policy = load_policy(s.policy)
    benchmarks = load_benchmarks(s.decontaminate_against, ngram=s.decontaminate_ngram, fields=s.decontaminate_field,
                                 completions=s.decontaminate_completions)
    template = TemplateSettings(kwargs=parse_template_kwargs(s.template_kwargs), date=s.template_date,
                                chat_template_file=str(s.chat_template_file) if s.chat_template_file else None)
    tokenize = TokenizeSettings(max_length=s.max_length, max_prompt_length=s.max_prompt_length,
                                chat_template=s.chat_template, template=template, loss_on=s.loss_on,
                                train_turns=s.train_turns,
                                images=_image_access(raw_path, hub, mix, s.allowed_image_root, loaded_policy))
    pairing = PairingSettings(s.pairing, s.pairing_seed, s.min_score_margin, s.rating, s.top_k,
                              loaded_policy.max_pairs_per_record, loaded_policy.above_max_pairs)
    pair_tokenizer = _pair_tokenizer(s.tokenizer, s.processor, tokenize, s.trust_remote_code)
    tokenizer = s.tokenizer or s.processor
    config = _config(raw_path, tokenizer, s.processor, tokenize, pairing, loaded_policy, benchmarks,
                     batch_size=s.batch_size, workers=workers, engine=s.engine, trust_remote_code=s.trust_remote_code,
                     balance_length=balance_length, seed=seed)
    return _Run(raw_path, out_path, mix, hub, input_files, workers,
                (balance_length, seed) if balance_length is not None else None, trainer_settings, loaded_policy, benchmarks, tokenize, pairing, pair_tokenizer, tokenizer, config)


def _write(tmp: Path, run: _Run, s: PrepareSettings) -> tuple[Written, dict[str, Any]]:
    """The rows into the staging directory `tmp` (prefdata.pipeline.shards), then the reports."""
    written = _write_shards(run, tmp, s, _report_builder(run.policy, run.mix))
    if run.benchmarks is not None:
        written.report.benchmarks = run.benchmarks[1]
    tokenizer = run.pair_tokenizer.tokenizer
    meta = {
        "input": str(run.raw_path), "tokenizer": str(run.tokenizer), "command": "prepare",
        "settings": {"max_length": s.max_length, "max_prompt_length": s.max_prompt_length,
                     "chat_template": s.chat_template,
                     "chat_template_file": str(s.chat_template_file) if s.chat_template_file else None},
        "tokenizer_chat_template": bool(tokenizer.chat_template),
        # Bundled templates a reasoning_lost hint may name: those made for this tokenizer's template.
        "bundled_templates": bundled_templates_for(tokenizer.chat_template),
    }
    built = build_report(written.report, written.accounting, meta)
    if run.trainer is not None:  # what the trainer's own preprocessing makes of RAW's rows
        built["trainer"] = trainer_section(run.raw_path, run.trainer, str(run.tokenizer), s.trust_remote_code,
                                           run.pair_tokenizer, run.policy)
        if built["trainer"]["errors"]:
            built["status"] = "fail"
    return written, _write_reports(tmp, built)


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
        # Facts of the one write path, kept for readers of older manifests' keys: the dataset-wide
        # checks are partitioned and the workers write the shards, on every engine and worker count.
        "partitioned_checks": True,
        "worker_writes": True,
        "trust_remote_code": run["trust_remote_code"],
        "policy": policy.to_dict(),
        "balance_length": run["balance_length"],
        "seed": run["seed"],
        **({"allowed_image_root": list(settings.images.allowed_roots)} if settings.images.allowed_roots else {}),
    }
    if benchmarks is not None:
        config["decontaminate"] = benchmarks[1].settings()
    return config


def _write_shards(run: _Run, tmp: Path, s: PrepareSettings, report: ReportBuilder) -> Written:
    """The workers write the shards (prefdata.pipeline.shards): Ray actors, local worker processes,
    or, with one worker, this process."""
    from prefdata.checks import stream
    from prefdata.engine.local import LocalEngine
    from prefdata.pipeline import shards

    runner = select_engine(s.engine, run.workers, s.ray_address) or LocalEngine(run.workers)
    input_bytes = None if run.hub else sum(path.stat().st_size for path in run.input_files)
    shard_bytes = shards.shard_bytes_of(input_bytes, runner)
    raw_path = run.input
    return shards.write_with_workers(
        stream.input_chunks(raw_path), tmp,
        check=CheckChunk(run.pair_tokenizer, run.tokenize, run.policy, benchmarks=run.index, pairing=run.pairing),
        policy=run.policy, engine=runner,
        shard_bytes=shard_bytes, batch_size=s.batch_size, handoff=_handoff(run.config, run.pair_tokenizer),
        input_name=str(raw_path.mix.path if isinstance(raw_path, MixPlan) else raw_path), progress=s.progress,
        report=report, balance=run.balance,
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


def _check_numbers(batch_size: int, workers: int | None) -> None:
    """The numbers given, checked."""
    if batch_size < 1:
        raise PrefdataError("--batch-size must be at least 1")
    if workers is not None and workers < 1:
        raise PrefdataError("--workers must be at least 1")


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
