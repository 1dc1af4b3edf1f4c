"""The hostile-input corpus (issue 6): every input gets exactly the behaviour EXPECTATIONS.toml states.

Two levels: reading + normalizing (counts of pairs, quarantined records and unknown shapes, or a
PrefdataError), and a full `prepare` run with the tiny tokenizer (row accounting holds, quarantine
entries are one line each, exit-2 inputs raise PrefdataError). No other exception type, ever.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefdata.errors import PrefdataError, RecordError, UnknownShapeError
from prefdata.io.formats import normalize_record
from prefdata.io.json_decode import MAX_RAW_TEXT
from prefdata.io.readers import iter_raw_records

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

HOSTILE = Path(__file__).parent / "hostile"
EXPECTATIONS: dict[str, dict] = tomllib.loads((HOSTILE / "EXPECTATIONS.toml").read_text())
BIG = 5 * 1024 * 1024
# Tokenizing one valid 5 MB string takes ~10 s here (tokenizer-bound): reader level only.
NOT_PREPARED = {"big_record.jsonl", "big_record_array.json"}


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
