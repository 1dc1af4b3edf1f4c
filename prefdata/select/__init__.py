"""`prefdata select OUT NEW`: keep the pairs that teach, by a signal and a budget, into a new full OUT.

The recipe, top to bottom: open OUT (finished, with pairs), compute the signal (prefdata.select.signals),
choose the pairs (prefdata.select.rule), and write NEW (prefdata.select.write): the kept pairs with
every column, OUT's dropped/quarantine lines plus a `not_selected` line per pair left out, a manifest
whose ledger holds and that names OUT and the settings, and the report (prefdata.report.selection).
Optionally the kept pairs get a `weight` (--weight-by) and an ODPO `offset` (--offset-by) column,
which `prefdata train` applies (docs/select.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefdata.core.errors import PrefdataError
from prefdata.core.quiet import quiet_libraries, wants_quiet
from prefdata.core.schema import OFFSET_COLUMN, WEIGHT_COLUMN
from prefdata.io.manifest import require_pairs, sha256_file
from prefdata.io.out_dir import abandon, prepare_output_dir, publish, refuse_inputs_inside
from prefdata.io.out_paths import out_file
from prefdata.report import render_selection
from prefdata.report import selection as report
from prefdata.select.rule import Selection, check_offsets, choose, parse_keep, weights_from
from prefdata.select.signals import SIGNALS, Columns, available_signals, compute_signal
from prefdata.select.write import (
    content_hash,
    copy_quarantine,
    new_accounting,
    write_dataset,
    write_dropped,
    write_new_manifest,
)
from prefdata.settings.commands import SelectSettings
from prefdata.settings.declare import settings_command


@dataclass
class SelectResult:
    new_dir: Path
    kept: int
    pairs_in: int
    report: dict[str, Any] = field(repr=False)
    exit_code: int = 0
    problem: str = ""  # one line when nothing was kept (exit 1)

    def summary(self) -> str:
        return (f"{render_selection.summary_line(self.report)}\nwrote {self.new_dir}/ (report: {self.new_dir}/report.html, "
                f"{self.new_dir}/report.md)")


@settings_command(SelectSettings)  # settings=SelectSettings(...) or flat keywords: prefdata.settings
def select_pairs(out_dir: str | Path, new_dir: str | Path, settings: SelectSettings) -> SelectResult:
    """Keep OUT's pairs chosen by `by` (a signal name, docs/select.md) into NEW, a full OUT.

    Each setting is declared once, in `prefdata.settings.commands.SelectSettings` (`prefdata select --help`);
    pass `settings=SelectSettings(...)`, flat keywords (`by="reward_margin"`), or both."""
    s = settings
    out, new = Path(out_dir), Path(new_dir)
    if s.by is None:
        raise PrefdataError(f"--by is required: one of {', '.join(SIGNALS)}")
    if out.resolve() == new.resolve():
        raise PrefdataError(f"NEW must be another directory than OUT ({out}): select never rewrites its input")
    if out.resolve() in new.resolve().parents:
        raise PrefdataError(f"NEW ({new}) lies inside OUT ({out}): select writes nothing into its input")
    refuse_inputs_inside(new, [out, s.policy_model])  # replacing NEW must not delete what select reads
    budget = parse_keep(s.keep)
    if s.min_signal is not None and s.max_signal is not None and s.min_signal > s.max_signal:
        raise PrefdataError(f"--min {s.min_signal} is above --max {s.max_signal}: no pair could be kept")
    manifest = require_pairs(out, "select")
    dataset = _load(out)
    table = dataset.data.table
    columns = Columns(table, str(out), s.seed, _policy_pass(table, s.policy_model, manifest, s.device))
    values = compute_signal(s.by, columns)  # missing inputs: one line naming the command that adds them
    extra = {name: compute_signal(name, columns) for name in {s.weight_by, s.offset_by} - {None, s.by}}
    extra[s.by] = values
    # A kept pair needs a finite value of every signal it is given (weight, offset) too.
    usable = np.ones(len(values), dtype=bool)
    for name in {s.weight_by, s.offset_by} - {None}:
        usable &= np.isfinite(extra[name])  # type: ignore[index]
    chosen = choose(values, keep=budget, min_value=s.min_signal, max_value=s.max_signal, lowest=s.lowest,
                    usable=usable)
    added = _added_columns(chosen, extra, s.weight_by, s.offset_by, s.offset_scale)
    if OFFSET_COLUMN in added:  # before anything is written
        check_offsets(added[OFFSET_COLUMN], chosen.kept, columns.where, s.offset_scale, str(s.offset_by))

    selection = {"by": s.by, "keep": s.keep, "min_signal": s.min_signal, "max_signal": s.max_signal,
                 "lowest": s.lowest, "seed": s.seed, "weight_by": s.weight_by, "offset_by": s.offset_by,
                 "offset_scale": s.offset_scale if s.offset_by else None,
                 "policy_model": str(s.policy_model) if s.policy_model is not None else None}
    lineage = {"path": str(out.resolve()), "content_hash": manifest.get("content_hash"),
               "manifest_sha256": sha256_file(out_file(out, "manifest.json"))}
    kept, not_selected = len(chosen.kept), len(values) - len(chosen.kept)
    accounting = new_accounting(manifest.get("row_accounting") or {"rows_out": len(values)}, kept, not_selected)
    staging = prepare_output_dir(new, s.overwrite, inputs=[out, s.policy_model])
    try:
        with quiet_libraries(wants_quiet(s.progress)):
            new_hash = content_hash(manifest.get("content_hash"), chosen.kept, added)
            written = write_dataset(dataset, chosen.kept, added, staging, new_hash)
        write_dropped(out, staging, table, chosen.reason, values, s.by)
        copy_quarantine(out, staging)
        built = _report(s.by, selection, values, chosen, extra, columns, table, accounting, lineage)
        (staging / "report.json").write_text(json.dumps(built, indent=2) + "\n", encoding="utf-8")
        (staging / "report.md").write_text(render_selection.render_markdown(built), encoding="utf-8")
        (staging / "report.html").write_text(render_selection.render_html(built), encoding="utf-8")
        write_new_manifest(staging, manifest, accounting=accounting, new_hash=new_hash, columns=written,
                           not_selected=not_selected, lineage=lineage, selection=selection)
        publish(staging, new)
    except BaseException:
        abandon(staging, new)
        raise
    result = SelectResult(new_dir=new, kept=kept, pairs_in=len(values), report=built)
    if kept == 0:
        result.exit_code = 1
        result.problem = (f"the selection kept no pair of {len(values):,} ({_why(chosen)}); see "
                          f"{new / 'dropped.jsonl'}")
    return result


def _policy_pass(table: Any, policy_model: str | Path | None, manifest: dict[str, Any], device: str) -> Any:
    """The on_policy model pass, deferred until a signal asks for it (None without --policy-model)."""
    if policy_model is None:
        return None
    tokenizer = manifest.get("tokenizer") or {}

    def run() -> tuple[np.ndarray, np.ndarray]:
        from prefdata.select.policy import mean_token_logps

        return mean_token_logps(table, policy_model, tokenizer_fingerprint=tokenizer.get("fingerprint"),
                                pad_token_id=int(tokenizer.get("pad_token_id") or 0), device=device)

    return run


def _load(out: Path) -> Any:
    from prefdata.io.out_dir import load_out_dataset

    return load_out_dataset(out, "select")


def _added_columns(chosen: Selection, extra: dict[str, np.ndarray], weight_by: str | None, offset_by: str | None,
                   offset_scale: float) -> dict[str, np.ndarray]:
    """The `weight` (percentile of --weight-by among the kept pairs) and `offset` (--offset-scale x
    --offset-by) columns of the kept pairs, in NEW's row order."""
    added = {}
    if weight_by is not None:
        added[WEIGHT_COLUMN] = weights_from(extra[weight_by][chosen.kept])
    if offset_by is not None:
        added[OFFSET_COLUMN] = offset_scale * extra[offset_by][chosen.kept]
    return added


def _why(chosen: Selection) -> str:
    counts = chosen.counts()
    return ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in counts.items() if n) or "no pairs"


def _report(by: str, settings: dict[str, Any], values: np.ndarray, chosen: Selection, extra: dict[str, np.ndarray],
            columns: Columns, table: Any, accounting: dict[str, Any], lineage: dict[str, Any]) -> dict[str, Any]:
    others = {**available_signals(columns), **{k: v for k, v in extra.items() if k != by}}
    others.pop(by, None)
    names = set(table.column_names)
    sources = table.column("source_file").to_pylist() if "source_file" in names else ["(unknown)"] * len(values)
    flags = table.column("flags").to_pylist() if "flags" in names else [[] for _ in values]
    return report.selection_report(
        signal=by, formula=SIGNALS[by].formula, settings=settings, values=values,
        choice=report.Choice(chosen.kept, chosen.counts(), chosen.budget, chosen.cut), other_signals=others,
        pairs=report.PairFacts(columns.length("chosen_ids"), columns.length("rejected_ids"), sources, flags),
        accounting=accounting, lineage=lineage)


__all__ = ["SelectResult", "select_pairs"]
