"""A check is one unit (prefdata/checks/units/): the flag list, the default policy, the report legends, the
drop-cause hints and docs/checks.md's table are made from it, and a flag is raised only where its unit says."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import pytest

from prefdata.checks import generated
from prefdata.checks.policy import SEVERITIES, load_policy
from prefdata.checks.units import BY_NAME, CHECKS
from prefdata.core import flags as F
from prefdata.report.hints import dropped_share_hint, keep_setting
from prefdata.report.render_common import FLAG_MEANINGS

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "prefdata"
REGENERATE = "run python -m prefdata.checks.generated"
# Trainer findings (prefdata/trainers/) say what another trainer's own processing would make of a pair,
# under the same names; they raise nothing in prefdata's OUT or reports.
NOT_SCANNED = ("prefdata/core/flags.py", "prefdata/checks/units/__init__.py", "prefdata/trainers/")


def _read(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


def test_the_flag_list_is_made_from_the_checks() -> None:
    assert _read(generated.FLAGS_MODULE) == generated.flags_module(), f"core/flags.py differs: {REGENERATE}"
    assert F.ALL_FLAGS == tuple(check.name for check in CHECKS)
    # validate's text path carries a pair's flags as one uint64 bit mask (validate/scan.py FLAG_BIT).
    assert len(CHECKS) <= 64, "more than 64 checks: widen validate/scan.py's flag_bits"
    assert [check.order for check in CHECKS] == list(range(len(CHECKS))), "orders must be 0, 1, ... (a new check: the next)"
    for path in (PACKAGE / "checks" / "units").glob("[!_]*.py"):  # one check a module, named after its flag
        assert importlib.import_module(f"prefdata.checks.units.{path.stem}").CHECK.name == path.stem


def test_the_default_policy_is_made_from_the_checks() -> None:
    text = _read(generated.DEFAULT_POLICY)
    assert text == generated.default_policy(text), f"default.toml's [flags] differ from the checks: {REGENERATE}"
    default = load_policy(None)
    assert default.severities == {check.name: check.severity for check in CHECKS}
    assert set(tomllib.loads(_read(generated.PR_POLICY))["flags"]) <= set(BY_NAME)


def test_the_readme_table_is_made_from_the_checks() -> None:
    text = _read(generated.FLAG_TABLE_PAGE)
    assert generated.TABLE.search(text), f"{generated.FLAG_TABLE_PAGE} lost its <!-- checks --> table"
    assert text == generated.readme(text, _read(generated.PR_POLICY)), f"docs/checks.md's flag table differs: {REGENERATE}"
    assert "| `identical` | chosen == rejected | drop (`pr.toml`: error) |" in text


def test_each_check_says_what_it_means_once() -> None:
    for check in CHECKS:
        assert check.severity in SEVERITIES and check.severity != "ignore", check.name
        assert check.meaning.strip() and "\n" not in check.meaning, check.name
        assert FLAG_MEANINGS[check.name] == check.meaning  # the report legends read the unit
    assert F.TOKEN_FLAGS == {check.name for check in CHECKS if check.tokens}


def _scan() -> tuple[dict[str, set[str]], set[str]]:
    """(flag -> the "module:function"s that add it to a pair, every "module:function" defined), read from
    the source without importing it. A function adds a flag when the flag's constant is an item of a list
    or tuple it builds (not one it loops over), or what it appends or inserts."""
    names = {name: value for name, value in vars(F).items() if name.isupper() and isinstance(value, str)}
    sites: dict[str, set[str]] = {}
    defined: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        scan = not relative.startswith(NOT_SCANNED)
        _visit(ast.parse(path.read_text(encoding="utf-8")), [], "", module, names, sites if scan else {}, defined)
    return sites, defined


def _visit(node: ast.AST, parents: list[ast.AST], where: str, module: str, names: dict[str, str],
           sites: dict[str, set[str]], defined: set[str]) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if not any(isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) for p in parents):  # nested: its outer one
            where = f"{where}.{node.name}" if where else node.name
            defined.add(f"{module}:{where}")
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("F", "flags")
            and node.attr in names and where and _adds(node, parents)):
        sites.setdefault(names[node.attr], set()).add(f"{module}:{where}")
    for child in ast.iter_child_nodes(node):
        _visit(child, [*parents, node], where, module, names, sites, defined)


def _adds(node: ast.AST, parents: list[ast.AST]) -> bool:
    child = node
    for parent in reversed(parents):  # a tuple looped over names flags to read, not to raise
        if isinstance(parent, (ast.For, ast.comprehension)) and child is parent.iter:
            return False
        child = parent
    parent = parents[-1]
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute):
        return parent.func.attr in ("append", "insert") and node in parent.args
    return isinstance(parent, (ast.List, ast.Tuple))


def test_a_flag_is_raised_only_where_its_check_says() -> None:
    sites, defined = _scan()
    for check in CHECKS:
        assert set(check.raised_by) <= defined, f"{check.name}: no such function {set(check.raised_by) - defined}"
        # A check's own `test` returns a bool; checks.checker.pair_flags adds the flag for it.
        own = {f"{check.test.__module__}:{check.test.__qualname__}"} if check.test else set()
        assert own <= set(check.raised_by), f"{check.name}: name its test in raised_by"
        assert sites.get(check.name, set()) == set(check.raised_by) - own, (
            f"{check.name} is raised in {sorted(sites.get(check.name, ()))}; "
            f"prefdata/checks/units/{check.name}.py names {sorted(check.raised_by)}")


@pytest.mark.parametrize("flag", ["system_lost", "turn_renders_differently"])
def test_template_flags_that_lose_pairs_name_the_template_not_the_data(flag: str) -> None:
    hint = dropped_share_hint({flag: {"count": 5, "severity": "error"}}, 5, 10, 0.2, {})
    assert hint["flag"] == flag and hint["setting"] == "--chat-template-file"
    assert "fix the data" not in hint["message"] and "chat template" in hint["message"]


def test_every_check_has_a_hint() -> None:
    for check in CHECKS:
        setting, why = keep_setting(check.name, {"max_length": 512})
        assert setting and why, check.name
    assert keep_setting("tied_reward", {}) == ("tie_threshold", BY_NAME["tied_reward"].hint)


def test_the_turn_renders_differently_hint_keeps_the_pair(tiny_tokenizer_dir: str) -> None:
    """What the hint offers works: a template that rewrites an earlier assistant turn once a later one
    follows flags the row, and --train-turns last (only the final turn, rendered as it stands) keeps it."""
    from prefdata.core.records import RawRecord
    from prefdata.io.formats import normalize_record
    from prefdata.tokenize.pairs import PairTokenizer
    from prefdata.tokenize.settings import TokenizeSettings
    from prefdata.tokenize.template import TemplateSettings

    rewriting = (
        "{% for message in messages %}{% set text = message['content'] %}"
        "{% if message['role'] == 'assistant' and not loop.last %}{% set text = text | upper %}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + text + '<|im_end|>' + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    def user(text: str) -> dict[str, str]:
        return {"role": "user", "content": text}

    def assistant(text: str) -> dict[str, str]:
        return {"role": "assistant", "content": text}

    # The halves differ from their first answer on, so each completion holds two assistant turns.
    row = {"chosen": [user("Hi"), assistant("Hello!"), user("A joke?"), assistant("Why did the chicken cross?")],
           "rejected": [user("Hi"), assistant("Go away."), user("A joke?"), assistant("No.")]}
    flags: dict[str, list[str]] = {}
    for train_turns in ("all", "last"):
        settings = TokenizeSettings(template=TemplateSettings(chat_template_text=rewriting), train_turns=train_turns)
        pair = normalize_record(RawRecord("t.jsonl", 1, row))
        flags[train_turns] = PairTokenizer(tiny_tokenizer_dir, settings).tokenize_pairs([pair])[0].flags
    assert F.TURN_RENDERS_DIFFERENTLY in flags["all"] and F.TURN_RENDERS_DIFFERENTLY not in flags["last"]
    assert "--train-turns last" in BY_NAME[F.TURN_RENDERS_DIFFERENTLY].hint


def test_a_check_that_is_one_function_runs_on_every_pair() -> None:
    """A unit with `test` is the whole check: pair_flags (every path's per-pair step) runs it."""
    from prefdata.checks.checker import pair_flags
    from prefdata.checks.units import PAIR_TESTS
    from prefdata.core.records import Pair

    assert (F.IMAGE_MISMATCH, BY_NAME[F.IMAGE_MISMATCH].test) in PAIR_TESTS
    policy = load_policy(None)
    pair = Pair("t.jsonl", 1, "Look:", "A cat.", "A dog.", images=[], image_parts=1)
    assert F.IMAGE_MISMATCH in pair_flags(pair, None, policy, None)
    pair.images = [{"path": "a.png"}]
    assert F.IMAGE_MISMATCH not in pair_flags(pair, None, policy, None)
