"""The `prefdata` command line: a thin layer over typed functions.

Exit codes: 0 ok, 1 findings at error severity (or a training stall with --fail-on-stall),
2 usage or input error. Errors are one line on stderr, never a traceback
(set PREFDATA_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import difflib
import os
import signal
import sys
from typing import Any, Callable, NoReturn

from prefdata import __version__
from prefdata.core.errors import PrefdataError
from prefdata.core.quiet import quiet_libraries, wants_quiet
from prefdata.core.ranks import is_main_process, process_rank
from prefdata.settings.commands import COMMANDS as DECLARED, Command
from prefdata.settings.options import GROUP_ORDER, RUN
from prefdata.settings.config import load_sourced
from prefdata.settings.declare import RequiredInUsage, add_to_parser, declared, missing_required, names
from prefdata.settings.trust import check_from_files

EPILOG = ("Exit codes: 0 ok, 1 findings at error severity, 2 usage or input error (including an input none "
          "of whose records could be read).")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: `prefdata prepare: error: ...`, exit 2, and a near flag named."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}{_did_you_mean(self, message)} (see `{self.prog} --help`)\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """`; did you mean --max-length?` for an unknown flag: the flags spelt nearly alike (difflib), then
    those whose help says the unknown flag's words (`--learning-rate` -> `--lr`, "peak learning rate")."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    actions = [action for action in parser._actions if action.option_strings]
    flags = [flag for action in actions for flag in action.option_strings if flag.startswith("--")]
    for word in message.split(":", 1)[1].split():
        if not word.startswith("--") or len(word) < 4:
            continue
        typed = word.split("=")[0]
        close = difflib.get_close_matches(typed, flags, n=3, cutoff=0.6)
        if close and difflib.SequenceMatcher(None, typed, close[0]).ratio() >= 0.85:
            return f"; did you mean {close[0]}?"  # a plain typo: the one flag it nearly is
        words = typed[2:].replace("-", " ").replace("_", " ").lower()
        by_help = [action.option_strings[-1] for action in actions
                   if len(words) > 3 and words in " ".join((action.help or "").lower().replace("-", " ").split())]
        close += [flag for flag in by_help if flag not in close]
        if close:
            return f"; did you mean {' or '.join(close[:3])}?"
    return ""


class _Formatter(RequiredInUsage):
    """Wraps the description to the terminal; keeps the examples' lines as written; required settings
    unbracketed in the usage."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _examples(command: Command) -> str:
    lines = ["examples:", *(f"  {example}" for example in command.examples)] if command.examples else []
    return "\n".join([*lines, "", EPILOG] if lines else [EPILOG])


def _add_command(sub: Any, command: Command) -> argparse.ArgumentParser:
    """One subcommand, made from its declared settings (prefdata.settings.commands)."""
    parser = sub.add_parser(command.name, help=command.help, description=command.description,
                            epilog=_examples(command), formatter_class=_Formatter, allow_abbrev=False)
    for positional in command.positionals:
        parser.add_argument(positional.name, metavar=positional.metavar, help=positional.help)
    sections = add_to_parser(parser, command.settings, GROUP_ORDER)
    run = sections.get(RUN) or parser.add_argument_group(RUN)
    run.add_argument("--config", metavar="FILE", help="TOML settings file: [COMMAND] tables, or pyproject's [tool.prefdata] "
                     "(flags override it; see docs/settings.md)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="prefdata",
        description="Make preference (DPO) training data trustworthy: prepare, validate, refs, select, train.",
        epilog=EPILOG,
        allow_abbrev=False,  # `--max-len` must not pass for `--max-length`: a flag is spelt out or refused
    )
    parser.add_argument("--version", action="version", version=f"prefdata {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in DECLARED.values():
        _add_command(sub, command)
    return parser


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings some source set for this command: config files, then flags (which win). Settings
    left unset are not passed, so each function's own default (the declared one) applies. A required
    setting that no source set is a usage error (exit 2), one line naming every missing flag."""
    declared_settings = DECLARED[args.command].settings
    allowed = names(declared_settings)
    sourced = load_sourced(args.command, getattr(args, "config", None), allowed)
    given = {name: value for name, value in vars(args).items() if value is not None and name in allowed}
    from_files = {name: got for name, got in sourced.items() if name not in given}
    items = {item.name: item for item in declared(declared_settings)}
    check_from_files(args.command, from_files, {name: item.flag for name, item in items.items()})
    # where each free-text value (a path, a model) the user did not type came from, for error lines
    args.from_files = {name: got for name, got in from_files.items() if not items[name].spec.choices}
    settings = {**{name: got.value for name, got in from_files.items()}, **given}
    missing = missing_required(declared_settings, settings)
    if missing:
        every = declared(declared_settings)
        either = [[item, *(other for other in every if other.flag in item.alternatives)] for item in missing]
        flags = " and ".join(" or ".join(f"{one.flag} {one.spec.metavar}" for one in items) for items in either)
        keys = " and ".join(" or ".join(f"`{one.name}`" for one in items) for items in either)
        verb = "is" if len(missing) == 1 else "are"
        raise PrefdataError(f"{flags} {verb} required (or set {keys} in the config file)")
    _refuse_config_inside_output(args, settings)
    return settings


