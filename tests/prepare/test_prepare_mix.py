"""`prefdata prepare mix.toml OUT` and `validate mix.toml`: the declared sample sizes, a `source`
column, the same OUT for the same seed whatever the workers and write path, another selection for
another seed, and per-source report numbers equal to counts taken here from OUT's files."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from prefdata.core.errors import PrefdataError
from prefdata.prepare import prepare
from prefdata.validate.command import validate


def _pairs(path: Path, rows: int, tag: str, seed: int, bad_every: int = 0) -> None:
    """Rows with chosen/rejected of random lengths, a pass-through `source`, some identical pairs
    (dropped) and, every `bad_every` rows, a line that is not JSON (quarantined)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            if bad_every and i % bad_every == bad_every - 1:
                handle.write("{not json\n")
                continue
            chosen = " ".join(["good"] * rng.randint(1, 20)) + f" {tag}{i}"
            rejected = chosen if i % 17 == 5 else " ".join(["bad"] * rng.randint(1, 20)) + f" {tag}{i}"
            handle.write(json.dumps({"prompt": f"{tag} question {i}?", "chosen": chosen, "rejected": rejected,
                                     "source": "upstream"}) + "\n")


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    _pairs(tmp_path / "hh.jsonl", 240, "h", 1, bad_every=37)
    (tmp_path / "uf").mkdir()
    _pairs(tmp_path / "uf" / "part1.jsonl", 60, "u", 2)
    _pairs(tmp_path / "uf" / "part2.jsonl", 90, "v", 3, bad_every=41)
    return tmp_path


def _mix(root: Path, seed: int = 0, extra: str = "", a: str = "weight = 0.7", b: str = "weight = 0.3") -> Path:
    path = root / f"mix-{seed}.toml"
    path.write_text(f'seed = {seed}\n{extra}\n[[source]]\nname = "hh"\npath = "hh.jsonl"\n{a}\n'
                    f'[[source]]\nname = "uf"\npath = "uf"\n{b}\n', encoding="utf-8")
    return path


def _read_out(out: Path) -> tuple[list[dict], list[dict], list[dict], dict, dict]:
    import datasets

    rows = datasets.load_from_disk(str(out)).to_list()
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    return rows, dropped, quarantined, json.loads((out / "manifest.json").read_text()), json.loads((out / "report.json").read_text())


