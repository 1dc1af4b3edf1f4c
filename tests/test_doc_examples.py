"""Every Python example and every shell command in README.md and docs/*.md runs as written, on tiny
models, from a directory that is not the repository (the shell commands: second half of this file).

Each fenced ```python block runs unchanged, as a script, in a fresh directory laid out so that the
placeholder paths the examples use exist there (nothing in the code is substituted):

- `out/`: an OUT prepared from examples/pairs/ with `--max-length 1024` and scored by `prefdata refs`
  (left out when the block calls `prepare(`: that block writes `out/` itself);
- `path/to/policy`, `path/to/model`, `path/to/tokenizer`, `Qwen/Qwen2.5-0.5B-Instruct`: the tiny random
  Qwen2 model (tests/conftest.py) with its tokenizer; the Hub is switched off, so a name never downloads;
- `data/train.jsonl`: twelve clean pairs; `checks/pr.toml`: the repository's.

A block that is a fragment (it names objects it does not create) says so on the line before it:
`<!-- example: not run (why) -->`. On a machine with a GPU the examples take their GPU branch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MODEL_PATHS = ("path/to/policy", "path/to/model", "path/to/tokenizer", "Qwen/Qwen2.5-0.5B-Instruct")
NOT_RUN = "<!-- example: not run"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_examples() -> list[tuple[str, str, bool]]:
    """(file:line, code, runs) for every ```python block of README.md and docs/*.md."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found.append((f"{path.relative_to(REPO)}:{line}", match.group(1), not before.startswith(NOT_RUN)))
    return found


EXAMPLES = python_examples()
RUNNABLE = [pytest.param(code, id=where) for where, code, runs in EXAMPLES if runs]


def test_the_trl_examples_are_collected_and_fragments_are_marked():
    runs = {where.split(":")[0] for where, _, run in EXAMPLES if run}
    assert {"README.md", "docs/trl.md", "docs/architecture.md"} <= runs
    for where, code, run in EXAMPLES:
        if "DPOConfig(" in code and run:
            assert "use_cpu=" in code and "bf16=" in code, f"{where}: a runnable TRL example names the CPU settings"


@pytest.fixture(scope="module")
def scored_out(tmp_path_factory, tiny_model_dir) -> Path:
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs

    out = tmp_path_factory.mktemp("doc-examples") / "out"
    result = prepare(REPO / "examples" / "pairs", out, tokenizer=tiny_model_dir, max_length=1024, progress=False)
    assert result.exit_code == 0, result.problem
    compute_refs(out, model=tiny_model_dir, progress=False)
    return out


def _workdir(tmp_path: Path, code: str, model: str, scored_out: Path) -> Path:
    for name in MODEL_PATHS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(model, target_is_directory=True)
    if "prepare(" not in code:
        shutil.copytree(scored_out, tmp_path / "out")
    (tmp_path / "data").mkdir()
    rows = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{i} plus {i} is {2 * i}.", "rejected": f"It is {i}."}
            for i in range(1, 13)]
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "checks").mkdir()
    shutil.copy(REPO / "checks" / "pr.toml", tmp_path / "checks" / "pr.toml")
    return tmp_path


@pytest.mark.parametrize("code", RUNNABLE)
def test_documented_example_runs_as_written(code, tmp_path, tiny_model_dir, scored_out):
    work = _workdir(tmp_path, code, tiny_model_dir, scored_out)
    (work / "example.py").write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "example.py"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output
    # Warnings a user would read as "the example is out of date".
    assert not re.search(r"FutureWarning|DeprecationWarning|is deprecated", output), output[-3000:]


# ---------------------------------------------------------------------------------------------------
# Shell commands: every command line in README.md and docs/*.md runs, as written, from a directory
# that is not the repository, in a "world" laid out so that the paths the docs name exist there.
#
# A command line is a line of a ```bash / ```sh / ```console / plain ``` block that starts with one
# of COMMAND_STARTS (a `\` continues it; `# ...` comments are the shell's). Each block runs in a
# fresh world, its lines in order, as a user follows them. `prefdata ...` lines run in one Python
# process (prefdata.cli.main, the `prefdata` script's entry point, with the line split as the shell
# splits it: one torch import for all of them); `python -m ...` lines run their module the same way;
# `make` lines run make. A line that no test runs fails test_every_documented_command_is_run,
# unless SKIPPED says why.
# ---------------------------------------------------------------------------------------------------

COMMAND_STARTS = ("prefdata ", "python -m prefdata", ".venv/bin/prefdata", ".venv/bin/python -m prefdata", "make ",
                  "torchrun ", "pip install ", "python bench/")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL = ("bash", "sh", "console", "shell", "")

