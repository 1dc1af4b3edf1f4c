#!/bin/sh
# Start-up and error messages of the same small CLI (two commands, 10 flags) in argparse, tyro,
# jsonargparse, typer and pydantic-settings: why prefdata declares its settings in-house
# (docs/architecture.md, "Settings, declared once").
#   python -m pip install --target /tmp/libbench tyro jsonargparse   # typer, pydantic-settings: in the venv
#   sh bench/cli_libraries/run.sh
set -e
cd "$(dirname "$0")"
PY=${PY:-python}
export PYTHONPATH=/tmp/libbench:$PWD COLUMNS=100
for cli in argparse_cli tyro_cli jap_cli typer_cli pyd_cli; do
    echo "== $cli"
    farm-bench -n 10 -- "$PY" "$cli.py" prepare --help 2>&1 | grep -E "wall|peak"
    "$PY" "$cli.py" prepare a b --max-length x 2>&1 | tail -4 || true
    "$PY" "$cli.py" prepare a b --max-lenght 3 2>&1 | tail -3 || true
done
