"""`prefdata select OUT NEW`: the signals against their formulas computed here row by row, the rule
(budget, thresholds, ties, non-finite values), NEW as a full OUT (rows, dropped.jsonl, ledger,
lineage, report), determinism, the weight/offset columns train reads, and the CLI's exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.cli import main
from prefdata.core.errors import PrefdataError
from prefdata.core.schema import check_out
from prefdata.prepare import prepare
from prefdata.refs import compute_refs
from prefdata.select import select_pairs
from prefdata.select.rule import choose, parse_keep
from prefdata.select.signals import SIGNALS, Columns, compute_signal, percentile
from prefdata.settings.options import SIGNAL_NAMES

N_PAIRS = 24


def _rows(source: int) -> list[dict]:
    rows = []
    for i in range(N_PAIRS // 2):
        k = source * 100 + i
        row = {"prompt": f"Question {k}: tell me about item {k}.", "chosen": "A fine answer " * (1 + k % 4),
               "rejected": "No " * (1 + k % 3), "reward_chosen": round(1.0 + (k * 37 % 11) / 3, 3),
               "reward_rejected": round((k * 13 % 7) / 4, 3)}
        if k == 5:
            row["reward_rejected"] = None  # no reward: a non-finite signal, never selected
        rows.append(row)
    if source == 0:  # one pair the policy drops, so OUT has a dropped.jsonl line to carry over
        rows.append({"prompt": "same", "chosen": "same words", "rejected": "same words", "reward_chosen": 1,
                     "reward_rejected": 0})
    return rows


@pytest.fixture(scope="module")
def outs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """OUT prepared from two source files (per-source shares), with and without refs."""
    root = tmp_path_factory.mktemp("select")
    raw = root / "raw"
    raw.mkdir()
    for source in (0, 1):
        (raw / f"part{source}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(source)) + "{broken\n",
                                                 encoding="utf-8")
    plain, scored = root / "plain", root / "scored"
    for out in (plain, scored):
        prepare(raw, out, tokenizer=tiny_model_dir, progress=False, workers=1)
    compute_refs(scored, tiny_model_dir, device="cpu", dtype="float32", progress=False)
    return {"plain": plain, "scored": scored}


def _table(out: Path):
    return datasets.load_from_disk(str(out)).to_list()


def _dropped(new: Path) -> list[dict]:
    return [json.loads(line) for line in (new / "dropped.jsonl").read_text().splitlines() if line.strip()]


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


# ---- signals against their formulas, row by row ---------------------------------------------------


def _independent(name: str, row: dict) -> float:
    def num(key):
        value = row.get(key)
        return float("nan") if value is None else float(value)

    margin = num("reward_chosen") - num("reward_rejected")
    return {
        "reward_margin": margin,
        "reward_rejected": num("reward_rejected"),
        "implicit_margin": num("ref_chosen_logps") - num("ref_rejected_logps"),
        "implicit_margin_per_token": (num("ref_chosen_logps") / num("chosen_token_count")
                                      - num("ref_rejected_logps") / num("rejected_token_count")),
        "rejected_length": float(len(row["rejected_ids"])),
        "length_difference": float(len(row["chosen_ids"]) - len(row["rejected_ids"])),
    }[name]


@pytest.mark.parametrize("name", ["reward_margin", "reward_rejected", "implicit_margin", "implicit_margin_per_token",
                                  "rejected_length", "length_difference"])
def test_each_signal_is_its_formula(outs, name):
    dataset = datasets.load_from_disk(str(outs["scored"]))
    got = compute_signal(name, Columns(dataset.data.table, "OUT"))
    want = np.array([_independent(name, row) for row in dataset.to_list()])
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert np.isfinite(got).sum() >= len(got) - 1


def test_rip_is_the_worst_percentile_of_its_three_filters(outs):
    rows = _table(outs["scored"])
    got = compute_signal("rip", Columns(datasets.load_from_disk(str(outs["scored"])).data.table, "OUT"))

    def pct(values):  # mid-rank percentile among the finite values, by counting
        finite = [v for v in values if math.isfinite(v)]
        return [(sum(f < v for f in finite) + sum(f <= v for f in finite)) / (2 * len(finite)) if math.isfinite(v)
                else float("nan") for v in values]

    rejected = [_independent("reward_rejected", r) for r in rows]
    lengths = [_independent("rejected_length", r) for r in rows]
    margins = [_independent("reward_margin", r) for r in rows]
    want = [min(a, b, 1 - c) if all(map(math.isfinite, (a, b, c))) else float("nan")
            for a, b, c in zip(pct(rejected), pct(lengths), pct(margins))]
    np.testing.assert_allclose(got, want, equal_nan=True)


def test_the_declared_signal_names_are_the_signals():
    assert tuple(SIGNALS) == SIGNAL_NAMES


def test_random_is_seeded_and_uniform_looking():
    table = datasets.Dataset.from_dict({"x": list(range(2000))}).data.table
    a, b, c = (compute_signal("random", Columns(table, "OUT", seed)) for seed in (1, 1, 2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.03 and len(set(a.tolist())) == 2000


# ---- the rule ---------------------------------------------------------------------------------------


def test_ties_are_broken_by_row_order_and_nan_is_never_kept():
    values = np.array([1.0, 3.0, np.nan, 3.0, 2.0, 3.0, np.inf])
    chosen = choose(np.where(np.isfinite(values), values, np.nan), keep=2)
    assert chosen.kept.tolist() == [1, 3]  # three tie at 3.0: the first two rows win
    assert chosen.cut == 3.0 and chosen.counts()["non_finite"] == 2 and chosen.counts()["beyond_budget"] == 3
    lowest = choose(np.where(np.isfinite(values), values, np.nan), keep=3, lowest=True)
    assert lowest.kept.tolist() == [0, 1, 4]
    assert choose(values, keep=None, min_value=2.0, max_value=3.0).kept.tolist() == [1, 3, 4, 5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(-5, 5), st.just(float("nan"))), min_size=1, max_size=40),
       st.integers(1, 50), st.booleans())
def test_the_budget_keeps_the_best_eligible_pairs(values, keep, lowest):
    values = np.array(values)
    chosen = choose(values, keep=keep, lowest=lowest)
    finite = np.isfinite(values)
    assert len(chosen.kept) == min(keep, int(finite.sum()))
    assert finite[chosen.kept].all()
    left = np.setdiff1d(np.flatnonzero(finite), chosen.kept)
    if len(left) and len(chosen.kept):
        if lowest:
            assert values[chosen.kept].max() <= values[left].min()
        else:
            assert values[chosen.kept].min() >= values[left].max()


def test_keep_is_a_share_or_a_count():
    assert parse_keep("0.3") == 0.3 and parse_keep("30%") == 0.3 and parse_keep("300") == 300
    assert parse_keep(1.0) == 1.0 and parse_keep(5) == 5
    for bad in ("0", "1.5", "-3", "many"):
        with pytest.raises(PrefdataError, match="--keep"):
            parse_keep(bad)


# ---- NEW, a full OUT --------------------------------------------------------------------------------


def test_new_holds_the_top_share_with_every_column_and_the_ledger_holds(outs, tmp_path):
    out, new = outs["scored"], tmp_path / "new"
    rows = _table(out)
    result = select_pairs(out, new, by="reward_margin", keep=0.25, progress=False)
    margins = np.array([_independent("reward_margin", r) for r in rows])
    ranked = sorted((i for i in range(len(rows)) if math.isfinite(margins[i])), key=lambda i: (-margins[i], i))
    budget = round(0.25 * len(rows))
    want = sorted(ranked[:budget])
    assert result.exit_code == 0 and result.kept == budget
    assert _table(new) == [rows[i] for i in want]  # every column, refs included, in OUT's order
    check_out(new)  # NEW keeps OUT's contract (ScoredPairs)
    from prefdata.validate.command import validate

    assert validate(str(new), progress=False, format="json").exit_code == 0  # and `prefdata validate NEW` passes

    dropped, parent_dropped = _dropped(new), _dropped(out)
    assert dropped[: len(parent_dropped)] == parent_dropped  # OUT's own dropped lines come first
    not_selected = dropped[len(parent_dropped):]
    assert [(d["source_file"], d["source_line"]) for d in not_selected] == [
        (rows[i]["source_file"], rows[i]["source_line"]) for i in range(len(rows)) if i not in want]
    for line in not_selected:
        assert line["reason"] == "not_selected" and "not_selected" in line["flags"]
        assert line["signal"] == "reward_margin"
        where = (line["source_file"], line["source_line"])
        i = next(j for j, r in enumerate(rows) if (r["source_file"], r["source_line"]) == where)
        if math.isfinite(margins[i]):
            assert line["value"] == pytest.approx(margins[i]) and line["why"] == "beyond_budget"
        else:
            assert line["value"] is None and line["why"] == "non_finite"

    parent, manifest = _manifest(out), _manifest(new)
    acc = manifest["row_accounting"]
    assert acc["rows_in"] == parent["row_accounting"]["rows_in"]
    assert acc["rows_in"] == acc["rows_out"] + acc["rows_dropped"] + acc["rows_quarantined"]
    assert acc["rows_out"] == budget and acc["rows_not_selected"] == len(rows) - budget
    assert acc["pairs_made"] == acc["pairs_kept"] + acc["pairs_dropped"]
    assert manifest["flag_counts"]["not_selected"] == len(rows) - budget
    assert manifest["selected_from"]["content_hash"] == parent["content_hash"] != manifest["content_hash"]
    assert manifest["selected_from"]["path"] == str(out.resolve())
    assert manifest["selection"]["by"] == "reward_margin" and manifest["selection"]["keep"] == 0.25
    assert manifest["refs"] == parent["refs"] and manifest["tokenizer"] == parent["tokenizer"]
    assert (new / "quarantine.jsonl").read_text() == (out / "quarantine.jsonl").read_text() != ""

    report = json.loads((new / "report.json").read_text())
    assert report["selection"]["cut"] == pytest.approx(margins[ranked[budget - 1]])
    assert report["selection"]["reasons"] == {"non_finite": 1, "below_min": 0, "above_max": 0,
                                              "beyond_budget": len(rows) - budget - 1}
    assert report["signals"]["reward_margin"]["before"]["non_finite"] == 1
    assert report["signals"]["reward_margin"]["after"]["min"] >= report["selection"]["cut"]
    assert {"implicit_margin", "rejected_length", "rip"} <= set(report["signals"])
    assert report["length_bias"]["before"]["pairs"] == len(rows) and report["length_bias"]["after"]["pairs"] == budget
    before = report["sources"]["before"]
    assert sorted(Path(k).name for k in before) == ["part0.jsonl", "part1.jsonl"]
    assert sum(v["pairs"] for v in report["sources"]["after"].values()) == budget
    assert "reward_margin" in (new / "report.md").read_text()
    page = (new / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and ">cut</text>" in page  # the cut, marked


def test_the_same_out_and_settings_give_the_same_new(outs, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for new in (a, b):
        select_pairs(outs["plain"], new, by="rejected_length", keep=7, progress=False)  # many ties
    assert _manifest(a)["content_hash"] == _manifest(b)["content_hash"]
    assert (a / "dropped.jsonl").read_bytes() == (b / "dropped.jsonl").read_bytes()
    assert _table(a) == _table(b)


def test_random_baseline_depends_on_its_seed_only(outs, tmp_path):
    kept = {}
    for name, seed in (("s1", 1), ("s1again", 1), ("s2", 2)):
        select_pairs(outs["plain"], tmp_path / name, by="random", seed=seed, keep=0.5, progress=False)
        kept[name] = [(r["source_file"], r["source_line"]) for r in _table(tmp_path / name)]
    assert kept["s1"] == kept["s1again"] != kept["s2"]
    assert len(kept["s1"]) == round(0.5 * N_PAIRS)


def test_thresholds_and_non_finite_counts(outs, tmp_path):
    result = select_pairs(outs["plain"], tmp_path / "new", by="reward_margin", min_signal=1.0, max_signal=3.0,
                          progress=False)
    margins = [_independent("reward_margin", r) for r in _table(outs["plain"])]
    assert result.kept == sum(1.0 <= m <= 3.0 for m in margins if math.isfinite(m))
    reasons = result.report["selection"]["reasons"]
    assert reasons["non_finite"] == 1
    assert reasons["below_min"] == sum(m < 1.0 for m in margins if math.isfinite(m))
    assert reasons["above_max"] == sum(m > 3.0 for m in margins if math.isfinite(m))


def test_weight_and_offset_columns_reach_what_train_reads(outs, tmp_path):
    from prefdata.train.data import load_pairs

    new = tmp_path / "new"
    select_pairs(outs["scored"], new, by="reward_margin", keep=1.0, weight_by="reward_margin",
                 offset_by="reward_margin", offset_scale=0.5, progress=False)
    rows = _table(new)
    margins = np.array([_independent("reward_margin", r) for r in rows])
    assert len(rows) == N_PAIRS - 1  # every finite pair
    data = load_pairs(new, need_refs=True)
    np.testing.assert_allclose(data.offsets, 0.5 * margins, rtol=1e-6)
    np.testing.assert_allclose(data.weights, percentile(margins), rtol=1e-6)
    assert 0 < data.weights.min() and data.weights.max() < 1
    assert data.weights[np.argmax(margins)] == data.weights.max()


def test_missing_inputs_name_the_command_that_adds_them(outs, tmp_path):
    with pytest.raises(PrefdataError, match=r"run `prefdata refs OUT --model REF` first"):
        select_pairs(outs["plain"], tmp_path / "new", by="implicit_margin", keep=0.5, progress=False)
    assert not (tmp_path / "new").exists()  # nothing written on an input error


def test_cli_end_to_end_exit_codes(outs, tmp_path, capsys):
    new = tmp_path / "new"
    argv = ["select", str(outs["plain"]), str(new), "--by", "reward_margin", "--keep", "50%", "--no-progress"]
    assert main(argv) == 0
    assert "select: kept 12 of 24 pairs by reward_margin" in capsys.readouterr().out
    assert len(_table(new)) == 12

    def one_line_error(argv) -> str:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1, err
        return f"{code} {err[0]}"

    assert one_line_error(["select", str(outs["plain"]), str(tmp_path / "x"), "--by", "implicit_margin"]).startswith(
        "2 prefdata select: error: signal implicit_margin needs ref_chosen_logps")
    assert one_line_error(["select", str(outs["plain"]), str(tmp_path / "x"), "--by", "reward_margin", "--keep",
                           "1.5"]).startswith("2 prefdata select: error: argument --keep")
    assert one_line_error(["select", str(outs["plain"]), str(outs["plain"]), "--by", "random"]).startswith(
        "2 prefdata select: error: NEW must be another directory")
    assert one_line_error(["select", str(outs["plain"]), str(new), "--by", "random"]).startswith(
        "2 prefdata select: error:")  # NEW exists: --overwrite needed
    # a selection that keeps nothing: exit 1, NEW still written with every pair in dropped.jsonl
    empty = tmp_path / "empty"
    assert main(["select", str(outs["plain"]), str(empty), "--by", "reward_margin", "--min", "1000",
                 "--no-progress"]) == 1
    assert "kept no pair" in capsys.readouterr().err
    assert _manifest(empty)["row_accounting"]["rows_out"] == 0
    assert sum(d.get("reason") == "not_selected" for d in _dropped(empty)) == N_PAIRS


def test_config_file_sets_the_selection(outs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sel.toml").write_text('[select]\nby = "reward_margin"\nkeep = 6\nlowest = true\n', encoding="utf-8")
    assert main(["select", str(outs["plain"]), str(tmp_path / "new"), "--config", "sel.toml", "--no-progress"]) == 0
    rows = _table(tmp_path / "new")
    margins = sorted(m for m in (_independent("reward_margin", r) for r in _table(outs["plain"])) if math.isfinite(m))
    assert sorted(_independent("reward_margin", r) for r in rows) == pytest.approx(margins[:6])


def test_new_is_trl_ready(outs, tmp_path):
    pytest.importorskip("trl")
    from prefdata.trl import load_out, out_settings

    select_pairs(outs["scored"], tmp_path / "new", by="implicit_margin", keep=10, progress=False)
    settings_new = out_settings(load_out(tmp_path / "new"))
    assert settings_new["content_hash"] == _manifest(tmp_path / "new")["content_hash"]
    assert settings_new["tokenizer_fingerprint"] == out_settings(load_out(outs["scored"]))["tokenizer_fingerprint"]


# ---- on_policy: the policy's mean per-token log-prob of each half -----------------------------------


def _mean_logp(model, prompt: list[int], completion: list[int]) -> float:
    """Independent: a plain forward of prompt + completion, log-softmax, gather, mean over the completion."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
    picked = [float(logp[t - 1, ids[0, t]]) for t in range(max(len(prompt), 1), len(prompt) + len(completion))]
    return sum(picked) / len(picked)


