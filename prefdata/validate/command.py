"""`prefdata validate`: run prefdata's checks on raw data or a prepared OUT/, report, and set the exit code.

Exit codes: 0 no finding at error severity; 1 findings at error severity (flags the policy makes
errors, quarantined records, an exceeded dataset limit) -- with a baseline, only regressions;
2 usage or input error (PrefdataError). Writes nothing but `output` and $GITHUB_STEP_SUMMARY.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from prefdata.checks.policy import Policy, load_policy
from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.io.messages import text_of
from prefdata.io.hub import parse_hub_id
from prefdata.io.manifest import MANIFEST_NAME, atomic_write_text, read_manifest
from prefdata.report.baseline import apply_baseline
from prefdata.report.builder import ReportBuilder
from prefdata.report.hints import dropped_share_problem, nothing_read_problem
from prefdata.report.sections import SCHEMA_VERSION, build_report
from prefdata.sets.decontaminate import DEFAULT_NGRAM, BenchmarkIndex, load_benchmarks
from prefdata.sets.mix import MixPlan, is_mix_file
from prefdata.settings.commands import ValidateSettings
from prefdata.settings.declare import takes_settings
from prefdata.templates import bundled_templates_for
from prefdata.tokenize.select import BOTH_GIVEN, select_pair_tokenizer

if TYPE_CHECKING:
    from prefdata.checks.merge import DatasetMerge
    from prefdata.checks.partitioned import PartitionedMerge
    from prefdata.tokenize.pairs import PairTokenizer

FORMATS = ("text", "json", "markdown", "github", "html")
# Flags the stored rows keep from `prepare` because re-checking cannot recompute them without
# re-tokenizing the original text (what was cut, how the template split the prompt) or the raw shape.
_STORED_TOKEN_FLAGS = (F.COMPLETION_TRUNCATED, F.PROMPT_BOUNDARY_MISMATCH)
_STORED_PAIR_FLAGS = (F.MULTI_TURN_COMPLETION, F.TIED_REWARD, F.REWARD_DISAGREES)


@dataclass
class ValidateResult:
    exit_code: int
    report: dict[str, Any] = field(default_factory=dict)
    rendered: str = ""  # the report in the requested format (what went to stdout or `output`)
    problem: str = ""  # one line when no record was readable or max_dropped_share was exceeded; the CLI prints it on stderr


def is_prepared_dir(path: str | Path) -> bool:
    """A directory written by `prefdata prepare`: a manifest next to a save_to_disk dataset."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST_NAME).is_file() and (p / "state.json").is_file()


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


