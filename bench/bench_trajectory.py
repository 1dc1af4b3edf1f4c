"""Prepare time of one long agent-trajectory pair (issue 41): a user prompt, then alternating
assistant turns (text and a tool call) and tool results; the halves diverge at the first assistant
turn, so each completion holds every later message and one loss-mask span per assistant turn.

    python bench/bench_trajectory.py --messages 200 999 [--tokenizer DIR] [--chat-template-file F]

Prints, per size, the seconds `prepare` took for the one pair (the CLI, in this process) and the
ratio of the largest size's time to the smallest's: linear in turns gives about the ratio of sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the web", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}}}}]


def trajectory(messages: int, variant: str) -> list[dict[str, Any]]:
    """`messages` messages: a user prompt, then assistant turns with a tool call each and their tool
    results, ending on an assistant answer when the count allows; `variant` changes every assistant
    turn, so two variants first differ at the first assistant turn."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "Find the population of the ten largest cities."}]
    step = 0
    while len(out) < messages:
        if len(out) == messages - 1:
            out.append({"role": "assistant", "content": f"[{variant}] Done after {step} searches."})
            break
        call_id = f"call_{step}"
        out.append({"role": "assistant", "content": f"[{variant}] Step {step}: I will search for city {step}.",
                    "tool_calls": [{"id": call_id, "type": "function", "function": {
                        "name": "search", "arguments": {"query": f"population of city {step} ({variant})"}}}]})
        if len(out) < messages:
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": f"City {step} has {1000 + 37 * step} thousand inhabitants."})
        step += 1
    return out


def trajectory_pair(messages: int) -> dict[str, Any]:
    """One pair row of two `messages`-message trajectories that diverge at the first assistant turn."""
    return {"tools": TOOLS, "chosen": trajectory(messages, "a"), "rejected": trajectory(messages, "b")}


def prepare_seconds(messages: int, tokenizer: str, template: str | None, workdir: Path) -> float:
    from prefdata.cli import main

    raw = workdir / f"raw-{messages}.jsonl"
    raw.write_text(json.dumps(trajectory_pair(messages)) + "\n", encoding="utf-8")
    out = workdir / f"out-{messages}"
    args = ["prepare", str(raw), str(out), "--tokenizer", tokenizer, "--no-progress", "--overwrite"]
    if template:
        args += ["--chat-template-file", template]
    began = time.perf_counter()
    code = main(args)
    seconds = time.perf_counter() - began
    if code != 0:
        raise SystemExit(f"prepare exited {code} on {messages} messages")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[200, 999])
    parser.add_argument("--tokenizer", default=str(ROOT.parent / "shared" / "assets" / "tokenizers" / "qwen2.5-instruct"))
    parser.add_argument("--chat-template-file", default=str(ROOT / "tests" / "fixtures" / "qwen3_chat_template.jinja"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        prepare_seconds(4, args.tokenizer, args.chat_template_file, Path(tmp))  # imports and tokenizer load
        times = {n: prepare_seconds(n, args.tokenizer, args.chat_template_file, Path(tmp)) for n in args.messages}
    for n, seconds in times.items():
        print(f"{n} messages: {seconds:.2f} s")
    low, high = min(times), max(times)
    if low != high:
        print(f"ratio {high}/{low} messages: {times[high] / times[low]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