def test_on_policy_is_the_mean_of_both_halves_mean_token_logprob(outs, tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    dataset = datasets.load_from_disk(str(outs["plain"]))
    from prefdata.select import _policy_pass

    columns = Columns(dataset.data.table, "OUT", 0, _policy_pass(dataset.data.table, tiny_model_dir,
                                                                   _manifest(outs["plain"]), "cpu"))
    got = compute_signal("on_policy", columns)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    want = [sum(_mean_logp(model, r["prompt_ids"], r[half]) for half in ("chosen_ids", "rejected_ids")) / 2
            for r in dataset.to_list()]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    result = select_pairs(outs["plain"], tmp_path / "new", by="on_policy", keep=5, policy_model=tiny_model_dir,
                          device="cpu", progress=False)
    kept = sorted(np.argsort(-np.array(want), kind="stable")[:5].tolist())
    assert [(r["source_file"], r["source_line"]) for r in _table(tmp_path / "new")] == [
        (dataset[i]["source_file"], dataset[i]["source_line"]) for i in kept]
    assert result.report["selection"]["settings"]["policy_model"] == tiny_model_dir


def test_on_policy_needs_a_policy_with_outs_tokenizer(outs, tmp_path, tiny_tokenizer_dir):
    from prefdata.tiny import build_tiny_model, build_tiny_tokenizer

    with pytest.raises(PrefdataError, match="on_policy needs a policy model: pass --policy-model"):
        select_pairs(outs["plain"], tmp_path / "a", by="random", weight_by="on_policy", progress=False)
    other_tok, other = tmp_path / "tok", tmp_path / "other"
    build_tiny_tokenizer(other_tok, vocab_size=300)
    build_tiny_model(other, tokenizer_dir=other_tok)
    with pytest.raises(PrefdataError, match="differs from the one OUT was prepared with"):
        select_pairs(outs["plain"], tmp_path / "b", by="on_policy", policy_model=str(other), progress=False)


def test_a_pair_without_a_finite_weight_signal_is_not_selected_and_the_budget_still_fills(outs, tmp_path):
    rows = _table(outs["plain"])
    result = select_pairs(outs["plain"], tmp_path / "new", by="rejected_length", keep=N_PAIRS - 1,
                          weight_by="reward_margin", progress=False)
    assert result.kept == N_PAIRS - 1  # the pair with no reward is the one left out, whatever its length
    assert result.report["selection"]["reasons"]["non_finite"] == 1
    left = [d for d in _dropped(tmp_path / "new") if d.get("reason") == "not_selected"]
    assert len(left) == 1 and left[0]["why"] == "non_finite"
    assert left[0]["value"] == len(next(r for r in rows if r["source_line"] == left[0]["source_line"]
                                        and r["source_file"] == left[0]["source_file"])["rejected_ids"])


def test_selection_does_not_depend_on_how_out_was_written(outs, tmp_path, tiny_model_dir, monkeypatch):
    """OUT written by the workers themselves, in several shards (the Ray engine's default path), and by
    the main process give the same NEW: select reads OUT's rows in order, whatever its files."""
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 1024)  # small chunks and shards: many files
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_BYTES", 2048)
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_CHUNKS", 2)
    sharded = tmp_path / "sharded"
    prepare(outs["plain"].parent / "raw", sharded, tokenizer=tiny_model_dir, progress=False, workers=2,
            batch_size=4)
    assert len(_manifest(sharded)["shards"]) > 1
    assert _manifest(sharded)["content_hash"] == _manifest(outs["plain"])["content_hash"]
    for name, out in (("one", outs["plain"]), ("many", sharded)):
        select_pairs(out, tmp_path / name, by="rip", keep=0.4, weight_by="length_difference", progress=False)
    assert _manifest(tmp_path / "one")["content_hash"] == _manifest(tmp_path / "many")["content_hash"]
    assert _table(tmp_path / "one") == _table(tmp_path / "many")
    assert (tmp_path / "one" / "dropped.jsonl").read_text() == (tmp_path / "many" / "dropped.jsonl").read_text()