@takes_settings(ValidateSettings)  # or settings=ValidateSettings(...): prefdata.settings
def validate(
    input: str | Path,
    *,
    tokenizer: str | None = None,
    processor: str | None = None,
    policy: str | Path | None = None,
    format: str = "text",
    output: str | Path | None = None,
    baseline: str | Path | None = None,
    against: str | Path | None = None,
    max_length: int | None = None,
    max_prompt_length: int | None = None,
    chat_template: bool = False,
    progress: bool = True,
    trust_remote_code: bool = False,
    batch_size: int = 1000,
    workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    partitioned_checks: bool = False,
    template_kwargs: dict[str, Any] | list[str] | None = None,
    chat_template_file: str | Path | None = None,
    template_date: str | None = None,
    pairing: str = "best-worst",
    pairing_seed: int = 0,
    min_score_margin: float = 0.0,
    rating: str = "mean",
    top_k: int = 2,
    decontaminate_against: str | Path | list[str | Path] | None = None,
    decontaminate_field: str | list[str] | None = None,
    decontaminate_ngram: int = DEFAULT_NGRAM,
    decontaminate_completions: bool = False,
    allowed_image_root: str | Path | list[str | Path] | None = None,
) -> ValidateResult:
    """Check INPUT (raw file/directory or prepared OUT/) and report in `format`.

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
    one per cluster CPU); the report is the same. `partitioned_checks`: raw input's dataset-wide
    checks by hash partitioning across the workers, in a first pass (prefdata.checks.partitioned).
    `template_kwargs`, `chat_template_file`, `template_date`: how conversations render, as in `prepare`.
    `pairing`, `pairing_seed`, `min_score_margin`, `rating`, `top_k`: how records of scored
    completions become pairs, as in `prepare` (prefdata.sets.pairing).
    `decontaminate_*`: flag `benchmark_overlap` against benchmark files, as in `prepare`.
    INPUT may be a mix file (prefdata.sets.mix): the same sampled records `prepare` reads from it, and
    the report's per-source section.
    Image paths in rows are read only under the input file's directory (a directory input: that
    directory) or an `allowed_image_root` (none by default); anything else, and an image above the
    policy's `max_image_pixels`, is quarantined naming the path, never opened (prefdata.io.images).
    """
    if format not in FORMATS:
        raise PrefdataError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    if tokenizer and processor:
        raise PrefdataError(BOTH_GIVEN)
    input_path = Path(input)
    hub = parse_hub_id(input)  # `org/name:split`: a Hub dataset split, streamed (prefdata.io.hub)
    if not input_path.exists() and hub is None:
        raise PrefdataError(f"{input_path}: no such file or directory")
    loaded_policy = load_policy(policy)
    base = _load_baseline(baseline) if baseline is not None else None
    if against is not None and not Path(against).exists():
        raise PrefdataError(f"--against {against}: no such file or directory")
    if output is not None and Path(output).resolve().is_relative_to(input_path.resolve()):
        raise PrefdataError(f"--output {output} is INPUT or inside it; validate never writes into its input")
    if workers is not None and workers < 1:
        raise PrefdataError("--workers must be at least 1")
    from prefdata.sets.pairing import PairingSettings

    pairing_settings = PairingSettings(pairing, pairing_seed, min_score_margin, rating, top_k,
                                       loaded_policy.max_pairs_per_record, loaded_policy.above_max_pairs)
    from prefdata.engine.select import check_engine

    check_engine(engine)
    _refuse_unfinished_out(input_path)
    benchmarks = load_benchmarks(decontaminate_against, ngram=decontaminate_ngram, fields=decontaminate_field,
                                 completions=decontaminate_completions)
    index = benchmarks[0] if benchmarks else None
    prepared = is_prepared_dir(input_path)
    mix = None
    if not prepared and is_mix_file(input_path):
        from prefdata.checks.stream import plan_input_mix

        mix = plan_input_mix(input_path)
    builder = ReportBuilder(loaded_policy, truncation_known=not prepared, sources=mix.file_sources() if mix else None)
    pair_tokenizer = None
    builder.benchmarks = benchmarks[1] if benchmarks else None
    if mix is not None:
        builder.source_plans = {entry["name"]: entry for entry in mix.record()["sources"]}
    if prepared:
        from prefdata.core.schema import check_out

        check_out(input_path)  # OUT's published contract first: a breach is an input error (exit 2)
        _check_prepared(input_path, builder, loaded_policy, against=against, progress=progress, batch_size=batch_size,
                        benchmarks=index, image_tokens=_image_token_counter(processor, input_path, trust_remote_code))
    else:
        from prefdata.io.images import image_access
        from prefdata.tokenize.settings import TokenizeSettings
        from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE, TemplateSettings, parse_template_kwargs

        template = TemplateSettings(
            kwargs=parse_template_kwargs(template_kwargs),
            chat_template_file=str(chat_template_file) if chat_template_file else None,
            date=template_date or DEFAULT_TEMPLATE_DATE,
        )
        settings = TokenizeSettings(max_length=max_length, max_prompt_length=max_prompt_length,
                                    chat_template=chat_template, template=template,
                                    images=image_access(None if hub else (input_path.parent if mix else input_path),
                                                        mix is not None, allowed_image_root,
                                                        loaded_policy.max_image_pixels))
        pair_tokenizer = select_pair_tokenizer(tokenizer, processor, settings, trust_remote_code)
        _check_raw(
            mix or input_path, builder, loaded_policy, settings, pair_tokenizer=pair_tokenizer, against=against,
            progress=progress, batch_size=batch_size, workers=workers, engine=engine,
            ray_address=ray_address, partitioned_checks=partitioned_checks, benchmarks=index, pairing=pairing_settings,
        )

    meta: dict[str, Any] = {
        "command": "validate",
        "input": str(input),
        "tokenizer": str(tokenizer or processor) if tokenizer or processor else None,
        **({"processor": str(processor)} if processor else {}),
        "input_kind": "prepared" if prepared else "raw",
        "against": str(against) if against is not None else None,
        # Rows of a directory input name their file relative to it; annotations need the full path.
        "source_root": str(input) if input_path.is_dir() and not prepared else (str(input_path.parent) if mix else None),
        "settings": {"max_length": max_length, "max_prompt_length": max_prompt_length, "chat_template": chat_template,
                             "chat_template_file": str(chat_template_file) if chat_template_file else None},
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
    report = build_report(builder, None, meta)
    if base is not None:
        apply_baseline(report, base)
        exit_code = 1 if report["baseline"]["regressions"] else 0
    else:
        exit_code = 1 if report["errors"] or report["limits_exceeded"] else 0
    rendered = _emit(report, format, output)
    # The one failure line for too many dropped pairs (main cause, setting that keeps them), unless
    # a baseline already had it.
    exceeded_before = base is not None and "max_dropped_share" not in report["baseline"]["new_thresholds_exceeded"]
    problem = "" if exceeded_before else dropped_share_problem(report)
    unreadable = nothing_read_problem(report, input, "the report") if not prepared else ""
    if unreadable:  # an input error, as in prepare (exit 2), whatever a baseline says; the report shows why
        exit_code, problem = 2, unreadable
    return ValidateResult(exit_code=exit_code, report=report, rendered=rendered, problem=problem)


def _check_prepared(
    input_path: Path, builder: ReportBuilder, policy: Policy, *, against: str | Path | None, progress: bool, batch_size: int,
    benchmarks: BenchmarkIndex | None = None, image_tokens: Callable[[list[Any]], list[int]] | None = None,
) -> None:
    from prefdata.checks.merge import DatasetMerge

    merge = DatasetMerge(policy.near_duplicate_prompt_threshold, background=True)
    rows = iter_prepared_rows(input_path, policy=policy, against=against, progress=progress, batch_size=batch_size, merge=merge,
                              benchmarks=benchmarks, image_tokens=image_tokens)
    _accumulate(rows, builder, merge)


def _image_token_counter(processor: str | None, out: Path, trust_remote_code: bool) -> Callable[[list[Any]], list[int]] | None:
    """With --processor on a prepared OUT/: each stored image's tokens, counted by the processor, which
    must be the one OUT was prepared with (another one's counts would not describe OUT's ids)."""
    if not processor:
        return None
    from prefdata.tokenize.settings import TokenizeSettings

    try:
        recorded = read_manifest(out).get("processor") or {}
    except OSError:  # an OUT that kept no pair has no manifest: nothing to count against
        recorded = {}
    if not recorded:
        raise PrefdataError(f"--processor was given but {out} was not prepared with one (it holds no image pairs)")
    vision = select_pair_tokenizer(None, processor, TokenizeSettings(), trust_remote_code)
    found, expected = vision.fingerprint(), str(recorded.get("fingerprint") or "")
    if found != expected:
        raise PrefdataError(
            f"the processor at {processor} ({found[:19]}) differs from the one {out} was prepared with "
            f"({recorded.get('path')}, {expected[:19]}): its image token counts would not describe OUT's ids"
        )
    return vision.image_token_counts  # type: ignore[union-attr]


def _check_raw(
    input_path: "Path | MixPlan",
    builder: ReportBuilder,
    policy: Policy,
    settings: Any,
    *,
    pair_tokenizer: "PairTokenizer | None",
    against: str | Path | None,
    progress: bool,
    batch_size: int,
    workers: int | None,
    engine: str = "local",
    ray_address: str | None = None,
    partitioned_checks: bool = False,
    benchmarks: BenchmarkIndex | None = None,
    pairing: Any = None,
) -> None:
    """Raw INPUT: text-only checks across workers in bulk (validate.merge), else row by row (checks.stream)
    through `pair_tokenizer` (--tokenizer or --processor).
    On Ray, `workers` is the number of actors (0: one per cluster CPU)."""
    from prefdata.checks.merge import DatasetMerge
    from prefdata.checks.partitioned import PartitionedMerge
    from prefdata.engine.local import default_workers
    from prefdata.engine.select import select_engine

    if workers is None:
        workers = 0 if engine == "ray" else default_workers()
    runner = select_engine(engine, workers, ray_address)
    # The bulk text path reads plain files in byte ranges (not a Hub split, not a mixture's samples).
    byte_ranges = not isinstance(input_path, MixPlan) and parse_hub_id(input_path) is None
    if pair_tokenizer is None and (workers > 1 or engine == "ray") and not partitioned_checks and byte_ranges:
        from prefdata.validate.merge import check_raw_text

        check_raw_text(
            input_path, builder, policy=policy, settings=settings, against=against,
            batch_size=batch_size, progress=progress, workers=workers, engine=runner, benchmarks=benchmarks,
            pairing=pairing,
        )
        return
    from prefdata.checks.stream import iter_checked_rows

    threshold = policy.near_duplicate_prompt_threshold
    merge = PartitionedMerge(threshold) if partitioned_checks else DatasetMerge(threshold)
    rows = iter_checked_rows(
        input_path, pair_tokenizer=pair_tokenizer, policy=policy, settings=settings, batch_size=batch_size,
        progress=progress, against=against, workers=workers, merge=merge,
        engine=runner, benchmarks=benchmarks, pairing=pairing,
    )
    _accumulate(rows, builder, merge)


def _accumulate(rows: Iterator[Any], builder: ReportBuilder, merge: "DatasetMerge | PartitionedMerge") -> None:
    """Feed every row to the report; then the near-duplicate prompts `merge` found among them (the
    rows' ordinals are the report's: builder.location() resolves them)."""
    for row in rows:
        builder.add(row)
    builder.add_near_duplicate_prompts(merge.near_duplicate_clusters(), builder.location)


# ----------------------------------------------------------------------------- prepared OUT/


def iter_prepared_rows(
    out_dir: str | Path,
    *,
    policy: Policy,
    against: str | Path | None = None,
    progress: bool = True,
    batch_size: int = 1000,
    merge: DatasetMerge | None = None,
    benchmarks: BenchmarkIndex | None = None,
    image_tokens: Callable[[list[Any]], list[int]] | None = None,
) -> Iterator[Any]:
    """Re-check the rows stored in a prepared OUT/, streaming it in record batches.

    Image pairs: the stored images are read (their headers only: sizes, not pixels) and their bytes
    count in the duplicate checks as in `prepare`; `image_tokens` (a processor's
    VisionPairTokenizer.image_token_counts) gives each image's tokens for the report.

    Each row is rebuilt as Pair + TokenizedPair from its columns and goes through the same checks as
    in `prepare`: text flags, token flags on the stored ids, dataset-wide duplicates, prompt leaks,
    non-finite reference log-probs. Flags that need the original tokenization are taken as stored."""
    import datasets

    from prefdata.checks.checker import PairChecker
    from prefdata.core.records import CheckedRow
    from prefdata.core.records import Pair, RawRecord, TokenizedPair

    try:
        dataset = datasets.load_from_disk(str(out_dir))
    except Exception as exc:  # a damaged OUT/ is an input error, not a crash
        raise PrefdataError(f"{out_dir}: cannot load the prepared dataset ({type(exc).__name__}: {exc})") from None
    missing = {"prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids", "source_file", "source_line"} - set(
        dataset.column_names
    )
    if missing:
        raise PrefdataError(f"{out_dir}: not a prefdata dataset (missing columns: {', '.join(sorted(missing))})")
    checker = PairChecker(policy, _leak_index(against) if against is not None else None, merge, benchmarks)
    # Image pairs: the images' bytes straight from the Arrow table, never decoded by `datasets`.
    images = dataset.data.column("images") if "images" in dataset.column_names else None
    if images is not None:
        dataset = dataset.remove_columns("images")
    has_refs = "ref_chosen_logps" in dataset.column_names and "ref_rejected_logps" in dataset.column_names
    batches = dataset.iter(batch_size=batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="checking", unit=" batches", total=math.ceil(len(dataset) / batch_size), disable=None)
    ordinal = 0  # the row's index: what near-duplicate prompt clusters report
    for batch in batches:
        stored_batch = images.slice(ordinal, len(batch["prompt"])).to_pylist() if images is not None else None
        for i in range(len(batch["prompt"])):
            stored = batch["flags"][i] if "flags" in batch else []
            prompt_ids, chosen_ids, rejected_ids = batch["prompt_ids"][i], batch["chosen_ids"][i], batch["rejected_ids"][i]
            # Conversational rows are message lists: checked as the text `prepare` checked.
            prompt = text_of(batch["prompt"][i], completion=False)
            chosen, rejected = text_of(batch["chosen"][i], completion=True), text_of(batch["rejected"][i], completion=True)
            text_less = not (prompt or chosen or rejected)
            pair = Pair(
                source_file=batch["source_file"][i],
                source_line=batch["source_line"][i],
                prompt=prompt,
                chosen=chosen,
                rejected=rejected,
                # Ids on the Pair only when there is no text: the text checks then compare ids.
                prompt_ids=prompt_ids if text_less else None,
                chosen_ids=chosen_ids if text_less else None,
                rejected_ids=rejected_ids if text_less else None,
                flags=[f for f in stored if f in _STORED_PAIR_FLAGS],
            )
            tokenized = TokenizedPair(
                prompt_ids=prompt_ids,
                chosen_ids=chosen_ids,
                rejected_ids=rejected_ids,
                prompt_len_full=len(prompt_ids),
                chosen_len_full=len(chosen_ids),
                rejected_len_full=len(rejected_ids),
                flags=[f for f in stored if f in _STORED_TOKEN_FLAGS],
            )
            non_finite = has_refs and not all(
                v is not None and math.isfinite(v) for v in (batch["ref_chosen_logps"][i], batch["ref_rejected_logps"][i])
            )
            extra = [F.NON_FINITE_REF_LOGPS] if non_finite else []
            if stored_batch is not None and stored_batch[i]:
                pair.image_data = _stored_images(stored_batch[i], pair, out_dir, policy.max_image_pixels)
                tokenized.image_tokens = image_tokens(pair.image_data) if image_tokens is not None else None
            kept, severity, outcome = checker.check(pair, tokenized, extra, ordinal=ordinal)
            ordinal += 1
            raw = RawRecord(source_file=pair.source_file, source_line=pair.source_line)
            yield CheckedRow(raw, pair, tokenized, kept, severity, outcome)


def _stored_images(values: list[dict[str, Any]], pair: Any, out_dir: str | Path, max_pixels: int) -> list[Any]:
    from prefdata.core.errors import RecordError
    from prefdata.io.images import stored_images

    try:
        return stored_images(values, max_pixels)
    except RecordError as exc:  # a damaged OUT/ is an input error
        raise PrefdataError(f"{out_dir}: the row from {pair.source_file}:{pair.source_line}: {exc}") from None


def _leak_index(against: str | Path) -> Any:
    """Prompts of OTHER: a prepared OUT/ (its prompt column) or raw data (read like INPUT)."""
    if is_prepared_dir(against):
        import datasets

        from prefdata.checks.dataset import PromptLeakIndex

        dataset = datasets.load_from_disk(str(against))

        def prompts() -> Iterator[Any]:
            for batch in dataset.select_columns(["prompt", "prompt_ids"]).iter(batch_size=4096):
                for text, ids in zip(batch["prompt"], batch["prompt_ids"]):
                    text = text_of(text, completion=False)
                    yield text if text else ids

        return PromptLeakIndex(prompts())
    from prefdata.checks.checker import build_leak_index

    return build_leak_index(against)


# ----------------------------------------------------------------------------- baseline / output


def _load_baseline(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PrefdataError(f"--baseline {p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PrefdataError(f"--baseline {p}: not a JSON report ({exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data or "flagged_rows" not in data:
        raise PrefdataError(f"--baseline {p}: not a prefdata report.json (no schema_version / flagged_rows)")
    if not isinstance(data["schema_version"], int) or data["schema_version"] > SCHEMA_VERSION:
        raise PrefdataError(
            f"--baseline {p}: report schema {data['schema_version']!r} is newer than this prefdata reads ({SCHEMA_VERSION})"
        )
    return data


def _render(report: dict[str, Any], fmt: str) -> str:
    from prefdata.report.render_html import render_html
    from prefdata.report.render_markdown import render_markdown
    from prefdata.report.render_text import render_text

    if fmt == "json":
        return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "html":
        return render_html(report)
    return render_text(report)


def _emit(report: dict[str, Any], fmt: str, output: str | Path | None) -> str:
    from prefdata.report.render_github import github_annotations, write_step_summary
    from prefdata.report.render_markdown import render_markdown
    from prefdata.report.render_text import render_text

    if fmt == "github":
        annotations = github_annotations(report)
        text = "".join(line + "\n" for line in annotations)
        sys.stdout.write(text)  # GitHub reads workflow commands from stdout only
        sys.stdout.write(render_text(report))
        write_step_summary(render_markdown(report))
        if output is not None:
            suffix = Path(output).suffix.lower()
            file_format = {".html": "html", ".htm": "html", ".md": "markdown"}.get(suffix, "json")
            _write(output, _render(report, file_format))
        return text
    rendered = _render(report, fmt)
    if output is not None:
        _write(output, rendered)
        if fmt != "text":
            sys.stdout.write(render_text(report))  # still say what happened on the terminal
    else:
        sys.stdout.write(rendered)
    return rendered


def _write(path: str | Path, text: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise PrefdataError(f"--output {p} is a directory")
    if not p.parent.exists():
        raise PrefdataError(f"--output {p}: directory {p.parent} does not exist")
    atomic_write_text(p, text)
