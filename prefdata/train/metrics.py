"""metrics.jsonl: per-pair sums that add up over micro-batches and ranks, and the logged lines."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from prefdata.model.losses import LossOutput
from prefdata.model.pairs import PairLogps

METRICS_FILE = "metrics.jsonl"


@dataclass
class TrainResult:
    output_dir: Path
    steps: int  # optimizer steps completed in total (including those before a resume)
    epochs: float
    metrics_path: Path
    last_metrics: dict[str, float] = field(default_factory=dict)  # the last logged train line
    eval_metrics: dict[str, float] | None = None
    stall_events: list[dict[str, Any]] = field(default_factory=list)
    resumed_from_step: int | None = None
    # The trained model itself, for a caller in the same process (online rounds sample from it next
    # instead of loading the saved copy again); not part of any report.
    model: Any = field(default=None, repr=False, compare=False)
    # The optimizer's and schedule's state dicts at the end, for a next call to continue in memory.
    optimizer_state: Any = field(default=None, repr=False, compare=False)

    def summary(self) -> str:
        """What the CLI prints at the end: where the model and metrics are, and how it went."""
        parts = [f"trained {self.steps} steps ({self.epochs:.2f} epochs)"]
        if self.resumed_from_step is not None:
            parts.append(f"resumed from step {self.resumed_from_step}")
        if self.last_metrics:
            parts.append(f"loss {self.last_metrics['loss']:.4f}, reward accuracy {self.last_metrics['rewards/accuracies']:.2f}")
        if self.eval_metrics:
            parts.append(f"eval loss {self.eval_metrics['eval/loss']:.4f}")
        if self.stall_events:
            parts.append(f"{len(self.stall_events)} stall warning(s)")
        return "; ".join(parts) + f"\nmodel: {self.output_dir}\nmetrics: {self.metrics_path}"


class Sums:
    """Per-pair sums that add up across micro-batches and ranks, then turn into TRL's means."""

    NAMES = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
             "logps/chosen", "logps/rejected", "abs_margin", "pairs", "tokens",
             "logit_sum/chosen", "logit_sum/rejected", "completion_tokens/chosen", "completion_tokens/rejected",
             "shared_pairs")
    SIZE = len(NAMES)
    INDEX: ClassVar[dict[str, int]] = {name: i for i, name in enumerate(NAMES)}
    PER_PAIR = NAMES[:8]  # averaged over pairs, as TRL logs them

    @staticmethod
    def of(out: LossOutput, logps: PairLogps, pair_tokens: int) -> torch.Tensor:
        """`pair_tokens`: prompt twice plus both completions per pair, TRL's token count, whatever
        the layout put through the model."""
        margins = out.chosen_rewards - out.rejected_rewards
        values = torch.stack([
            out.losses.detach().sum(), out.chosen_rewards.sum(), out.rejected_rewards.sum(),
            (margins > 0).float().sum(), margins.sum(), logps.chosen.detach().sum(), logps.rejected.detach().sum(),
            margins.abs().sum(),
        ]).double().cpu()
        counts = torch.stack([
            logps.chosen_logit_sums.sum(), logps.rejected_logit_sums.sum(),
            logps.chosen_counts.sum().float(), logps.rejected_counts.sum().float(),
        ]).double().cpu()
        extra = torch.tensor([float(len(logps.chosen)), float(pair_tokens)], dtype=torch.float64)
        return torch.cat([values, extra, counts, torch.tensor([float(logps.shared_pairs)], dtype=torch.float64)])

    @staticmethod
    def means(sums: torch.Tensor) -> dict[str, float]:
        """Per-pair means, and TRL's `logits/*`: the vocabulary-mean logit averaged over completion tokens."""
        at = Sums.INDEX
        pairs = max(float(sums[at["pairs"]]), 1.0)
        means = {name: float(sums[at[name]]) / pairs for name in Sums.PER_PAIR}
        for half in ("chosen", "rejected"):
            tokens = float(sums[at[f"completion_tokens/{half}"]])
            means[f"logits/{half}"] = float(sums[at[f"logit_sum/{half}"]]) / tokens if tokens > 0 else 0.0
        return means


class Window:
    """What happened since the last metrics line; `num_tokens` counts from step 0 of the run."""

    def __init__(self, num_tokens: int = 0) -> None:
        self.sums = torch.zeros(Sums.SIZE, dtype=torch.float64)
        self.seconds = 0.0
        self.grad_norm = 0.0
        self.lr = 0.0
        self.num_tokens = num_tokens

    def add(self, sums: torch.Tensor, grad_norm: float, lr: float, seconds: float) -> None:
        self.sums += sums
        self.seconds += seconds
        self.grad_norm, self.lr = grad_norm, lr
        self.num_tokens += int(sums[Sums.INDEX["tokens"]])

    def flush(self, step: int, epoch: float, elapsed_s: float) -> dict[str, float]:
        line: dict[str, Any] = {"step": step, "epoch": round(epoch, 6)}
        means = Sums.means(self.sums)
        line.update({k: v for k, v in means.items() if k != "abs_margin"})
        line["grad_norm"] = self.grad_norm
        line["lr"] = self.lr
        line["learning_rate"] = self.lr  # TRL's name
        line["num_tokens"] = self.num_tokens  # TRL's name: prompt + completion tokens of both halves, cumulative
        line["shared_pairs"] = int(self.sums[Sums.INDEX["shared_pairs"]])  # pairs whose prompt ran once
        tokens = float(self.sums[Sums.INDEX["tokens"]])
        line["tokens_per_s"] = tokens / self.seconds if self.seconds > 0 else 0.0
        line["elapsed_s"] = round(elapsed_s, 4)  # since this process entered the loop (resets on resume)
        self.__init__(self.num_tokens)
        return line


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=float) + "\n")


def truncate_metrics(path: Path, keep_through_step: int) -> None:
    """A fresh run starts an empty file; a resumed one drops lines logged after its checkpoint."""
    if keep_through_step == 0 or not path.exists():
        path.write_text("")
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= keep_through_step]
    path.write_text("".join(line + "\n" for line in kept))
