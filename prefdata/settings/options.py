"""The groups of flags several commands share (the chat template, tokenization, pairing, decontamination,
the engine, another trainer, sampling, reward), and the `--help` sections. A command's settings class
(prefdata.settings.commands) inherits the groups it takes, so a flag several commands have is written once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefdata.core.trainer_names import TRAINERS
from prefdata.sets.pairing import DEFAULT_TOP_K, STRATEGIES
from prefdata.settings.declare import Settings, setting
from prefdata.settings.flag_values import finite_float, non_negative_float, positive_int, positive_seconds
from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE

# `--help` sections, in the order they are shown.
IO, TOKENS, TEMPLATE, CHECKS, PAIRING, DECON, BALANCE = (
    "input and output", "tokenization", "chat template", "checks", "scored completions to pairs",
    "benchmark decontamination", "length balance")
MODEL, LOSS, OPTIM, SCHEDULE, SAMPLING, REWARD, ROUNDS, RUN = (
    "model", "loss", "optimization", "evaluation and checkpoints", "sampling", "reward", "rounds", "run")
SELECTION, LOSS_COLUMNS = "selection", "weights and offsets for the loss"
GROUP_ORDER = (IO, MODEL, TOKENS, TEMPLATE, CHECKS, PAIRING, DECON, BALANCE, SELECTION, LOSS_COLUMNS, SAMPLING, REWARD,
               ROUNDS, LOSS, OPTIM, SCHEDULE, RUN)
# `prefdata select`'s signals (prefdata.select.signals.SIGNALS; tests/select checks the two agree).
SIGNAL_NAMES = ("reward_margin", "reward_rejected", "implicit_margin", "implicit_margin_per_token", "rejected_length",
                "length_difference", "rip", "random", "on_policy")


@dataclass(kw_only=True)
class Progress(Settings):
    progress: bool = setting(True, "hide progress bars", group=RUN, flag="--no-progress", action="off")


@dataclass(kw_only=True)
class TemplateOptions(Settings):
    """How conversations render: the same flags on prepare, validate, generate and online."""

    template_kwargs: dict[str, Any] | list[str] | None = setting(
        None, "variables for the chat template, e.g. enable_thinking=false (values are JSON where they parse; "
        "repeatable); recorded in the manifest", group=TEMPLATE, metavar="NAME=VALUE[,...]", action="append")
    chat_template_file: str | Path | None = setting(
        None, "a Jinja chat template that replaces the tokenizer's, or a bundled one by name "
        "(deepseek-r1-keep-reasoning: R1's template keeping the last turn's reasoning; see docs/reasoning.md); "
        "recorded in the manifest", group=TEMPLATE, metavar="FILE")
    template_date: str | None = setting(
        DEFAULT_TEMPLATE_DATE, "the date templates print (strftime_now, date_string), pinned so OUT does not change "
        "with the day", group=TEMPLATE, metavar="YYYY-MM-DD")


@dataclass(kw_only=True)
class TokenizeOptions(TemplateOptions):
    """Truncation and rendering: prepare and validate."""

    max_length: int | None = setting(None, "max prompt+completion tokens per half", group=TOKENS, metavar="N",
                                     parse=positive_int)
    max_prompt_length: int | None = setting(None, "max prompt tokens (cut from the left)", group=TOKENS, metavar="N",
                                            parse=positive_int)
    chat_template: bool = setting(
        False, "render plain-string rows through the tokenizer's chat template (one user + one assistant turn)",
        group=TEMPLATE, action="on")
    train_turns: str = setting(
        "all", "in completions that hold turns the model did not write (agent trajectories with tool results, "
        "multi-turn transcripts): train every assistant turn after the split, or only the last; tool results, "
        "user turns and role headers stay in the sequence as context, out of the loss (chosen_loss_mask / "
        "rejected_loss_mask; refs and train honour them)", group=TOKENS, choices=("all", "last"))
    trust_remote_code: bool = setting(
        False, "allow tokenizer/model code from the model directory (off by default)", group=TOKENS, action="on")


@dataclass(kw_only=True)
class PairingOptions(Settings):
    """How records of scored completions become pairs: the same flags on prepare and validate."""

    pairing: str = setting(
        "best-worst", "scored completions -> pairs: best-worst (the best vs the worst), best-vs-random-lower "
        "(the best vs a random lower-scored one), all-pairs (every better/worse pair), top-k (the --top-k pairs "
        "with the widest score gaps), sweet-spot (the best vs the one scored nearest mean - 2 sd of the prompt's "
        "scores, arXiv 2502.16825; with few samples that is the worst); higher scores and lower ranks are better (rank 1 beats rank 2); tied scores "
        "are never paired; a prompt makes at most the check policy's max_pairs_per_record pairs (1000 in the default "
        "policy)",
        group=PAIRING, choices=STRATEGIES)
    pairing_seed: int = setting(0, "seed for the random picks of --pairing (the pairs do not depend on --workers or "
                                "--engine)", group=PAIRING, metavar="N", parse=int)
    min_score_margin: float = setting(
        0.0, "pair only completions whose scores differ by at least X (rank steps for ranks; 0: any strict "
        "difference)", group=PAIRING, metavar="X", parse=non_negative_float)
    rating: str = setting("mean", "completions with several ratings (UltraFeedback's annotations): their mean or the "
                          "one named, e.g. helpfulness or overall_score", group=PAIRING, metavar="mean|NAME")
    top_k: int = setting(DEFAULT_TOP_K, "pairs per prompt with --pairing top-k", group=PAIRING, metavar="K",
                         parse=positive_int)


@dataclass(kw_only=True)
class DecontaminateOptions(Settings):
    """Benchmark decontamination: the same flags on prepare and validate."""

    decontaminate_against: str | Path | list[str | Path] | None = setting(
        None, "benchmark files, directories or Hub ids (org/name:split) in any format prefdata reads; pairs whose "
        "prompt shares a run of N words with a benchmark item are flagged benchmark_overlap (default policy: drop; "
        "pr: error). The item's text is read from --decontaminate-field, else from the first of prompt, question, "
        "problem, instruction, input, text that it has, else from a preference row's prompt", group=DECON,
        metavar="PATH", action="many")
    decontaminate_field: str | list[str] | None = setting(
        None, "the benchmark field that holds the text, when it is none of the common ones (repeatable: each field "
        "is matched on its own)", group=DECON, metavar="NAME", action="append")
    decontaminate_ngram: int = setting(
        13, "words in a run (13 as lm-eval-harness and GPT-3); words are lowercased and stripped of punctuation; "
        "benchmark items of 8 to N-1 words are matched whole", group=DECON, metavar="N", parse=positive_int)
    decontaminate_completions: bool = setting(
        False, "also flag pairs whose chosen or rejected completion overlaps a benchmark item (e.g. a leaked answer)",
        group=DECON, action="on")


@dataclass(kw_only=True)
class EngineOptions(Settings):
    """Where the work runs: prepare and validate (refs declares its own)."""

    engine: str = setting("local", "where the work runs: worker processes here (local) or a Ray cluster", group=RUN,
                          choices=("local", "ray"))
    ray_address: str | None = setting(None, "Ray cluster to use with --engine ray", group=RUN, metavar="ADDR",
                                      default_text="RAY_ADDRESS, else a local Ray")


@dataclass(kw_only=True)
class TrainerOptions(Settings):
    """Another trainer's own preprocessing on the same rows (prefdata.trainers): prepare and validate."""

    trainer: str | None = setting(
        None, "also run each pair through this trainer's own preprocessing (its code, CPU only, no model; needs "
        "--tokenizer and the trainer installed) and check what it will train on; findings say `under <trainer>` "
        "with the setting that causes them and the one that avoids them (docs/trainers.md)", group=CHECKS,
        choices=TRAINERS)
    trainer_args: list[str] | None = setting(
        None, "a --trainer setting as given to that trainer, in its own names, e.g. OpenRLHF's data.max_len=1024, "
        "data.prompt_key=prompt, data.apply_chat_template (the trainer's defaults otherwise; docs/trainers.md "
        "lists each trainer's; repeatable)", group=CHECKS,
        flag="--trainer-arg", metavar="NAME[=VALUE]", action="append")
    trainer_python: str | None = setting(
        None, "the Python of the environment the trainer is installed in, for trainers whose pins differ from "
        "prefdata's (LLaMA-Factory, axolotl): their preprocessing runs there in a child process; default: the "
        "Python behind the trainer's command on PATH (llamafactory-cli, axolotl), else this one", group=CHECKS,
        metavar="PYTHON")