def test_mix_gives_the_declared_counts_a_source_column_and_its_ledger(sources, tmp_path, tiny_tokenizer_dir) -> None:
    result = prepare(_mix(sources, extra="rows = 200"), tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
    rows, dropped, quarantined, manifest, report = _read_out(tmp_path / "out")
    file_source = {"hh.jsonl": "hh", "uf/part1.jsonl": "uf", "uf/part2.jsonl": "uf"}
    # rows = 200 at 0.7 / 0.3: exactly 140 and 60 records sampled, each landing in one ledger.
    per_source = Counter(r["source"] for r in rows) + Counter(d["extra"]["source"] for d in dropped)
    per_source += Counter(file_source[q["source_file"]] for q in quarantined)
    assert per_source == {"hh": 140, "uf": 60}
    assert result.rows_in == 200 == result.rows_out + result.rows_dropped + result.rows_quarantined
    assert {r["raw_source"] for r in rows} == {"upstream"}  # the input's own column, kept under another name
    assert all(file_source[r["source_file"]] == r["source"] for r in rows)
    mix = manifest["mix"]
    assert (mix["rows_available"], mix["rows_sampled"], mix["rows_not_sampled"]) == (390, 200, 190)
    assert [(s["name"], s["available"], s["sampled"]) for s in mix["sources"]] == [("hh", 240, 140), ("uf", 150, 60)]
    assert {i.get("source") for i in manifest["inputs"]} == {None, "hh", "uf"}  # None: the mix file itself
    assert manifest["config"]["seed"] == 0
    # No line is sampled twice.
    lines = [(r["source_file"], r["source_line"]) for r in rows] + [(d["source_file"], d["source_line"]) for d in dropped]
    lines += [(q["source_file"], q["source_line"]) for q in quarantined]
    assert len(lines) == len(set(lines)) == 200
    assert [s["name"] for s in report["sources"]] == ["hh", "uf"]


def test_per_source_report_equals_counts_from_out(sources, tmp_path, tiny_tokenizer_dir) -> None:
    prepare(_mix(sources), tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=2, progress=False)
    rows, dropped, quarantined, _, report = _read_out(tmp_path / "out")
    by_name = {s["name"]: s for s in report["sources"]}
    file_source = {"hh.jsonl": "hh", "uf/part1.jsonl": "uf", "uf/part2.jsonl": "uf"}
    for name, entry in by_name.items():
        kept = [r for r in rows if r["source"] == name]
        gone = [d for d in dropped if d["extra"]["source"] == name]
        bad = [q for q in quarantined if file_source[q["source_file"]] == name]
        assert (entry["kept"], entry["dropped"], entry["quarantined"]) == (len(kept), len(gone), len(bad))
        assert entry["rows_in"] == len(kept) + len(gone) + len(bad) == entry["mix"]["sampled"]
        flags = Counter(f for r in kept for f in r["flags"]) + Counter(f for d in gone for f in d["flags"])
        assert entry["flags"] == dict(flags)
        # No --max-length: the stored completion ids are the whole completions.
        longer_tokens = sum(len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in kept)
        longer_chars = sum(len(r["chosen"]) > len(r["rejected"]) for r in kept)
        bias = entry["length_bias"]["kept"]
        assert bias["tokens"]["pairs"] == len(kept) and bias["tokens"]["chosen_longer_count"] == longer_tokens
        assert bias["characters"]["chosen_longer_count"] == longer_chars
        assert bias["tokens"]["chosen_longer"] == round(longer_tokens / len(kept), 6)
        every = kept + gone
        assert entry["length_bias"]["characters"]["chosen_longer_count"] == sum(len(p["chosen"]) > len(p["rejected"]) for p in every)
        assert entry["tokens"]["chosen"]["count"] == len(every)
        assert entry["tokens"]["chosen"]["max"] >= max(len(r["chosen_ids"]) for r in kept)
    assert sum(s["kept"] for s in report["sources"]) == report["accounting"]["rows_out"]
    overall = report["length_bias"]["kept"]["tokens"]
    assert overall["chosen_longer_count"] == sum(len(r["chosen_ids"]) > len(r["rejected_ids"]) for r in rows)
    assert report["length_bias"]["characters"]["pairs"] == len(rows) + len(dropped)
    for name in ("report.md", "report.html"):
        text = (tmp_path / "out" / name).read_text()
        assert "Sources" in text and "hh" in text and "uf" in text


def test_same_seed_same_out_whatever_the_workers_and_batch_size(sources, tmp_path, tiny_tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 700)  # many chunks: the samples are decided chunk by chunk
    mix = _mix(sources, seed=5)
    hashes = set()
    for i, options in enumerate(({"workers": 1}, {"workers": 2}, {"workers": 1, "batch_size": 7})):
        prepare(mix, tmp_path / f"out{i}", tokenizer=tiny_tokenizer_dir, progress=False, **options)
        manifest = json.loads((tmp_path / f"out{i}" / "manifest.json").read_text())
        hashes.add((manifest["content_hash"], (tmp_path / f"out{i}" / "dropped.jsonl").read_text()))
    assert len(hashes) == 1


def test_another_seed_samples_other_records(sources, tmp_path, tiny_tokenizer_dir) -> None:
    picked = []
    for seed in (0, 1):
        prepare(_mix(sources, seed=seed), tmp_path / f"out{seed}", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
        rows, dropped, quarantined, manifest, _ = _read_out(tmp_path / f"out{seed}")
        picked.append({(r["source_file"], r["source_line"]) for r in rows + dropped + quarantined})
        assert [s["sampled"] for s in manifest["mix"]["sources"]] == [239, 103]  # the same counts (342 at 0.7 / 0.3, largest remainders) ...
    assert picked[0] != picked[1]  # ... of other records


def test_validate_reads_the_mix_file(sources, tmp_path, tiny_tokenizer_dir) -> None:
    mix = _mix(sources, extra="rows = 150")
    prepared = prepare(mix, tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
    checked = validate(mix, format="json", progress=False, tokenizer=tiny_tokenizer_dir, workers=1)
    text_only = validate(mix, format="json", progress=False, workers=2)  # no tokenizer, several workers
    for report in (checked.report, text_only.report):
        assert report["accounting"]["rows_in"] == prepared.rows_in == 150
        assert [(s["name"], s["rows_in"], s["kept"], s["dropped"], s["quarantined"]) for s in report["sources"]] == [
            (s["name"], s["rows_in"], s["kept"], s["dropped"], s["quarantined"]) for s in prepared.report["sources"]]
    assert checked.report["sources"][0]["tokens"] is not None and text_only.report["sources"][0]["tokens"] is None
    assert checked.exit_code == 1  # the sampled unreadable lines are errors in validate


def test_mix_with_a_hub_split_and_per_source_rows(tmp_path, tiny_tokenizer_dir, monkeypatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "org" / "name" / "data"
    data.mkdir(parents=True)
    rows = [{"prompt": f"Q{i}?", "chosen": f"A long answer {i}", "rejected": "No."} for i in range(30)]
    pq.write_table(pa.Table.from_pylist(rows), data / "train_prefs-00000-of-00001.parquet")
    monkeypatch.chdir(tmp_path)
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _pairs(tmp_path / "local.jsonl", 40, "l", 4)
    mix = tmp_path / "mix.toml"
    mix.write_text('[[source]]\npath = "org/name:train_prefs"\nrows = 12\n[[source]]\npath = "local.jsonl"\nrows = 20\n')
    result = prepare(mix, tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
    out_rows, dropped, _, manifest, _ = _read_out(tmp_path / "out")
    assert Counter(r["source"] for r in out_rows + [{"source": d["extra"]["source"]} for d in dropped]) == {"name": 12, "local": 20}
    assert result.rows_in == 32
    assert {r["source_file"] for r in out_rows if r["source"] == "name"} == {"org/name:train_prefs"}
    assert any(i.get("hub_id") == "org/name" and i["source"] == "name" for i in manifest["inputs"])


def test_cli_prepare_and_validate_take_a_mix_file(sources, tmp_path, tiny_tokenizer_dir, capsys) -> None:
    from prefdata.cli import main

    mix = _mix(sources, extra="rows = 100")
    assert main(["prepare", str(mix), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--workers", "1"]) == 0
    assert "sources: hh" in capsys.readouterr().out
    assert main(["validate", str(mix), "--no-progress", "--format", "markdown"]) == 1  # unreadable lines sampled
    assert "### Sources" in capsys.readouterr().out
    bad = _mix(sources, extra="rows = 100000")
    assert main(["prepare", str(bad), str(tmp_path / "out2"), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "fewer than the" in err and "nothing is upsampled" in err


def test_out_inside_a_source_is_refused(sources, tiny_tokenizer_dir) -> None:
    with pytest.raises(PrefdataError, match="must not be inside the input"):
        prepare(_mix(sources), sources / "uf" / "out", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
