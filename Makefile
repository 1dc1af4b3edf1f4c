# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python

.PHONY: setup demo test bench

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m prefdata.demo

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

bench: setup
	$(PY) bench/bench_prepare.py --quick