def test_on_policy_scores_only_the_model_turns_of_a_trajectory(tmp_path):
    """Rows with per-token loss masks (agent trajectories): the mean runs over the tokens the loss sums
    (mask 1), as refs and train sum them, not over tool results and user turns."""
    import torch
    from transformers import AutoModelForCausalLM

    from prefdata.select import _policy_pass
    from tests.tokenize.test_trajectories import ROWS, _write
    from prefdata.tiny import build_tiny_model, build_tiny_tokenizer
    from prefdata.tiny.text import REASONING_TEMPLATE

    build_tiny_tokenizer(tmp_path / "tok", chat_template=REASONING_TEMPLATE)
    build_tiny_model(tmp_path / "model", tokenizer_dir=tmp_path / "tok")
    model_dir, out = str(tmp_path / "model"), tmp_path / "out"
    prepare(_write(tmp_path / "raw.jsonl", ROWS), out, tokenizer=model_dir, progress=False, workers=1)
    dataset = datasets.load_from_disk(str(out))
    assert "chosen_loss_mask" in dataset.column_names
    got = compute_signal("on_policy", Columns(dataset.data.table, "OUT", 0,
                                              _policy_pass(dataset.data.table, model_dir, _manifest(out), "cpu")))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def masked_mean(prompt, completion, mask):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits.float()[0], dim=-1)
        mask = mask if mask is not None else [1] * len(completion)
        picked = [float(logp[len(prompt) + k - 1, completion[k]]) for k in range(len(completion))
                  if mask[k] and len(prompt) + k >= 1]
        return sum(picked) / len(picked)

    want = [(masked_mean(r["prompt_ids"], r["chosen_ids"], r["chosen_loss_mask"])
             + masked_mean(r["prompt_ids"], r["rejected_ids"], r["rejected_loss_mask"])) / 2 for r in dataset.to_list()]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert any(0 in (r["chosen_loss_mask"] or []) for r in dataset.to_list())  # masks really leave tokens out
