#!/usr/bin/env bash
# Sets up .venv with prefdata and its test/bench dependencies. Safe to rerun (skips work when done).
#
# torch: an importable torch (a CUDA build you already have, seen through --system-site-packages,
# or one installed in .venv) is kept as it is. Otherwise: $PREFDATA_TORCH if set; the CUDA build
# when nvidia-smi finds a GPU; else the CPU build (from PyTorch's CPU index when it is reachable,
# otherwise `torch==2.13.0`, which this workplace's package mirror serves as a CPU build).
# pyproject.toml asks for torch>=2.6 (the lowest transformers 5.22 runs with; the floors run tests
# 2.13, scripts/floors.txt says why), so no later step replaces a torch chosen here; a kept torch
# older than 2.6 is upgraded by the install below.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${PREFDATA_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check"

stamp="$VENV/.prefdata-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c "import prefdata, torch" 2>/dev/null; then
  exit 0
fi

if "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
elif [ -n "${PREFDATA_TORCH:-}" ]; then
  $PIP install -q "$PREFDATA_TORCH"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: GPU found; installing the CUDA build of torch"
  $PIP install -q torch
elif "$PY" - <<'PYEOF' 2>/dev/null
import urllib.request
urllib.request.urlopen("https://download.pytorch.org/whl/cpu/torch/", timeout=5)
PYEOF
then
  echo "setup: installing the CPU build of torch from PyTorch's CPU index"
  $PIP install -q torch --index-url https://download.pytorch.org/whl/cpu
else
  echo "setup: installing torch==2.13.0 (CPU build from the local package mirror)"
  $PIP install -q "torch==2.13.0"
fi

echo "setup: installing prefdata with its dev, bench, trl, ray, vision, openrlhf and real extras (what the tests need)"
$PIP install -q -e ".[dev,bench,trl,ray,vision,openrlhf,real]"
# `validate --trainer openrlhf` runs OpenRLHF's own preprocessing (tests/trainers). --no-deps: openrlhf's
# requirements pin deepspeed and flash-attn (source builds that need CUDA) and another transformers;
# its preprocessing needs only what prefdata[openrlhf] installed above.
$PIP install -q --no-deps "openrlhf==0.11.2"
# Its wheel also installs a top-level `tests` package, which would shadow this repository's tests/.
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if grep -q '^tests/__init__.py' "$site"/openrlhf-0.11.2.dist-info/RECORD 2>/dev/null; then rm -rf "$site/tests"; fi
"$PY" -c "import prefdata, torch; print(f'setup: prefdata {prefdata.__version__}, torch {torch.__version__}, cuda={torch.cuda.is_available()}')"
echo "$want" > "$stamp"