def _refuse_config_inside_output(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    """A --config file kept inside the directory a command replaces would be deleted with it."""
    from pathlib import Path

    from prefdata.io.out_dir import refuse_inputs_inside

    output = {"prepare": getattr(args, "out", None), "select": getattr(args, "new", None),
              "train": settings.get("output"), "export": getattr(args, "dir", None)}.get(args.command)
    if getattr(args, "config", None) and output:
        refuse_inputs_inside(Path(output), [args.config])


def _origin_note(message: str, args: argparse.Namespace) -> str:
    """` (tokenizer = 'tok' is from pyproject.toml [tool.prefdata] tokenizer)` when the error names a
    value a settings file set: the user may never have typed it."""
    from_files = getattr(args, "from_files", {})
    for name, got in from_files.items():
        values = got.value if isinstance(got.value, list) else [got.value]
        if any(isinstance(value, str) and len(value) > 2 and value in message for value in values):
            return f" ({name} = {got.value!r} is from {got.where})"
    return ""


def _run_prepare(args: argparse.Namespace) -> int:
    from prefdata.prepare import prepare

    settings = _settings(args)
    result = prepare(args.raw, args.out, **settings)
    from prefdata.report.render_text import render_text

    print(render_text(result.report))
    print(f"wrote {result.out_dir}/ (report: {result.out_dir}/report.html, {result.out_dir}/report.md)")
    if result.problem:  # an empty result must not pass for a successful run
        print(f"prefdata prepare: error: {result.problem}", file=sys.stderr)
    return result.exit_code


def _run_validate(args: argparse.Namespace) -> int:
    from prefdata.validate.command import validate

    settings = _settings(args)  # refuses what a pull request's settings file must not set (settings.trust)
    result = validate(args.input, **settings)
    if result.problem:
        print(f"prefdata validate: error: {result.problem}", file=sys.stderr)
    return result.exit_code


def _run_refs(args: argparse.Namespace) -> int:
    from prefdata.refs import compute_refs

    settings = _settings(args)
    engine, ray_address, workers = settings.pop("engine", "local"), settings.pop("ray_address", None), settings.pop("workers", None)
    if engine == "ray":
        from prefdata.refs.ray import compute_refs_on_ray

        settings.pop("progress", None)  # the actors report no progress bars
        result = compute_refs_on_ray(args.out, ray_address=ray_address, workers=workers, **settings)
    elif engine != "local":
        raise PrefdataError(f"--engine must be one of local, ray, got {engine!r}")
    else:
        result = compute_refs(args.out, **settings)
    if is_main_process():  # under torchrun the other ranks only compute their shards
        print(result.summary() if hasattr(result, "summary") else result)
    return 0


def _run_select(args: argparse.Namespace) -> int:
    from prefdata.select import select_pairs

    result = select_pairs(args.out, args.new, **_settings(args))
    print(result.summary())
    if result.problem:  # a selection that keeps nothing must not pass for a successful run
        print(f"prefdata select: error: {result.problem}", file=sys.stderr)
    return result.exit_code


def _run_export(args: argparse.Namespace) -> int:
    from prefdata.trainers.export import export_for_trainer

    print(export_for_trainer(args.out, args.dir, **_settings(args)).summary())
    return 0


def _run_train(args: argparse.Namespace) -> int:
    from prefdata.train.recipe import train

    settings = _settings(args)
    result = train(args.out, **settings)
    if is_main_process():  # under torchrun every rank trained the same model; one says so
        print(result.summary() if hasattr(result, "summary") else result)
    return int(getattr(result, "exit_code", 0))


def _run_generate(args: argparse.Namespace) -> int:
    from prefdata.online.generate import generate

    settings = _settings(args)
    if settings.get("engine") == "vllm":
        from prefdata.online.vllm_engine import vllm_available

        reason = vllm_available()
        if reason is not None:
            raise PrefdataError(reason)
    print(generate(args.prompts, args.out, **settings).summary())
    return 0


def _run_score(args: argparse.Namespace) -> int:
    from prefdata.online.score import score

    settings = _settings(args)
    print(score(args.input, **settings).summary())
    return 0


def _run_online(args: argparse.Namespace) -> int:
    from prefdata.online.rounds import run_online

    settings = _settings(args)
    if settings.get("engine") == "vllm":
        from prefdata.online.vllm_engine import vllm_available

        reason = vllm_available()
        if reason is not None:
            raise PrefdataError(reason)
    print(run_online(args.prompts, **settings).summary())
    return 0


def _run_show(args: argparse.Namespace) -> int:
    from prefdata.show import show_row

    settings = _settings(args)
    print(show_row(args.out, row=settings.get("row"), line=settings.get("line")))
    return 0


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse; a flag no command knows is reported by that command's parser (naming a near flag)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = getattr(args, "command", None)
        sub = next((a.choices[command] for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                    and command in a.choices), parser)
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "prepare": _run_prepare,
    "validate": _run_validate,
    "refs": _run_refs,
    "select": _run_select,
    "export": _run_export,
    "train": _run_train,
    "show": _run_show,
    "generate": _run_generate,
    "score": _run_score,
    "online": _run_online,
}


