"""The hostile-input corpus (issue 6): every input gets exactly the behaviour EXPECTATIONS.toml states.

Two levels: reading + normalizing (counts of pairs, quarantined records and unknown shapes, or a
PrefdataError), and a full `prepare` run with the tiny tokenizer (row accounting holds, quarantine
entries are one line each, exit-2 inputs raise PrefdataError). No other exception type, ever.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import datasets
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.core.errors import PrefdataError, RecordError, UnknownShapeError
from prefdata.io.formats import normalize_record
from prefdata.io.json_decode import MAX_RAW_TEXT
from prefdata.io.readers import iter_raw_records
from prefdata.validate.command import validate

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

HOSTILE = Path(__file__).parent / "hostile"
EXPECTATIONS: dict[str, dict] = tomllib.loads((HOSTILE / "EXPECTATIONS.toml").read_text())
BIG = 5 * 1024 * 1024
# Tokenizing one valid 5 MB string takes ~10 s here (tokenizer-bound): reader level only (the
# 10 MB pair goes through prepare in tests/test_reliability.py).
NOT_PREPARED = {"big_record.jsonl", "big_record_array.json"} | {name for name, spec in EXPECTATIONS.items() if "budget_s" in spec}


def _row(i: int, **extra) -> dict:
    return {"prompt": f"Question {i}?", "chosen": f"Good answer {i}.", "rejected": f"Bad answer {i}.", **extra}


def _generate(name: str, directory: Path) -> Path:
    """Inputs too large to commit (5 MB records) or impossible in git (an empty directory)."""
    path = directory / name
    big_text = ("lorem ipsum dolor sit amet, " * (BIG // 28 + 1))[:BIG]
    if name == "big_record.jsonl":
        rows = [_row(1), _row(2, chosen=big_text), _row(3)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif name == "big_record_array.json":
        path.write_text(json.dumps([_row(1, rejected=big_text), _row(2)]))
    elif name == "big_broken_record.jsonl":
        broken = json.dumps(_row(2, chosen=big_text))[:-1] + ',}'
        path.write_text(json.dumps(_row(1)) + "\n" + broken + "\n")
    elif name == "huge_pair.jsonl":
        near_copy = big_text[: BIG // 2] + " one small edit " + big_text[BIG // 2 + 16 :]
        rows = [_row(1), _row(2, chosen=big_text + big_text[:100], rejected=near_copy), _row(3)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif name == "many_messages.jsonl":
        turns = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i}"} for i in range(100_000)]
        rows = [
            {"prompt": [{"role": "user", "content": "hi"}], "chosen": turns[1:], "rejected": turns[1:-1]},
            {"prompt": turns[:-1], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]},
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif name == "huge_single_line_array.json":
        filler = "word " * 480
        path.write_text(json.dumps([_row(i, chosen=f"{filler}{i}", rejected=f"{i} other") for i in range(20_000)]))
    elif name == "empty_dir":
        path.mkdir()
    elif name == "missing.jsonl":
        pass
    else:
        raise AssertionError(f"no generator for {name}")
    return path


def _input(name: str, tmp_path: Path) -> Path:
    if EXPECTATIONS[name].get("generated"):
        return _generate(name, tmp_path)
    path = HOSTILE / name
    assert path.exists(), f"{name} is listed in EXPECTATIONS.toml but missing from tests/hostile"
    return path


def _one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message


def test_corpus_is_complete():
    committed = {p.name for p in HOSTILE.iterdir()} - {"EXPECTATIONS.toml", "make_corpus.py", "__pycache__"}
    listed = {name for name, spec in EXPECTATIONS.items() if not spec.get("generated")}
    assert committed == listed  # every committed input has an expectation and vice versa
    assert len(EXPECTATIONS) >= 30
    huge = {name for name, spec in EXPECTATIONS.items() if "budget_s" in spec}
    assert {"huge_pair.jsonl", "many_messages.jsonl", "huge_single_line_array.json"} <= huge


@pytest.mark.parametrize("name", sorted(EXPECTATIONS))
def test_read_and_normalize(name, tmp_path):
    spec = EXPECTATIONS[name]
    path = _input(name, tmp_path)
    counts = {"ok": 0, "quarantined": 0, "unknown": 0}
    try:
        for record in iter_raw_records(path):
            assert record.source_line >= 1
            try:
                normalize_record(record)
                counts["ok"] += 1
            except UnknownShapeError as exc:
                _one_line(str(exc))
                counts["unknown"] += 1
            except RecordError as exc:
                _one_line(str(exc))
                counts["quarantined"] += 1
                if record.raw_text is not None:
                    assert len(record.raw_text) <= MAX_RAW_TEXT + 100  # quarantine stays small
    except PrefdataError as exc:
        assert "exit2" in spec, f"{name}: unexpected PrefdataError: {exc}"
        _one_line(str(exc))
        assert spec["exit2"] in str(exc)
        return
    assert "exit2" not in spec, f"{name}: expected exit 2 ({spec['exit2']}), got {counts}"
    expected = {key: spec.get(key, 0) for key in counts}
    assert counts == expected, spec["why"]


@pytest.mark.parametrize("name", sorted(set(EXPECTATIONS) - NOT_PREPARED))
def test_prepare_accounts_for_every_record(name, tmp_path, tiny_tokenizer_dir):
    prepare = pytest.importorskip("prefdata.prepare").prepare
    spec = EXPECTATIONS[name]
    path = _input(name, tmp_path)
    ok, quarantined, unknown = (spec.get(key, 0) for key in ("ok", "quarantined", "unknown"))
    must_fail = "exit2" in spec or (unknown and not ok and not quarantined)
    out = tmp_path / "out"
    if must_fail:
        with pytest.raises(PrefdataError) as info:
            prepare(path, out, tokenizer=tiny_tokenizer_dir, progress=False)
        _one_line(str(info.value))
        assert not out.exists()  # nothing half-written is left behind
        return
    if not ok:  # issue 16: no record could be read -> exit 2, and OUT shows why
        with pytest.raises(PrefdataError) as info:
            prepare(path, out, tokenizer=tiny_tokenizer_dir, progress=False)
        assert info.value.exit_code == 2 and "quarantine.jsonl" in info.value.args[0]
        _one_line(str(info.value))
        entries = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
        assert len(entries) == quarantined + unknown
        assert not (out / "manifest.json").exists()
        return
    result = prepare(path, out, tokenizer=tiny_tokenizer_dir, progress=False)
    assert result.rows_in == result.rows_out + result.rows_dropped + result.rows_quarantined
    assert result.rows_in == ok + quarantined + unknown
    assert result.rows_quarantined == quarantined + unknown
    assert result.rows_out + result.rows_dropped == ok
    entries = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert len(entries) == result.rows_quarantined
    for entry in entries:
        _one_line(entry["error"])
        assert entry["source_line"] >= 1


@pytest.mark.parametrize("name", sorted(EXPECTATIONS))
def test_validate_accounts_for_every_record(name, tmp_path):
    """The same corpus through `validate` (raw input, default workers): the same counts, or the
    same one-line exit 2; huge inputs within their stated time budget."""
    spec = EXPECTATIONS[name]
    path = _input(name, tmp_path)
    ok, quarantined, unknown = (spec.get(key, 0) for key in ("ok", "quarantined", "unknown"))
    started = time.perf_counter()
    try:
        report = validate(path, progress=False, format="json", output=tmp_path / "report.json").report
    except PrefdataError as exc:
        _one_line(str(exc))
        assert "exit2" in spec or (unknown and not ok and not quarantined), f"{name}: unexpected PrefdataError: {exc}"
        if "exit2" in spec:
            assert spec["exit2"] in str(exc)
        return
    seconds = time.perf_counter() - started
    assert "exit2" not in spec, f"{name}: expected exit 2 ({spec['exit2']})"
    outcomes = report["outcomes"]
    assert sum(outcomes.values()) == ok + quarantined + unknown
    assert outcomes.get("quarantined", 0) == quarantined + unknown
    if "budget_s" in spec:
        assert seconds < spec["budget_s"], f"{name}: validate took {seconds:.1f} s (budget {spec['budget_s']} s)"


# --- property: random records never break prepare -----------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_scalar = st.none() | st.booleans() | st.integers(-5, 600) | _text
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "gpt", "human", "narrator"]), "content": _text | _scalar}
)
_value = _scalar | st.lists(_message, max_size=3) | _message | st.lists(st.integers(-1, 600), max_size=4)
_record = st.one_of(
    st.fixed_dictionaries({"prompt": _text, "chosen": _text, "rejected": _text}),
    st.fixed_dictionaries({"prompt": _value, "chosen": _value, "rejected": _value}),
    st.fixed_dictionaries(
        {"conversations": st.lists(st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "x"]), "value": _text}), max_size=3),
         "chosen": _message, "rejected": _message}
    ),
    st.fixed_dictionaries({"prompt_ids": _value, "chosen_ids": _value, "rejected_ids": _value}),
    st.dictionaries(st.sampled_from(["prompt", "chosen", "rejected", "label", "messages", "id"]), _value, max_size=4),
)
_line = st.one_of(_record.map(json.dumps), st.sampled_from(["{broken", "[1, 2]", "null", '"text"', ""]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, min_size=1, max_size=12))
def test_prepare_never_raises_on_random_records(lines, tmp_path_factory, tiny_tokenizer_dir):
    prepare = pytest.importorskip("prefdata.prepare").prepare
    directory = tmp_path_factory.mktemp("random")
    path = directory / "random.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records = sum(1 for line in lines if line.strip())
    try:
        result = prepare(path, directory / "out", tokenizer=tiny_tokenizer_dir, progress=False)
    except PrefdataError as exc:  # only for inputs with no pairs at all: empty, or no preference shape
        _one_line(str(exc))
        pairs = 0
        for raw in iter_raw_records(path) if records else []:
            try:
                normalize_record(raw)
                pairs += 1
            except RecordError:
                pass
        assert pairs == 0
        return
    assert result.rows_in == records
    assert result.rows_in == result.rows_out + result.rows_dropped + result.rows_quarantined


def _pairs_in(path: Path) -> int:
    pairs = 0
    for raw in iter_raw_records(path):
        try:
            normalize_record(raw)
            pairs += 1
        except RecordError:
            pass
    return pairs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, min_size=1, max_size=12), tokenized=st.booleans(), workers=st.sampled_from([1, 2]))
def test_validate_never_raises_on_random_records(lines, tokenized, workers, tmp_path_factory, tiny_tokenizer_dir):
    """`validate` gets the same property as `prepare` (issue 16): random record shapes never raise
    anything but a one-line PrefdataError, and every record is accounted for in the report."""
    directory = tmp_path_factory.mktemp("random-validate")
    path = directory / "random.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records = sum(1 for line in lines if line.strip())
    try:
        result = validate(
            path, tokenizer=tiny_tokenizer_dir if tokenized else None, workers=workers,
            progress=False, format="json", output=directory / "report.json",
        )
    except PrefdataError as exc:  # only for inputs with no pairs at all: empty, or no preference shape
        _one_line(str(exc))
        assert (_pairs_in(path) if records else 0) == 0
        return
    outcomes = result.report["outcomes"]
    assert sum(outcomes.values()) == records
    assert outcomes.get("kept", 0) + outcomes.get("dropped", 0) == _pairs_in(path)
    if outcomes.get("quarantined", 0) == records:  # no record readable: an input error, as in prepare (issue 31)
        assert result.exit_code == 2 and result.problem.startswith("no record of")
        _one_line(result.problem)
    else:
        assert result.exit_code in (0, 1)
    assert json.loads((directory / "report.json").read_text())["outcomes"] == outcomes


# --- image paths and sizes from strangers' data (issue 30) ---------------------------------------
# Each file: good rows around one hostile row. The hostile row's record is quarantined with a reason
# naming its path as written, the good rows are prepared, and no byte from outside the data
# directory reaches OUT's Arrow data -- in prepare and in validate (one worker and several).

OUTSIDE_COLOR = (7, 77, 177)


def _png(size: tuple[int, int], color=OUTSIDE_COLOR, mode: str = "RGB") -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, size, color if mode == "RGB" else 0).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_row(i: int, image) -> dict:
    return {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Color {i}?"}]}],
            "chosen": [{"role": "assistant", "content": f"Red {i}."}],
            "rejected": [{"role": "assistant", "content": f"Blue {i}."}], "images": [image]}


@pytest.fixture
def image_tree(tmp_path):
    """tmp/secret/ holds the files a hostile row reaches for; tmp/data/ the data and its images, with
    a file symlink and a directory symlink that lead out to secret/."""
    pytest.importorskip("PIL.Image", reason="image pairs need Pillow (the [vision] extra)")
    secret = tmp_path / "secret"
    (secret / "dir").mkdir(parents=True)
    (secret / "outside.png").write_bytes(_png((28, 28)))
    (secret / "dir" / "outside.png").write_bytes(_png((28, 28)))
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "ok.png").write_bytes(_png((28, 28), (200, 10, 10)))
    (data / "img" / "hostname").write_text("build-host-42\n")  # a text file inside the data
    (data / "img" / "huge.png").write_bytes(_png((12_000, 12_000), mode="1"))  # 144 megapixels, a few KB
    (data / "link.png").symlink_to(secret / "outside.png")
    (data / "linkdir").symlink_to(secret / "dir", target_is_directory=True)
    return tmp_path


def _hostile_image_cases(root: Path) -> dict[str, tuple[object, str]]:
    """name -> (the hostile row's image, what its quarantine reason must say)."""
    outside = "the path leads outside the input file's directory; not read"
    return {
        "absolute": (str(root / "secret" / "outside.png"), outside),
        "absolute_dict": ({"path": str(root / "secret" / "outside.png"), "bytes": None}, outside),  # save_to_disk / Hub form
        "dotdot": ("../secret/outside.png", outside),
        "dotdot_inside": ("img/../../secret/outside.png", outside),
        "etc_passwd": ("../../../../../../../../etc/passwd", outside),
        "etc_hostname": ("/etc/hostname", outside),
        "file_symlink": ("link.png", outside),
        "dir_symlink": ("linkdir/outside.png", outside),
        "text_inside": ("img/hostname", "cannot decode: not an image file (14 bytes of text)"),
        "huge": ("img/huge.png", "12000 x 12000 = 144,000,000 pixels, above max_image_pixels 89,478,485"),
    }


def _write_hostile_file(root: Path, image) -> Path:
    rows = [_image_row(1, "img/ok.png"), _image_row(2, image), _image_row(3, "img/ok.png")]
    path = root / "data" / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    pytest.importorskip("PIL.Image", reason="image pairs need Pillow (the [vision] extra)")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "LlavaProcessor") or not hasattr(transformers, "CLIPImageProcessorPil"):
        pytest.skip("this transformers has no LlavaProcessor / CLIPImageProcessorPil")
    from prefdata.tiny import build_tiny_llava_processor

    path = tmp_path_factory.mktemp("llava") / "processor"
    build_tiny_llava_processor(path)
    return str(path)


