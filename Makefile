# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python

.PHONY: setup trainer-venvs demo test test-floors bench bench-gpu smollm2 demo-real

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m prefdata.tiny.demo

test: setup trainer-venvs
	$(PY) -m pytest -q -p no:cacheprovider

# LLaMA-Factory's and axolotl's own venvs (.venv-llamafactory, .venv-axolotl: CPU torch, their pinned releases),
# where tests/trainers runs `validate --trainer llamafactory|axolotl`: about 3.2 GB and a few minutes, once.
# The tests only: a user of either trainer points --trainer-python at the venv they train in.
trainer-venvs:
	@bash scripts/trainer-venv.sh llamafactory axolotl

# The data-path tests (read, tokenize, check, report, prepare, validate, show, refs, select, trajectories) once more at the
# lowest releases pyproject.toml allows (scripts/floors.txt), in a second venv, .venv-floors.
# CI runs it after `make test`: 4 to 5 minutes on a clean 2-core machine, building the venv included.
test-floors:
	@bash scripts/test-floors.sh

# SmolLM2-135M-Instruct as a float32 model, once, in ~/.cache/prefdata (or $$PREFDATA_SMOLLM2_DIR): tests/real_model.
smollm2: setup
	$(PY) scripts/get_smollm2.py

# prepare -> refs -> train -> held-out reward accuracy on SmolLM2-135M-Instruct and real UltraFeedback pairs
# from ../shared, on CPU (scripts/demo_real.py). Not run in CI.
demo-real: smollm2
	$(PY) scripts/demo_real.py

bench: setup
	$(PY) bench/bench_prepare.py --quick

# On a machine with one NVIDIA GPU: setup installs the CUDA build of torch (nvidia-smi finds the GPU),
# then every GPU row (refs and train vs TRL, MFU, layouts, peak memory, the GPU tests) in one table:
# bench/results/gpu.md and gpu.json. Sized to finish in under 10 minutes on one H100-class GPU (not yet run on one).
bench-gpu: setup
	PYTHONUNBUFFERED=1 $(PY) bench/bench_gpu.py
