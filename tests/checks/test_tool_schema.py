"""Tool schemas from strangers' data are checked in bounded time (issue 30): prefdata.checks.tool_schema."""

from __future__ import annotations

import time

import pytest

from prefdata.checks.tool_schema import WORK_BUDGET, Verdict, check_arguments, search, start_budget

pytest.importorskip("re2", reason="google-re2 runs tool schemas' patterns")

BACKTRACKS = "^(a+)+$"  # Python's re takes ~2^n steps on n 'a's and a '!'
LOOPS = {
    "self": {"$ref": "#"},
    "pair": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "property": {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
}


def _check(schema, arguments) -> tuple[Verdict, float]:
    start_budget()
    started = time.perf_counter()
    verdict = check_arguments(schema, arguments)
    return verdict, time.perf_counter() - started


@pytest.mark.parametrize("shape", sorted(LOOPS))
def test_a_ref_loop_makes_the_schema_unusable(shape):
    verdict, seconds = _check(LOOPS[shape], {"a": 1})
    assert verdict is Verdict.UNUSABLE and seconds < 5


@pytest.mark.parametrize("ref", ["https://example.com/schema.json", "file:///etc/passwd", "#/$defs/missing"])
def test_a_ref_that_does_not_resolve_inside_the_schema_is_unusable_and_never_fetched(ref, monkeypatch):
    import urllib.request

    opened = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda *args, **kwargs: opened.append(args))
    assert _check({"$ref": ref}, {"a": 1})[0] is Verdict.UNUSABLE
    assert not opened  # jsonschema's default registry would fetch it (file:// included)


def test_a_backtracking_pattern_runs_in_linear_time():
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": BACKTRACKS}}}
    verdict, seconds = _check(schema, {"a": "a" * 40 + "!"})
    assert verdict is Verdict.INVALID and seconds < 1
    assert _check(schema, {"a": "a" * 40})[0] is Verdict.VALID
    schema = {"type": "object", "patternProperties": {BACKTRACKS: {"type": "integer"}}, "additionalProperties": False}
    verdict, seconds = _check(schema, {"a" * 40 + "!": 1})
    assert verdict is Verdict.INVALID and seconds < 1  # not matched, so additional
    assert _check(schema, {"aaa": 1})[0] is Verdict.VALID
    assert _check(schema, {"aaa": "x"})[0] is Verdict.INVALID
    schema = {"type": "object", "propertyNames": {"pattern": BACKTRACKS}}
    assert _check(schema, {"a" * 40 + "!": 1})[0] is Verdict.INVALID


def test_a_pattern_re2_cannot_compile_counts_as_matched():
    assert search("^(?=a)b", "zz") is None and search(r"(a)\1", "aa") is None
    assert _check({"properties": {"a": {"pattern": "^(?=x)y"}}}, {"a": "zz"})[0] is Verdict.VALID
    schema = {"patternProperties": {r"^(?!x)": {"type": "integer"}}, "additionalProperties": False}
    assert _check(schema, {"key": "text"})[0] is Verdict.VALID  # neither applied nor called additional


def test_an_exponential_schema_runs_out_of_budget():
    defs = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]} for i in range(40)}
    defs["a40"] = {"type": "string"}
    verdict, seconds = _check({"$defs": defs, "$ref": "#/$defs/a0"}, 5)  # 2^40 branches
    assert verdict is Verdict.UNUSABLE and seconds < 10


def test_unique_items_is_not_quadratic_and_keeps_json_equality():
    verdict, seconds = _check({"uniqueItems": True}, [{"i": i} for i in range(20_000)])
    assert verdict is Verdict.VALID and seconds < 5
    assert _check({"uniqueItems": True}, [{"i": 1}, {"i": 1.0}])[0] is Verdict.INVALID
    assert _check({"uniqueItems": True}, [1, True, [0], [False]])[0] is Verdict.VALID


def test_ordinary_schemas_keep_their_meaning():
    schema = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}, "required": ["city"],
              "additionalProperties": False}
    assert _check(schema, {"city": "Paris"})[0] is Verdict.VALID
    assert _check(schema, {"city": "paris"})[0] is Verdict.INVALID
    assert _check(schema, {"town": "Paris"})[0] is Verdict.INVALID
    assert _check({"type": 5}, {})[0] is Verdict.VALID  # a schema that breaks its meta-schema accuses no call
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    assert _check(tree, {"kids": [{"kids": []}, {"kids": [{"kids": []}]}]})[0] is Verdict.VALID  # recursion that ends


def test_the_verdict_does_not_depend_on_what_the_process_checked_before():
    """A pair's calls share one budget; a call this process checked before is charged again, so a
    pair gets the same verdicts in any worker, whatever that worker checked earlier."""
    defs = {f"a{i}": {"anyOf": [{"type": "string"}, {"$ref": f"#/$defs/a{i + 1}"}]} for i in range(6)}
    defs["a6"] = {"type": "integer"}
    costly = {"$defs": defs, "$ref": "#/$defs/a0"}
    start_budget()
    verdicts = [check_arguments(costly, 1) for _ in range(WORK_BUDGET)]
    valid = verdicts.index(Verdict.UNUSABLE)
    assert 1 < valid < WORK_BUDGET and set(verdicts[valid:]) == {Verdict.UNUSABLE}
    start_budget()
    assert [check_arguments(costly, 1) for _ in range(valid + 1)] == verdicts[: valid + 1]
