"""OUT's contract as pandera models (polars backend): the columns, their types and row-level rules.

`PreparedPairs` is OUT's dataset after `prefdata prepare`; `ScoredPairs` after `prefdata refs`.
`TokenPairs`/`ScoredTokenPairs` are the part `refs` and `train` read (id and reference columns), so
they also accept pre-tokenized datasets from elsewhere. `validate OUT` checks the full contract with
`check_out`, `refs` and `train` the part they read; users' pipelines validate their own frames:

    import glob, polars as pl
    from prefdata.core.schema import ScoredPairs
    frame = pl.concat([pl.read_ipc_stream(f) for f in sorted(glob.glob("out/data-*.arrow"))])
    ScoredPairs.validate(frame)

Pass-through columns are allowed (not strict). The text columns `prompt`, `chosen`, `rejected` are
strings, or TRL message lists (`list[struct{role, content}]`) for conversational rows (docs/trl.md);
with image pairs a content is a list of parts (`list[struct{type, text}]`) and `images` holds
each row's images as `datasets.Image` stores them (`list[struct{bytes, path}]`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pandera.polars as pa
import polars as pl

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.core.numbers import OFFSET_MAX, WEIGHT_MAX, WEIGHT_MIN

ID_DTYPE = pl.List(pl.Int32)
MESSAGES_DTYPE = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
# Image pairs: content as TRL's list of parts, and the images as datasets.Image stores them.
PARTS_MESSAGES_DTYPE = pl.List(pl.Struct({"role": pl.String,
                                          "content": pl.List(pl.Struct({"type": pl.String, "text": pl.String}))}))
IMAGES_DTYPE = pl.List(pl.Struct({"bytes": pl.Binary, "path": pl.String}))
TEXT_COLUMNS = ("prompt", "chosen", "rejected")
ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")
# `refs` also stores each half's sum over the pair's public length min(|yc|, |yr|) (LD-DPO).
PUBLIC_REF_COLUMNS = ("ref_chosen_public_logps", "ref_rejected_public_logps")
# `prepare --loss-on answer`: per half, how many leading completion tokens (the reasoning block) stay in
# the sequence but out of the loss. Absent: the whole completion is in the loss.
LOSS_START_COLUMNS = ("chosen_loss_start", "rejected_loss_start")
# Completions holding turns the model did not write (agent trajectories, multi-turn transcripts): per
# half, one 0/1 entry per completion id (1 = in the loss). Absent, or null on a row: every token is.
LOSS_MASK_COLUMNS = ("chosen_loss_mask", "rejected_loss_mask")
# Optional per-pair loss inputs (given in the data, or written by `prefdata select --weight-by/--offset-by`):
# `weight` scales the pair's loss (0 or in [1e-9, 1e9]), `offset` is ODPO's margin δ (|δ| <= 1e4): the bounds
# float32 training holds (prefdata.core.numbers). Absent: 1 and 0.
WEIGHT_COLUMN, OFFSET_COLUMN = "weight", "offset"
BATCH_ROWS = 65_536  # rows validated at a time by `check_out`: memory stays flat on large OUTs
# A sum of log-probs is <= 0; float32 accumulation may leave a hair above.
_LOGP_TOLERANCE = 1e-3


def _flagged(data: pa.PolarsData, flag: str) -> pl.Expr:
    if "flags" not in data.lazyframe.collect_schema():
        return pl.lit(False)
    return pl.col("flags").list.contains(flag).fill_null(False)


def _both_or_neither(data: pa.PolarsData, names: tuple[str, ...], of_type: Any, label: str) -> pl.LazyFrame | None:
    """For a pair of optional columns: passes (neither is there) or fails (one alone, or of another
    type than `of_type` accepts) as a whole frame; None when both are there to be checked row by row."""
    schema = data.lazyframe.collect_schema()
    present = [name for name in names if name in schema]
    if not present:
        return data.lazyframe.select(pl.lit(True).alias(label))
    if len(present) < len(names) or not all(of_type(schema[name]) for name in present):
        return data.lazyframe.select(pl.lit(False).alias(label))
    return None


# Message fields besides role and content that chat templates read (tool calls, tool turns, reasoning):
# prepare keeps them in the text columns where rows have them (prefdata.io.columns.MESSAGE_FIELD_TYPES).
_OPTIONAL_MESSAGE_FIELDS = frozenset({"reasoning_content", "tool_calls", "tool_call_id", "name"})


def _is_messages_dtype(dtype: pl.DataType) -> bool:
    """TRL's message lists: role and content (a string, or image pairs' list of parts), plus any of the
    optional fields a template reads."""
    if dtype in (MESSAGES_DTYPE, PARTS_MESSAGES_DTYPE):
        return True
    if not (isinstance(dtype, pl.List) and isinstance(dtype.inner, pl.Struct)):
        return False
    fields = {field.name: field.dtype for field in dtype.inner.fields}
    content = fields.get("content")
    return (fields.get("role") == pl.String and content in (pl.String, PARTS_MESSAGES_DTYPE.inner.fields[1].dtype)
            and set(fields) - {"role", "content"} <= _OPTIONAL_MESSAGE_FIELDS)


def _is_integer_list(dtype: pl.DataType) -> bool:
    return isinstance(dtype, pl.List) and dtype.inner.is_integer()


def has_loss_starts(columns: Any) -> bool:
    """Whether rows carry `--loss-on answer` loss starts; PrefdataError when only one half does."""
    return _both_halves(columns, LOSS_START_COLUMNS, "prepare it again with --loss-on answer")


def has_loss_masks(columns: Any) -> bool:
    """Whether rows carry per-token loss masks; PrefdataError when only one half does."""
    return _both_halves(columns, LOSS_MASK_COLUMNS, "prepare it again")


def _both_halves(columns: Any, names: tuple[str, str], remedy: str) -> bool:
    """Whether `columns` hold both of a pair of per-half columns; PrefdataError (naming `remedy`)
    when they hold one only."""
    present = [name for name in names if name in columns]
    if len(present) == 1:
        missing = next(name for name in names if name not in present)
        raise PrefdataError(f"the data has {present[0]} but no {missing}: {remedy}")
    return bool(present)


def _skipped_tokens(half: str, schema: Any) -> pl.Expr:
    """Completion tokens of `half` kept out of the loss (0 without loss starts)."""
    if f"{half}_loss_start" not in schema:
        return pl.lit(0)
    return pl.min_horizontal(pl.col(f"{half}_loss_start"), pl.col(f"{half}_ids").list.len())


def _loss_tokens(half: str, schema: Any) -> pl.Expr:
    """Completion tokens of `half` in the loss: past its loss start, where its loss mask is 1."""
    counted = pl.col(f"{half}_ids").list.len() - _skipped_tokens(half, schema)
    if f"{half}_loss_mask" not in schema:
        return counted
    masked = pl.col(f"{half}_loss_mask").list.slice(_skipped_tokens(half, schema)).list.sum()
    return pl.when(pl.col(f"{half}_loss_mask").is_null()).then(counted).otherwise(masked)


class TokenPairs(pa.DataFrameModel):
    """What `refs` and `train` read: the three id columns (completion ids exclude the prompt)."""

    class Config:
        strict = False  # every other column travels with the pairs

    @pa.dataframe_check
    def id_columns_are_integer_lists(cls, data: pa.PolarsData) -> pl.LazyFrame:
        schema = data.lazyframe.collect_schema()
        ok = all(name in schema and _is_integer_list(schema[name]) for name in ID_COLUMNS)
        return data.lazyframe.select(pl.lit(ok).alias("id_columns"))

    @pa.dataframe_check
    def token_ids_are_non_negative(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(
            pl.all_horizontal((pl.col(name).list.min().fill_null(0) >= 0) for name in ID_COLUMNS)
        )

    @pa.dataframe_check
    def completions_have_tokens_unless_flagged(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """Each half needs a loss token; a kept row without one must say so (`no_completion_tokens`)."""
        has_tokens = (pl.col("chosen_ids").list.len() > 0) & (pl.col("rejected_ids").list.len() > 0)
        return data.lazyframe.select(has_tokens | _flagged(data, F.NO_COMPLETION_TOKENS))

    @pa.dataframe_check
    def loss_starts_are_non_negative_integers(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """`--loss-on answer`: both halves' loss starts or neither, whole numbers >= 0."""
        settled = _both_or_neither(data, LOSS_START_COLUMNS, lambda dtype: dtype.is_integer(), "loss_starts")
        if settled is not None:
            return settled
        non_negative = [(pl.col(name) >= 0).fill_null(False) for name in LOSS_START_COLUMNS]
        return data.lazyframe.select(pl.all_horizontal(non_negative))


    @pa.dataframe_check
    def loss_masks_align_with_the_completion_ids(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """Per-token loss masks: both halves' columns or neither, on each row both or neither (null),
        one 0/1 entry per completion id."""
        settled = _both_or_neither(data, LOSS_MASK_COLUMNS, _is_integer_list, "loss_masks")
        if settled is not None:
            return settled
        checks = [pl.col(LOSS_MASK_COLUMNS[0]).is_null() == pl.col(LOSS_MASK_COLUMNS[1]).is_null()]
        for half in ("chosen", "rejected"):
            mask = pl.col(f"{half}_loss_mask")
            aligned = (mask.list.len() == pl.col(f"{half}_ids").list.len()) & mask.list.eval(
                pl.element().is_in([0, 1])).list.all()
            checks.append(mask.is_null() | aligned.fill_null(False))
        return data.lazyframe.select(pl.all_horizontal(checks))

    @pa.dataframe_check
    def weights_fit_float32_training(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """`weight`: optional, never null; 0 or within the bounds float32 training holds (core.numbers)."""
        in_range = lambda value: (value == 0) | ((value >= WEIGHT_MIN) & (value <= WEIGHT_MAX))
        return _loss_input_rows(data, WEIGHT_COLUMN, in_range)

    @pa.dataframe_check
    def offsets_fit_float32_training(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """`offset`: optional, never null; |offset| within the bound float32 training holds (core.numbers)."""
        return _loss_input_rows(data, OFFSET_COLUMN, lambda value: value.abs() <= OFFSET_MAX)


def _loss_input_rows(data: pa.PolarsData, name: str, in_range: Any) -> pl.LazyFrame:
    """Per row: whether column `name` (when present) holds a number `in_range` accepts. A column of
    another type (a raw file's mixed values stored as text) fails on its first row that is not a
    number, so the error names that row; on every row when each one reads as a number."""
    schema = data.lazyframe.collect_schema()
    if name not in schema:
        return data.lazyframe.select(pl.lit(True).alias(name))  # aliased: older pandera cannot find "literal"
    value = pl.col(name).cast(pl.Float64, strict=False)
    ok = (value.is_finite() & in_range(value)).fill_null(False)
    if not schema[name].is_numeric():
        ok = pl.when(ok.all()).then(pl.lit(False)).otherwise(ok)
    return data.lazyframe.select(ok.alias(name))


class ScoredTokenPairs(TokenPairs):
    """What `train` reads after `refs`: numeric reference columns. Non-finite values are allowed here
    (train skips those rows); the full contract, `ScoredPairs`, requires them flagged."""

    @pa.dataframe_check
    def ref_columns_are_numbers(cls, data: pa.PolarsData) -> pl.LazyFrame:
        schema = data.lazyframe.collect_schema()
        ok = all(name in schema and schema[name].is_numeric() for name in REF_COLUMNS)
        return data.lazyframe.select(pl.lit(ok).alias("ref_columns"))


class PreparedPairs(TokenPairs):
    """OUT's dataset as `prefdata prepare` writes it: exact types, text and source columns."""

    prompt_ids: ID_DTYPE = pa.Field(nullable=False)
    chosen_ids: ID_DTYPE = pa.Field(nullable=False)
    rejected_ids: ID_DTYPE = pa.Field(nullable=False)
    flags: pl.List(pl.String) = pa.Field(nullable=False)
    source_file: pl.String = pa.Field(nullable=False)
    source_line: pl.Int64 = pa.Field(nullable=False, ge=1)

    @pa.dataframe_check
    def text_columns_are_strings_or_messages(cls, data: pa.PolarsData) -> pl.LazyFrame:
        schema = data.lazyframe.collect_schema()
        ok = all(name in schema and (schema[name] == pl.String or _is_messages_dtype(schema[name]))
                 for name in TEXT_COLUMNS)
        return data.lazyframe.select(pl.lit(ok).alias("text_columns"))

    @pa.dataframe_check
    def flags_are_known(cls, data: pa.PolarsData) -> pl.LazyFrame:
        known = pl.col("flags").list.eval(pl.element().is_in(list(F.ALL_FLAGS))).list.all()
        return data.lazyframe.select(known.fill_null(True))


class ScoredPairs(PreparedPairs):
    """After `prefdata refs`: reference log-probs (sums over the completion) and completion token counts."""

    ref_chosen_logps: pl.Float32 = pa.Field(nullable=True)
    ref_rejected_logps: pl.Float32 = pa.Field(nullable=True)
    chosen_token_count: pl.Int64 = pa.Field(nullable=False, ge=0)
    rejected_token_count: pl.Int64 = pa.Field(nullable=False, ge=0)

    @pa.dataframe_check
    def refs_are_finite_log_probs_unless_flagged(cls, data: pa.PolarsData) -> pl.LazyFrame:
        ok = pl.all_horizontal(
            pl.col(name).is_not_null() & pl.col(name).is_finite() & (pl.col(name) <= _LOGP_TOLERANCE)
            for name in REF_COLUMNS
        )
        return data.lazyframe.select(ok.fill_null(False) | _flagged(data, F.NON_FINITE_REF_LOGPS))

    @pa.dataframe_check
    def public_refs_lie_between_the_full_sum_and_zero(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """LD-DPO's public-length sums (when stored): a part of the full sum of log-probs <= 0, so
        full <= public <= 0, both halves or neither; non-finite only where the row is flagged."""
        settled = _both_or_neither(data, PUBLIC_REF_COLUMNS, lambda dtype: dtype.is_float(), "public_refs")
        if settled is not None:
            return settled
        ok = pl.all_horizontal(
            pl.col(public).is_finite() & (pl.col(public) <= _LOGP_TOLERANCE)
            & (pl.col(public) >= pl.col(full) - _LOGP_TOLERANCE * (1 + pl.col(full).abs()))
            for public, full in zip(PUBLIC_REF_COLUMNS, REF_COLUMNS)
        )
        return data.lazyframe.select(ok.fill_null(False) | _flagged(data, F.NON_FINITE_REF_LOGPS))

    @pa.dataframe_check
    def token_counts_match_the_completion_ids(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """The counts are what the loss masks sum to: one per completion id (from the loss start on,
        where the row's per-token loss mask is 1)."""
        schema = data.lazyframe.collect_schema()
        return data.lazyframe.select(
            (pl.col("chosen_token_count") == _loss_tokens("chosen", schema))
            & (pl.col("rejected_token_count") == _loss_tokens("rejected", schema))
        )


def model_for(columns: list[str], tokens_only: bool = False) -> type[TokenPairs]:
    """The model a frame with `columns` must satisfy: the full contract (`PreparedPairs`, or
    `ScoredPairs` once reference columns exist), or with `tokens_only` what refs/train read."""
    scored = any(name in columns for name in REF_COLUMNS)
    if tokens_only:
        return ScoredTokenPairs if scored else TokenPairs
    return ScoredPairs if scored else PreparedPairs


def _data_files(out: Path) -> list[Path]:
    try:
        state = json.loads((out / "state.json").read_text(encoding="utf-8"))
        return [out / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefdataError(f"{out}: no readable dataset state.json ({type(exc).__name__}: {exc})") from None


def _frames(out: Path, batch_rows: int) -> Iterator[pl.DataFrame]:
    import pyarrow as pa_arrow

    for path in _data_files(out):
        try:
            with pa_arrow.memory_map(str(path)) as source:
                reader = pa_arrow.ipc.open_stream(source)
                pending: list[pa_arrow.RecordBatch] = []
                rows = 0
                for batch in reader:
                    pending.append(batch)
                    rows += batch.num_rows
                    if rows >= batch_rows:
                        yield pl.from_arrow(pa_arrow.Table.from_batches(pending))
                        pending, rows = [], 0
                if pending:
                    yield pl.from_arrow(pa_arrow.Table.from_batches(pending))
        except (OSError, pa_arrow.ArrowInvalid) as exc:
            raise PrefdataError(f"{path}: cannot read OUT's data ({type(exc).__name__}: {exc})") from None


_MODEL_NAMES = ("TokenPairs", "ScoredTokenPairs", "PreparedPairs", "ScoredPairs")
# Checks whose rule the one-line error states in words (a check's own `name=` is lost by pandera in
# a subclass whose parent was validated first, so the words live here).
_CHECK_WORDS = {
    "weights_fit_float32_training": f"weight is a number, 0 or in [{WEIGHT_MIN:g}, {WEIGHT_MAX:g}]",
    "offsets_fit_float32_training": f"offset is a number in [-{OFFSET_MAX:g}, {OFFSET_MAX:g}]",
}


def describe_failures(
    error: pa.errors.SchemaErrors | pa.errors.SchemaError, frame: pl.DataFrame | None = None, limit: int = 3
) -> str:
    """pandera's report as one line: which checks failed, on how many rows, and the first row's
    source_file:source_line when `frame` (the validated frame) is given."""
    cases = getattr(error, "failure_cases", None)
    if not isinstance(cases, pl.DataFrame) or cases.is_empty():
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    parts = []
    for (check,), group in cases.group_by(["check"], maintain_order=True):
        column = group["column"][0] if "column" in group.columns else None
        where = f" ({column})" if column and column not in _MODEL_NAMES else ""
        index = group["index"][0] if "index" in group.columns else None
        if index is not None and frame is not None and {"source_file", "source_line"} <= set(frame.columns):
            example = f"first at {frame['source_file'][index]}:{frame['source_line'][index]}"
        else:
            example = f"got {str(group['failure_case'][0])[:120]}" if "failure_case" in group.columns else ""
        parts.append(f"{_CHECK_WORDS.get(check, check)}{where}: {group.height} failing, {example}")
        if len(parts) >= limit:
            break
    return "; ".join(parts)


def check_frame(frame: pl.DataFrame, label: str, *, tokens_only: bool = False, first_row: int = 1) -> None:
    """Validate one frame of OUT's rows; PrefdataError (one line) naming the model, the failing checks
    and where they fail first. `first_row` numbers the frame's rows within the whole dataset."""
    model = model_for(frame.columns, tokens_only)
    if "images" in frame.columns:  # image pairs: checked here, as pandera cannot report on binary columns
        if frame.schema["images"] != IMAGES_DTYPE:
            raise PrefdataError(f"{label} breaks OUT's schema: its images column is {frame.schema['images']}, "
                                f"not {IMAGES_DTYPE} (datasets.Image's storage)")
    # pandera reports a failing row as JSON, which polars cannot write for binary data (the image bytes
    # of image OUTs: it panics). No model reads such a column (they pass through), so it is left out.
    checked = frame.select([name for name, dtype in frame.schema.items() if not _holds_binary(dtype)])
    try:
        model.validate(checked, lazy=True)
    except (pa.errors.SchemaErrors, pa.errors.SchemaError) as exc:
        raise PrefdataError(
            f"{label} breaks OUT's schema (prefdata.core.schema.{model.__name__}, rows {first_row}-"
            f"{first_row + frame.height - 1}): {describe_failures(exc, frame)}"
        ) from None


def _holds_binary(dtype: Any) -> bool:
    """Whether a polars type is or contains Binary (in a list, array or struct)."""
    if dtype == pl.Binary:
        return True
    inner = getattr(dtype, "inner", None)
    if inner is not None:
        return _holds_binary(inner)
    return any(_holds_binary(field.dtype) for field in getattr(dtype, "fields", None) or ())


def check_table(table: Any, label: str, *, tokens_only: bool = False, batch_rows: int = BATCH_ROWS) -> int:
    """`check_frame` over an Arrow table (e.g. `datasets.Dataset.data.table`) in slices; rows checked."""
    checked = 0
    for start in range(0, table.num_rows, batch_rows):
        frame = pl.from_arrow(table.slice(start, batch_rows))
        check_frame(frame, label, tokens_only=tokens_only, first_row=start + 1)
        checked += frame.height
    return checked


def check_out(out_dir: str | Path, *, tokens_only: bool = False, batch_rows: int = BATCH_ROWS) -> int:
    """Validate every row of OUT's dataset against its model (see `model_for`); the rows checked."""
    out = Path(out_dir)
    checked = 0
    for frame in _frames(out, batch_rows):
        check_frame(frame, str(out), tokens_only=tokens_only, first_row=checked + 1)
        checked += frame.height
    return checked
