"""The `prefdata` command line: a thin layer over typed functions.

Exit codes: 0 ok, 1 findings at error severity (or a training stall with --fail-on-stall),
2 usage or input error. Errors are one line on stderr, never a traceback
(set PREFDATA_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Callable

from prefdata import __version__
from prefdata.config import load_settings
from prefdata.errors import PrefdataError
from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE
from prefdata.quiet import quiet_libraries, wants_quiet

EPILOG = "Exit codes: 0 ok, 1 findings at error severity, 2 usage or input error."


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {value}")
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
    _add_template_options(parser)
    parser.add_argument("--trust-remote-code", action="store_true", default=None, help="allow tokenizer/model code from the model directory (off by default)")


def _add_template_options(parser: argparse.ArgumentParser) -> None:
    """How conversations render: the same flags on prepare, validate, generate and online."""
    parser.add_argument(
        "--template-kwargs", action="append", metavar="NAME=VALUE[,...]",
        help="variables for the chat template, e.g. enable_thinking=false (values are JSON where they parse; "
        "repeatable); recorded in the manifest",
    )
    parser.add_argument(
        "--chat-template-file", metavar="FILE",
        help="a Jinja chat template that replaces the tokenizer's, or a bundled one by name "
        "(deepseek-r1-keep-reasoning: R1's template keeping the last turn's reasoning; see docs/reasoning.md); "
        "recorded in the manifest",
    )
    parser.add_argument(
        "--template-date", metavar="YYYY-MM-DD",
        help=f"the date templates print (strftime_now, date_string), pinned so OUT does not change with the day "
        f"(default {DEFAULT_TEMPLATE_DATE})",
    )


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _add_pairing_options(parser: argparse.ArgumentParser) -> None:
    """How records of scored completions become pairs: the same flags on prepare and validate."""
    from prefdata.pairing import DEFAULT_TOP_K, STRATEGIES

    parser.add_argument(
        "--pairing", choices=STRATEGIES,
        help="scored completions -> pairs: best-worst (default: the best vs the worst), best-vs-random-lower "
        "(the best vs a random lower-scored one), all-pairs (every better/worse pair), top-k (the --top-k pairs "
        "with the widest score gaps); higher scores and lower ranks are better (rank 1 beats rank 2); tied scores are never paired",
    )
    parser.add_argument("--pairing-seed", type=int, metavar="N",
                        help="seed for the random picks of --pairing (default 0; the pairs do not depend on --workers or --engine)")
    parser.add_argument("--min-score-margin", type=_non_negative_float, metavar="X",
                        help="pair only completions whose scores differ by at least X (rank steps for ranks; default 0: any strict difference)")
    parser.add_argument("--rating", metavar="mean|NAME",
                        help="completions with several ratings (UltraFeedback's annotations): their mean (default) or the one "
                        "named, e.g. helpfulness or overall_score")
    parser.add_argument("--top-k", type=_positive_int, metavar="K", help=f"pairs per prompt with --pairing top-k (default {DEFAULT_TOP_K})")


def _add_decontaminate_options(parser: argparse.ArgumentParser) -> None:
    """Benchmark decontamination: the same flags on prepare and validate."""
    parser.add_argument(
        "--decontaminate-against", nargs="+", metavar="PATH",
        help="benchmark files, directories or Hub ids (org/name:split) in any format prefdata reads; pairs whose prompt "
        "shares a run of N words with a benchmark item are flagged benchmark_overlap (default policy: drop; pr: error). "
        "The item's text is read from --decontaminate-field, else from the first of prompt, question, problem, "
        "instruction, input, text that it has, else from a preference row's prompt",
    )
    parser.add_argument(
        "--decontaminate-field", action="append", metavar="NAME",
        help="the benchmark field that holds the text, when it is none of the common ones (repeatable: each field "
        "is matched on its own)",
    )
    parser.add_argument(
        "--decontaminate-ngram", type=_positive_int, metavar="N",
        help="words in a run (default 13, as lm-eval-harness and GPT-3); words are lowercased and stripped of "
        "punctuation; benchmark items of 8 to N-1 words are matched whole",
    )
    parser.add_argument(
        "--decontaminate-completions", action="store_true", default=None,
        help="also flag pairs whose chosen or rejected completion overlaps a benchmark item (e.g. a leaked answer)",
    )


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
    p.add_argument("raw", metavar="RAW", help="a .jsonl/.jsonl.gz/.json/.parquet file, a directory of them, a save_to_disk dataset, "
                   "a Hub dataset id with a split (org/name:split, streamed), or a mix file (mix.toml: [[source]] tables "
                   "with path and weight or rows, and a seed; see README 'Mixing sources')")
    p.add_argument("out", metavar="OUT", help="output directory (must not exist unless --overwrite)")
    p.add_argument("--tokenizer", metavar="PATH", help="Hugging Face tokenizer directory (required unless --processor)")
    p.add_argument(
        "--processor", metavar="PATH",
        help="instead of --tokenizer, for image pairs: an AutoProcessor directory; its chat template renders the "
        "prompt, and each image placeholder is expanded exactly as the processor expands it (learned from the "
        "processor at start: <image> x N as LLaVA, <|vision_start|><|image_pad|>...<|vision_end|> with a "
        "size-dependent N as Qwen2-VL, fixed text around the run as Gemma 3); a processor whose layout changes with "
        "the image (Idefics3 / SmolVLM rows x cols tiles) gets each image's text as the processor builds it for that "
        "width x height, cached by size; one that neither rule reproduces exactly is refused. Needs Pillow only "
        "(prefdata[vision]): no torchvision, no video processor",
    )
    _add_tokenize_options(p)
    p.add_argument("--policy", metavar="NAME|FILE", help="check policy: bundled `default` (the default) or `pr`, or a TOML file")
    p.add_argument(
        "--loss-on", choices=["all", "answer"],
        help="all completion tokens in the loss (default), or only the answer: a leading reasoning block "
        "(<think>…</think>) stays in the sequence but out of the loss (refs and train honour it)",
    )
    _add_pairing_options(p)
    _add_decontaminate_options(p)
    p.add_argument(
        "--balance-length", type=_share, nargs="?", const=0.5, metavar="TARGET",
        help="subsample the kept pairs so that chosen is the longer half (tokens, before truncation) in TARGET of "
        "them (default 0.5); the pairs removed go to dropped.jsonl flagged length_balance (seeded by --seed; "
        "they do not count toward max_dropped_share). Give it after RAW OUT, or with a value",
    )
    p.add_argument("--seed", type=int, help="seed of --balance-length's subsample (default: the mix file's seed, else 0)")
    p.add_argument("--overwrite", action="store_true", default=None, help="replace an existing OUT written by prefdata")
    p.add_argument("--batch-size", type=_positive_int, metavar="N", help="records per processing batch (default 1000)")
    p.add_argument("--workers", type=_positive_int, metavar="N", help="processes that tokenize (default: all cores, at most 8; with --engine ray: Ray actors, default one per cluster CPU)")
    _add_engine_options(p)
    p.add_argument(
        "--worker-writes", action=argparse.BooleanOptionalAction, default=None,
        help="the workers write the Arrow shards themselves, so no row passes through one process "
        "(default: on with --engine ray; implies --partitioned-checks; on a cluster OUT must be on shared storage)",
    )
    _add_common(p)

    v = sub.add_parser(
        "validate", help="run the checks and report; exit 1 on findings at error severity",
        description="Run prefdata's checks on a raw file/directory or a prepared OUT/ and report. "
        "Writes nothing but --output.",
        epilog=EPILOG,
    )
    v.add_argument("input", metavar="INPUT", help="raw file/directory, a mix file (mix.toml, the records prepare would sample), "
                   "or a prepared OUT/")
    v.add_argument("--tokenizer", metavar="PATH", help="also run token-level checks (after truncation)")
    v.add_argument(
        "--processor", metavar="PATH",
        help="instead of --tokenizer, for image pairs: an AutoProcessor directory; counts each image's tokens as "
        "prepare --processor does (lengths, image_truncated, tokens per image); without it image placeholders are "
        "only counted against the images (needs Pillow: prefdata[vision])",
    )
    _add_tokenize_options(v)
    v.add_argument("--policy", metavar="NAME|FILE", help="check policy: bundled `default` (the default) or `pr` (strict, for PRs), or a TOML file")
    v.add_argument("--format", choices=["text", "json", "markdown", "github", "html"], help="report format (default text)")
    v.add_argument("--output", metavar="FILE", help="write the report here instead of stdout")
    v.add_argument("--baseline", metavar="REPORT.json", help="report from the base branch: only regressions fail")
    v.add_argument("--against", metavar="OTHER", help="flag prompts that also occur in OTHER (e.g. the eval split)")
    _add_pairing_options(v)
    _add_decontaminate_options(v)
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
    r.add_argument("--processor", metavar="DIR",
                   help="image OUTs (prepared with --processor): the AutoProcessor directory whose image processor makes the "
                   "pixel values; must be the one OUT was prepared with (default: --model when it holds processor files, "
                   "else the manifest's)")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default auto (cuda when available)")
    r.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="default auto (bf16 on GPU, fp32 on CPU)")
    r.add_argument("--batch-tokens", type=_positive_int, metavar="N", help="token budget per forward batch")
    r.add_argument("--trust-remote-code", action="store_true", default=None, help="allow model code from the model directory")
    r.add_argument("--recompute", action="store_true", default=None,
                   help="compute the refs again even when OUT already holds them from this model, dtype and device type "
                   "(otherwise such a rerun says so and stops, exit 0)")
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
    t.add_argument("--processor", metavar="DIR",
                   help="image OUTs (prepared with --processor): the AutoProcessor directory whose image processor makes the "
                   "pixel values; must be the one OUT was prepared with (default: --model when it holds processor files, "
                   "else the manifest's); saved with the trained model")
    t.add_argument("--output", metavar="DIR", help="where checkpoints, metrics.jsonl and the final model go (required)")
    t.add_argument("--loss", choices=["sigmoid", "ipo", "hinge", "robust", "simpo"],
                   help="preference loss (default sigmoid: DPO); simpo needs no reference log-probs")
    t.add_argument("--beta", type=float, help="strength of the implicit KL penalty / reward scale (default 0.1)")
    t.add_argument("--label-smoothing", type=float, help="assumed share of flipped labels, sigmoid/robust loss (default 0)")
    t.add_argument("--lr", type=float, help="peak learning rate of AdamW (default 5e-6)")
    group = t.add_mutually_exclusive_group()
    group.add_argument("--epochs", type=_positive_int, metavar="N", help="passes over the data (default 1)")
    group.add_argument("--max-steps", type=_positive_int, metavar="N", help="stop after N optimizer steps instead of --epochs")
    size = t.add_mutually_exclusive_group()
    size.add_argument("--batch-tokens", type=_positive_int, metavar="N", help="token budget per micro-batch (instead of --batch-pairs)")
    size.add_argument("--batch-pairs", type=_positive_int, metavar="N", help="pairs per micro-batch (default 8)")
    t.add_argument("--grad-accum", type=_positive_int, metavar="N", help="micro-batches per optimizer step (default 1)")
    t.add_argument("--eval", dest="eval_dir", metavar="OUT_EVAL", help="a prepared eval split to evaluate on")
    t.add_argument("--eval-every", type=_positive_int, metavar="N", help="also evaluate every N steps")
    t.add_argument("--simpo-gamma", type=float, help="SimPO target margin (default 0.5)")
    t.add_argument("--ld-alpha", type=float, metavar="ALPHA",
                   help="length-desensitized DPO (LD-DPO, TRL's ld_alpha), in [0, 1]: the log-probs of each half's "
                   "tokens beyond the shorter half's length count ALPHA times, in the policy's and the reference's sums "
                   "(1 is plain DPO, 0 ignores the extra length); needs refs from this prefdata version; not with simpo"),
    t.add_argument("--warmup-ratio", type=float, help="share of steps for linear warmup (default 0.1)")
    t.add_argument("--lr-schedule", choices=["cosine", "linear", "constant"],
                   help="learning rate after warmup: cosine or linear decay to 0 at the last step, or constant (default cosine)")
    t.add_argument("--max-grad-norm", type=float, help="gradient clipping norm (default 1.0)")
    t.add_argument("--save-every", type=_positive_int, metavar="N", help="checkpoint every N steps (default 500)")
    t.add_argument("--stall-steps", type=_positive_int, metavar="N", help="steps at ln 2 before the stall warning (default 20)")
    t.add_argument("--seed", type=int, help="seed for shuffling and initialization (default 0)")
    t.add_argument("--no-shuffle", dest="shuffle", action="store_false", default=None,
                   help="keep the data order instead of a seeded shuffle per epoch")
    t.add_argument("--resume", action="store_true", default=None, help="continue from the last checkpoint in --output")
    t.add_argument("--fail-on-stall", action="store_true", default=None, help="exit 1 when the loss stalls at ln 2")
    t.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    t.add_argument("--lora", action="store_true", default=None, help="train LoRA adapters (needs the `lora` extra: peft)")
    t.add_argument("--trust-remote-code", action="store_true", default=None, help="allow model code from the model directory (off by default)")
    _add_common(t)

    _add_online_commands(sub)

    s = sub.add_parser(
        "show", help="print one row of OUT/ with its loss masks made visible",
        description="Print a prepared row: prompt tokens, and per half the tokens the loss sees.",
    )
    s.add_argument("out", metavar="OUT", help="a directory written by `prefdata prepare`")
    s.add_argument("--row", type=int, default=None, help="row index in the dataset (default 0)")
    s.add_argument("--line", type=int, default=None, help="find the row by its source line instead")
    _add_common(s)
    return parser


def _add_generation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=_positive_int, metavar="K", help="completions sampled per prompt (default 2)")
    parser.add_argument("--max-new-tokens", type=_positive_int, metavar="N", help="token limit per completion (default 128)")
    parser.add_argument("--temperature", type=float, metavar="T", help="sampling temperature; 0 is greedy (default 1.0)")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling mass (default 1.0)")
    parser.add_argument("--seed", type=int, help="sampling seed (default 0)")
    parser.add_argument("--batch-size", type=_positive_int, metavar="B", help="prompts per generate call, rows per reward-model batch (default 8)")
    parser.add_argument("--engine", choices=["transformers", "vllm"], help="generation engine (vllm needs vLLM and a GPU)")
    parser.add_argument("--chat-template", action="store_true", default=None,
                        help="render string prompts through the policy's chat template (as prepare --chat-template)")
    parser.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument("--trust-remote-code", action="store_true", default=None, help="allow model code from the model directories")


def _add_reward_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--reward-model", metavar="RM", help="sequence-classification reward model directory (1 output)")
    group.add_argument("--reward-fn", metavar="FILE.py:NAME", help="reward function f(prompts, completions, **kwargs) -> list[float]")
    parser.add_argument("--score-reasoning", action="store_true", default=None,
                        help="score the whole completion, reasoning included (default: the final answer, a leading "
                        "<think>...</think> block removed)")


def _add_online_commands(sub: Any) -> None:
    g = sub.add_parser(
        "generate", help="sample K completions per prompt from a policy into OUT/generations.jsonl",
        description="Batched sampling (KV cache, left padding) with the prompt rendered as prepare renders it; "
        "one JSONL line per sample with prompt, completion, sample, source_file, source_line, finished.",
        epilog=EPILOG,
    )
    g.add_argument("prompts", metavar="PROMPTS", help="prompt-only rows ({\"prompt\": ...}) or preference data in any shape prepare reads")
    g.add_argument("out", metavar="OUT", help="output directory (generations.jsonl goes there)")
    g.add_argument("--model", metavar="POLICY", help="policy model directory (required)")
    g.add_argument("--overwrite", action="store_true", default=None, help="replace an existing OUT/generations.jsonl")
    _add_generation_options(g)
    _add_template_options(g)
    _add_common(g)

    sc = sub.add_parser(
        "score", help="reward generations (then pair best vs worst) or add reward columns to preference data",
        description="Generations get a `reward` per sample and pairs.jsonl (highest vs lowest reward per prompt); "
        "an offline preference file gets reward_chosen/reward_rejected (validate then flags reward_disagrees).",
        epilog=EPILOG,
    )
    sc.add_argument("input", metavar="INPUT", help="generations.jsonl from `prefdata generate`, or a preference file/directory")
    _add_reward_options(sc)
    sc.add_argument("--output", metavar="FILE", help="scored rows (default: generations in place, else INPUT.scored.jsonl)")
    sc.add_argument("--pairs", metavar="FILE", help="where generation pairs go (default: pairs.jsonl beside INPUT)")
    sc.add_argument("--batch-size", type=_positive_int, metavar="B", help="rows per reward-model batch (default 8)")
    sc.add_argument("--missing-eos-penalty", type=float, metavar="X",
                    help="subtract X from the reward of an unfinished sample before pairing (TRL's missing_eos_penalty)")
    sc.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    sc.add_argument("--trust-remote-code", action="store_true", default=None, help="allow model code from the reward model directory")
    _add_common(sc)

    o = sub.add_parser(
        "online", help="online DPO: rounds of generate -> score -> prepare -> refs -> train",
        description="Each round samples from the current policy on fresh prompts, pairs best vs worst reward, "
        "checks the pairs like any prepared data, computes reference log-probs and trains one round. "
        "A rerun continues after the last finished round.",
        epilog=EPILOG,
    )
    o.add_argument("prompts", metavar="PROMPTS", help="prompt-only rows or preference data in any shape prepare reads")
    o.add_argument("--model", metavar="POLICY", help="starting policy directory (required)")
    o.add_argument("--output", metavar="DIR", help="run directory: round-<r>/, rounds.jsonl, policy/ (required)")
    _add_reward_options(o)
    o.add_argument("--rounds", type=_positive_int, metavar="R", help="rounds to run (default 1)")
    o.add_argument("--prompts-per-round", type=_positive_int, metavar="N", help="fresh prompts per round (default 64)")
    o.add_argument("--ref-model", metavar="M", help="reference model (default: the starting policy)")
    _add_generation_options(o)
    o.add_argument("--max-length", type=_positive_int, metavar="N", help="max prompt+completion tokens per half when preparing")
    o.add_argument("--max-prompt-length", type=_positive_int, metavar="N", help="max prompt tokens when preparing")
    o.add_argument("--policy", metavar="NAME|FILE", help="check policy: bundled `default` (the default) or `pr`, or a TOML file")
    o.add_argument("--loss", choices=["sigmoid", "ipo", "hinge", "robust"], help="preference loss (default sigmoid)")
    o.add_argument("--beta", type=float, help="DPO beta (default 0.1)")
    o.add_argument("--lr", type=float, help="peak learning rate (default 5e-6)")
    o.add_argument("--lr-schedule", choices=["cosine", "linear", "constant"],
                   help="one schedule over the whole run, not per round: one optimizer (AdamW) continues from round "
                   "to round, as in TRL's OnlineDPOTrainer; the rate decays to 0 at the run's planned last step "
                   "(rounds x epochs x ceil(prompts-per-round / batch-pairs)) (default cosine)")
    o.add_argument("--epochs", type=_positive_int,
                   help="passes over each round's pairs before sampling again (default 1; TRL: one pass)")
    o.add_argument("--batch-pairs", type=_positive_int, metavar="N",
                   help="pairs per optimizer step (default 8; TRL's per_device_train_batch_size). A round of N prompts "
                   "takes ceil(N / batch-pairs) steps per epoch: N = batch-pairs is fully online (a step per sampling)")
    o.add_argument("--warmup-ratio", type=float, help="share of the run's planned steps for linear warmup (default 0)")
    o.add_argument("--missing-eos-penalty", type=float, metavar="X",
                   help="subtract X from the reward of a sample that hit --max-new-tokens before pairing "
                   "(TRL's missing_eos_penalty; default none). To drop such pairs instead: completion_truncated = "
                   "\"drop\" in the check policy")
    o.add_argument("--keep-round-policies", action="store_true", default=None,
                   help="keep every round's weights (default: only the current policy's)")
    _add_template_options(o)
    _add_common(o)


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
    if not settings.get("processor"):
        _require(settings, "tokenizer", "--tokenizer PATH")
    result = prepare(args.raw, args.out, **settings)
    from prefdata.report.render_text import render_text

    print(render_text(result.report))
    print(f"wrote {result.out_dir}/ (report: {result.out_dir}/report.html, {result.out_dir}/report.md)")
    if result.problem:  # an empty result must not pass for a successful run
        print(f"prefdata prepare: error: {result.problem}", file=sys.stderr)
    return result.exit_code


def _run_validate(args: argparse.Namespace) -> int:
    from prefdata.validate.command import validate

    settings = _merged("validate", args, {"input"}, validate)
    result = validate(args.input, **settings)
    if result.problem:
        print(f"prefdata validate: error: {result.problem}", file=sys.stderr)
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


def _run_generate(args: argparse.Namespace) -> int:
    from prefdata.online.generate import generate

    settings = _merged("generate", args, {"prompts", "out"}, generate)
    _require(settings, "model", "--model POLICY")
    if settings.get("engine") == "vllm":
        from prefdata.online.vllm_engine import vllm_available

        reason = vllm_available()
        if reason is not None:
            raise PrefdataError(reason)
    print(generate(args.prompts, args.out, **settings).summary())
    return 0


def _run_score(args: argparse.Namespace) -> int:
    from prefdata.online.score import score

    settings = _merged("score", args, {"input"}, score)
    print(score(args.input, **settings).summary())
    return 0


def _run_online(args: argparse.Namespace) -> int:
    from prefdata.online.rounds import run_online

    settings = _merged("online", args, {"prompts"}, run_online)
    _require(settings, "model", "--model POLICY")
    _require(settings, "output", "--output DIR")
    if settings.get("engine") == "vllm":
        from prefdata.online.vllm_engine import vllm_available

        reason = vllm_available()
        if reason is not None:
            raise PrefdataError(reason)
    print(run_online(args.prompts, **settings).summary())
    return 0


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
    "generate": _run_generate,
    "score": _run_score,
    "online": _run_online,
}


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)  # argparse exits 2 with a one-line usage error itself
    except KeyboardInterrupt:  # Ctrl-C before any work began: the same one line and exit code as later
        print("prefdata: interrupted", file=sys.stderr)
        return 130
    if args.command is None:
        parser.print_help()
        return 2
    try:
        # --no-progress and non-TTY runs: no third-party bars or warnings either (PREFDATA_DEBUG keeps them).
        with quiet_libraries(wants_quiet(getattr(args, "progress", None))):
            code = COMMANDS[args.command](args)
        if argv is None:
            # The work is done and written: a Ctrl-C during the interpreter's shutdown must not turn
            # this exit code into "killed by SIGINT".
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        return code
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
