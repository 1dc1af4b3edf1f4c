"""Tool-call arguments against a tool's parameter schema, in bounded time, whatever the schema.

Tool schemas come from the data (a stranger's pull request, for `validate --policy pr`), so checking
a call against one must neither hang a worker nor end the run (issue 30). `jsonschema` does the
checking, with these keywords replaced:

- `pattern`, `patternProperties` and the `additionalProperties` that depends on them match with RE2
  (google-re2: linear in the text, no backtracking), never with Python's `re`. A pattern RE2 cannot
  compile (lookaround, backreference, over RE2's memory limit) cannot be checked: it counts as
  matched, so it never accuses a call. `unevaluatedProperties` beside any `patternProperties` is
  not checked either (jsonschema would match those patterns with `re`).
- `uniqueItems` compares items by hashing (jsonschema compares every pair of objects: quadratic).
- Every keyword step is counted: a schema that takes more than WORK_BUDGET steps for one pair
  (an exponential nest of `anyOf` or `$ref`), recurses without end (a `$ref` loop) or names a
  `$ref` that does not resolve (nothing is fetched: references resolve inside the schema only)
  is `UNUSABLE`.
- `format` is not asserted (JSON Schema's default); the schema itself is checked against its
  meta-schema without format checks (which would compile its patterns with `re`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

# Keyword steps (plus the size of list/object keyword values) per pair: a call with a 10-property
# schema takes ~50, 1,000 array items of 5 properties ~12,000; 20,000 steps of `$ref`/`anyOf`
# nesting take ~1 s here.
WORK_BUDGET = 20_000
_MAX_CACHED = 256


class Verdict(Enum):
    VALID = "valid"
    INVALID = "invalid"
    UNUSABLE = "unusable"  # the schema cannot be evaluated (loop, unresolvable $ref, over budget)


class _OverBudget(Exception):
    pass


_work = threading.local()  # steps left for the pair being checked (threads never share a count)
_VALIDATORS: dict[str, Any] = {}  # schema (JSON text) -> validator, or None for a broken schema
# (schema, arguments) -> (verdict, steps it took), or (None, N): it takes more than N steps.
# A record's pairs repeat its prompt's calls: each is evaluated once per process.
_VERDICTS: dict[tuple[str, str], tuple[Verdict | None, int]] = {}
_PATTERNS: dict[str, Any] = {}  # pattern -> compiled RE2 pattern, or None when RE2 cannot compile it
_CLASSES: dict[tuple[type, bool], type] = {}


def start_budget() -> None:
    """Give the pair about to be checked its WORK_BUDGET (its calls share it)."""
    _work.left = WORK_BUDGET


def check_arguments(schema: dict[str, Any], arguments: Any) -> Verdict:
    """Whether `arguments` satisfy `schema`, within what is left of the pair's budget (see
    `start_budget`). A schema that breaks its meta-schema is the tool author's problem, not the
    call's: VALID. The verdict depends only on the schema, the arguments and the budget left, never
    on what this process checked before (a record's pairs, in any worker, get the same flags)."""
    try:
        key = (json.dumps(schema, sort_keys=True, default=str), json.dumps(arguments, sort_keys=True, default=str))
    except (ValueError, RecursionError):  # nested deeper than json goes: deeper than any evaluation
        return Verdict.UNUSABLE
    left = getattr(_work, "left", WORK_BUDGET)
    verdict, cost = _VERDICTS.get(key, (None, -1))
    if verdict is not None and cost <= left:  # known, and affordable: charged as if checked again
        _work.left = left - cost
        return verdict
    if verdict is not None or left <= cost:  # known to cost more than is left
        _work.left = 0
        return Verdict.UNUSABLE
    verdict = _evaluate(key[0], schema, arguments)
    if len(_VERDICTS) >= 4 * _MAX_CACHED:
        _VERDICTS.clear()
    # Over budget: remember only that it costs more than `left` steps.
    _VERDICTS[key] = (None, left) if verdict is None else (verdict, left - _work.left)
    return verdict or Verdict.UNUSABLE


def _evaluate(key: str, schema: dict[str, Any], arguments: Any) -> Verdict | None:
    """The verdict, or None when the budget ran out first."""
    try:
        validator = _validator(key, schema)
        if validator is None or validator.is_valid(arguments):
            return Verdict.VALID
        return Verdict.INVALID
    except _OverBudget:
        _work.left = 0
        return None
    except RecursionError:
        return Verdict.UNUSABLE
    except Exception:  # noqa: BLE001 - an unresolvable $ref, or any other failure of a stranger's schema
        return Verdict.UNUSABLE


def _validator(key: str, schema: dict[str, Any]) -> Any:
    import jsonschema
    from jsonschema_specifications import REGISTRY

    if key in _VALIDATORS:
        return _VALIDATORS[key]
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        base.check_schema(schema, format_checker=None)
        # jsonschema's default registry fetches a `$ref` it cannot resolve (https://, file://): this
        # one holds the meta-schemas only, so nothing outside the schema is ever read.
        validator: Any = _bounded_class(base, _has_key(schema, "patternProperties"))(schema, registry=REGISTRY)
    except jsonschema.SchemaError:
        validator = None
    if len(_VALIDATORS) >= _MAX_CACHED:
        _VALIDATORS.clear()
    _VALIDATORS[key] = validator
    return validator


def _bounded_class(base: type, skip_unevaluated: bool) -> type:
    """`base` with the keywords of the module doc replaced and every keyword step counted."""
    cls = _CLASSES.get((base, skip_unevaluated))
    if cls is None:
        import jsonschema

        keywords: dict[str, Callable[..., Any]] = dict(base.VALIDATORS)  # type: ignore[attr-defined]
        for name, replacement in _REPLACEMENTS.items():
            if name in keywords:
                keywords[name] = replacement
        if skip_unevaluated and "unevaluatedProperties" in keywords:
            keywords["unevaluatedProperties"] = _not_checked
        cls = jsonschema.validators.extend(base, {name: _counted(fn) for name, fn in keywords.items()})
        _CLASSES[(base, skip_unevaluated)] = cls
    return cls


def _counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _work.left = getattr(_work, "left", WORK_BUDGET) - 1 - (len(value) if isinstance(value, (list, dict)) else 0)
        if _work.left < 0:
            raise _OverBudget
        return keyword(validator, value, instance, schema)

    return run


def search(pattern: str, text: str) -> bool | None:
    """Whether RE2 finds `pattern` in `text`; None when RE2 cannot compile the pattern (or is
    not installed): the pattern cannot be checked."""
    if pattern not in _PATTERNS:
        if len(_PATTERNS) >= _MAX_CACHED:
            _PATTERNS.clear()
        _PATTERNS[pattern] = _compile(pattern)
    compiled = _PATTERNS[pattern]
    return None if compiled is None else compiled.search(text) is not None


def _compile(pattern: str) -> Any:
    try:
        import re2
    except ImportError:
        return None
    options = re2.Options()
    options.log_errors = False  # a stranger's bad pattern is not our stderr's business
    options.never_capture = True
    try:
        return re2.compile(pattern, options)
    except Exception:  # noqa: BLE001 - re2.error, or a pattern text RE2's wrapper refuses
        return None


def _error(message: str) -> Any:
    from jsonschema import ValidationError

    return ValidationError(message)


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and isinstance(pattern, str) and search(pattern, instance) is False:
        yield _error(f"{instance[:60]!r} does not match {pattern[:60]!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):  # None (cannot check): the subschema is not applied
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    # A key an unchecked pattern might match is not called additional: no false accusation.
    extras = [key for key in instance if key not in named and all(search(p, key) is False for p in patterns)]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        yield _error(f"additional properties are not allowed: {', '.join(repr(k)[:40] for k in extras[:5])}")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if unique and validator.is_type(instance, "array") and len({_canonical(v) for v in instance}) < len(instance):
        yield _error("array items are not unique")


def _canonical(value: Any) -> Any:
    """A hashable form equal exactly when JSON Schema calls two values equal (1 == 1.0, true != 1)."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("o", repr(value))


def _not_checked(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    return iter(())


def _has_key(value: Any, key: str) -> bool:
    """Whether `key` appears anywhere in a JSON value (iterative: any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if key in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


_REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}
