"""The user's path, not the checkout's: a wheel built from this tree, installed without `-e` into a
fresh virtual environment, runs the demo and the commands from a directory that is not the
repository (issue 40: the demo found its examples through the checkout and wrote into the install).

The fresh venv gets prefdata from the wheel only. Its dependencies (torch, transformers, ...) are
not reinstalled: a .pth file names the test interpreter's site-packages directories, and a directory
that a .pth line adds has its own .pth files skipped, so the editable install of prefdata there
stays invisible (asserted below).
"""

from __future__ import annotations

import os
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "prefdata"
pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(done: subprocess.CompletedProcess) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return output


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """prefdata's wheel, built from a copy of the tree (the build writes nothing into the checkout)."""
    if _run([sys.executable, "-m", "pip", "--version"], REPO).returncode != 0:
        pytest.skip("pip is not installed in the test interpreter: no wheel can be built")
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "prefdata", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "-w", str(root / "dist"), str(source)], root))
    (built,) = (root / "dist").glob("prefdata-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel (no -e); the test interpreter's dependencies reached by a .pth."""
    env_dir = tmp_path_factory.mktemp("venv") / "fresh"
    _ok(_run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(env_dir)],
             env_dir.parent))
    python = env_dir / "bin" / "python"
    _ok(_run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
              str(wheel)], env_dir.parent))
    purelib = Path(_ok(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            env_dir)).strip())
    ours = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (purelib / "zz-dependencies.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(ours)), encoding="utf-8")
    return env_dir


def _installed_files(env_dir: Path) -> dict[str, int]:
    (package,) = env_dir.glob("lib/python*/site-packages/prefdata")
    return {str(p.relative_to(package)): p.stat().st_mtime_ns for p in package.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_every_bundled_file_is_in_the_wheel(wheel):
    """Each non-Python file inside prefdata/ (policies, templates, the demos' examples) ships."""
    bundled = {str(p.relative_to(REPO)) for p in PACKAGE.rglob("*")
               if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert {"prefdata/policies/pr.toml", "prefdata/tiny/examples/pairs/explicit.jsonl",
            "prefdata/tiny/examples/images/pairs.jsonl"} <= bundled
    assert bundled - set(zipfile.ZipFile(wheel).namelist()) == set()


def test_the_repository_examples_are_the_bundled_ones():
    """examples/pairs and examples/images (what the README points at) are the package's files, not copies."""
    for name in ("pairs", "images"):
        assert (REPO / "examples" / name).resolve() == PACKAGE / "tiny" / "examples" / name


def test_the_installed_wheel_runs_the_demo_and_the_commands_from_elsewhere(venv, tmp_path):
    python, prefdata = venv / "bin" / "python", venv / "bin" / "prefdata"
    where = _ok(_run([str(python), "-c", "import prefdata, sys; print(prefdata.__file__); print(*sys.path, sep='\\n')"],
                     tmp_path)).splitlines()
    assert Path(where[0]).is_relative_to(venv), f"prefdata imported from {where[0]}, not the wheel"
    assert str(REPO) not in where[1:]  # ("" is the temporary directory: -c puts the cwd first)
    before = _installed_files(venv)

    # The demo, from a directory that is not the repository: its output lands in ./demo-out.
    demo = _ok(_run([str(python), "-m", "prefdata.tiny.demo", "--max-steps", "4"], tmp_path))
    assert (tmp_path / "demo-out" / "prepared" / "manifest.json").is_file()
    assert (tmp_path / "demo-out" / "checkpoint").is_dir()
    hint = demo.rstrip().splitlines()[-1].split("loss masks: ", 1)[1]
    assert hint.startswith(str(prefdata)), hint  # not on PATH here: the command names the script
    assert "⟦" in _ok(_run(shlex.split(hint), tmp_path))  # the command the demo suggests works as printed

    # The commands on a copy of the bundled examples, with the demo's tiny model.
    model = "demo-out/tiny-model"
    shutil.copytree(PACKAGE / "tiny" / "examples" / "pairs", tmp_path / "data")
    _ok(_run([str(prefdata), "prepare", "data", "out", "--tokenizer", model, "--max-length", "256"], tmp_path))
    assert "conflicting_pair" in _ok(_run([str(prefdata), "validate", "out"], tmp_path))
    assert "⟦" in _ok(_run([str(prefdata), "show", "out", "--row", "0"], tmp_path))
    _ok(_run([str(prefdata), "refs", "out", "--model", model], tmp_path))
    _ok(_run([str(prefdata), "select", "out", "new", "--by", "random", "--seed", "1", "--keep", "0.5"], tmp_path))
    assert (tmp_path / "new" / "manifest.json").is_file()
    # A bundled policy, found inside the installed package.
    policy = _run([str(prefdata), "validate", "data", "--policy", "pr"], tmp_path)
    assert policy.returncode in (0, 1) and "Traceback" not in policy.stderr, policy.stderr[-2000:]
    assert "max_dropped_share" in policy.stdout + policy.stderr  # pr.toml's rule was read

    # The inputs the other demos (--images, the online demo) default to, and the bundled templates, are installed.
    check = ("import sys\nfrom pathlib import Path\nimport prefdata.templates, prefdata.tiny.demo as d, "
             "prefdata.tiny.online_demo as o\n"
             "assert d.EXAMPLES.is_relative_to(sys.prefix) and (d.EXAMPLES / 'images' / 'pairs.jsonl').is_file()\n"
             "assert (o.EXAMPLES / 'pairs' / 'explicit.jsonl').is_file()\n"
             "assert list(Path(prefdata.templates.__file__).parent.glob('*.jinja'))\n")
    _ok(_run([str(python), "-c", check], tmp_path))

    assert _installed_files(venv) == before, "a command wrote inside the installed package"