def _no_outside_bytes(out: Path, root: Path) -> None:
    secret = (root / "secret" / "outside.png").read_bytes()
    for arrow in out.glob("*.arrow"):
        blob = arrow.read_bytes()
        assert secret not in blob and b"root:" not in blob and b"build-host" not in blob


@pytest.mark.parametrize("case", sorted(_hostile_image_cases(Path("/x"))))
def test_prepare_quarantines_a_hostile_image_path_and_prepares_the_rest(case, image_tree, llava_dir):
    from datasets import load_from_disk

    from prefdata.prepare import prepare

    image, reason = _hostile_image_cases(image_tree)[case]
    raw = _write_hostile_file(image_tree, image)
    out = image_tree / "out"
    result = prepare(raw, out, processor=llava_dir, progress=False, workers=1)
    assert (result.rows_in, result.rows_out, result.rows_quarantined) == (3, 2, 1)
    [entry] = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    written = image if isinstance(image, str) else image["path"]
    assert entry["source_line"] == 2
    assert entry["error"].startswith(f"image 0 ({written}): {reason}")
    _one_line(entry["error"])
    assert "BytesIO" not in entry["error"]
    assert sorted(load_from_disk(str(out))["source_line"]) == [1, 3]
    _no_outside_bytes(out, image_tree)


