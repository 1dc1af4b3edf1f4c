#!/usr/bin/env bash
# Builds the venv of each trainer named (llamafactory, ...) as .venv-<name> in the repository root.
# Those trainers pin releases prefdata cannot import (LLaMA-Factory: transformers<=5.6, datasets<=4.0,
# trl<=0.24; prefdata needs transformers>=5.22), so `validate --trainer <name>` runs their preprocessing
# as a child process in this venv (prefdata/trainers/worker_process.py) and tests/trainers find it here.
# CPU only: torch==2.13.0 first (the local package mirror's build is the CPU one), then the trainer
# with --no-deps and an explicit pinned list, so no install pulls CUDA/nvidia packages.
# Safe to rerun: a venv whose stamp matches its pinned list is kept as it is.
#   bash scripts/trainer-venv.sh llamafactory
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_PIN="torch==2.13.0"

# Each trainer: the packages installed with their dependencies, then those installed with --no-deps.
pins_llamafactory() {
  # LLaMA-Factory 0.9.5's data path (template, processors, loader); its own requirements add gradio,
  # torchaudio, torchvision, modelscope... which preprocessing never touches (the worker stubs
  # torchaudio/torchvision, imported at module level by data/mm_plugin.py).
  DEPS="transformers==5.6.0 datasets==4.0.0 trl==0.24.0 peft==0.18.1 accelerate==1.11.0 omegaconf==2.3.0 pyyaml"
  NODEPS="llamafactory==0.9.5"
  CHECK="llamafactory transformers datasets"  # modules that must be found (not imported: seconds each)
}

found() {
  "$1" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))" $CHECK 2>/dev/null
}

pins_axolotl() {
  # axolotl 0.19.0's DPO data path (load_cfg, load_tokenizer, prepare_preference_datasets, TRL's DPOTrainer
  # tokenize step and collator) at its own pins; its requirements add triton, xformers, bitsandbytes,
  # liger-kernel, torchao, gradio, modal, lm_eval... (4.3 GB), which that path never imports.
  DEPS="transformers==5.16.1 tokenizers==0.23.1 huggingface_hub==1.17.0 datasets==4.8.4 trl==1.9.0 accelerate==1.13.0
    peft==0.20.0 pydantic==2.12.5 PyYAML==6.0.3 packaging==26.0 addict==2.4.0 fire==0.7.1 sentencepiece==0.2.3
    jinja2==3.1.6 colorama==0.4.6 posthog==6.7.11 pillow==13.0.0 numba==0.68.1"
  NODEPS="axolotl==0.19.0"
  CHECK="axolotl transformers datasets trl"
}

build() {
  local name=$1
  local fn="pins_$name"
  if ! declare -F "$fn" >/dev/null; then
    echo "trainer-venv: unknown trainer '$name' (known: $(declare -F | sed -n 's/.* pins_//p' | tr '\n' ' '))" >&2
    exit 2
  fi
  "$fn"
  local venv=".venv-$name" py=".venv-$name/bin/python"
  local want
  want=$(printf '%s\n' "$PYTHON" "$TORCH_PIN" "$DEPS" "$NODEPS" | sha256sum | cut -d' ' -f1)
  if [ -f "$venv/.prefdata-trainer" ] && [ "$(cat "$venv/.prefdata-trainer")" = "$want" ] && found "$py"; then
    return 0
  fi
  local start=$SECONDS
  echo "trainer-venv: building $venv ($NODEPS)"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  local pip="$py -m pip --disable-pip-version-check -qq"
  # shellcheck disable=SC2086
  $pip install "$TORCH_PIN"
  # shellcheck disable=SC2086
  $pip install "$TORCH_PIN" $DEPS
  # shellcheck disable=SC2086
  $pip install --no-deps $NODEPS
  if "$py" -m pip list 2>/dev/null | grep -qiE '^(nvidia-|triton )'; then
    echo "trainer-venv: $venv pulled CUDA packages; refusing it" >&2
    exit 1
  fi
  found "$py" || { echo "trainer-venv: $venv lacks one of: $CHECK" >&2; exit 1; }
  echo "$want" > "$venv/.prefdata-trainer"
  echo "trainer-venv: $venv ready in $((SECONDS - start)) s, $(du -sh "$venv" | cut -f1)"
}

[ $# -gt 0 ] || { echo "usage: bash scripts/trainer-venv.sh TRAINER..." >&2; exit 2; }
for name in "$@"; do build "$name"; done