# The world: what each path a user supplies is here (built by `world_assets` and `_world`).
STAND_INS = {
    "tok/, policy/, POLICY, path/to/{model,policy,tokenizer,reference-model,Qwen2.5-0.5B-Instruct}, "
    "Qwen/Qwen2.5-0.5B-Instruct": "the tiny random Qwen2 model with its ChatML tokenizer (prefdata.tiny)",
    "path/to/Qwen3-8B, path/to/DeepSeek-R1-Distill-Qwen-7B": "a tiny Qwen2 with prefdata.tiny's Qwen3-style "
    "reasoning template (the R1 lines replace it with the bundled template, as written)",
    "RM": "prefdata.tiny's reward model (sequence classification, its own tokenizer)",
    "path/to/llava/, path/to/llava-1.5-7b-hf": "the tiny LLaVA with its processor (prefdata.tiny.vision)",
    "data/train.jsonl, data/eval.jsonl, data/hh.jsonl, raw.jsonl, data.jsonl": "small clean pair files "
    "(two of data/eval.jsonl's prompts are in data/train.jsonl: --against finds them)",
    "data/images.jsonl, data/pairs.jsonl": "the image example's nine clean rows (examples/images/, with its img/)",
    "pairs.jsonl": "conversational pairs with reasoning_content where the block's model is a reasoning one, "
    "else six clean pairs and one whose prompt is a benchmark item",
    "ultrafeedback_raw.jsonl, scored.jsonl": "scored completions (UltraFeedback raw; completions + scores)",
    "mix.toml": "a mixture of data/hh.jsonl and ultrafeedback_raw.jsonl",
    "gsm8k_test.jsonl, mmlu_test.parquet, evals/, openai/openai_humaneval:test": "benchmark items; gsm8k's is a "
    "prompt of ultrafeedback_raw.jsonl and pairs.jsonl (so the PR checks' exit 1 is the documented one)",
    "base-report.json": "`prefdata validate data/ --format json` of the same data/ and policy (no regression)",
    "prompts.jsonl, rules.py:my_reward": "64 prompts (one round of --prompts-per-round 64); a length reward",
    "out/": "24 clean pairs with reward columns, prepared with the tiny model and scored by refs (a block "
    "that prepares out/ itself starts without it)",
    "examples/agent/": "the repository's",
}
# Text replaced before a line runs, each with why: a Hub id, a target that would install, sizes a
# real model needs and the tiny one does not.
REWRITES = {
    "openai/openai_humaneval:test": "humaneval_test.jsonl",  # a Hub dataset; the Hub is off in tests
    "make demo": "make -o setup demo",  # `setup` would pip-install into the shared .venv; the demo itself runs
    "--rounds 10": "--rounds 1",  # an online run's rounds are alike: one stands for ten
    "--max-new-tokens 256": "--max-new-tokens 8",  # the tiny random model rarely samples EOS: each token is one more step
}
# Lines no test runs, and why (a substring of the line -> the reason).
SKIPPED = {
    "torchrun ": "8 processes on 8 GPUs; tests/train/test_torchrun.py runs refs and train under torchrun on CPU",
    "pip install ": "needs the package index; tests/test_wheel_install.py installs the wheel built from this tree",
    "make test": "the whole test suite, which holds this test",
    "python bench/": "benchmarks: minutes each; bench/README.md gives their figures and how to run them",
    "--trainer llamafactory": "runs in LLaMA-Factory's own venv (scripts/trainer-venv.sh); tests/trainers/"
    "test_llamafactory*.py run validate, prepare and export --trainer llamafactory on real rows there",
    "--trainer axolotl": "runs in axolotl's own venv (scripts/trainer-venv.sh) on the user's axolotl YAML; "
    "tests/trainers/test_axolotl*.py run validate and export --trainer axolotl there",
}
# Exit codes other than 0 that a line documents: a substring of the line -> (code, what its output
# must name: the documented reason).
EXIT_CODES = {
    # "a benchmark prompt fails it"
    "validate mix.toml --tokenizer tok/ --pairing best-vs-random-lower --rating mean --policy pr": (1, "benchmark_overlap"),
    # "a PR that brings one in fails"
    "validate pairs.jsonl --policy pr --decontaminate-against evals/": (1, "benchmark_overlap"),
}


