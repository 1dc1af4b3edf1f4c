"""Every Python example in README.md and docs/*.md runs as written, on a tiny model.

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
