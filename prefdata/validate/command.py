"""`prefdata validate`: run prefdata's checks on raw data or a prepared OUT/, report, and set the exit code.

Exit codes: 0 no finding at error severity; 1 findings at error severity (flags the policy makes
errors, quarantined records, an exceeded dataset limit) -- with a baseline, only regressions;
2 usage or input error (PrefdataError). Writes nothing but `output` and $GITHUB_STEP_SUMMARY.

The recipe is `validate`, top to bottom; raw input is checked in prefdata.validate.raw, a prepared
OUT/ in prefdata.validate.prepared, and the report goes out through prefdata.validate.output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata.checks.policy import Policy, load_policy
from prefdata.core.errors import PrefdataError
from prefdata.io.hub import parse_hub_id
from prefdata.io.manifest import MANIFEST_NAME, read_manifest
from prefdata.report.baseline import apply_baseline
from prefdata.report.builder import ReportBuilder
from prefdata.report.hints import dropped_share_problem, nothing_read_problem
from prefdata.report.sections import build_report
from prefdata.sets.decontaminate import load_benchmarks
from prefdata.sets.mix import MixPlan, is_mix_file
from prefdata.settings.commands import ValidateSettings
from prefdata.settings.declare import settings_command
from prefdata.templates import bundled_templates_for
from prefdata.tokenize.select import BOTH_GIVEN, select_pair_tokenizer
from prefdata.validate.output import emit, load_baseline
from prefdata.validate.prepared import check_prepared, image_token_counter, is_prepared_dir
from prefdata.validate.raw import check_raw

FORMATS = ("text", "json", "markdown", "github", "html")


@dataclass
class ValidateResult:
    exit_code: int
    report: dict[str, Any] = field(default_factory=dict)
    rendered: str = ""  # the report in the requested format (what went to stdout or `output`)
    problem: str = ""  # one line when no record was readable or max_dropped_share was exceeded; the CLI prints it on stderr


def _refuse_unfinished_out(path: Path) -> None:
    """A directory prefdata created but never finished (no manifest) is not raw input: reading its
    leftovers as data would pass or fail for the wrong reason. One line saying what happened."""
    from prefdata.io.out_dir import STAGING_PREFIX, is_prefdata_dir

    if not path.is_dir() or not is_prefdata_dir(path) or (path / MANIFEST_NAME).is_file():
        return
    if any(path.glob(f"{STAGING_PREFIX}*")):
        why = "a prepare was interrupted before it finished; rerun it"
    elif (path / "quarantine.jsonl").is_file():
        why = f"its prepare could read no record, see {path / 'quarantine.jsonl'}"
    else:
        why = "no manifest.json; rerun `prefdata prepare`"
    raise PrefdataError(f"{path} is an unfinished prefdata OUT ({why})")


@settings_command(ValidateSettings)  # settings=ValidateSettings(...) or flat keywords: prefdata.settings
def validate(input: str | Path, settings: ValidateSettings) -> ValidateResult:
    """Check INPUT (raw file/directory or prepared OUT/) and report in `format`.

    Each setting is declared once, in `prefdata.settings.commands.ValidateSettings` (`prefdata validate
    --help`); pass `settings=ValidateSettings(...)`, flat keywords (`tokenizer="tok"`), or both.

    Without a tokenizer raw input gets every text-level check; with one, the token-level checks on
    the truncated ids as well (as `prepare` would). `processor` (image pairs) in place of `tokenizer`:
    an AutoProcessor directory, which counts each image's tokens exactly as `prepare --processor`
    does (lengths, `image_truncated`, the report's tokens per image); without it, image placeholders
    are only counted against the images (`image_mismatch`). A prepared OUT/ is re-checked from its stored
    columns (its ids are what training sees). `--format github` prints annotations to stdout and
    appends the Markdown report to $GITHUB_STEP_SUMMARY; its `output`, if given, gets the report as
    HTML (.html), Markdown (.md) or JSON (anything else), e.g. to keep as the next baseline.
    `workers`: processes that read and check raw input (default: all cores, at most 8; 1 checks in
    this process only); the report does not depend on it. `engine="ray"` checks raw input on a
    Ray cluster (`ray_address`, else RAY_ADDRESS, else a local Ray) with `workers` actors (default:
    one per cluster CPU); the report is the same. The dataset-wide checks run by hash partitioning
    across the workers, in a first pass (prefdata.checks.partitioned).
    `template_kwargs`, `chat_template_file`, `template_date`: how conversations render, as in `prepare`.
    `pairing`, `pairing_seed`, `min_score_margin`, `rating`, `top_k`: how records of scored
    completions become pairs, as in `prepare` (prefdata.sets.pairing).
    `decontaminate_*`: flag `benchmark_overlap` against benchmark files, as in `prepare`.
    INPUT may be a mix file (prefdata.sets.mix): the same sampled records `prepare` reads from it, and
    the report's per-source section.
    `trainer`, `trainer_args`: also run the rows through that trainer's own preprocessing with its
    settings (prefdata.trainers); findings at error severity there fail the run too.
    Image paths in rows are read only under the input file's directory (a directory input: that
    directory) or an `allowed_image_root` (none by default); anything else, and an image above the
    policy's `max_image_pixels`, is quarantined naming the path, never opened (prefdata.io.images).
    """
    plan = _plan(input, settings)
    pair_tokenizer = _check(plan, settings)
    return _result(input, plan, settings, pair_tokenizer)


@dataclass
class _Plan:
    """What validate read and decided before checking: INPUT's path and kind, the loaded policy and
    baseline, the benchmarks, the report's builder, the trainer's settings, how records become pairs."""

    path: Path
    hub: Any
    policy: Policy
    base: dict[str, Any] | None
    prepared: bool
    mix: MixPlan | None
    builder: ReportBuilder
    benchmarks: Any  # the BenchmarkIndex, or None
    trainer: Any
    pairing: Any


def _plan(input: str | Path, s: ValidateSettings) -> _Plan:
    """The arguments checked and loaded, in the order whose first problem is the one reported."""
    input_path, hub, loaded_policy, base = _arguments(input, s.format, s.tokenizer, s.processor, s.policy, s.baseline,
                                                      s.against, s.output, s.workers)
    from prefdata.engine.select import check_engine
    from prefdata.sets.pairing import PairingSettings

    pairing = PairingSettings(s.pairing, s.pairing_seed, s.min_score_margin, s.rating, s.top_k,
                              loaded_policy.max_pairs_per_record, loaded_policy.above_max_pairs)
    check_engine(s.engine)
    _refuse_unfinished_out(input_path)
    benchmarks = load_benchmarks(s.decontaminate_against, ngram=s.decontaminate_ngram, fields=s.decontaminate_field,
                                 completions=s.decontaminate_completions)
    prepared = is_prepared_dir(input_path)
    from prefdata.trainers.run import check_trainer_arguments

    trainer_settings = check_trainer_arguments(s.trainer, s.trainer_args, s.trainer_python, s.tokenizer, prepared,
                                               s.trainer is None or (hub is None and not is_mix_file(input_path)))
    mix = None
    if not prepared and is_mix_file(input_path):
        from prefdata.checks.stream import plan_input_mix

        mix = plan_input_mix(input_path)
    builder = _report_builder(loaded_policy, prepared, mix, benchmarks)
    return _Plan(input_path, hub, loaded_policy, base, prepared, mix, builder, benchmarks[0] if benchmarks else None,
                 trainer_settings, pairing)


def _check(plan: _Plan, s: ValidateSettings) -> Any:
    """Every check into the report's builder: a prepared OUT/ from its stored columns, raw input as
    prepare would read it. Returns the pair tokenizer raw input was checked with (or None)."""
    if plan.prepared:
        from prefdata.core.schema import check_out

        check_out(plan.path)  # OUT's published contract first: a breach is an input error (exit 2)
        check_prepared(plan.path, plan.builder, plan.policy, against=s.against, progress=s.progress,
                       batch_size=s.batch_size, benchmarks=plan.benchmarks,
                       image_tokens=image_token_counter(s.processor, plan.path, s.trust_remote_code))
        return None
    tokenize = _tokenize_settings(plan.path, plan.hub, plan.mix, plan.policy, s.max_length, s.max_prompt_length,
                                  s.chat_template, s.template_kwargs, s.chat_template_file, s.template_date,
                                  s.allowed_image_root, s.train_turns)
    pair_tokenizer = select_pair_tokenizer(s.tokenizer, s.processor, tokenize, s.trust_remote_code)
    check_raw(plan.mix or plan.path, plan.builder, plan.policy, tokenize, s, pair_tokenizer=pair_tokenizer,
              benchmarks=plan.benchmarks, pairing=plan.pairing)
    return pair_tokenizer


def _result(input: str | Path, plan: _Plan, s: ValidateSettings, pair_tokenizer: Any) -> ValidateResult:
    """The report built, the trainer's section and the baseline applied, written out; the exit code."""
    meta = _meta(input, plan.path, plan.prepared, plan.mix, s.tokenizer, s.processor, s.against, pair_tokenizer,
                 {"max_length": s.max_length, "max_prompt_length": s.max_prompt_length, "chat_template": s.chat_template,
                  "chat_template_file": str(s.chat_template_file) if s.chat_template_file else None})
    report = build_report(plan.builder, None, meta)
    if plan.trainer is not None:  # what the trainer's own preprocessing makes of the same rows
        from prefdata.trainers.run import trainer_section

        report["trainer"] = trainer_section(plan.path, plan.trainer, str(s.tokenizer), s.trust_remote_code,
                                            pair_tokenizer, plan.policy)
        if report["trainer"]["errors"]:
            report["status"] = "fail"
    base = plan.base
    if base is not None:
        apply_baseline(report, base)
        exit_code = 1 if report["baseline"]["regressions"] else 0
    else:
        exit_code = 1 if report["errors"] or report["limits_exceeded"] else 0
    if report.get("trainer", {}).get("errors"):
        exit_code = 1  # pairs the trainer would train on broken, at the policy's error severity
    rendered = emit(report, s.format, s.output)
    # The one failure line for too many dropped pairs (main cause, setting that keeps them), unless
    # a baseline already had it.
    exceeded_before = base is not None and "max_dropped_share" not in report["baseline"]["new_thresholds_exceeded"]
    problem = "" if exceeded_before else dropped_share_problem(report)
    unreadable = nothing_read_problem(report, input, "the report") if not plan.prepared else ""
    if unreadable:  # an input error, as in prepare (exit 2), whatever a baseline says; the report shows why
        exit_code, problem = 2, unreadable
    return ValidateResult(exit_code=exit_code, report=report, rendered=rendered, problem=problem)