def shell_commands() -> list[tuple[str, int, str]]:
    """(file:line, block number, command) for every documented command line, continuation lines joined."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block, match in enumerate(FENCE.finditer(text)):
            if match.group(1) not in SHELL or "──" in match.group(2):  # box-drawing: a diagram, not commands
                continue
            first = text.count("\n", 0, match.start(2)) + 1
            lines = match.group(2).split("\n")
            i = 0
            while i < len(lines):
                start, line = i, lines[i].rstrip()
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1].rstrip() + " " + lines[i].strip()
                i += 1
                line = line.strip().removeprefix("$ ")
                if line.startswith(COMMAND_STARTS):
                    found.append((f"{path.relative_to(REPO)}:{first + start}", block, line))
    return found


COMMANDS = shell_commands()


def _skipped(command: str) -> str | None:
    return next((why for part, why in SKIPPED.items() if part in command), None)


def _blocks() -> dict[str, list[tuple[str, str]]]:
    """Runnable commands by block ("README.md#3"), in order, rewritten."""
    blocks: dict[str, list[tuple[str, str]]] = {}
    for where, block, command in COMMANDS:
        if _skipped(command):
            continue
        for old, new in REWRITES.items():
            command = command.replace(old, new)
        blocks.setdefault(f"{where.split(':')[0]}#{block}", []).append((where, command))
    return blocks


BLOCKS = _blocks()


def test_every_documented_command_is_run():
    """A command line in the docs is either run below or skipped with a reason; the skips stay few."""
    assert len(COMMANDS) > 50, "the command lines were not found: has the docs' layout changed?"
    run = {where for commands in BLOCKS.values() for where, _ in commands}
    for where, _, command in COMMANDS:
        assert where in run or _skipped(command), f"{where}: {command}: no test runs it and SKIPPED says nothing"
    # 8, plus the lines of the two trainers that run in their own venvs (tests/trainers run them there)
    assert sum(bool(_skipped(c)) for _, _, c in COMMANDS) <= 14
    used = {part for part in SKIPPED if any(part in c for _, _, c in COMMANDS)}
    assert used == set(SKIPPED), f"SKIPPED entries that match no documented line: {set(SKIPPED) - used}"
    stale = [part for part in EXIT_CODES if not any(part in c for _, _, c in COMMANDS)]
    assert stale == [], f"EXIT_CODES entries that match no documented line: {stale}"


def _clean_pairs(n: int, start: int = 1) -> str:
    rows = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{i} plus {i} is {2 * i}.", "rejected": f"It is {i}."}
            for i in range(start, start + n)]
    return "".join(json.dumps(r) + "\n" for r in rows)


BENCHMARK_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle on the shore"


@pytest.fixture(scope="module")
def world_assets(tmp_path_factory, tiny_model_dir) -> Path:
    """The models every world links to, and an OUT with rewards and refs."""
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs
    from prefdata.tiny import REASONING_TEMPLATE, build_tiny_model, build_tiny_tokenizer
    from prefdata.tiny.reward import build_tiny_reward_model
    from prefdata.tiny.vision import build_tiny_llava_model, build_tiny_llava_processor

    assets = tmp_path_factory.mktemp("doc-world")
    build_tiny_tokenizer(assets / "reasoning-tokenizer", chat_template=REASONING_TEMPLATE)
    build_tiny_model(assets / "reasoning-model", tokenizer_dir=assets / "reasoning-tokenizer", architecture="qwen2")
    build_tiny_reward_model(assets / "reward-model")
    build_tiny_llava_processor(assets / "llava-processor")
    build_tiny_llava_model(assets / "llava", assets / "llava-processor")
    rewarded = assets / "rewarded.jsonl"
    rows = [json.loads(line) for line in _clean_pairs(24).splitlines()]
    for i, row in enumerate(rows):
        row.update(reward_chosen=1.0 + (i % 5) * 0.5, reward_rejected=0.2 * (i % 3))
        if i % 4 == 0:
            row["rejected"] = row["rejected"] + " Longer than the chosen answer, and wrong."
    rewarded.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = prepare(rewarded, assets / "out", tokenizer=tiny_model_dir, max_length=1024, progress=False)
    assert result.exit_code == 0, result.problem
    compute_refs(assets / "out", model=tiny_model_dir, progress=False)
    return assets


def _world(work: Path, assets: Path, model: str, prepared_out: bool, reasoning_pairs: bool) -> None:
    """A user's directory for one block: the stand-ins of STAND_INS."""
    links = {name: model for name in ("tok", "policy", "POLICY", "path/to/model", "path/to/policy", "path/to/tokenizer",
                                      "path/to/reference-model", "path/to/Qwen2.5-0.5B-Instruct",
                                      "Qwen/Qwen2.5-0.5B-Instruct")}
    links.update({"path/to/Qwen3-8B": assets / "reasoning-model",
                  "path/to/DeepSeek-R1-Distill-Qwen-7B": assets / "reasoning-model", "RM": assets / "reward-model",
                  "path/to/llava": assets / "llava", "path/to/llava-1.5-7b-hf": assets / "llava",
                  ".venv": Path(sys.executable).parent.parent})
    for name, target in links.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).symlink_to(target, target_is_directory=True)
    shutil.copy(REPO / "Makefile", work / "Makefile")
    shutil.copytree(REPO / "examples" / "agent", work / "examples" / "agent")
    data = work / "data"
    shutil.copytree(REPO / "examples" / "images" / "img", data / "img")
    clean_images = (REPO / "examples" / "images" / "pairs.jsonl").read_text(encoding="utf-8").splitlines()[:9]
    for name in ("images.jsonl", "pairs.jsonl"):  # the example's clean rows (its last four are broken on purpose)
        (data / name).write_text("\n".join(clean_images) + "\n", encoding="utf-8")
    (data / "train.jsonl").write_text(_clean_pairs(12), encoding="utf-8")
    (data / "eval.jsonl").write_text(_clean_pairs(3, start=11), encoding="utf-8")  # two prompts leak
    (data / "hh.jsonl").write_text(_clean_pairs(10, start=20), encoding="utf-8")
    for name in ("raw.jsonl", "data.jsonl"):
        (work / name).write_text(_clean_pairs(8, start=40), encoding="utf-8")
    reasoning = [{"prompt": [{"role": "user", "content": f"What is {i} times 3?"}],
                  "chosen": [{"role": "assistant", "reasoning_content": f"{i} threes make {3 * i}.",
                              "content": f"{3 * i}"}],
                  "rejected": [{"role": "assistant", "reasoning_content": "Guess.", "content": f"{3 * i + 1}"}]}
                 for i in range(1, 7)]
    benchmark = json.dumps({"prompt": BENCHMARK_PROMPT, "chosen": "Once upon a time.", "rejected": "No."}) + "\n"
    pairs = "".join(json.dumps(r) + "\n" for r in reasoning) if reasoning_pairs else _clean_pairs(6, start=60) + benchmark
    (work / "pairs.jsonl").write_text(pairs, encoding="utf-8")
    instructions = [BENCHMARK_PROMPT, *(f"Explain in one sentence why the number {i} is interesting" for i in range(7))]
    uf = [{"instruction": text, "completions": [
        {"response": f"Answer {k} to: {text}", "annotations": {"helpfulness": {"Rating": str(k + 2)},
                                                               "honesty": {"Rating": str(k + 3)}}}
        for k in range(3)]} for text in instructions]
    (work / "ultrafeedback_raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in uf), encoding="utf-8")
    scored = [{"prompt": text, "completions": [f"First try at: {text}", f"A better reply to: {text}",
                                               f"The best reply to: {text}"], "scores": [1.0, 2.5, 4.0]}
              for text in instructions[1:]]
    (work / "scored.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scored), encoding="utf-8")
    (work / "mix.toml").write_text('seed = 0\n[[source]]\nname = "hh"\npath = "data/hh.jsonl"\nweight = 0.7\n'
                                   '[[source]]\nname = "uf"\npath = "ultrafeedback_raw.jsonl"\nweight = 0.3\n',
                                   encoding="utf-8")
    (work / "gsm8k_test.jsonl").write_text(json.dumps({"question": BENCHMARK_PROMPT}) + "\n", encoding="utf-8")
    (work / "evals").mkdir()
    shutil.copy(work / "gsm8k_test.jsonl", work / "evals" / "gsm8k_test.jsonl")
    (work / "humaneval_test.jsonl").write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n", encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["Which planet is the largest in the solar system by mass?"]}),
                   work / "mmlu_test.parquet")
    prompts = [{"prompt": [{"role": "user", "content": f"Tell me about the number {i}."}]} for i in range(64)]
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts), encoding="utf-8")
    (work / "rules.py").write_text("def my_reward(prompts, completions, **kwargs):\n"
                                   "    return [float(len(str(c))) for c in completions]\n", encoding="utf-8")
    if prepared_out:
        shutil.copytree(assets / "out", work / "out")


