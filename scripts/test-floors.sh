#!/usr/bin/env bash
# `make test-floors`: the data-path tests on the lowest dependency releases pyproject.toml allows.
#
# Builds a second venv ($PREFDATA_FLOORS_VENV, default .venv-floors; no system site-packages) with
# prefdata installed under scripts/floors.txt as constraints (exactly pyproject's `>=` floors;
# tests/test_floors.py keeps the two equal), then runs the tests of reading, tokenizing, checking,
# reporting, prepare, validate, show and refs there. Training, online DPO, TRL, Ray and image tests
# stay with `make test` (their extras are not installed here). Safe to rerun: the venv is reused
# while floors.txt and pyproject.toml are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${PREFDATA_FLOORS_VENV:-.venv-floors}
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check"

stamp="$VENV/.prefdata-floors"
want=$(cat pyproject.toml scripts/floors.txt scripts/test-floors.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  rm -rf "$VENV"
  echo "test-floors: creating $VENV at the floors of scripts/floors.txt"
  "$PYTHON" -m venv "$VENV"
  # torch: the CPU build, as scripts/setup.sh installs it (PyTorch's CPU index when reachable;
  # otherwise the package mirror's, whose torch==2.13.0 is the CPU build).
  torch_pin=$(grep -E '^torch==' scripts/floors.txt)
  if "$PY" -c "import urllib.request; urllib.request.urlopen('https://download.pytorch.org/whl/cpu/torch/', timeout=5)" 2>/dev/null; then
    $PIP install -qq "$torch_pin" --index-url https://download.pytorch.org/whl/cpu
  fi
  $PIP install -qq -c scripts/floors.txt -e . "pytest>=8" "hypothesis>=6"  # -qq: errors only
  echo "$want" > "$stamp"
fi
"$PY" - <<'PYEOF'
# Every floor is what got installed: a resolver that quietly picked another release would make
# this a run of something else.
import re
from importlib.metadata import version
from pathlib import Path

wrong = []
for line in Path("scripts/floors.txt").read_text().splitlines():
    match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
    if match and version(match[1]).split("+")[0] != match[2]:
        wrong.append(f"{match[1]} {version(match[1])} (floor {match[2]})")
if wrong:
    raise SystemExit("test-floors: installed releases differ from scripts/floors.txt: " + ", ".join(wrong))
print("test-floors: " + ", ".join(f"{m[1]} {m[2]}" for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$", Path("scripts/floors.txt").read_text(), re.M)))
PYEOF
exec "$PY" -m pytest -q -p no:cacheprovider \
  tests/tokenize tests/io tests/checks tests/report tests/prepare tests/validate \
  tests/prepare/test_prepare.py tests/refs/test_refs.py tests/core/test_schema.py tests/test_show.py tests/test_cli.py tests/test_floors.py \
  tests/select tests/tokenize/test_trajectories.py tests/sets/test_pairing_sweet_spot.py
