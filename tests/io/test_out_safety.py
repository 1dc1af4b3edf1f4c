"""Invariant 8 against hostile and careless inputs (issue 40 items 3-4, issue 41 items 3, 4, 6, 7):
commands that read an OUT write nothing into it, never follow a symlink or a path out of it, and
check its ledger against its files; nothing is replaced without --overwrite (train included), and
--overwrite never deletes an input that lives inside the output."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.prepare import prepare

SECRET = "TOPSECRET-not-for-NEW"
COMMANDS = ["select", "validate", "show", "refs", "train"]


def _rows() -> list[dict]:
    rows = [{"prompt": f"Question {i}: tell me about item {i}.", "chosen": "A fine answer " * (1 + i % 4),
             "rejected": "No " * (1 + i % 3), "reward_chosen": 1.0 + i, "reward_rejected": 0.5} for i in range(12)]
    rows.append({"prompt": "same", "chosen": "same words", "rejected": "same words"})  # dropped: identical
    return rows


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("raw") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()) + "{broken\n", encoding="utf-8")  # 1 quarantined
    return path


@pytest.fixture(scope="module")
def out(tmp_path_factory, raw, tiny_model_dir) -> Path:
    """12 kept pairs, 1 dropped, 1 quarantined; prepared with the tiny model's tokenizer so train runs."""
    path = tmp_path_factory.mktemp("prepared") / "out"
    result = prepare(raw, path, tokenizer=tiny_model_dir, progress=False, workers=1)
    assert (result.rows_out, result.rows_dropped, result.rows_quarantined) == (12, 1, 1)
    return path


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (and `root` itself) with its mtime, and each file's bytes hashed: a
    file written, replaced, or created and removed again all change it."""
    entries = {".": ("dir", root.stat().st_mtime_ns)}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        entries[str(path.relative_to(root))] = (digest, stat.st_mtime_ns)
    return entries


def _cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out and "internal error" not in captured.err
    return code, captured.err.strip().splitlines()


def _argv(command: str, out: Path, model: str, scratch: Path) -> list[str]:
    return {
        "select": ["select", str(out), str(scratch / "new"), "--by", "reward_margin", "--keep", "6", "--no-progress"],
        "validate": ["validate", str(out), "--no-progress"],
        "show": ["show", str(out)],
        "refs": ["refs", str(out), "--model", model, "--no-progress", "--device", "cpu"],
        "train": ["train", str(out), "--model", model, "--output", str(scratch / "run"), "--no-progress",
                  "--max-steps", "1", "--loss", "simpo", "--device", "cpu"],
    }[command]


def _refused(code: int, err: list[str], command: str, *needles: str) -> None:
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"prefdata {command}: error: "), err
    for needle in needles:
        assert needle in err[0], err[0]


# ---- nothing written into OUT ----------------------------------------------------------------------


def test_select_writes_nothing_into_out(out, tmp_path, capsys):
    """`datasets` caches a selection (cache-<hash>.arrow) beside the dataset it came from: one more
    file in OUT per run, before. Two runs, one of them adding a weight column (a flatten)."""
    before = _snapshot(out)
    for i, extra in enumerate(([], ["--weight-by", "reward_margin"])):
        code, err = _cli(["select", str(out), str(tmp_path / f"new{i}"), "--by", "reward_margin", "--keep", "6",
                          "--no-progress", *extra], capsys)
        assert code == 0, err
    assert _snapshot(out) == before
    import datasets

    new = datasets.load_from_disk(str(tmp_path / "new1"))
    assert len(new) == 6 and "weight" in new.column_names
    assert not [p for p in (tmp_path / "new1").rglob("*") if "scratch" in p.name or p.name.startswith("cache-")]


@pytest.mark.parametrize("command", ["validate", "show", "train"])
def test_commands_that_read_out_write_nothing_into_it(command, out, tiny_model_dir, tmp_path, capsys):
    before = _snapshot(out)
    code, err = _cli(_argv(command, out, tiny_model_dir, tmp_path), capsys)
    assert code in (0, 1), err
    assert _snapshot(out) == before


def _read_only_command(directory: Path, argv: list[str]) -> list[str]:
    """`argv` run with `directory` read-only: chmod -w for a user; root writes through that, so for
    root a read-only bind mount in a private mount namespace (skipped where that is not allowed)."""
    if os.geteuid() != 0:
        for path in [directory, *directory.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        return argv
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: no way to make OUT read-only for root")
    mount = f"mount --bind {shlex.quote(str(directory))} {shlex.quote(str(directory))} && " \
            f"mount -o remount,bind,ro {shlex.quote(str(directory))}"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"{mount} && ! touch {shlex.quote(str(directory / 'probe'))} 2>/dev/null"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("running as root where a read-only bind mount is not allowed (no CAP_SYS_ADMIN)")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f"{mount} && exec {shlex.join(argv)}"]


def test_select_works_on_a_read_only_out(out, tmp_path):
    """It failed with an internal error: `datasets` tried to write its cache file into OUT."""
    readonly = tmp_path / "readonly"
    shutil.copytree(out, readonly)
    argv = [sys.executable, "-m", "prefdata", "select", str(readonly), str(tmp_path / "new"), "--by", "reward_margin",
            "--keep", "6", "--weight-by", "reward_margin", "--no-progress"]
    try:
        done = subprocess.run(_read_only_command(readonly, argv), capture_output=True, text=True, timeout=300)
    finally:
        for path in [readonly, *readonly.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "new" / "manifest.json").is_file()


# ---- train's --output: refused unless --overwrite or --resume --------------------------------------


def test_train_refuses_an_existing_output_unless_overwrite(out, tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = _argv("train", out, tiny_model_dir, tmp_path)
    assert _cli(argv, capsys)[0] == 0
    before = _snapshot(run)
    code, err = _cli(argv, capsys)
    _refused(code, err, "train", str(run), "--overwrite", "--resume")
    code, err = _cli([*argv, "--resume"], capsys)  # no checkpoint: it used to restart from step 1, silently
    _refused(code, err, "train", f"no checkpoint found in {run}")
    assert _snapshot(run) == before, "a refused run changed the earlier run's model or metrics"
    (run / "stale-from-the-earlier-run.txt").write_text("old\n")
    code, err = _cli([*argv, "--overwrite"], capsys)
    assert code == 0, err
    assert (run / "model.safetensors").is_file() and not (run / "stale-from-the-earlier-run.txt").exists()


def test_train_overwrite_never_empties_a_directory_train_did_not_write(out, tiny_model_dir, tmp_path, capsys):
    mine = tmp_path / "run"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own file\n")
    code, err = _cli([*_argv("train", out, tiny_model_dir, tmp_path), "--overwrite"], capsys)
    _refused(code, err, "train", "did not write")
    assert (mine / "notes.txt").read_text() == "the user's own file\n"


@pytest.mark.parametrize("where", ["model_inside_output", "output_inside_out"])
def test_train_keeps_its_inputs_out_of_its_output(where, out, tiny_model_dir, tmp_path, capsys):
    argv = _argv("train", out, tiny_model_dir, tmp_path)
    if where == "model_inside_output":
        shutil.copytree(tiny_model_dir, tmp_path / "run" / "base")
        argv[argv.index("--model") + 1] = str(tmp_path / "run" / "base")
        argv.append("--overwrite")
    else:
        argv[argv.index("--output") + 1] = str(out / "run")
    before_out = _snapshot(out)
    code, err = _cli(argv, capsys)
    _refused(code, err, "train", "lies inside")
    assert _snapshot(out) == before_out
    if where == "model_inside_output":
        assert (tmp_path / "run" / "base" / "config.json").is_file()


# ---- a tampered OUT: nothing read from outside it -------------------------------------------------


def _secret_file(tmp_path: Path, lines: int) -> Path:
    """A file outside OUT with as many lines as the file it stands in for: the ledger alone cannot tell."""
    path = tmp_path / "elsewhere" / "secret.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(json.dumps({"source_line": i + 1, "secret": SECRET}) + "\n" for i in range(lines)))
    return path


def _tamper(kind: str, out: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of OUT tampered as `kind`; returns it and the name the refusal must mention."""
    bad = tmp_path / "tampered"
    shutil.copytree(out, bad)
    data = json.loads((bad / "state.json").read_text())["_data_files"][0]["filename"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    if kind in ("dropped_symlink", "quarantine_symlink"):
        name = kind.split("_")[0] + ".jsonl"
        lines = len((bad / name).read_text().splitlines())
        (bad / name).unlink()
        (bad / name).symlink_to(_secret_file(tmp_path, lines))
        return bad, name
    if kind in ("data_symlink", "manifest_symlink"):
        name = data if kind == "data_symlink" else "manifest.json"
        shutil.move(str(bad / name), str(elsewhere / name))
        (bad / name).symlink_to(elsewhere / name)
        return bad, name
    # state.json naming a data file outside OUT: a copy of the real one, so the rows would be read
    shutil.copyfile(bad / data, elsewhere / data)
    target = f"../elsewhere/{data}" if kind == "state_dotdot" else str(elsewhere / data)
    state = json.loads((bad / "state.json").read_text())
    state["_data_files"] = [{"filename": target}]
    (bad / "state.json").write_text(json.dumps(state))
    (bad / data).unlink()
    return bad, target


TAMPERS = ["dropped_symlink", "quarantine_symlink", "data_symlink", "manifest_symlink", "state_dotdot",
           "state_absolute"]


@pytest.mark.parametrize("kind", TAMPERS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_tampered_out_is_refused_and_nothing_outside_it_is_read(command, kind, out, tiny_model_dir, tmp_path, capsys):
    bad, name = _tamper(kind, out, tmp_path)
    code, err = _cli(_argv(command, bad, tiny_model_dir, tmp_path), capsys)
    _refused(code, err, command, name)
    assert not (tmp_path / "new").exists() and not (tmp_path / "run").exists()


# ---- the ledger checked against the files, the manifest's types checked ---------------------------


def _edit_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


LEDGERS = {
    # the case: 12 rows under a manifest that says 40 (its sum consistent)
    "forty_rows": (lambda m: m["row_accounting"].update(rows_out=40, pairs_kept=40, pairs_made=41, rows_in=42),
                   None, ("rows_out 40", "12 dataset rows")),
    "extra_dropped_line": (None, "dropped.jsonl", ("rows_dropped 1", "2 dropped.jsonl lines")),
    "no_quarantine_file": (None, "quarantine.jsonl", ("rows_quarantined 1", "0 quarantine.jsonl lines")),
    "rows_in_off": (lambda m: m["row_accounting"].update(rows_in=19), None, ("rows_in 19", "= 14")),
    "rows_dropped_text": (lambda m: m["row_accounting"].update(rows_dropped="x"), None,
                          ("row_accounting.rows_dropped", "non-negative integer")),
    "accounting_list": (lambda m: m.update(row_accounting=[12, 1, 1]), None, ("row_accounting", "object")),
}


@pytest.mark.parametrize("kind", sorted(LEDGERS))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_ledger_that_does_not_match_the_files_is_refused(command, kind, out, tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    edit, file, needles = LEDGERS[kind]
    if edit is not None:
        _edit_manifest(bad, edit)
    elif file == "dropped.jsonl":
        with open(bad / file, "a") as handle:
            handle.write(json.dumps({"source_line": 99, "flags": ["identical"]}) + "\n")
    else:
        (bad / file).unlink()
    code, err = _cli(_argv(command, bad, tiny_model_dir, tmp_path), capsys)
    _refused(code, err, command, *needles)
    assert not (tmp_path / "new").exists() and not (tmp_path / "run").exists()


# ---- --overwrite never deletes an input inside the output -----------------------------------------


def test_select_overwrite_refuses_an_input_inside_new(out, tmp_path, capsys):
    new = tmp_path / "new"
    assert _cli(_argv("select", out, "", tmp_path), capsys)[0] == 0
    shutil.copytree(out, new / "inner")
    before = _snapshot(new / "inner")
    code, err = _cli(["select", str(new / "inner"), str(new), "--by", "reward_margin", "--keep", "6", "--overwrite",
                      "--no-progress"], capsys)
    _refused(code, err, "select", str(new / "inner"), "inside")
    assert _snapshot(new / "inner") == before


def test_select_refuses_a_new_inside_out(out, tmp_path, capsys):
    before = _snapshot(out)
    code, err = _cli(["select", str(out), str(out / "new"), "--by", "reward_margin", "--keep", "6", "--no-progress"],
                     capsys)
    _refused(code, err, "select", "inside OUT")
    assert _snapshot(out) == before


@pytest.mark.parametrize("input_kind", ["raw", "decontaminate", "policy"])
def test_prepare_overwrite_refuses_an_input_inside_out(input_kind, raw, tiny_model_dir, tmp_path, capsys):
    target = tmp_path / "out"
    prepare(raw, target, tokenizer=tiny_model_dir, progress=False, workers=1)
    argv = ["prepare", str(raw), str(target), "--tokenizer", tiny_model_dir, "--no-progress", "--workers", "1",
            "--overwrite"]
    if input_kind == "raw":
        inside = target / "raw.jsonl"
        shutil.copyfile(raw, inside)
        argv[1] = str(inside)
    elif input_kind == "decontaminate":
        inside = target / "bench.jsonl"
        inside.write_text(json.dumps({"prompt": "an unrelated benchmark question"}) + "\n")
        argv += ["--decontaminate-against", str(inside)]
    else:
        inside = target / "policy.toml"
        inside.write_text('[flags]\nidentical = "drop"\n')
        argv += ["--policy", str(inside)]
    before = inside.read_bytes()
    code, err = _cli(argv, capsys)
    _refused(code, err, "prepare", str(inside), "inside")
    assert inside.read_bytes() == before


def test_a_config_file_inside_the_output_is_refused(raw, tiny_model_dir, tmp_path, capsys):
    target = tmp_path / "out"
    prepare(raw, target, tokenizer=tiny_model_dir, progress=False, workers=1)
    config = target / "prefdata.toml"
    config.write_text("[prepare]\nworkers = 1\n")
    code, err = _cli(["prepare", str(raw), str(target), "--tokenizer", tiny_model_dir, "--no-progress", "--overwrite",
                      "--config", str(config)], capsys)
    _refused(code, err, "prepare", str(config), "inside")
    assert config.is_file()


def test_generate_overwrite_refuses_to_replace_its_own_prompts(raw, tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "gen" / "generations.jsonl"
    prompts.parent.mkdir()
    shutil.copyfile(raw, prompts)
    code, err = _cli(["generate", str(prompts), str(prompts.parent), "--model", tiny_model_dir, "--overwrite",
                      "--no-progress"], capsys)
    _refused(code, err, "generate", str(prompts), "is the output")
    assert prompts.read_bytes() == raw.read_bytes()


@pytest.mark.parametrize("command", ["validate", "prepare"])
def test_a_raw_save_to_disk_input_naming_files_outside_it_is_refused(command, out, tiny_model_dir, tmp_path, capsys):
    """A `datasets.save_to_disk` directory given as RAW (not an OUT: no manifest) whose state.json
    climbs out with `../`: the Arrow file it names is never read."""
    raw = tmp_path / "raw_dataset"
    shutil.copytree(out, raw, ignore=shutil.ignore_patterns("manifest.json", ".prefdata-output", "*.jsonl"))
    data = json.loads((raw / "state.json").read_text())["_data_files"][0]["filename"]
    (tmp_path / "elsewhere").mkdir()
    shutil.move(str(raw / data), str(tmp_path / "elsewhere" / data))
    state = json.loads((raw / "state.json").read_text())
    state["_data_files"] = [{"filename": f"../elsewhere/{data}"}]
    (raw / "state.json").write_text(json.dumps(state))
    argv = {"validate": ["validate", str(raw), "--no-progress"],
            "prepare": ["prepare", str(raw), str(tmp_path / "new"), "--tokenizer", tiny_model_dir, "--no-progress",
                        "--workers", "1"]}[command]
    code, err = _cli(argv, capsys)
    _refused(code, err, command, f"../elsewhere/{data}")
    assert not (tmp_path / "new").exists()