# Lines that write an OUT a user makes anew each time: the block's lines are alternatives (README's
# "prepare ... out/" variants), so each starts without the OUT the previous one wrote.
_WRITES_OUT = re.compile(r"^prefdata (?:prepare|generate) \S+ (\S+)")


def _plan(assets: Path, model: str, root: Path, blocks: dict[str, list[tuple[str, str]]]) -> list[dict]:
    plan = []
    for name, commands in blocks.items():
        work = root / re.sub(r"[^\w]+", "-", name)
        work.mkdir(parents=True)
        first_out = next((c for _, c in commands if " out/" in c), "")
        _world(work, assets, model, prepared_out=not first_out.startswith("prefdata prepare"),
               reasoning_pairs=any(re.search(r"Qwen3|DeepSeek-R1", c) for _, c in commands))
        # The base branch's report: the same check on the same data, so the head brings no regression.
        prelude = ["prefdata validate data/ --policy pr --format json --output base-report.json --against data/eval.jsonl"] \
            if any("base-report.json" in c for _, c in commands) else []
        plan.append({"block": name, "cwd": str(work), "prelude": prelude, "commands": commands})
    return plan


@pytest.mark.slow
def test_documented_commands_run_as_written(world_assets, tiny_model_dir, tmp_path):
    plan = _plan(world_assets, tiny_model_dir, tmp_path, BLOCKS)
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    # PATH as it is: after `make demo` prefdata is .venv/bin/prefdata, not on PATH (the README's case).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for name in ("PYTHONPATH", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS"):  # --format github must not write into CI's summary
        env.pop(name, None)
    done = subprocess.run([sys.executable, __file__, str(tmp_path / "plan.json"), str(tmp_path / "results.json")],
                          cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]  # (each line's time goes to stdout: pytest -s shows it)
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    printed = [r["command"] for r in results if r["where"].endswith("(the command it printed)")]
    if any("make -o setup demo" in c for cs in BLOCKS.values() for _, c in cs) and shutil.which("prefdata") is None:
        assert ".venv/bin/prefdata show demo-out/prepared --row 0" in printed  # what the README says it prints
    failures = []
    for result in results:
        expected, reason = next((v for part, v in EXIT_CODES.items() if part in result["command"]), (0, ""))
        if result["code"] != expected or "Traceback" in result["output"] or reason not in result["output"]:
            failures.append(f"{result['where']}: {result['command']}\n  exit {result['code']} (expected {expected})"
                            f"\n  {result['output'][-1500:]}")
    assert failures == [], "\n\n".join(failures)