def _arguments(
    input: str | Path, format: str, tokenizer: str | None, processor: str | None, policy: str | Path | None,
    baseline: str | Path | None, against: str | Path | None, output: str | Path | None, workers: int | None,
) -> tuple[Path, Any, Policy, dict[str, Any] | None]:
    """The arguments checked in this order (the first problem is the one reported), and what they
    load: INPUT's path, its Hub id (`org/name:split`, streamed: prefdata.io.hub), the policy, the
    baseline report."""
    if format not in FORMATS:
        raise PrefdataError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    if tokenizer and processor:
        raise PrefdataError(BOTH_GIVEN)
    input_path = Path(input)
    hub = parse_hub_id(input)
    if not input_path.exists() and hub is None:
        raise PrefdataError(f"{input_path}: no such file or directory")
    loaded_policy = load_policy(policy)
    base = load_baseline(baseline) if baseline is not None else None
    if against is not None and not Path(against).exists():
        raise PrefdataError(f"--against {against}: no such file or directory")
    if output is not None and Path(output).resolve().is_relative_to(input_path.resolve()):
        raise PrefdataError(f"--output {output} is INPUT or inside it; validate never writes into its input")
    if workers is not None and workers < 1:
        raise PrefdataError("--workers must be at least 1")
    return input_path, hub, loaded_policy, base


