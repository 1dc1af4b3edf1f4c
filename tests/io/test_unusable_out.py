"""Issue 24, item 1: no command leaves an OUT that nothing can read, and every command meets an
unusable OUT (empty, no kept pair, half-written, all records quarantined) with either a working
result or one line and exit 2 -- never a traceback or an "internal error", and never by changing OUT."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.io.out_dir import MARKER, STAGING_PREFIX

GOOD = [
    {"prompt": "What is two plus two?", "chosen": "Four, because two and two make four.", "rejected": "Five."},
    {"prompt": "Name a colour.", "chosen": "Blue is a colour.", "rejected": "A table."},
]
SAME = [
    {"prompt": "hi", "chosen": "same answer", "rejected": "same answer"},
    {"prompt": "yo", "chosen": "a b", "rejected": "a b"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _prepare(raw: Path, out: Path, tokenizer: str) -> int:
    return main(["prepare", str(raw), str(out), "--tokenizer", tokenizer, "--no-progress", "--workers", "1"])


def _tree(out: Path) -> dict[str, str]:
    """Every file under OUT with a hash of its bytes: what 'never damages OUT' compares."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def outs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """One OUT of each unusable kind, plus a good one the half-written ones are cut from."""
    base = tmp_path_factory.mktemp("outs")
    made = {"empty": base / "empty"}
    made["empty"].mkdir()
    assert _prepare(_jsonl(base / "same.jsonl", SAME), base / "no_pair", tiny_model_dir) == 1
    made["no_pair"] = base / "no_pair"
    (base / "junk.jsonl").write_text("{not json\n[1, 2]\n", encoding="utf-8")
    assert _prepare(base / "junk.jsonl", base / "all_quarantined", tiny_model_dir) == 2
    made["all_quarantined"] = base / "all_quarantined"
    good = base / "good"
    assert _prepare(_jsonl(base / "good.jsonl", GOOD), good, tiny_model_dir) == 0
    # A prepare SIGKILLed before publishing: everything in its staging directory, no manifest.
    killed = base / "killed_before_publish"
    staging = killed / f"{STAGING_PREFIX}99999"
    shutil.copytree(good, staging)
    (staging / "manifest.json").unlink()
    (staging / MARKER).rename(killed / MARKER)
    made["killed_before_publish"] = killed
    # Killed mid-publish: the data files renamed into OUT, the manifest still in staging.
    mid = base / "killed_mid_publish"
    shutil.copytree(good, mid)
    (mid / f"{STAGING_PREFIX}99999").mkdir()
    (mid / "manifest.json").rename(mid / f"{STAGING_PREFIX}99999" / "manifest.json")
    made["killed_mid_publish"] = mid
    return made


KINDS = ["empty", "no_pair", "all_quarantined", "killed_before_publish", "killed_mid_publish"]


def _commands(out: Path, model: str, scratch: Path) -> dict[str, list[str]]:
    return {
        "validate": ["validate", str(out)],
        "refs": ["refs", str(out), "--model", model, "--no-progress"],
        "train": ["train", str(out), "--model", model, "--output", str(scratch / "ckpt"), "--no-progress", "--max-steps", "1"],
        "show": ["show", str(out)],
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["validate", "refs", "train", "show"])
def test_every_command_refuses_an_unusable_out_in_one_line(kind, command, outs, tiny_model_dir, tmp_path, capsys):
    out = outs[kind]
    before = _tree(out)
    capsys.readouterr()
    code = main(_commands(out, tiny_model_dir, tmp_path)[command])
    captured = capsys.readouterr()
    assert _tree(out) == before, f"{command} changed {kind} OUT"
    assert not (tmp_path / "ckpt").exists(), "train wrote its output before refusing"
    assert "Traceback" not in captured.err + captured.out and "internal error" not in captured.err
    if command == "validate" and kind == "no_pair":
        assert code == 0  # a finished, empty OUT is readable: validate reports on its 0 rows
        return
    assert code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"prefdata {command}: error: "), captured.err
    if kind == "no_pair":
        assert "holds no pair" in lines[0] and "dropped.jsonl" in lines[0]
    if kind.startswith("killed"):
        assert "interrupted" in lines[0]


def test_load_from_disk_reads_every_finished_out_and_refuses_the_others(outs):
    import datasets

    assert len(datasets.load_from_disk(str(outs["no_pair"]))) == 0  # finished with no pair: empty, loadable
    assert len(datasets.load_from_disk(str(outs["all_quarantined"]))) == 0
    assert len(datasets.load_from_disk(str(outs["killed_mid_publish"]))) == len(GOOD)
    for kind in ("empty", "killed_before_publish"):
        with pytest.raises(FileNotFoundError):
            datasets.load_from_disk(str(outs[kind]))


def test_refs_on_a_no_pair_out_leaves_it_readable_by_everything(outs, tiny_model_dir, tmp_path):
    """The issue's sequence: prepare keeps no pair, refs, then train / validate / load_from_disk."""
    import datasets

    out = tmp_path / "no_pair"
    shutil.copytree(outs["no_pair"], out)
    assert main(["refs", str(out), "--model", tiny_model_dir, "--no-progress"]) == 2
    assert main(["train", str(out), "--model", tiny_model_dir, "--output", str(tmp_path / "ckpt"), "--no-progress"]) == 2
    assert main(["validate", str(out)]) == 0
    assert len(datasets.load_from_disk(str(out))) == 0