@pytest.mark.parametrize("workers", [1, 2])
def test_validate_quarantines_every_hostile_image_path(workers, image_tree, tmp_path):
    """One file holding every hostile class (validate --policy pr, as on a pull request): each record
    is quarantined with its own reason naming its path; the good rows are checked."""
    cases = _hostile_image_cases(image_tree)
    rows = [_image_row(1, "img/ok.png")] + [_image_row(i + 2, image) for i, (image, _) in enumerate(cases.values())]
    raw = image_tree / "data" / "all.jsonl"
    raw.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = validate(raw, policy="pr", progress=False, workers=workers, batch_size=3, format="json",
                      output=tmp_path / f"report{workers}.json").report
    assert report["outcomes"]["quarantined"] == len(cases) and report["outcomes"]["kept"] == 1
    reasons = {row["source_line"]: entry["reason"] for entry in report["quarantine"]["reasons"] for row in entry["rows"]}
    for line, (image, reason) in enumerate(cases.values(), start=2):
        written = image if isinstance(image, str) else image["path"]
        assert reasons[line].startswith(f"image 0 ({written}): {reason}"), (line, reasons[line])


def test_an_allowed_image_root_lets_paths_reach_it(image_tree, llava_dir):
    """--allowed-image-root names a directory outside the data that rows may read from."""
    from datasets import load_from_disk

    from prefdata.prepare import prepare

    raw = _write_hostile_file(image_tree, "../secret/outside.png")
    out = image_tree / "out"
    result = prepare(raw, out, processor=llava_dir, progress=False, workers=1,
                     allowed_image_root=[str(image_tree / "secret")])
    assert (result.rows_out, result.rows_quarantined) == (3, 0)
    stored = load_from_disk(str(out)).data.column("images").to_pylist()
    assert (image_tree / "secret" / "outside.png").read_bytes() in [row[0]["bytes"] for row in stored]
    with pytest.raises(PrefdataError, match="--allowed-image-root .*: not a directory"):
        prepare(raw, image_tree / "out2", processor=llava_dir, progress=False, allowed_image_root=str(raw))