def _report_builder(policy: Policy, prepared: bool, mix: MixPlan | None, benchmarks: Any) -> ReportBuilder:
    """The report's accumulator: a mixture's sources, the benchmarks decontamination read."""
    builder = ReportBuilder(policy, truncation_known=not prepared, sources=mix.file_sources() if mix else None)
    builder.benchmarks = benchmarks[1] if benchmarks else None
    if mix is not None:
        builder.source_plans = {entry["name"]: entry for entry in mix.record()["sources"]}
    return builder


def _tokenize_settings(
    input_path: Path, hub: Any, mix: MixPlan | None, policy: Policy, max_length: int | None,
    max_prompt_length: int | None, chat_template: bool, template_kwargs: dict[str, Any] | list[str] | None,
    chat_template_file: str | Path | None, template_date: str | None,
    allowed_image_root: str | Path | list[str | Path] | None, train_turns: str = "all",
) -> Any:
    """How raw INPUT is rendered and tokenized, as `prepare` would; image paths are read under
    INPUT's directory (a mixture's: the mix file's) or an allowed root."""
    from prefdata.io.images import image_access
    from prefdata.tokenize.settings import TokenizeSettings
    from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE, TemplateSettings, parse_template_kwargs

    template = TemplateSettings(
        kwargs=parse_template_kwargs(template_kwargs),
        chat_template_file=str(chat_template_file) if chat_template_file else None,
        date=template_date or DEFAULT_TEMPLATE_DATE,
    )
    return TokenizeSettings(max_length=max_length, max_prompt_length=max_prompt_length,
                            chat_template=chat_template, template=template, train_turns=train_turns,
                            images=image_access(None if hub else (input_path.parent if mix else input_path),
                                                mix is not None, allowed_image_root,
                                                policy.max_image_pixels))


