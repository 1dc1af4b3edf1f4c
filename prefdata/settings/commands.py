"""Every command's settings, declared once: name (Python keyword and TOML key), type, default, help, flag.

The CLI (prefdata.cli), the config loader (prefdata.settings.config), `--help` and the docs' flag tables
(docs/cli.md, docs/commands.md's tables) are made from these classes. Each command's function takes the same
names as keywords, or the whole object as `settings=` (tests/settings/test_settings.py keeps both in step).

Shared groups of flags (the chat template, pairing, decontamination...) are small dataclasses that a
command's settings inherit (prefdata.settings.options), so a flag that several commands have is written
once; what a flag's text may be is prefdata.settings.flag_values. Defaults that live in
a heavy module (numpy, torch) are written here as literals; the signature test catches a drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefdata.core.trainer_names import EXPORT_TRAINERS
from prefdata.settings.declare import Settings, setting
from prefdata.settings.flag_values import (
    finite_float, line_ref, non_negative_int, offset_scale, OFFSET_SCALE_LIMIT, positive_int, share, share_or_count,
)
from prefdata.settings.options import (
    BALANCE, CHECKS, DecontaminateOptions, EngineOptions, GenerationOptions, IO, LOSS, LOSS_COLUMNS, MODEL,
    OPTIM, PairingOptions, Progress, REWARD, RewardOptions, ROUNDS, RUN, SCHEDULE, SELECTION, SIGNAL_NAMES,
    TEMPLATE, TemplateOptions, TokenizeOptions, TOKENS, TrainerOptions,
)
from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE


@dataclass(kw_only=True)
class PrepareSettings(Progress, TrainerOptions, EngineOptions, DecontaminateOptions, PairingOptions, TokenizeOptions):
    tokenizer: str | None = setting(None, "Hugging Face tokenizer directory", group=IO, metavar="PATH",
                                    required=True, exclusive="reader")
    processor: str | None = setting(
        None, "instead of --tokenizer, for image pairs: an AutoProcessor directory; its chat template renders the "
        "prompt, and each image placeholder is expanded exactly as the processor expands it (learned from the "
        "processor at start: <image> x N as LLaVA, <|vision_start|><|image_pad|>...<|vision_end|> with a "
        "size-dependent N as Qwen2-VL, fixed text around the run as Gemma 3); a processor whose layout changes with "
        "the image (Idefics3 / SmolVLM rows x cols tiles) gets each image's text as the processor builds it for that "
        "width x height, cached by size; one that neither rule reproduces exactly is refused. Needs Pillow only "
        "(prefdata[vision]): no torchvision, no video processor", group=IO, metavar="PATH", exclusive="reader")
    policy: str | Path | None = setting(None, "check policy: bundled `default` or `pr`, or a TOML file", group=CHECKS,
                                        metavar="NAME|FILE", default_text="default")
    loss_on: str = setting(
        "all", "all completion tokens in the loss, or only the answer: a leading reasoning block "
        "(<think>…</think>) stays in the sequence but out of the loss (refs and train honour it)", group=TOKENS,
        choices=("all", "answer"))
    balance_length: float | None = setting(
        None, "subsample the kept pairs so that chosen is the longer half (tokens, before truncation) in TARGET of "
        "them (0.5 when given without a value); the pairs removed go to dropped.jsonl flagged length_balance "
        "(seeded by --seed; they do not count toward max_dropped_share). Give it after RAW OUT, or with a value",
        group=BALANCE, metavar="TARGET", parse=share, action="optional-value", const=0.5, default_text="off")
    seed: int | None = setting(None, "seed of --balance-length's subsample", group=BALANCE, parse=int,
                               default_text="the mix file's seed, else 0")
    overwrite: bool = setting(False, "replace an existing OUT written by prefdata", group=IO, action="on")
    allowed_image_root: str | Path | list[str | Path] | None = setting(
        None, "a directory image paths in the rows may also lead into (repeatable; default: none, only the input "
        "file's directory; a path that leaves them, by an absolute path, .. or a symlink, is quarantined unread)", group=IO,
        metavar="DIR", action="append")
    batch_size: int = setting(1000, "records per processing batch", group=RUN, metavar="N", parse=positive_int)
    workers: int | None = setting(None, "processes that tokenize (with --engine ray: Ray actors)", group=RUN,
                                  metavar="N", parse=positive_int,
                                  default_text="all cores, at most 8 (one for a single file of at most 256 KiB); with --engine ray one per cluster CPU")


@dataclass(kw_only=True)
class ValidateSettings(Progress, TrainerOptions, EngineOptions, DecontaminateOptions, PairingOptions, TokenizeOptions):
    tokenizer: str | None = setting(None, "also run token-level checks (after truncation)", group=IO, metavar="PATH",
                                    exclusive="reader")
    processor: str | None = setting(
        None, "instead of --tokenizer, for image pairs: an AutoProcessor directory; counts each image's tokens as "
        "prepare --processor does (lengths, image_truncated, tokens per image); without it image placeholders are "
        "only counted against the images (needs Pillow: prefdata[vision])", group=IO, metavar="PATH", exclusive="reader")
    policy: str | Path | None = setting(None, "check policy: bundled `default` or `pr` (strict, for PRs), or a TOML "
                                        "file", group=CHECKS, metavar="NAME|FILE", default_text="default")
    format: str = setting("text", "report format", group=IO, choices=("text", "json", "markdown", "github", "html"))
    output: str | Path | None = setting(None, "write the report here instead of stdout (this flag only: a settings file "
                                        "cannot choose where validate writes)", group=IO, metavar="FILE")
    trust_remote_code: bool = setting(
        False, "allow tokenizer/processor code from its directory (off by default; this flag only: a settings file, "
        "which a pull request can change, cannot turn it on)", group=TOKENS, action="on")
    baseline: str | Path | None = setting(None, "report from the base branch: only regressions fail", group=CHECKS,
                                          metavar="REPORT.json")
    against: str | Path | None = setting(None, "flag prompts that also occur in OTHER (e.g. the eval split)",
                                         group=CHECKS, metavar="OTHER")
    allowed_image_root: str | Path | list[str | Path] | None = setting(
        None, "a directory image paths in the rows may also lead into (repeatable; default: none, only the input "
        "file's directory; a path that leaves them, by an absolute path, .. or a symlink, is quarantined unread). Only this flag counts for validate: a settings file in the checked "
        "repository (which a pull request can change) cannot widen it", group=IO, metavar="DIR", action="append")
    template_date: str | None = setting(
        None, "the date templates print (strftime_now, date_string), pinned so OUT does not change with the day",
        group=TEMPLATE, metavar="YYYY-MM-DD", default_text=DEFAULT_TEMPLATE_DATE)
    batch_size: int = setting(1000, "records per processing batch", group=RUN, flag=False, parse=positive_int)
    workers: int | None = setting(None, "processes that check raw input (with --engine ray: Ray actors)", group=RUN,
                                  metavar="N", parse=positive_int,
                                  default_text="all cores, at most 8 (one for a single file of at most 256 KiB)")


@dataclass(kw_only=True)
class RefsSettings(Progress):
    routed = frozenset({"engine", "ray_address", "workers"})  # the CLI runs compute_refs_on_ray with these
    python_only = frozenset({"rank", "world_size", "loaded_model"})

    model: str | None = setting(None, "reference model directory", group=MODEL, metavar="PATH", required=True)
    processor: str | None = setting(
        None, "image OUTs (prepared with --processor): the AutoProcessor directory whose image processor makes the "
        "pixel values; must be the one OUT was prepared with", group=MODEL, metavar="DIR",
        default_text="--model when it holds processor files, else the manifest's")
    device: str = setting("auto", "auto: cuda when available", group=RUN, choices=("auto", "cpu", "cuda"))
    dtype: str = setting("auto", "auto: bf16 on GPU, fp32 on CPU", group=MODEL, choices=("auto", "float32", "bfloat16"))
    batch_tokens: int = setting(16384, "token budget per forward batch", group=RUN, metavar="N", parse=positive_int)
    trust_remote_code: bool = setting(False, "allow model code from the model directory", group=MODEL, action="on")
    recompute: bool = setting(
        False, "compute the refs again even when OUT already holds them from this model, dtype and device type "
        "(otherwise such a rerun says so and stops, exit 0)", group=IO, action="on")
    resume: bool = setting(True, "continue from the finished shards of a killed run", group=RUN, flag=False)
    layout: str = setting("auto", "how pairs are laid out in a forward (auto, packed, padded)", group=RUN, flag=False)
    shard_batches: int = setting(8, "batches per resumable shard", group=RUN, flag=False, parse=positive_int)
    workers: int | None = setting(None, "with --engine ray: model actors", group=RUN, metavar="N", parse=positive_int,
                                  default_text="one per GPU, else one per CPU")
    engine: str = setting("local", "where the work runs: this process (local) or a Ray cluster", group=RUN,
                          choices=("local", "ray"))
    ray_address: str | None = setting(None, "Ray cluster to use with --engine ray", group=RUN, metavar="ADDR",
                                      default_text="RAY_ADDRESS, else a local Ray")


@dataclass(kw_only=True)
class TrainSettings(Progress):
    python_only = frozenset({"loaded_policy", "loaded_optimizer"})

    model: str | Path | None = setting(None, "policy model to start from", group=MODEL, metavar="PATH", required=True)
    processor: str | Path | None = setting(
        None, "image OUTs (prepared with --processor): the AutoProcessor directory whose image processor makes the "
        "pixel values; must be the one OUT was prepared with; saved with the trained model", group=MODEL,
        metavar="DIR", default_text="--model when it holds processor files, else the manifest's")
    output: str | Path | None = setting(None, "where checkpoints, metrics.jsonl and the final model go", group=IO,
                                        metavar="DIR", required=True)
    loss: str = setting("sigmoid", "preference loss (sigmoid: DPO); simpo needs no reference log-probs", group=LOSS,
                        choices=("sigmoid", "ipo", "hinge", "robust", "simpo"))
    beta: float = setting(0.1, "strength of the implicit KL penalty / reward scale", group=LOSS, parse=finite_float)
    label_smoothing: float = setting(0.0, "assumed share of flipped labels, sigmoid/robust loss", group=LOSS,
                                     parse=finite_float)
    lr: float = setting(5e-6, "peak learning rate of AdamW", group=OPTIM, parse=finite_float)
    epochs: int = setting(1, "passes over the data", group=OPTIM, metavar="N", parse=positive_int, exclusive="length")
    max_steps: int | None = setting(None, "stop after N optimizer steps instead of --epochs", group=OPTIM,
                                    metavar="N", parse=positive_int, exclusive="length")
    batch_tokens: int | None = setting(None, "token budget per micro-batch (instead of --batch-pairs)", group=OPTIM,
                                       metavar="N", parse=positive_int, exclusive="size")
    batch_pairs: int = setting(8, "pairs per micro-batch, per rank under torchrun (as TRL's per_device_train_batch_size)",
                               group=OPTIM, metavar="N", parse=positive_int, exclusive="size")
    grad_accum: int = setting(1, "micro-batches per optimizer step", group=OPTIM, metavar="N", parse=positive_int)
    eval_dir: str | Path | None = setting(None, "a prepared eval split to evaluate on", group=SCHEDULE, flag="--eval",
                                          metavar="OUT_EVAL")
    # 0 as train(eval_every=0) always took it: no evaluation between steps (the loop evaluates when eval_every is truthy)
    eval_every: int | None = setting(None, "also evaluate every N steps; 0: only at the end", group=SCHEDULE, metavar="N",
                                     parse=non_negative_int)
    simpo_gamma: float = setting(0.5, "SimPO target margin", group=LOSS, parse=finite_float)
    ld_alpha: float | None = setting(
        None, "length-desensitized DPO (LD-DPO, TRL's ld_alpha), in [0, 1]: the log-probs of each half's tokens "
        "beyond the shorter half's length count ALPHA times, in the policy's and the reference's sums (1 is plain "
        "DPO, 0 ignores the extra length); needs refs from this prefdata version; not with simpo", group=LOSS,
        metavar="ALPHA", parse=finite_float, default_text="off")
    warmup_ratio: float = setting(0.1, "share of steps for linear warmup", group=OPTIM, parse=finite_float)
    lr_schedule: str = setting("cosine", "learning rate after warmup: cosine or linear decay to 0 at the last step, "
                               "or constant", group=OPTIM, choices=("cosine", "linear", "constant"))
    max_grad_norm: float | None = setting(1.0, "gradient clipping norm", group=OPTIM, parse=finite_float)
    # 0 as train(save_every=0) always took it: no periodic checkpoints (the loop saves when save_every is truthy)
    save_every: int | None = setting(500, "checkpoint every N steps; 0: none (the final model is still saved)",
                                     group=SCHEDULE, metavar="N", parse=non_negative_int)
    stall_steps: int = setting(20, "steps at ln 2 before the stall warning", group=SCHEDULE, metavar="N",
                               parse=positive_int)
    seed: int = setting(0, "seed for shuffling and initialization", group=RUN, parse=int)
    shuffle: bool = setting(True, "keep the data order instead of a seeded shuffle per epoch", group=RUN,
                            flag="--no-shuffle", action="off")
    resume: bool = setting(False, "continue from the last checkpoint in --output", group=SCHEDULE, action="on")
    overwrite: bool = setting(False, "replace the run already in --output", group=IO, action="on")
    fail_on_stall: bool = setting(False, "exit 1 when the loss stalls at ln 2", group=SCHEDULE, action="on")
    device: str = setting("auto", "cpu, cuda or cuda:N; auto: cuda when available", group=RUN)
    lora: bool = setting(False, "train LoRA adapters (needs the `lora` extra: peft)", group=MODEL, action="on")
    trust_remote_code: bool = setting(False, "allow model code from the model directory (off by default)",
                                      group=MODEL, action="on")
    log_every: int = setting(1, "steps between metrics.jsonl lines", group=SCHEDULE, flag=False, parse=positive_int)
    layout: str = setting("auto", "how pairs are laid out in a forward (auto, packed, padded)", group=RUN, flag=False)
    schedule_steps: int | None = setting(None, "the steps the learning-rate schedule spans (online: the whole run)",
                                         group=OPTIM, flag=False, parse=positive_int)
    optimizer_from: str | Path | None = setting(None, "a saved optimizer state to continue from (online rounds)",
                                                group=OPTIM, flag=False)
    save_optimizer: bool = setting(False, "save the optimizer state with the model (online rounds)", group=OPTIM,
                                   flag=False)
    save_model: bool = setting(True, "save the final model (online rounds between checkpoints keep it in memory)",
                               group=IO, flag=False)


@dataclass(kw_only=True)
class GenerateSettings(Progress, TemplateOptions, GenerationOptions):
    model: str | Path | None = setting(None, "policy model directory", group=MODEL, metavar="POLICY", required=True)
    overwrite: bool = setting(False, "replace an existing OUT/generations.jsonl", group=IO, action="on")


@dataclass(kw_only=True)
class ScoreSettings(Progress, RewardOptions):
    output: str | Path | None = setting(None, "scored rows", group=IO, metavar="FILE",
                                        default_text="generations in place, else INPUT.scored.jsonl")
    pairs: str | Path | None = setting(None, "where generation pairs go", group=IO, metavar="FILE",
                                       default_text="pairs.jsonl beside INPUT")
    batch_size: int = setting(8, "rows per reward-model batch", group=RUN, metavar="B", parse=positive_int)
    missing_eos_penalty: float | None = setting(
        None, "subtract X from the reward of an unfinished sample before pairing (TRL's missing_eos_penalty)",
        group=REWARD, metavar="X", parse=finite_float)
    device: str = setting("auto", "cpu, cuda or cuda:N; auto: cuda when available", group=RUN)
    trust_remote_code: bool = setting(False, "allow model code from the reward model directory", group=MODEL,
                                      action="on")


@dataclass(kw_only=True)
class OnlineSettings(Progress, TemplateOptions, GenerationOptions, RewardOptions):
    model: str | Path | None = setting(None, "starting policy directory", group=MODEL, metavar="POLICY", required=True)
    output: str | Path | None = setting(None, "run directory: round-<r>/, rounds.jsonl, policy/", group=IO,
                                        metavar="DIR", required=True)
    rounds: int | None = setting(None, "rounds to run (the prompt file wraps around)", group=ROUNDS, metavar="R",
                                 parse=positive_int, default_text="one pass over the prompts")
    prompts_per_round: int | None = setting(
        None, "fresh prompts sampled per round; more than --batch-pairs is semi-online: several steps on one "
        "sampling, cheaper per prompt, but at a high learning rate it learns less than TRL (docs/online.md)",
        group=ROUNDS, metavar="N", parse=positive_int,
        default_text="--batch-pairs: fully online, a fresh sampling before every optimizer step, as TRL's OnlineDPOTrainer")
    ref_model: str | Path | None = setting(None, "reference model", group=MODEL, metavar="M",
                                           default_text="the starting policy")
    max_length: int | None = setting(None, "max prompt+completion tokens per half when preparing", group=TOKENS,
                                     metavar="N", parse=positive_int)
    max_prompt_length: int | None = setting(None, "max prompt tokens when preparing", group=TOKENS, metavar="N",
                                            parse=positive_int)
    policy: str | Path | None = setting(None, "check policy: bundled `default` or `pr`, or a TOML file", group=CHECKS,
                                        metavar="NAME|FILE", default_text="default")
    loss: str = setting("sigmoid", "preference loss", group=LOSS, choices=("sigmoid", "ipo", "hinge", "robust"))
    beta: float = setting(0.1, "DPO beta", group=LOSS, parse=finite_float)
    lr: float = setting(5e-6, "peak learning rate", group=OPTIM, parse=finite_float)
    lr_schedule: str = setting(
        "cosine", "one schedule over the whole run, not per round: one optimizer (AdamW) continues from round to "
        "round, as in TRL's OnlineDPOTrainer; the rate decays to 0 at the run's planned last step (rounds x epochs x "
        "ceil(prompts-per-round / batch-pairs))", group=OPTIM, choices=("cosine", "linear", "constant"))
    epochs: int = setting(1, "passes over each round's pairs before sampling again (TRL: one pass)", group=OPTIM,
                          parse=positive_int)
    batch_pairs: int = setting(
        8, "pairs per optimizer step (TRL's per_device_train_batch_size). A round of N prompts takes "
        "ceil(N / batch-pairs) steps per epoch: N = batch-pairs is fully online (a step per sampling)", group=OPTIM,
        metavar="N", parse=positive_int)
    warmup_ratio: float = setting(0.0, "share of the run's planned steps for linear warmup", group=OPTIM, parse=finite_float)
    missing_eos_penalty: float | None = setting(
        None, "subtract X from the reward of a sample that hit --max-new-tokens before pairing (TRL's "
        "missing_eos_penalty). To drop such pairs instead: completion_truncated = \"drop\" in the check policy",
        group=REWARD, metavar="X", parse=finite_float, default_text="none")
    keep_round_policies: bool = setting(False, "keep every round's weights (default: only the current policy's)",
                                        group=IO, action="on")
    save_every: int | None = setting(
        None, "write the policy and optimizer to disk every R rounds (a checkpoint a rerun continues from); between "
        "checkpoints they stay in memory. The last round is always saved", group=IO, metavar="R", parse=positive_int,
        default_text="about every 64 prompts: ceil(64 / prompts-per-round)")


@dataclass(kw_only=True)
class ShowSettings(Progress):
    routed = frozenset({"progress"})  # show prints one row: no progress bar to hide

    row: int | None = setting(None, "row index in the dataset", group=IO, parse=int, default_text="0")
    line: int | str | None = setting(
        None, "find the row by its source line instead: N, or FILE:N (as reports print it) when several input "
        "files have a line N", group=IO, metavar="[FILE:]N", parse=line_ref)


@dataclass(kw_only=True)
class SelectSettings(Progress):
    by: str | None = setting(
        None, "the signal that orders the pairs (formulas: docs/select.md); random (seeded by --seed) is the honest "
        "baseline; rip is RIP's three filters as one number", group=SELECTION, choices=SIGNAL_NAMES, metavar="SIGNAL",
        required=True)
    keep: float | int | str | None = setting(
        None, "the budget: a share of OUT's pairs (0.3) or a number of pairs (300), the highest signals first",
        group=SELECTION, metavar="SHARE|N", parse=share_or_count, default_text="every pair within --min/--max")
    min_signal: float | None = setting(None, "keep only pairs whose signal is at least X", group=SELECTION,
                                       flag="--min", metavar="X", parse=finite_float)
    max_signal: float | None = setting(None, "keep only pairs whose signal is at most X", group=SELECTION,
                                       flag="--max", metavar="X", parse=finite_float)
    lowest: bool = setting(False, "the budget takes the lowest signals first (e.g. --by rejected_length for short "
                           "rejected halves)", group=SELECTION, action="on")
    seed: int = setting(0, "seed of --by random", group=SELECTION, parse=int)
    weight_by: str | None = setting(
        None, "add a `weight` column: each kept pair's percentile of this signal among the kept pairs, in (0, 1); "
        "`prefdata train` weighs the loss by it", group=LOSS_COLUMNS, choices=SIGNAL_NAMES)
    offset_by: str | None = setting(
        None, "add an `offset` column (ODPO's margin): --offset-scale x this signal; `prefdata train` and the TRL "
        "hand-off subtract it from the loss's logit", group=LOSS_COLUMNS, choices=SIGNAL_NAMES)
    offset_scale: float = setting(1.0, f"the factor of --offset-by, |A| <= {OFFSET_SCALE_LIMIT:g} (offsets are float32)",
                                  group=LOSS_COLUMNS, metavar="A", parse=offset_scale)
    policy_model: str | Path | None = setting(
        None, "the policy whose likelihood --by/--weight-by/--offset-by on_policy measures (one forward per pair, as "
        "refs runs it); its tokenizer must be OUT's", group=SELECTION, metavar="PATH")
    device: str = setting("auto", "where the on_policy pass runs; auto: cuda when available", group=RUN,
                          choices=("auto", "cpu", "cuda"))
    overwrite: bool = setting(False, "replace an existing NEW written by prefdata", group=IO, action="on")


@dataclass(kw_only=True)
class ExportSettings(Settings):
    trainer: str | None = setting(
        None, "the trainer whose input format DIR gets: openrlhf writes train.jsonl (prompt/chosen/rejected, "
        "message lists where OUT's rows are conversations) and openrlhf_args.txt, the --data.* flags its "
        "train_dpo.py needs; llamafactory writes a dataset_dir: prefdata_dpo.jsonl, dataset_info.json (ranking: "
        "true) and llamafactory.yaml, the config lines (docs/trainers.md)", group=IO, choices=EXPORT_TRAINERS,
        metavar="TRAINER",
        required=True)
    trainer_args: list[str] | None = setting(
        None, "a setting as given to that trainer, for its flags: data.max_len=N (default OUT's --max-length, "
        "else OpenRLHF's 512), data.tokenizer_chat_template=JINJA; the keys and the template switch follow "
        "from OUT; LLaMA-Factory's template=NAME, cutoff_len=N (repeatable)", group=IO, flag="--trainer-arg", metavar="NAME=VALUE", action="append")
    overwrite: bool = setting(False, "replace an existing DIR written by prefdata", group=IO, action="on")


@dataclass(frozen=True)
class Positional:
    name: str
    metavar: str
    help: str


@dataclass(frozen=True)
class Command:
    """A command as the CLI and the docs show it."""

    name: str
    help: str
    description: str
    positionals: tuple[Positional, ...]
    settings: type
    function: str  # "module:name" of the Python function that runs it (imported only when it runs)
    examples: tuple[str, ...] = ()


_RAW = Positional("raw", "RAW", "a .jsonl/.jsonl.gz/.json/.parquet file, a directory of them, a save_to_disk "
                  "dataset, a Hub dataset id with a split (org/name:split, streamed), or a mix file (mix.toml: "
                  "[[source]] tables with path and weight or rows, and a seed; see docs/building.md, 'Mixing sources')")
_PREPARED = Positional("out", "OUT", "a directory written by `prefdata prepare`")

COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("prepare", "read raw pairs, tokenize, check, write an Arrow dataset to OUT/",
            "Read any common preference format, tokenize with the model's chat template, truncate, flag and drop bad "
            "pairs, and write OUT/ (datasets.load_from_disk-able Arrow dataset, manifest.json, dropped.jsonl, "
            "quarantine.jsonl, report.json/.md/.html).",
            (_RAW, Positional("out", "OUT", "output directory (must not exist unless --overwrite)")), PrepareSettings,
            "prefdata.prepare:prepare",
            ("prefdata prepare data/train.jsonl out/ --tokenizer path/to/tokenizer --max-length 2048 "
             "--max-prompt-length 1024",
             "prefdata prepare mix.toml out/ --tokenizer path/to/tokenizer --balance-length 0.5")),
    Command("validate", "run the checks and report; exit 1 on findings at error severity",
            "Run prefdata's checks on a raw file/directory or a prepared OUT/ and report. Writes nothing but --output.",
            (Positional("input", "INPUT", "raw file/directory, a mix file (mix.toml, the records prepare would "
                        "sample), or a prepared OUT/"),), ValidateSettings, "prefdata.validate.command:validate",
            ("prefdata validate data/train.jsonl --tokenizer path/to/tokenizer --max-length 2048",
             "prefdata validate data/ --policy pr --format github --baseline base-report.json")),
    Command("refs", "precompute reference-model log-probs into OUT/",
            "Add ref_chosen_logps / ref_rejected_logps (and completion token counts) to a prepared OUT/.",
            (_PREPARED,), RefsSettings, "prefdata.refs:compute_refs",
            ("prefdata refs out/ --model path/to/reference-model",
             "torchrun --nproc-per-node 8 -m prefdata refs out/ --model path/to/reference-model")),
    Command("select", "keep the pairs that teach: by a signal and a budget, into a new OUT",
            "Order OUT's pairs by a signal (reward margin, the reference's implicit margin, lengths, RIP, how likely a "
            "policy is to write them, random), keep "
            "a budget and/or a range, and write NEW: a full OUT whose dropped.jsonl has every pair left out as "
            "not_selected with its signal's value, and whose report shows what the selection did. Optionally adds "
            "weight and offset columns that train applies.",
            (_PREPARED, Positional("new", "NEW", "output directory (must not exist unless --overwrite)")),
            SelectSettings, "prefdata.select:select_pairs",
            ("prefdata select out/ out-top30/ --by reward_margin --keep 0.3",
             "prefdata select out/ out-random30/ --by random --seed 1 --keep 0.3",
             "prefdata select out/ out-weighted/ --by reward_margin --keep 1.0 --weight-by reward_margin")),
    Command("export", "write OUT's kept pairs in another trainer's input format, with the flags it needs",
            "Write OUT's dataset rows (never its dropped or quarantined records), in order, as the trainer's native "
            "input: for OpenRLHF, DIR/train.jsonl with prompt/chosen/rejected (message lists for conversations, "
            "rendered by its --data.apply_chat_template), source_file/source_line and OUT's ref_chosen_logps/"
            "ref_rejected_logps where present, and DIR/openrlhf_args.txt with train_dpo.py's --data.* flags. "
            "OpenRLHF's DPO computes reference log-probs with a live reference model and cannot read precomputed "
            "ones: the ref columns pass through for other tools. For LLaMA-Factory, DIR is a dataset_dir: "
            "prefdata_dpo.jsonl (alpaca strings or sharegpt conversations), dataset_info.json with its ranking "
            "entry, and llamafactory.yaml with the config lines; it cannot read precomputed reference log-probs "
            "either (precompute_ref_log_probs is False).",
            (_PREPARED, Positional("dir", "DIR", "output directory (must not exist unless --overwrite; not inside "
                                   "OUT)")), ExportSettings, "prefdata.trainers.export:export_for_trainer",
            ("prefdata export out/ openrlhf-data/ --trainer openrlhf --trainer-arg data.max_len=1024",)),
    Command("train", "train a policy with DPO on OUT/ using its precomputed reference log-probs",
            "A lean DPO trainer: no reference model in memory; metrics.jsonl with TRL's metric names.",
            (Positional("out", "OUT", "a prepared OUT/ (with `prefdata refs` columns unless --loss simpo)"),),
            TrainSettings, "prefdata.train.recipe:train",
            ("prefdata train out/ --model path/to/policy --output ckpt/ --beta 0.1 --lr 5e-7 --batch-pairs 8",)),
    Command("generate", "sample K completions per prompt from a policy into OUT/generations.jsonl",
            "Batched sampling (KV cache, left padding) with the prompt rendered as prepare renders it; one JSONL line "
            "per sample with prompt, completion, sample, source_file, source_line, finished.",
            (Positional("prompts", "PROMPTS", "prompt-only rows ({\"prompt\": ...}) or preference data in any shape "
                        "prepare reads"),
             Positional("out", "OUT", "output directory (generations.jsonl goes there)")), GenerateSettings,
            "prefdata.online.generate:generate",
            ("prefdata generate prompts.jsonl gen/ --model POLICY --samples 4 --max-new-tokens 256",)),
    Command("score", "reward generations (then pair best vs worst) or add reward columns to preference data",
            "Generations get a `reward` per sample and pairs.jsonl (highest vs lowest reward per prompt); an offline "
            "preference file gets reward_chosen/reward_rejected (validate then flags reward_disagrees).",
            (Positional("input", "INPUT", "generations.jsonl from `prefdata generate`, or a preference "
                        "file/directory"),), ScoreSettings, "prefdata.online.score:score",
            ("prefdata score gen/generations.jsonl --reward-model RM",)),
    Command("online", "online DPO: rounds of generate -> score -> prepare -> refs -> train",
            "Each round samples from the current policy on fresh prompts, pairs best vs worst reward, checks the pairs "
            "like any prepared data, computes reference log-probs and trains one round. A rerun continues after the "
            "last finished round.",
            (Positional("prompts", "PROMPTS", "prompt-only rows or preference data in any shape prepare reads"),),
            OnlineSettings, "prefdata.online.rounds:run_online",
            ("prefdata online prompts.jsonl --model POLICY --reward-fn rules.py:my_reward --output run/ --rounds 10",)),
    Command("show", "print one row of OUT/ with its loss masks made visible",
            "Print a prepared row: prompt tokens, and per half the tokens the loss sees.", (_PREPARED,),
            ShowSettings, "prefdata.show:show_row", ("prefdata show out/ --row 0",)),
)}