@dataclass(kw_only=True)
class GenerationOptions(Settings):
    """Sampling from a policy: generate and online."""

    samples: int = setting(2, "completions sampled per prompt", group=SAMPLING, metavar="K", parse=positive_int)
    max_new_tokens: int = setting(128, "token limit per completion", group=SAMPLING, metavar="N", parse=positive_int)
    temperature: float = setting(1.0, "sampling temperature; 0 is greedy", group=SAMPLING, metavar="T", parse=finite_float)
    top_p: float = setting(1.0, "nucleus sampling mass", group=SAMPLING, metavar="P", parse=finite_float)
    seed: int = setting(0, "sampling seed", group=SAMPLING, parse=int)
    batch_size: int = setting(8, "prompts per generate call, rows per reward-model batch", group=RUN, metavar="B",
                              parse=positive_int)
    engine: str = setting("transformers", "generation engine (vllm needs vLLM and a GPU)", group=RUN,
                          choices=("transformers", "vllm"))
    chat_template: bool = setting(False, "render string prompts through the policy's chat template (as prepare "
                                  "--chat-template)", group=TEMPLATE, action="on")
    device: str = setting("auto", "cpu, cuda or cuda:N; auto: cuda when available", group=RUN)
    trust_remote_code: bool = setting(False, "allow model code from the model directories", group=MODEL, action="on")


@dataclass(kw_only=True)
class RewardOptions(Settings):
    """What scores a completion: score and online."""

    reward_model: str | Path | None = setting(None, "sequence-classification reward model directory (1 output)",
                                              group=REWARD, metavar="RM", exclusive="reward")
    reward_fn: str | None = setting(None, "reward function f(prompts, completions, **kwargs) -> list[float]",
                                    group=REWARD, metavar="FILE.py:NAME", exclusive="reward")
    score_reasoning: bool = setting(
        False, "score the whole completion, reasoning included (default: the final answer, a leading "
        "<think>...</think> block removed)", group=REWARD, action="on")
    reward_timeout: float = setting(300.0, "seconds one --reward-fn call (or its import) may take before the run "
                                    "stops", group=REWARD, metavar="SECONDS", parse=positive_seconds)


# ---- the commands ---------------------------------------------------------------------------------