def _meta(
    input: str | Path, input_path: Path, prepared: bool, mix: MixPlan | None, tokenizer: str | None,
    processor: str | None, against: str | Path | None, pair_tokenizer: Any, settings: dict[str, Any],
) -> dict[str, Any]:
    """What the report says about the run: the input and its kind, the tokenizer, the settings; for
    a prepared OUT/, what its manifest recorded."""
    meta: dict[str, Any] = {
        "command": "validate",
        "input": str(input),
        "tokenizer": str(tokenizer or processor) if tokenizer or processor else None,
        **({"processor": str(processor)} if processor else {}),
        "input_kind": "prepared" if prepared else "raw",
        "against": str(against) if against is not None else None,
        # Rows of a directory input name their file relative to it; annotations need the full path.
        "source_root": str(input) if input_path.is_dir() and not prepared else (str(input_path.parent) if mix else None),
        "settings": settings,
        "tokenizer_chat_template": bool(pair_tokenizer.tokenizer.chat_template) if pair_tokenizer is not None else None,
        # Bundled templates a reasoning_lost hint may name: those made for this tokenizer's template.
        "bundled_templates": bundled_templates_for(pair_tokenizer.tokenizer.chat_template) if pair_tokenizer is not None else [],
    }
    if prepared:
        manifest = read_manifest(input_path)
        meta["tokenizer"] = meta["tokenizer"] or (manifest.get("tokenizer") or {}).get("path")
        meta["prepared_accounting"] = manifest.get("row_accounting")
        raw = (manifest.get("config") or {}).get("raw")
        meta["source_root"] = raw if raw and Path(raw).is_dir() else None
        meta["note"] = "re-checked the stored rows; token-level checks use the stored (already truncated) ids"
    return meta
