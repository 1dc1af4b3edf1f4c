"""Running a trainer's own preprocessing in the trainer's own environment.

LLaMA-Factory and axolotl pin transformers, datasets and TRL releases prefdata cannot run with (LLaMA-Factory
0.9.5: transformers <= 5.6; prefdata needs >= 5.22), so their code cannot be imported into prefdata's process.
Their users have a venv where the trainer works; prefdata runs a worker script there, in a child process:
the script (prefdata/trainers/workers/*.py) imports only the standard library and the trainer, reads one
JSON request on stdin and writes one JSON answer on stdout. Nothing of prefdata is imported there, so the
trainer's environment needs no prefdata install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError

WORKERS = Path(__file__).parent / "workers"


def trainer_python(given: str | None, command: str, module: str, install: str) -> str:
    """The interpreter to run `module`'s worker with: --trainer-python; else the Python behind `command`
    on PATH (the shebang of llamafactory-cli / axolotl, the script its users run); else this process's
    Python when it can import `module`. Otherwise one line saying how to point at the trainer."""
    if given:
        path = shutil.which(given) or given
        if not Path(path).is_file() or not os.access(path, os.X_OK):
            raise PrefdataError(f"--trainer-python {given}: not an executable file")
        return path
    script = shutil.which(command)
    if script:
        first = Path(script).read_bytes()[:512].split(b"\n", 1)[0].decode("utf-8", "replace")
        if first.startswith("#!") and "python" in first and Path(first[2:].strip().split()[0]).is_file():
            return first[2:].strip().split()[0]
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return sys.executable
    raise PrefdataError(f"{module} is not installed here and no `{command}` is on PATH: give the Python of the "
                        f"environment it is installed in with --trainer-python (or install it: {install})")


def run_worker(script: str, python: str, request: dict[str, Any], trainer: str, timeout: float = 3600.0) -> dict[str, Any]:
    """Run workers/`script` with `python` on `request` (JSON in, JSON out). The worker reports a failure
    of the trainer's own code as {"error": "..."}; it is raised here as one line."""
    path = WORKERS / script
    env = {**os.environ, "PYTHONNOUSERSITE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_VERBOSITY": "error", "DATASETS_VERBOSITY": "error", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
           "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)  # prefdata's own path must not shadow the trainer's packages
    try:
        done = subprocess.run([python, "-I", str(path)], input=json.dumps(request), capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=request.get("cwd") or None)
    except subprocess.TimeoutExpired:
        raise PrefdataError(f"{trainer}'s preprocessing did not finish in {timeout:.0f} s") from None
    except OSError as exc:
        raise PrefdataError(f"cannot run {python} for {trainer}: {exc.strerror or exc}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PrefdataError(f"{trainer}'s preprocessing failed under {python} (exit {done.returncode}): {tail}")
    answer = json.loads(lines[-1])
    if answer.get("error"):
        raise PrefdataError(f"{trainer}: {answer['error']}")
    return answer
