"""Benchmark: does `prefdata select` choose pairs that teach? A learning case with a known truth.

The task (built in code, no download): conversational prompts, answers of random corpus words, and a
true preference = prefdata.tiny.learning_case's rule reward (the answer's share of letters a to m).
The *given* scores are that reward plus Gaussian noise, calibrated so that about `--misordered` (30%)
of the training pairs are ordered against the truth, as real reward labels are. Each training pair
takes its chosen/rejected order from the given scores; the held-out pairs are clean (true order,
true gap >= 0.05).

Per seed (the data, the noise, the policy's initialization, the shuffle and the random subset all
follow the seed): `prefdata prepare` + `refs` on the training pairs and the held-out pairs, then
`prefdata train` from the same tiny random Llama policy (6k vocabulary), the same lr, beta, batch
size and number of epochs, on

- all:       every pair;
- top:       `select --by reward_margin --keep 0.3` (the widest given-score margins);
- random:    `select --by random --seed S --keep 0.3` (the honest baseline);
- weighted:  every pair, `select --keep 1.0 --weight-by reward_margin` (loss weights = margin percentile).

Printed: each run's held-out implicit-reward accuracy on the clean pairs (share of pairs whose
policy/reference log-ratio is higher for the truly better answer), and per run kind the mean and the
spread (sample standard deviation) over the seeds.

    python bench/bench_select.py                       # 3 seeds, 1500 training pairs, 400 held out
    python bench/bench_select.py --seeds 0 1 2 3 4 --pairs 1500 --epochs 1 --lr 5e-3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RUNS = ("all", "top", "random", "weighted")


def _answers(rng: random.Random, words: list[str], n: int) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))) for _ in range(n)]


def _true_reward(text: str) -> float:
    from prefdata.tiny.learning_case import first_half_share

    return first_half_share([""], [text])[0]


def _noise_for(gaps: list[float], share: float, rng: random.Random) -> float:
    """The noise sd whose N(0, sd) per score misorders `share` of pairs with true gaps `gaps` (by bisection
    on a fixed draw, so the share is met on these very pairs)."""
    draws = [(rng.gauss(0, 1), rng.gauss(0, 1)) for _ in gaps]

    def misordered(sd: float) -> float:
        return sum((g + sd * (a - b)) * g < 0 for g, (a, b) in zip(gaps, draws)) / len(gaps)

    lo, hi = 0.0, 10.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if misordered(mid) < share else (lo, mid)
    return (lo + hi) / 2


def write_case(work: Path, seed: int, pairs: int, held_out: int, misordered: float) -> dict[str, float]:
    """train.jsonl (noisy given scores as reward_chosen/reward_rejected) and eval.jsonl (clean pairs)."""
    from prefdata.tiny.learning_case import TOPICS, _corpus

    rng = random.Random(seed)
    words = sorted({w.strip(".?!,").lower() for line in _corpus(seed + 7, 8000) for w in line.split()})

    def prompt(i: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Question {i}: tell me about {TOPICS[i % len(TOPICS)]}."}]

    raw = []
    for i in range(pairs):
        a, b = _answers(rng, words, 2)
        raw.append((i, a, b, _true_reward(a), _true_reward(b)))
    sd = _noise_for([ra - rb for _, _, _, ra, rb in raw], misordered, random.Random(seed + 1))
    noise = random.Random(seed + 1)
    rows, wrong = [], 0
    for i, a, b, ra, rb in raw:
        sa, sb = ra + sd * noise.gauss(0, 1), rb + sd * noise.gauss(0, 1)
        if sa == sb:
            sb -= 1e-9
        chosen, rejected, sc, sr, tc, tr = (a, b, sa, sb, ra, rb) if sa > sb else (b, a, sb, sa, rb, ra)
        wrong += tc < tr
        rows.append({"prompt": prompt(i), "chosen": [{"role": "assistant", "content": chosen}],
                     "rejected": [{"role": "assistant", "content": rejected}],
                     "reward_chosen": round(sc, 6), "reward_rejected": round(sr, 6)})
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    clean = []
    while len(clean) < held_out:
        a, b = _answers(rng, words, 2)
        ra, rb = _true_reward(a), _true_reward(b)
        if abs(ra - rb) < 0.05:
            continue
        good, bad = (a, b) if ra > rb else (b, a)
        clean.append({"prompt": prompt(pairs + len(clean)), "chosen": [{"role": "assistant", "content": good}],
                      "rejected": [{"role": "assistant", "content": bad}]})
    (work / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in clean), encoding="utf-8")
    return {"noise_sd": sd, "misordered": wrong / pairs}


def run_seed(work: Path, seed: int, args: argparse.Namespace) -> dict[str, float]:
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs
    from prefdata.select import select_pairs
    from prefdata.tiny.learning_case import build_case_tokenizer
    from prefdata.tiny.text import build_tiny_model
    from prefdata.train.recipe import train

    work.mkdir(parents=True)
    case = write_case(work, seed, args.pairs, args.held_out, args.misordered)
    build_case_tokenizer(work / "tokenizer", seed=0)
    build_tiny_model(work / "policy", tokenizer_dir=work / "tokenizer", architecture="llama",
                     hidden_size=args.hidden, num_layers=args.layers, seed=seed)
    quiet = dict(progress=False)
    for split in ("train", "eval"):
        prepare(work / f"{split}.jsonl", work / split, tokenizer=str(work / "policy"), workers=1, **quiet)
        compute_refs(work / split, str(work / "policy"), device="cpu", dtype="float32", **quiet)
    variants = {
        "all": work / "train",
        "top": dict(by="reward_margin", keep=args.keep),
        "random": dict(by="random", seed=seed, keep=args.keep),
        "weighted": dict(by="reward_margin", keep=1.0, weight_by="reward_margin"),
    }
    accuracy = {"misordered": case["misordered"]}
    for name in RUNS:
        data = variants[name]
        if isinstance(data, dict):
            select_pairs(work / "train", work / f"sel-{name}", **data, **quiet)
            data = work / f"sel-{name}"
        result = train(data, model=str(work / "policy"), output=work / f"run-{name}", eval_dir=work / "eval",
                       lr=args.lr, beta=args.beta, epochs=args.epochs, batch_pairs=args.batch_pairs, seed=seed,
                       warmup_ratio=0.1, save_every=None, device="cpu", **quiet)
        accuracy[name] = result.eval_metrics["eval/rewards/accuracies"]
    return accuracy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pairs", type=int, default=1500)
    parser.add_argument("--held-out", type=int, default=400)
    parser.add_argument("--misordered", type=float, default=0.3,
                        help="share of training pairs ordered against the truth")
    parser.add_argument("--keep", type=float, default=0.3)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-pairs", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args(argv)

    from prefdata.core.quiet import quiet_libraries

    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp, quiet_libraries(True):
        root = args.work or Path(tmp)
        for seed in args.seeds:
            results.append(run_seed(root / f"seed-{seed}", seed, args))
            row = results[-1]
            print(f"seed {seed}: misordered {row['misordered']:.1%}  " + "  ".join(f"{k} {row[k]:.3f}" for k in RUNS),
                  flush=True)
    print(f"\nheld-out implicit-reward accuracy on clean pairs ({args.pairs} training pairs, ~{args.misordered:.0%} "
          f"misordered by the given scores; keep {args.keep:.0%}; lr {args.lr}, beta {args.beta}, "
          f"{args.epochs} epoch(s), {args.batch_pairs} pairs per step; seeds {' '.join(map(str, args.seeds))}):\n")
    print("| run | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean | sd |")
    print("| --- |" + " --- |" * (len(args.seeds) + 2))
    labels = {"all": "all pairs", "top": f"top {args.keep:.0%} by reward_margin",
              "random": f"random {args.keep:.0%}", "weighted": "all pairs, weight-by reward_margin"}
    for name in RUNS:
        values = [r[name] for r in results]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"| {labels[name]} | " + " | ".join(f"{v:.3f}" for v in values)
              + f" | {statistics.mean(values):.3f} | {sd:.3f} |")
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
