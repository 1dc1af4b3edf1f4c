"""`python -m prefdata.tiny.online_demo`: online DPO on CPU in well under a minute, with tiny models built in code.

Fully online rounds (4 prompts, one step each; 16 rounds = 4 passes over the 16 prompts) of
generate -> score -> prepare -> refs -> train on the learning case of
`bench/bench_online.py --learn` (a tiny random Llama policy, a 6k-vocabulary ChatML tokenizer, a rule
reward = the answer's share of letters a to m), printing each round and the curve of the mean reward
of fresh samples. How far it rises depends on the seed (`--seed`): docs/online.md gives the range
over seeds. Then an offline preference file scored by a tiny reward model with its own tokenizer,
for `reward_disagrees`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent / "examples"  # package data: runs from an installed wheel


# Set before torch loads (`python -m prefdata.tiny.online_demo` does): MKL's results made the same on
# every x86 CPU (conditional numerical reproducibility), ATen's kernels the portable ones rather than
# the AVX2/AVX-512 ones the CPU offers, one thread. Sampling amplifies the last bit of a logit, so
# without this one seed's curve differs between two machines of the same kind (issue 40).
PINNED_ARITHMETIC = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1",
                     "MKL_NUM_THREADS": "1"}


def pin_arithmetic() -> bool:
    """PINNED_ARITHMETIC into the environment (values the user set win); False once torch is loaded."""
    if "torch" in sys.modules:
        return False
    for name, value in PINNED_ARITHMETIC.items():
        os.environ.setdefault(name, value)
    return True


@contextlib.contextmanager
def _one_thread_deterministic() -> Iterator[None]:
    """One torch thread and deterministic kernels for the demo's run, as they were afterwards."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def run_demo(work: Path, passes: int = 4, seed: int = 0, pinned: bool = False) -> int:
    """The demo in `work`; `pinned`: PINNED_ARITHMETIC took effect (this process loaded torch after it)."""
    with _one_thread_deterministic():
        return _run_demo(work, passes, seed, pinned)


def _run_demo(work: Path, passes: int, seed: int, pinned: bool) -> int:
    import statistics

    from prefdata.online.generate import generate_rows
    from prefdata.online.sample_settings import SamplingSettings
    from prefdata.online.prompts import read_prompts
    from prefdata.online.rounds import run_online
    from prefdata.online.score import score
    from prefdata.tiny.learning_case import build_learning_case, first_half_share
    from prefdata.tiny.reward import build_tiny_reward_model

    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    print(f"[1/3] tiny Llama policy (6k-vocabulary ChatML tokenizer, 150 warm-start steps so it ends its answers), "
          f"16 prompts and a rule reward in {work}/case/")
    case = build_learning_case(work / "case", prompts=16, warm_start_steps=150, seed=seed)
    build_tiny_reward_model(work / "tiny-reward-model")

    run = work / "online"
    shutil.rmtree(run, ignore_errors=True)  # the demo's own run: each demo starts afresh, whatever ran there before
    # Fully online (the default): 4 prompts a round, one step each; `passes` passes over the 16 prompts.
    rounds = passes * 16 // 4
    print(f"[2/3] prefdata online {case['prompts']} --model {case['policy']} --reward-fn {case['reward_fn']} "
          f"--rounds {rounds} --samples 4 --max-new-tokens 32 --lr 2e-2 --batch-pairs 4 --seed {seed} --output {run}")
    result = run_online(
        case["prompts"], model=case["policy"], output=run, reward_fn=str(case["reward_fn"]), rounds=rounds,
        samples=4, max_new_tokens=32, lr=2e-2, beta=0.1, batch_pairs=4, batch_size=64,
        seed=seed, device="cpu", progress=False,
    )

    def fresh_reward(policy: Path) -> float:
        settings = SamplingSettings(samples=8, max_new_tokens=32, seed=123, batch_size=64, device="cpu")
        rows = generate_rows(read_prompts(case["prompts"]).rows, policy, settings, progress=False)
        return statistics.fmean(first_half_share([], [row["completion"] for row in rows]))

    lines = result.rounds
    curve = [statistics.fmean(line["reward_mean"] for line in lines[i : i + 4]) for i in range(0, len(lines), 4)]
    finished = [sum(line["samples"] - line["unfinished"] for line in lines[i : i + 4]) for i in range(0, len(lines), 4)]
    print("      mean reward of fresh samples by pass over the prompts, then the final policy: "
          + " -> ".join(f"{m:.3f}" for m in [*curve, fresh_reward(result.policy)]))
    print("      finished samples (ended with EOS) by pass, of 64: " + ", ".join(map(str, finished)))
    # One run is one draw: sampling amplifies the last bit of a logit, so these figures are the seed's
    # (and, unpinned, the CPU's); docs/online.md gives their range over seeds.
    where = ("arithmetic pinned: another x86-64 CPU with this torch gives the same" if pinned
             else "and this CPU's: torch was loaded before the demo could pin its arithmetic")
    print(f"      (seed {seed}'s run, {where}; the range over seeds: docs/online.md, `--seed N`)")

    print(f"[3/3] prefdata score {EXAMPLES / 'pairs'} --reward-model {work / 'tiny-reward-model'}")
    scored = score(EXAMPLES / "pairs", reward_model=work / "tiny-reward-model",
                   output=work / "scored.jsonl", device="cpu", progress=False)
    print("      " + scored.summary().replace("\n", "\n      "))
    print(f"\ndone in {time.time() - started:.0f}s: rounds in {run / 'rounds.jsonl'}, final policy in {run / 'policy'}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefdata.tiny.online_demo", description=__doc__)
    parser.add_argument("--work", default=str(Path("demo-out") / "online"),
                        help="where everything is written (default: demo-out/online/ in the current directory)")
    parser.add_argument("--passes", type=int, default=4,
                        help="passes over the 16 prompts, 4 fully online rounds each (default 4)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the case (tokenizer corpus, policy, warm start) and the run's sampling (default 0)")
    args = parser.parse_args(argv)
    pinned = pin_arithmetic()
    from prefdata.core.quiet import quiet_libraries

    with quiet_libraries(True):  # prefdata's own lines only
        return run_demo(Path(args.work), args.passes, args.seed, pinned)


if __name__ == "__main__":
    sys.exit(main())