def test_max_image_pixels_is_a_policy_threshold(image_tree, tmp_path, llava_dir):
    from prefdata.prepare import prepare

    (image_tree / "data" / "img" / "wide.png").write_bytes(_png((40, 40)))
    raw = _write_hostile_file(image_tree, "img/wide.png")
    policy = tmp_path / "small.toml"
    policy.write_text("[thresholds]\nmax_image_pixels = 1000\n")
    result = prepare(raw, image_tree / "out", processor=llava_dir, progress=False, workers=1, policy=str(policy))
    assert (result.rows_out, result.rows_quarantined) == (2, 1)  # 28 x 28 = 784 passes, 40 x 40 = 1,600 does not
    [entry] = [json.loads(line) for line in (image_tree / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert "40 x 40 = 1,600 pixels, above max_image_pixels 1,000" in entry["error"]


def test_validate_reads_allowed_roots_from_its_flag_only(image_tree, tmp_path, monkeypatch):
    """A settings file in the checked repository (a pull request can change it) cannot widen validate's
    reach: only the flag does."""
    from prefdata.cli import main

    raw = _write_hostile_file(image_tree, "../secret/outside.png")
    monkeypatch.chdir(image_tree / "data")
    (image_tree / "data" / "pyproject.toml").write_text(f'[tool.prefdata]\nallowed_image_root = ["{image_tree / "secret"}"]\n')
    report = tmp_path / "r.json"
    # the file's key is refused in one line (exit 2) before anything is read; docs/settings.md
    assert main(["validate", str(raw), "--no-progress", "--workers", "1", "--format", "json", "--output", str(report)]) == 2
    assert not report.exists()
    assert main(["validate", str(raw), "--no-progress", "--workers", "1", "--format", "json", "--output", str(report),
                 "--allowed-image-root", str(image_tree / "secret")]) == 0
    assert json.loads(report.read_text())["outcomes"]["quarantined"] == 0


# --- a closed output pipe ends the command quietly (issues 30, 31) -------------------------------

def _with_closed_stdout(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run `python -m prefdata ARGS` with stdout a pipe whose reading end is already closed, as
    `prefdata ... | head -1` leaves it once head has its line: every write fails."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "prefdata", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
                              timeout=120)
    finally:
        os.close(write_end)
    return done.returncode, done.stderr


def test_show_and_validate_end_quietly_when_the_reader_goes_away(tmp_path, tiny_tokenizer_dir):
    from prefdata.prepare import prepare

    raw = tmp_path / "pairs.jsonl"
    raw.write_text("".join(json.dumps(_row(i)) + "\n" for i in range(20)))
    prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False, workers=1)
    for args in (["show", str(tmp_path / "out"), "--row", "3"],
                 ["validate", str(raw), "--format", "github", "--no-progress", "--workers", "1"]):
        code, stderr = _with_closed_stdout(args, tmp_path)
        assert code in (0, 141), (args, code, stderr)
        assert "BrokenPipe" not in stderr and "internal error" not in stderr and "Traceback" not in stderr, stderr


# --- one huge record costs memory in proportion (issue 30) ---------------------------------------

def _peak_mib(args: list[str]) -> float:
    """Peak RSS (MiB) of `python -m prefdata ARGS` and its workers, measured in a fresh wrapper
    process so that no earlier child of the test run counts."""
    import subprocess
    import sys

    wrapper = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True); "
               "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "prefdata", *args],
                         capture_output=True, text=True, env=env, timeout=300, check=True).stdout.split()
    assert out[0] in ("0", "1"), out
    return int(out[1]) / 1024  # ru_maxrss is in KiB on Linux


