"""The package's layout holds: each part imports only what stands below it (docs/architecture.md's
layers), no module imports itself back through others (lazy and type-only imports count), and the
package's top level holds the CLI and its entry points only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "prefdata"

# Bottom first, as docs/architecture.md draws them. A part may import parts of lower rows only;
# parts on one row do not import each other.
LAYERS = [
    {"core", "templates"},  # what every layer shares; bundled templates (data)
    {"io", "engine"},  # read and write; the engine that runs stages (it imports none of them)
    {"sets"},  # set building: mixtures, sampling, pairing scored completions, decontamination, balance
    {"tokenize"},
    {"checks", "settings"},  # the checks (and the checked-row stream); the commands' declared settings
    {"report", "model", "trainers"},  # findings laid out; model-side log-probs and losses; other trainers' preprocessing
    {"pipeline"},  # the two passes prepare writes through and validate checks raw input through
    {"prepare", "validate", "show", "refs", "select", "train", "trl"},  # the commands, and the TRL hand-off
    {"online"},  # generate -> score -> prepare -> refs -> train
    {"cli", "tiny"},  # the command line; tiny models and the demos on top of everything
    {"__main__"},
]
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "cli.py", "show.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every prefdata module `path` imports: at the top, inside a function, or for type checking."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("prefdata."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("prefdata."):
                found.add(node.module)
            if node.module.startswith("prefdata"):  # `from prefdata.core import flags` imports prefdata.core.flags
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_each_part_imports_only_what_stands_below_it():
    row = {part: index for index, parts in enumerate(LAYERS) for part in parts}
    upward = []
    for module, imported in sorted(_graph().items()):
        source = _part(module)
        for target in sorted({_part(m) for m in imported} - {source, ""}):
            assert source in row and target in row, f"{module}: add its part to LAYERS and docs/architecture.md"
            if row[target] >= row[source]:
                upward.append(f"{module} imports prefdata.{target}")
    assert upward == []


def test_no_module_imports_itself_back():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current trail, 2: done
    circles = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_top_level_holds_the_cli_and_its_entry_points_only():
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert set(loose) == TOP_LEVEL_MODULES, "a module lives in the part it serves (docs/architecture.md)"


def test_no_test_folder_is_named_like_a_package_the_tests_import():
    # pytest puts tests/ on sys.path (its top-level test files have no __init__.py), so a folder tests/trl/
    # is importable as a namespace package `trl`: where TRL is not installed (the floors venv), `import trl`
    # then succeeds with an empty module and importorskip("trl") no longer skips.
    imported = {"trl", "ray", "torch", "transformers", "datasets", "peft", "openrlhf", "llamafactory", "axolotl",
                "vllm", "pyarrow", "polars", "pandera", "numpy", "gguf", "PIL", "accelerate", "tokenizers"}
    folders = {p.name for p in (Path(__file__).parent).iterdir() if p.is_dir()}
    assert not folders & imported, f"rename tests/{sorted(folders & imported)[0]}/ (it shadows the package of that name)"