def _reader_left() -> int:
    """The reader of our output went away (`prefdata show OUT | head -1`): end quietly with the code a
    shell gives a process killed by SIGPIPE. Python ignores SIGPIPE, so a write raised BrokenPipeError;
    stdout now points at /dev/null so the interpreter's final flush has nowhere to fail (as the Python
    docs' note on SIGPIPE advises)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (an embedding caller's stream)
        pass
    return 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = _parse(parser, argv)  # exits 2 with a one-line usage error
    except KeyboardInterrupt:  # Ctrl-C before any work began: the same one line and exit code as later
        print("prefdata: interrupted", file=sys.stderr)
        return 130
    if args.command is None:
        parser.print_help()
        return 2
    if not is_main_process() and hasattr(args, "progress"):
        args.progress = False  # torchrun: rank 0's bars and notices stand for every rank
    try:
        # --no-progress and non-TTY runs: no third-party bars or warnings either (PREFDATA_DEBUG keeps them).
        with quiet_libraries(wants_quiet(getattr(args, "progress", None))):
            code = COMMANDS[args.command](args)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's shutdown
        if argv is None:
            # The work is done and written: a Ctrl-C during the interpreter's shutdown must not turn
            # this exit code into "killed by SIGINT".
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return code
    except PrefdataError as exc:
        print(f"prefdata {args.command}{_rank_tag()}: error: {exc}{_origin_note(str(exc), args)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"prefdata {args.command}: interrupted; nothing partial was left behind as finished output", file=sys.stderr)
        # Cleanup already ran on the way here. An interrupt that lands inside the interpreter's own
        # shutdown (library threads, lazy imports) would turn exit 130 into "killed by SIGINT", so
        # when we are the process's entry point we leave at once.
        if argv is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130
    except BrokenPipeError:
        return _reader_left()
    except Exception as exc:  # the promise is one line, never a traceback
        if os.environ.get("PREFDATA_DEBUG"):
            raise
        print(
            f"prefdata {args.command}{_rank_tag()}: internal error: {type(exc).__name__}: {exc} "
            "(set PREFDATA_DEBUG=1 for a traceback, and please report it)",
            file=sys.stderr,
        )
        return 2


def _rank_tag() -> str:
    """Errors come from every rank (one rank may fail alone); ranks other than 0 say which they are."""
    return "" if is_main_process() else f" (rank {process_rank()})"


if __name__ == "__main__":  # `python -m prefdata.cli`
    sys.exit(main())