def _words(size: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocabulary = [f"w{rng.randrange(10**6)}" for _ in range(50_000)]
    text = " ".join(rng.choices(vocabulary, k=size // 7 + 1))
    return text[:size]


def _huge_inputs(directory: Path) -> dict[str, Path]:
    """Five ordinary rows ("small"), the same with a 10 MB reasoning trace among them ("reasoning"),
    and a benchmark file of one short item ("bench_small") or with a 50 MB item beside it ("bench")."""
    paths = {name: directory / f"{name}.jsonl" for name in ("small", "reasoning", "bench_small", "bench")}
    paths["small"].write_text("".join(json.dumps(_row(i)) + "\n" for i in range(5)))
    rows = [_row(i) for i in range(5)]
    rows.insert(2, {"prompt": [{"role": "user", "content": "think"}],
                    "chosen": [{"role": "assistant", "content": "yes", "reasoning_content": _words(10 * 2**20, 1)}],
                    "rejected": [{"role": "assistant", "content": "no"}]})
    paths["reasoning"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["bench_small"].write_text(json.dumps({"question": "what is the capital of france and why is it there"}) + "\n")
    paths["bench"].write_text(paths["bench_small"].read_text() + json.dumps({"question": _words(50 * 2**20, 2)}) + "\n")
    return paths


@pytest.mark.skipif(__import__("sys").platform != "linux", reason="ru_maxrss in KiB is Linux's unit")
def test_a_huge_record_costs_memory_in_proportion(tmp_path):
    """A 10 MB reasoning trace and a 50 MB benchmark line each raise validate's peak memory by at
    most 20x their size above the same run without them (measured 8x and 10x; 36x and 18x before
    the word hashes and n-gram runs of huge texts were computed a piece at a time)."""
    inputs = _huge_inputs(tmp_path)
    common = ["--no-progress", "--workers", "1", "--format", "json", "--output", str(tmp_path / "r.json")]

    base = _peak_mib(["validate", str(inputs["small"]), *common])
    assert _peak_mib(["validate", str(inputs["reasoning"]), *common]) - base < 20 * 10
    base = _peak_mib(["validate", str(inputs["small"]), "--decontaminate-against", str(inputs["bench_small"]), *common])
    # 10x measured after the fix (18x before): 14x leaves room for allocator noise and still fails the old way
    assert _peak_mib(["validate", str(inputs["small"]), "--decontaminate-against", str(inputs["bench"]), *common]) - base < 14 * 50


@pytest.mark.slow
@pytest.mark.skipif(__import__("sys").platform != "linux", reason="ru_maxrss in KiB is Linux's unit")
def test_prepare_keeps_a_huge_record_in_proportion(tmp_path, tiny_tokenizer_dir):
    """The same through prepare, tokenizing: the 10 MB trace rendered into the completion by a
    template that keeps reasoning (9.1 M tokens with the tiny tokenizer), and the 50 MB benchmark
    line. Measured 17x and 5x above the run without them; the trace cost 216x (2.5 GB) while the
    Rust tokenizer took the whole text in one call, now it takes 64 Ki characters at a time."""
    inputs = _huge_inputs(tmp_path)

    def peak(raw: Path, *extra: str) -> float:
        return _peak_mib(["prepare", str(raw), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir,
                          "--overwrite", "--no-progress", "--workers", "1", *extra])

    template = ("--chat-template-file", "deepseek-r1-keep-reasoning")
    base = peak(inputs["small"], *template)
    assert peak(inputs["reasoning"], *template) - base < 20 * 10
    lengths = pc.list_value_length(datasets.load_from_disk(str(tmp_path / "out")).data.column("chosen_ids"))
    assert max(lengths.to_pylist()) > 9_000_000  # the whole trace reached the tokens
    base = peak(inputs["small"], "--decontaminate-against", str(inputs["bench_small"]))
    assert peak(inputs["small"], "--decontaminate-against", str(inputs["bench"])) - base < 20 * 50


# --- scores beyond a float, and one record of very many completions (issue 30) -------------------
# A 400-digit score or rank (or "1e400") is no score, as NaN and Infinity are: that completion takes
# no part and the rest of its record still pairs. Finite scores of +-1e308 pair, and their margin,
# which overflows to inf, is counted apart from the report's margin distribution.

HUGE = 10**400


def _huge_score_rows() -> list[dict]:
    return [
        {"prompt": "p1", "completions": ["a1", "b1", "c1"], "scores": [1, HUGE, 0]},  # pairs a1 over c1
        {"prompt": "p2", "completions": ["a2", "b2"], "ranks": [1, HUGE]},  # one ranked completion: no pair
        {"prompt": "p3", "completions": ["a3", "b3", "c3"], "scores": ["1e400", 2, 1]},  # b3 over c3
        {"prompt": "p4", "completions": ["a4", "b4"], "scores": [1e308, -1e308]},  # margin inf
        {"prompt": "p5", "completions": ["a5", "b5"], "ranks": [-1e308, 1e308]},  # rank margin inf
        {"prompt": "p6", "chosen": "a6", "rejected": "b6", "reward_chosen": HUGE, "reward_rejected": 1},
        {"prompt": "p7", "completions": ["a7", "b7"], "scores": [2, 1]},
        _row(8),
    ]


def _check_huge_score_report(report: dict) -> None:
    acc = report["accounting"]
    assert (acc["records_in"], acc["records_paired"], acc["records_unpaired"], acc["records_quarantined"]) == (8, 7, 1, 0)
    assert (acc["pairs_made"], acc["pairs_kept"], acc["pairs_dropped"]) == (7, 7, 0)
    scored = report["scored"]
    assert [(u["reason"], [r["source_line"] for r in u["rows"]]) for u in scored["unpaired"]] == [("single_completion", [2])]
    margins = scored["margins"]
    assert (margins["score"]["count"], margins["score"]["non_finite"], margins["score"]["max"]) == (3, 1, 1.0)
    assert margins["rank"] == {"count": 0, "non_finite": 1}
    assert not report["flags"].get("reward_disagrees")  # a reward no float holds is no reward


def test_scores_beyond_a_float_cost_their_completion_only(tmp_path, tiny_tokenizer_dir):
    from datasets import load_from_disk

    from prefdata.cli import main
    from prefdata.prepare import prepare

    raw = tmp_path / "huge_scores.jsonl"
    raw.write_text("".join(json.dumps(row) + "\n" for row in _huge_score_rows()))
    out = tmp_path / "out"
    result = prepare(raw, out, tokenizer=tiny_tokenizer_dir, progress=False, workers=1)
    assert result.exit_code == 0 and (result.rows_in, result.rows_out, result.rows_dropped, result.rows_quarantined) == (8, 7, 1, 0)
    _check_huge_score_report(json.loads((out / "report.json").read_text()))
    rows = load_from_disk(str(out)).to_list()
    pairs = {row["source_line"]: (row["chosen"], row["rejected"]) for row in rows}
    assert pairs == {1: ("a1", "c1"), 3: ("b3", "c3"), 4: ("a4", "b4"), 5: ("a5", "b5"), 6: ("a6", "b6"),
                     7: ("a7", "b7"), 8: ("Good answer 8.", "Bad answer 8.")}
    assert [row["rank_chosen"] for row in rows if row["source_line"] == 5] == [-1e308]  # a float, not 309 digits
    [unpaired] = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert (unpaired["source_line"], unpaired["unpaired"], unpaired["ranks"]) == (2, "single_completion", [1, None])
    assert "margin beyond a float" in (out / "report.md").read_text()
    assert "margin beyond a float" in (out / "report.html").read_text()
    # validate, in one worker and in two over small chunks: the same fates; the CLI exits 0.
    for workers in (1, 2):
        checked = validate(raw, progress=False, workers=workers, batch_size=3, format="json",
                           output=tmp_path / f"report{workers}.json")
        assert checked.exit_code == 0
        _check_huge_score_report(checked.report)
    assert main(["validate", str(raw), "--no-progress", "--workers", "1", "--format", "json",
                 "--output", str(tmp_path / "cli.json")]) == 0


def test_margins_near_the_float_limit_fit_the_report(tmp_path, tiny_tokenizer_dir):
    """Finite margins of 1.7e308 and 1.79e308: a round bin width would put the histogram's last edge
    past any float (the HTML plot then raised OverflowError); the edges stay finite, the numbers short."""
    import math

    from prefdata.prepare import prepare

    raw = tmp_path / "near_limit.jsonl"
    rows = [{"prompt": "p1", "completions": ["a", "b"], "scores": [1.7e308, 0]},
            {"prompt": "p2", "completions": ["a", "b"], "scores": [1.79e308, 1e308]},
            {"prompt": "p3", "completions": ["a", "b"], "ranks": [1, 1.79e308]}]
    raw.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False, workers=1)
    assert result.exit_code == 0 and result.rows_out == 3
    for scale, top in (("score", 1.7e308), ("rank", 1.79e308)):
        margins = result.report["scored"]["margins"][scale]
        assert margins["max"] == top and "non_finite" not in margins
        edges = margins["histogram"]["edges"]
        assert all(math.isfinite(edge) for edge in edges) and edges[-1] >= top
    assert "max 1.79e+308" in (tmp_path / "out" / "report.md").read_text()
    assert "1.79e+308" in (tmp_path / "out" / "report.html").read_text()


def _wide_record_file(path: Path) -> Path:
    """Line 1: one prompt with 10,000 completions scored 1 to 10 (all-pairs: about 45 million valid
    pairs, `_valid_pairs`); line 2: an ordinary record of three; line 3: two tied completions."""
    import random

    rng = random.Random(30)
    rows = [{"prompt": "Rate these.", "completions": [f"answer {i}" for i in range(10_000)],
             "scores": [rng.randint(1, 10) for _ in range(10_000)]},
            {"prompt": "p2", "completions": ["good", "bad", "ok"], "scores": [3, 1, 2]},
            {"prompt": "p3", "completions": ["x", "y"], "scores": [1, 1]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _valid_pairs(path: Path) -> int:
    """all-pairs' count for line 1: every pair of completions with different scores."""
    from collections import Counter

    counts = Counter(json.loads(path.read_text().splitlines()[0])["scores"])
    return sum(counts[a] * counts[b] for a in counts for b in counts if a > b)


def test_a_record_of_ten_thousand_completions_is_capped(tmp_path, tiny_tokenizer_dir):
    """all-pairs on 10,000 completions made 50 million pairs (still running after 400 s); the default
    policy caps the record at max_pairs_per_record = 1000 pairs, counted in the report."""
    from datasets import load_from_disk

    from prefdata.prepare import prepare

    raw = _wide_record_file(tmp_path / "wide.jsonl")
    started = time.perf_counter()
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False, workers=1, pairing="all-pairs")
    assert time.perf_counter() - started < 60
    assert result.exit_code == 0 and (result.rows_in, result.rows_out, result.rows_dropped) == (1004, 1003, 1)
    acc = result.report["accounting"]
    assert (acc["records_in"], acc["records_paired"], acc["records_unpaired"], acc["pairs_made"]) == (3, 2, 1, 1003)
    capped, possible = result.report["scored"]["capped"], _valid_pairs(raw)
    assert possible > 44_000_000
    assert (capped["records"], capped["pairs_not_made"]) == (1, possible - 1000)
    assert [(r["source_line"], r["pairs"], r["possible"]) for r in capped["rows"]] == [(1, 1000, possible)]
    scores = json.loads(raw.read_text().splitlines()[0])["scores"]
    made = [(row["chosen_sample"], row["rejected_sample"]) for row in load_from_disk(str(tmp_path / "out")) if row["source_line"] == 1]
    assert len(made) == len(set(made)) == 1000 and all(scores[c] > scores[r] for c, r in made)
    assert len({c for c, _ in made}) > 100  # a sample across the record, not one completion against many
    assert "max_pairs_per_record" in (tmp_path / "out" / "report.md").read_text()
    [ties] = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert (ties["source_line"], ties["unpaired"]) == (3, "ties")

    report = validate(raw, progress=False, workers=2, pairing="all-pairs", format="json",
                      output=tmp_path / "report.json").report
    assert report["outcomes"] == {"kept": 1003, "dropped": 0, "quarantined": 0, "unpaired": 1}
    assert report["scored"]["capped"]["records"] == 1


def test_a_record_above_the_cap_is_set_aside_when_the_policy_says_so(tmp_path, tiny_tokenizer_dir):
    from prefdata.cli import main
    from prefdata.prepare import prepare

    raw = _wide_record_file(tmp_path / "wide.jsonl")
    policy = tmp_path / "aside.toml"
    policy.write_text('[thresholds]\nmax_pairs_per_record = 500\nabove_max_pairs = "set_aside"\n')
    result = prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False, workers=1,
                     pairing="all-pairs", policy=str(policy))
    assert result.exit_code == 0 and (result.rows_in, result.rows_out, result.rows_dropped) == (5, 3, 2)
    acc = result.report["accounting"]
    assert (acc["records_in"], acc["records_paired"], acc["records_unpaired"], acc["pairs_made"]) == (3, 1, 2, 3)
    dropped = {entry["source_line"]: entry for entry in map(json.loads, (tmp_path / "out" / "dropped.jsonl").read_text().splitlines())}
    assert dropped[1]["unpaired"] == "too_many_pairs" and len(dropped[1]["completions"]) == 10_000
    assert dropped[1]["detail"] == (f"all-pairs would make {_valid_pairs(raw):,} pairs from 10,000 scored completions, above "
                                    'max_pairs_per_record 500 (policy [thresholds]; above_max_pairs = "set_aside")')
    _one_line(dropped[1]["detail"])
    reasons = {u["reason"]: [r["source_line"] for r in u["rows"]] for u in result.report["scored"]["unpaired"]}
    assert reasons == {"too_many_pairs": [1], "ties": [3]}
    assert "too_many_pairs" in (tmp_path / "out" / "report.md").read_text()
    # best-worst makes one pair of the same record, whatever the cap; top-k above the cap is set aside too.
    assert prepare(raw, tmp_path / "bw", tokenizer=tiny_tokenizer_dir, progress=False, workers=1,
                   policy=str(policy)).rows_out == 2
    report = validate(raw, progress=False, workers=1, pairing="top-k", top_k=600, policy=str(policy), format="json",
                      output=tmp_path / "topk.json").report
    assert {u["reason"] for u in report["scored"]["unpaired"]} == {"too_many_pairs", "ties"}
    started = time.perf_counter()
    assert main(["validate", str(raw), "--no-progress", "--pairing", "all-pairs", "--policy", str(policy),
                 "--format", "json", "--output", str(tmp_path / "cli.json")]) == 0
    assert time.perf_counter() - started < 30


# --- hostile tool schemas end to end (issue 30) --------------------------------------------------
# A $ref loop ended the run with RecursionError (exit 2, no OUT); a backtracking pattern spun a worker
# forever, past Ctrl-C. Each now costs its row only: flagged tool_call_invalid (error severity: prepare
# moves the row to dropped.jsonl and exits 1), the rest prepared, nothing fetched or read from a $ref.

BACKTRACKS = "^(a+)+$"  # Python's re takes ~2^41 steps on 40 'a' and a '!'
HOSTILE_SCHEMAS = {  # source line -> the function's parameters (every call passes {"a": ...})
    1: {"$ref": "#"},
    2: {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    3: {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
    4: {"type": "object", "properties": {"a": {"type": "string", "pattern": BACKTRACKS}}},
    5: {"$ref": "file:///etc/passwd"},
}


def _tool_row(line: int, parameters: dict, argument: str) -> dict:
    tools = [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": parameters}}]
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"a": argument}}}
    return {"prompt": [{"role": "user", "content": f"Look up item {line}."}],  # distinct: no duplicate_pair
            "chosen": [{"role": "assistant", "content": None, "tool_calls": [call]}],
            "rejected": [{"role": "assistant", "content": "I cannot."}], "tools": tools}


def _hostile_tools_file(path: Path) -> Path:
    """Lines 1-5: the hostile schemas; line 6: the backtracking pattern with an argument it matches
    (a valid call); line 7: an ordinary string row."""
    rows = [_tool_row(line, HOSTILE_SCHEMAS[line], "a" * 40 + "!") for line in sorted(HOSTILE_SCHEMAS)]
    rows += [_tool_row(6, HOSTILE_SCHEMAS[4], "aaaa"), _row(7)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run_cli(args: list[str], cwd: Path) -> tuple[int, str, float]:
    """`python -m prefdata ARGS` in a subprocess: a hang fails the test at the timeout instead of
    stalling the suite (an in-process regex cannot be interrupted)."""
    import os
    import subprocess
    import sys

    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "prefdata", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}, timeout=120)
    return done.returncode, done.stderr, time.perf_counter() - started


@pytest.fixture(scope="module")
def tools_tokenizer(tmp_path_factory) -> str:
    """The tiny tokenizer with a template that renders tools and calls (no reasoning_lost here)."""
    from prefdata.tiny import REASONING_TEMPLATE, build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tools-tokenizer")
    build_tiny_tokenizer(path, chat_template=REASONING_TEMPLATE)
    return str(path)


# Startup (imports) takes a few seconds of these on a loaded machine; the checks themselves well under one.
TOOLS_BUDGET_S = 30


def test_hostile_tool_schemas_cost_their_row_in_prepare(tmp_path, tools_tokenizer):
    raw = _hostile_tools_file(tmp_path / "tools.jsonl")
    out = tmp_path / "out"
    code, stderr, seconds = _run_cli(["prepare", str(raw), str(out), "--tokenizer", tools_tokenizer,
                                      "--workers", "2", "--no-progress"], tmp_path)
    assert code == 1, stderr  # tool_call_invalid is an error: the rows are dropped and the run fails
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert seconds < TOOLS_BUDGET_S
    accounting = json.loads((out / "manifest.json").read_text())["row_accounting"]
    assert (accounting["rows_in"], accounting["rows_out"], accounting["rows_dropped"], accounting["rows_quarantined"]) == (7, 2, 5, 0)
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert [(entry["source_line"], entry["flags"]) for entry in dropped] == [(line, ["tool_call_invalid"]) for line in range(1, 6)]
    kept = datasets.load_from_disk(str(out))
    assert sorted(zip(kept["source_line"], kept["flags"])) == [(6, []), (7, [])]
    for path in out.iterdir():  # the file:// $ref was never read, so nothing of it reached OUT
        assert path.is_dir() or "root:x:0:0" not in path.read_text(errors="replace")


def test_hostile_tool_schemas_cost_their_row_in_validate_pr(tmp_path):
    raw = _hostile_tools_file(tmp_path / "tools.jsonl")
    report_path = tmp_path / "report.json"
    code, stderr, seconds = _run_cli(["validate", str(raw), "--policy", "pr", "--workers", "2", "--no-progress",
                                      "--format", "json", "--output", str(report_path)], tmp_path)
    assert code == 1, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert seconds < TOOLS_BUDGET_S
    report = json.loads(report_path.read_text())
    assert report["outcomes"] == {"kept": 2, "dropped": 5, "quarantined": 0}  # what prepare would do
    assert set(report["flags"]) == {"tool_call_invalid"}  # lines 6 and 7 carry no flag
    flagged = report["flags"]["tool_call_invalid"]
    assert flagged["count"] == 5 and flagged["severity"] == "error"
    assert sorted(example["source_line"] for example in flagged["examples"]) == [1, 2, 3, 4, 5]
    assert "root:x:0:0" not in report_path.read_text()
