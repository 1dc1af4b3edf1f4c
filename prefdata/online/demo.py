"""`python -m prefdata.online.demo`: online DPO on CPU in about a minute, with tiny models built in code.

Three rounds of generate -> score -> prepare -> refs -> train with a rule reward (the number of
letters "e" in the completion), printing the mean reward per round: it rises as the policy learns.
Then the same prompts' pairs scored by a tiny reward model with its own tokenizer, and an offline
preference file scored for `reward_disagrees`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    "What is the capital of France?", "Write a short poem about the sea.", "Give me three tips for sleep.",
    "How many legs does a spider have?", "Translate good morning to German.", "Explain how to add numbers.",
    "Suggest a name for a cat.", "What is 2 + 2?", "Tell me about the quick brown fox.", "Why is the sea blue?",
    "Name a color.", "Say hello.", "Describe a lazy dog.", "What do cats eat?", "Count to five.", "Write one word.",
]
RULE = '''def count_e(prompts, completions, **kwargs):
    """Reward = how many letters "e" the completion has (TRL's reward-function convention)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.count("e")) for t in texts]
'''


def run_demo(work: Path, rounds: int = 3) -> int:
    from prefdata.online.rounds import run_online
    from prefdata.online.score import score
    from prefdata.online.tiny import build_tiny_reward_model
    from prefdata.tiny import build_tiny_model, build_tiny_tokenizer

    started = time.time()
    work.mkdir(parents=True, exist_ok=True)
    policy, reward_model = work / "tiny-policy", work / "tiny-reward-model"
    print(f"[1/3] tiny policy (Qwen2, ChatML) and tiny reward model (Llama, its own tokenizer) in {work}/")
    build_tiny_tokenizer(work / "tiny-tokenizer")
    build_tiny_model(policy, tokenizer_dir=work / "tiny-tokenizer")
    build_tiny_reward_model(reward_model)
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS))
    (work / "rules.py").write_text(RULE)

    run = work / "online"
    print(f"[2/3] prefdata online {prompts} --model {policy} --reward-fn {work / 'rules.py'}:count_e "
          f"--rounds {rounds} --prompts-per-round 16 --samples 4 --lr 1e-2 --epochs 2 --output {run}")
    result = run_online(
        prompts, model=policy, output=run, reward_fn=f"{work / 'rules.py'}:count_e", rounds=rounds,
        prompts_per_round=16, samples=4, max_new_tokens=16, lr=1e-2, beta=0.1, batch_pairs=4, epochs=2,
        batch_size=16, seed=0, device="cpu", progress=False,
    )
    means = [line["reward_mean"] for line in result.rounds]
    print("      mean reward per round: " + " -> ".join(f"{m:.2f}" for m in means))

    print(f"[3/3] prefdata score {REPO / 'examples' / 'pairs'} --reward-model {reward_model}")
    scored = score(REPO / "examples" / "pairs", reward_model=reward_model, output=work / "scored.jsonl",
                   device="cpu", progress=False)
    print("      " + scored.summary().replace("\n", "\n      "))
    print(f"\ndone in {time.time() - started:.0f}s: rounds in {run / 'rounds.jsonl'}, final policy in {run / 'policy'}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefdata.online.demo", description=__doc__)
    parser.add_argument("--work", default=str(REPO / "demo-out" / "online"), help="where everything is written")
    parser.add_argument("--rounds", type=int, default=3, help="online rounds (default 3)")
    args = parser.parse_args(argv)
    return run_demo(Path(args.work), args.rounds)


if __name__ == "__main__":
    sys.exit(main())
