"""The `prefdata` command line: a thin layer over typed functions.

Exit codes: 0 ok, 1 findings at error severity (or a training stall with --fail-on-stall),
2 usage or input error. Errors are one line on stderr, never a traceback
(set PREFDATA_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from prefdata import __version__
from prefdata.config import load_settings
from prefdata.errors import PrefdataError

EPILOG = "Exit codes: 0 ok, 1 findings at error severity, 2 usage or input error."


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML settings file (flags override it)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="hide progress bars")


def _add_tokenize_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-length", type=_positive_int, metavar="N", help="max prompt+completion tokens per half")
    parser.add_argument("--max-prompt-length", type=_positive_int, metavar="N", help="max prompt tokens (cut from the left)")
    parser.add_argument(
        "--chat-template", action="store_true", default=None,
        help="render plain-string rows through the tokenizer's chat template (one user + one assistant turn)",
    )
    parser.add_argument("--trust-remote-code", action="store_true", default=None, help="allow tokenizer/model code from the model directory (off by default)")


def _add_engine_options(parser: argparse.ArgumentParser, partitioned: bool = True) -> None:
    parser.add_argument("--engine", choices=["local", "ray"], help="where the work runs: worker processes here (local, default) or a Ray cluster")
    parser.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to use with --engine ray (default: RAY_ADDRESS, else a local Ray)")
    if partitioned:
        parser.add_argument(
            "--partitioned-checks", action="store_true", default=None,
            help="dataset-wide checks by hash partitioning across the workers (a first pass over the input; "
            "with --engine ray no process holds every row's digests)",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefdata",
        description="Make preference (DPO) training data trustworthy: prepare, validate, refs, train.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"prefdata {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "prepare", help="read raw pairs, tokenize, check, write an Arrow dataset to OUT/",
        description="Read any common preference format, tokenize with the model's chat template, truncate, "
        "flag and drop bad pairs, and write OUT/ (datasets.load_from_disk-able Arrow dataset, manifest.json, "
        "dropped.jsonl, quarantine.jsonl, report.json/.md/.html).",
        epilog=EPILOG,
    )
    p.add_argument("raw", metavar="RAW", help="a .jsonl/.jsonl.gz/.json/.parquet file, a directory of them, or a save_to_disk dataset")
    p.add_argument("out", metavar="OUT", help="output directory (must not exist unless --overwrite)")
    p.add_argument("--tokenizer", metavar="PATH", help="Hugging Face tokenizer directory (required)")
    _add_tokenize_options(p)
    p.add_argument("--policy", metavar="FILE", help="check policy TOML (default: checks/default.toml)")
    p.add_argument("--overwrite", action="store_true", default=None, help="replace an existing OUT written by prefdata")
    p.add_argument("--batch-size", type=_positive_int, metavar="N", help="records per processing batch (default 1000)")
    p.add_argument("--workers", type=_positive_int, metavar="N", help="processes that tokenize (default: all cores, at most 8; with --engine ray: Ray actors, default one per cluster CPU)")
    _add_engine_options(p)
    _add_common(p)

    v = sub.add_parser(
        "validate", help="run the checks and report; exit 1 on findings at error severity",
        description="Run prefdata's checks on a raw file/directory or a prepared OUT/ and report. "
        "Writes nothing but --output.",
        epilog=EPILOG,
    )
    v.add_argument("input", metavar="INPUT", help="raw file/directory or a prepared OUT/")
    v.add_argument("--tokenizer", metavar="PATH", help="also run token-level checks (after truncation)")
    _add_tokenize_options(v)
    v.add_argument("--policy", metavar="FILE", help="check policy TOML (e.g. checks/pr.toml)")
    v.add_argument("--format", choices=["text", "json", "markdown", "github", "html"], help="report format (default text)")
    v.add_argument("--output", metavar="FILE", help="write the report here instead of stdout")
    v.add_argument("--baseline", metavar="REPORT.json", help="report from the base branch: only regressions fail")
    v.add_argument("--against", metavar="OTHER", help="flag prompts that also occur in OTHER (e.g. the eval split)")
    v.add_argument("--workers", type=_positive_int, metavar="N", help="processes that check raw input (default: all cores, at most 8; with --engine ray: Ray actors)")
    _add_engine_options(v)
    _add_common(v)

    r = sub.add_parser(
        "refs", help="precompute reference-model log-probs into OUT/",
        description="Add ref_chosen_logps / ref_rejected_logps (and completion token counts) to a prepared OUT/.",
        epilog=EPILOG,
    )
    r.add_argument("out", metavar="OUT", help="a directory written by `prefdata prepare`")
    r.add_argument("--model", metavar="PATH", help="reference model directory (required)")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default auto (cuda when available)")
    r.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="default auto (bf16 on GPU, fp32 on CPU)")
    r.add_argument("--batch-tokens", type=_positive_int, metavar="N", help="token budget per forward batch")
    r.add_argument("--trust-remote-code", action="store_true", default=None, help="allow model code from the model directory")
    r.add_argument("--workers", type=_positive_int, metavar="N", help="with --engine ray: model actors (default: one per GPU, else one per CPU)")
    _add_engine_options(r, partitioned=False)
    _add_common(r)

    t = sub.add_parser(
        "train", help="train a policy with DPO on OUT/ using its precomputed reference log-probs",
        description="A lean DPO trainer: no reference model in memory; metrics.jsonl with TRL's metric names.",
        epilog=EPILOG,
    )
    t.add_argument("out", metavar="OUT", help="a prepared OUT/ (with `prefdata refs` columns unless --loss simpo)")
    t.add_argument("--model", metavar="PATH", help="policy model to start from (required)")
    t.add_argument("--output", metavar="DIR", help="where checkpoints, metrics.jsonl and the final model go (required)")
    t.add_argument("--loss", choices=["sigmoid", "ipo", "hinge", "robust", "simpo"])
    t.add_argument("--beta", type=float)
    t.add_argument("--label-smoothing", type=float)
    t.add_argument("--lr", type=float)
    group = t.add_mutually_exclusive_group()
    group.add_argument("--epochs", type=_positive_int)
    group.add_argument("--max-steps", type=_positive_int)
    size = t.add_mutually_exclusive_group()
    size.add_argument("--batch-tokens", type=_positive_int)
    size.add_argument("--batch-pairs", type=_positive_int)
    t.add_argument("--grad-accum", type=_positive_int)
    t.add_argument("--eval", dest="eval_dir", metavar="OUT_EVAL", help="a prepared eval split to evaluate on")
    t.add_argument("--eval-every", type=_positive_int, metavar="N", help="also evaluate every N steps")
    t.add_argument("--simpo-gamma", type=float, help="SimPO target margin (default 0.5)")
    t.add_argument("--warmup-ratio", type=float, help="share of steps for linear warmup (default 0.1)")
    t.add_argument("--max-grad-norm", type=float, help="gradient clipping norm (default 1.0)")
    t.add_argument("--save-every", type=_positive_int, metavar="N", help="checkpoint every N steps (default 500)")
    t.add_argument("--stall-steps", type=_positive_int, metavar="N", help="steps at ln 2 before the stall warning (default 20)")
    t.add_argument("--seed", type=int)
    t.add_argument("--resume", action="store_true", default=None, help="continue from the last checkpoint in --output")
    t.add_argument("--fail-on-stall", action="store_true", default=None, help="exit 1 when the loss stalls at ln 2")
    t.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    t.add_argument("--lora", action="store_true", default=None, help="train LoRA adapters (needs the `lora` extra: peft)")
    t.add_argument("--trust-remote-code", action="store_true", default=None)
    _add_common(t)

    s = sub.add_parser(
        "show", help="print one row of OUT/ with its loss masks made visible",
        description="Print a prepared row: prompt tokens, and per half the tokens the loss sees.",
    )
    s.add_argument("out", metavar="OUT")
    s.add_argument("--row", type=int, default=None, help="row index in the dataset (default 0)")
    s.add_argument("--line", type=int, default=None, help="find the row by its source line instead")
    _add_common(s)
    return parser


def _kwargs(args: argparse.Namespace, skip: set[str]) -> dict[str, Any]:
    """The options the user actually set on the command line."""
    return {k: v for k, v in vars(args).items() if v is not None and k not in skip}


def _merged(command: str, args: argparse.Namespace, positional: set[str], function: Callable[..., Any],
            extra: frozenset[str] = frozenset()) -> dict[str, Any]:
    import inspect

    params = inspect.signature(function).parameters
    allowed = {name for name in params if name not in positional} | extra
    settings = load_settings(command, getattr(args, "config", None), allowed)
    settings.update(_kwargs(args, positional | {"config", "command"}))
    return settings


def _require(settings: dict[str, Any], name: str, flag: str) -> None:
    if not settings.get(name):
        raise PrefdataError(f"{flag} is required (or set `{name}` in the config file)")


def _run_prepare(args: argparse.Namespace) -> int:
    from prefdata.prepare import prepare

    settings = _merged("prepare", args, {"raw", "out"}, prepare)
    _require(settings, "tokenizer", "--tokenizer PATH")
    result = prepare(args.raw, args.out, **settings)
    from prefdata.report.render import render_text

    print(render_text(result.report))
    print(f"wrote {result.out_dir}/ (report: {result.out_dir}/report.html, {result.out_dir}/report.md)")
    return result.exit_code


def _run_validate(args: argparse.Namespace) -> int:
    from prefdata.validate.command import validate

    settings = _merged("validate", args, {"input"}, validate)
    result = validate(args.input, **settings)
    return result.exit_code


def _run_refs(args: argparse.Namespace) -> int:
    from prefdata.refs import compute_refs

    settings = _merged("refs", args, {"out_dir"}, compute_refs, frozenset({"engine", "ray_address", "workers"}))
    settings.pop("out", None)
    _require(settings, "model", "--model PATH")
    engine, ray_address, workers = settings.pop("engine", "local"), settings.pop("ray_address", None), settings.pop("workers", None)
    if engine == "ray":
        from prefdata.refs_ray import compute_refs_on_ray

        settings.pop("progress", None)  # the actors report no progress bars
        result = compute_refs_on_ray(args.out, ray_address=ray_address, workers=workers, **settings)
    elif engine != "local":
        raise PrefdataError(f"--engine must be one of local, ray, got {engine!r}")
    else:
        result = compute_refs(args.out, **settings)
    print(result.summary() if hasattr(result, "summary") else result)
    return 0


def _run_train(args: argparse.Namespace) -> int:
    from prefdata.train.recipe import train

    settings = _merged("train", args, {"out_dir"}, train)
    settings.pop("out", None)
    _require(settings, "model", "--model PATH")
    _require(settings, "output", "--output DIR")
    result = train(args.out, **settings)
    print(result.summary() if hasattr(result, "summary") else result)
    return int(getattr(result, "exit_code", 0))


def _run_show(args: argparse.Namespace) -> int:
    from prefdata.show import show_row

    print(show_row(args.out, row=args.row, line=args.line))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "prepare": _run_prepare,
    "validate": _run_validate,
    "refs": _run_refs,
    "train": _run_train,
    "show": _run_show,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse exits 2 with a one-line usage error itself
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except PrefdataError as exc:
        print(f"prefdata {args.command}: error: {exc}", file=sys.stderr)
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
    except Exception as exc:  # the promise is one line, never a traceback
        if os.environ.get("PREFDATA_DEBUG"):
            raise
        print(
            f"prefdata {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(set PREFDATA_DEBUG=1 for a traceback, and please report it)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # `python -m prefdata.cli`
    sys.exit(main())
