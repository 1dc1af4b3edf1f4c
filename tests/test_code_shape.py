"""The package stays in small pieces: no function under prefdata/ takes more than 12 parameters or runs
over 100 lines, no module over 500 lines. Commands take their declared settings objects
(prefdata.settings.declare.settings_command) instead of walls of keywords. The few exceptions are
listed here, each with its reason; an entry that no longer needs its exception fails too, so the
list only shrinks."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "prefdata"
MAX_PARAMETERS = 12  # self and cls count, as do *args and **kwargs
MAX_FUNCTION_LINES = 100  # from `def` to the last line, docstring included, decorators not
MAX_MODULE_LINES = 500

# "path:qualified name" -> why it may take more parameters
MANY_PARAMETERS = {
    "prefdata/trl/trainer.py:DPOTrainer.__init__": "TRL's DPOTrainer constructor, parameter for "
    "parameter, so that it drops in where TRL's is used",
}
# "path:qualified name" -> why it may run longer
LONG_FUNCTIONS: dict[str, str] = {}
# "path" -> why it may be longer
LONG_MODULES: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function, methods and nested functions included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    return (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
            + (args.vararg is not None) + (args.kwarg is not None))


@functools.cache  # one parse of the package for every test here
def _shape() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(parameters of each function over the limit, lines of each function over it, lines of each module over it)."""
    params, lines, modules = {}, {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            modules[relative] = len(text.splitlines())
        for name, node in _functions(ast.parse(text)):
            where = f"{relative}:{name}"
            if _parameters(node) > MAX_PARAMETERS:
                params[where] = _parameters(node)
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                lines[where] = node.end_lineno - node.lineno + 1
    return params, lines, modules


def test_no_function_takes_more_than_12_parameters():
    params, _, _ = _shape()
    over = {where: n for where, n in params.items() if where not in MANY_PARAMETERS}
    assert not over, f"more than {MAX_PARAMETERS} parameters (pass a settings object or a small dataclass): {over}"


def test_no_function_runs_over_100_lines():
    _, lines, _ = _shape()
    over = {where: n for where, n in lines.items() if where not in LONG_FUNCTIONS}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split them): {over}"


def test_no_module_runs_over_500_lines():
    _, _, modules = _shape()
    over = {where: n for where, n in modules.items() if where not in LONG_MODULES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them): {over}"


def test_every_exception_is_still_needed():
    params, lines, modules = _shape()
    stale = [*(set(MANY_PARAMETERS) - set(params)), *(set(LONG_FUNCTIONS) - set(lines)),
             *(set(LONG_MODULES) - set(modules))]
    assert not stale, f"within the limits now: remove them from the lists in tests/test_code_shape.py: {stale}"


def test_the_shape_check_sees_what_it_counts():
    """The counting itself: parameters of every kind, lines from `def` on, nested functions by name."""
    tree = ast.parse("class C:\n    def m(self, a, /, b, *args, c, **kw):\n        def inner(x):\n"
                     "            return x\n        return inner\n")
    found = {name: (_parameters(node), node.end_lineno - node.lineno + 1) for name, node in _functions(tree)}
    assert found == {"C.m": (6, 4), "C.m.inner": (1, 2)}