def _run_plan(plan_file: str, results_file: str) -> None:
    """The runner (a subprocess of the test): each block's lines in its world, in this one process."""
    import contextlib
    import io
    import runpy
    import shlex
    import time
    import traceback

    from prefdata.cli import main as prefdata_main

    def run_argv(argv: list[str]) -> int:
        if argv[0] in ("prefdata", ".venv/bin/prefdata"):
            return prefdata_main(argv[1:])
        if argv[0] in ("python", ".venv/bin/python") and argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            return 0
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        print(done.stdout + done.stderr)
        return done.returncode

    def run_line(line: str) -> tuple[int, str]:
        words = shlex.split(line, comments=True)
        parts, current = [], []
        for word in words:
            if word == "&&":
                parts.append(current)
                current = []
            else:
                current.append(word)
        parts.append(current)
        buffer, code = io.StringIO(), 0
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            for argv in parts:
                try:
                    code = run_argv(argv)
                except SystemExit as stop:
                    code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                except BaseException:  # noqa: BLE001 - reported as the line's failure
                    buffer.write(traceback.format_exc())
                    code = -1
                if code != 0:
                    break
        return code, buffer.getvalue()

    results = []
    for block in json.loads(Path(plan_file).read_text(encoding="utf-8")):
        os.chdir(block["cwd"])
        for line in block["prelude"]:
            run_line(line)
        for where, line in block["commands"]:
            match = _WRITES_OUT.match(line)
            if match and Path(match.group(1)).exists():
                shutil.rmtree(match.group(1))
            started = time.time()
            code, output = run_line(line)
            results.append({"where": where, "command": line, "code": code, "output": output,
                            "seconds": round(time.time() - started, 1)})
            print(f"{results[-1]['seconds']:6.1f}s exit {code}  {where}: {line}", file=sys.__stdout__, flush=True)
            hint = re.search(r"look at a row with its loss masks: (.+)", output)
            if hint:  # the demo's last line: the command it suggests runs as printed
                code, output = run_line(hint.group(1))
                results.append({"where": f"{where} (the command it printed)", "command": hint.group(1), "code": code,
                                "output": output, "seconds": 0})
    Path(results_file).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    _run_plan(sys.argv[1], sys.argv[2])
