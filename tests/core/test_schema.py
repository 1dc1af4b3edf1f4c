"""OUT's published contract (prefdata.core.schema): real outputs satisfy it, broken rows are named, and
validate/refs/train refuse an OUT that breaks it."""

from __future__ import annotations

import glob
import shutil
from pathlib import Path

import pandera.polars as pa
import polars as pl
import pyarrow as pyarrow
import pytest

from prefdata.core.errors import PrefdataError
from prefdata.core.schema import PreparedPairs, ScoredPairs, ScoredTokenPairs, TokenPairs, check_out
from prefdata.prepare import prepare
from prefdata.refs import compute_refs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pairs"


def read(out: Path) -> pl.DataFrame:
    return pl.concat([pl.read_ipc_stream(f) for f in sorted(glob.glob(f"{out}/data-*.arrow"))])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("schema") / "out"
    prepare(EXAMPLES, out, tokenizer=tiny_model_dir, max_length=48, progress=False, workers=1)
    return out


@pytest.fixture(scope="module")
def scored(tmp_path_factory, prepared, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("schema-refs") / "out"
    shutil.copytree(prepared, out)
    compute_refs(out, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    return out


def rewrite(out: Path, frame: pl.DataFrame) -> None:
    """Replace OUT's data with `frame` (one file), as a tool that edits OUT in place would."""
    files = sorted(glob.glob(f"{out}/data-*.arrow"))
    for extra in files[1:]:
        Path(extra).unlink()
    table = frame.to_arrow()
    with pyarrow.ipc.new_stream(files[0], table.schema) as writer:
        writer.write_table(table)


def failures(model: type, frame: pl.DataFrame) -> set[str]:
    try:
        model.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        return set(exc.failure_cases["check"].to_list())
    return set()


def test_prepared_and_scored_outs_satisfy_the_contract(prepared, scored):
    frame = read(prepared)
    assert failures(PreparedPairs, frame) == set()
    assert check_out(prepared) == frame.height > 0
    assert failures(ScoredPairs, read(scored)) == set()
    assert check_out(scored) == frame.height
    # The mixed example directory keeps the messages beside the string columns (docs/trl.md).
    assert frame.schema["prompt"] == pl.String and "prompt_messages" in frame.columns


def test_conversational_outs_store_message_lists_and_satisfy_the_contract(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    prepare(EXAMPLES / "conversational.jsonl", out, tokenizer=tiny_model_dir, progress=False, workers=1)
    frame = read(out)
    assert frame.schema["prompt"] == pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
    assert failures(PreparedPairs, frame) == set()


@pytest.mark.parametrize(
    ("change", "check"),
    [
        (pl.when(pl.int_range(pl.len()) == 0).then(pl.lit([], dtype=pl.List(pl.Int32))).otherwise(pl.col("chosen_ids"))
         .alias("chosen_ids"), "completions_have_tokens_unless_flagged"),
        (pl.when(pl.int_range(pl.len()) == 1).then(pl.lit([-1], dtype=pl.List(pl.Int32))).otherwise(pl.col("prompt_ids"))
         .alias("prompt_ids"), "token_ids_are_non_negative"),
        (pl.lit(0, dtype=pl.Int64).alias("source_line"), "greater_than_or_equal_to(1)"),
        (pl.col("flags").list.concat(pl.lit(["not_a_flag"])).alias("flags"), "flags_are_known"),
    ],
)
def test_row_rules_of_a_prepared_out(prepared, change, check):
    broken = read(prepared).with_columns(change)
    assert check in failures(PreparedPairs, broken)


def test_row_rules_of_a_scored_out(scored):
    frame = read(scored)
    nan_unflagged = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(float("nan")).otherwise(pl.col("ref_chosen_logps"))
        .cast(pl.Float32).alias("ref_chosen_logps"))
    assert "refs_are_finite_log_probs_unless_flagged" in failures(ScoredPairs, nan_unflagged)
    assert failures(ScoredTokenPairs, nan_unflagged) == set()  # train skips such rows itself
    flagged = nan_unflagged.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit(["non_finite_ref_logps"])).otherwise(pl.col("flags"))
        .alias("flags"))
    assert failures(ScoredPairs, flagged) == set()  # what `refs` writes for a non-finite row
    positive = frame.with_columns(pl.lit(2.0, dtype=pl.Float32).alias("ref_rejected_logps"))
    assert "refs_are_finite_log_probs_unless_flagged" in failures(ScoredPairs, positive)  # a log-prob sum is <= 0
    # LD-DPO's public-length sums are a part of the full sum: full <= public <= 0.
    assert {"ref_chosen_public_logps", "ref_rejected_public_logps"} <= set(frame.columns)
    beyond_full = frame.with_columns((pl.col("ref_chosen_logps") - 1.0).alias("ref_chosen_public_logps"))
    assert "public_refs_lie_between_the_full_sum_and_zero" in failures(ScoredPairs, beyond_full)
    half_missing = frame.drop("ref_rejected_public_logps")
    assert "public_refs_lie_between_the_full_sum_and_zero" in failures(ScoredPairs, half_missing)
    assert failures(ScoredPairs, frame.drop("ref_chosen_public_logps", "ref_rejected_public_logps")) == set()
    miscounted = frame.with_columns(pl.col("chosen_token_count") + 1)
    assert "token_counts_match_the_completion_ids" in failures(ScoredPairs, miscounted)


def test_the_token_part_accepts_other_integer_widths_and_still_needs_the_ids(prepared):
    frame = read(prepared).with_columns(pl.col("chosen_ids").cast(pl.List(pl.Int64)))
    assert failures(TokenPairs, frame) == set()
    assert "dtype('List(Int32)')" in failures(PreparedPairs, frame)
    assert "id_columns_are_integer_lists" in failures(TokenPairs, frame.drop("rejected_ids"))


def test_validate_refs_and_train_refuse_an_out_that_breaks_it(prepared, tiny_model_dir, tmp_path):
    from prefdata.train.recipe import train
    from prefdata.validate.command import validate

    out = tmp_path / "broken"
    shutil.copytree(prepared, out)
    frame = read(out)
    first = frame.row(0, named=True)
    rewrite(out, frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit([], dtype=pl.List(pl.Int32))).otherwise(pl.col("rejected_ids"))
        .alias("rejected_ids")))

    with pytest.raises(PrefdataError) as error:
        validate(out, progress=False)
    message = str(error.value)
    assert "PreparedPairs" in message and "completions_have_tokens_unless_flagged" in message
    assert f"first at {first['source_file']}:{first['source_line']}" in message and "\n" not in message
    with pytest.raises(PrefdataError, match="TokenPairs.*completions_have_tokens_unless_flagged"):
        compute_refs(out, tiny_model_dir, device="cpu", progress=False)
    with pytest.raises(PrefdataError, match="TokenPairs.*completions_have_tokens_unless_flagged"):
        train(out, model=tiny_model_dir, output=tmp_path / "run", loss="simpo", max_steps=1)
