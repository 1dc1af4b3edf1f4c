"""`python -m prefdata.tiny.demo`: the whole pipeline on the shipped example, on CPU, in about a minute.

Builds a tiny tokenizer (real ChatML template) and a tiny random Qwen2 model from code, then runs
prepare -> validate -> refs -> train on examples/pairs/ (several input shapes, a few bad rows).
`--images`: the same stages for image preference pairs (examples/images/) with a tiny LLaVA
(a CLIP vision tower and a Llama text model) and its processor, built from code, written under
WORK/images/ so that the text demo's WORK/prepared/ and WORK/checkpoint/ stay as they are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

# The demos' inputs are package data (examples/pairs and examples/images in a clone link here), so
# an installed wheel runs them from any directory.
EXAMPLES = Path(__file__).resolve().parent / "examples"


def run_demo(work: Path, examples: Path, max_steps: int = 30) -> int:
    """prepare -> validate -> refs -> train on text pairs, with a tiny random Qwen2."""
    from prefdata.tiny.text import build_tiny_model, build_tiny_tokenizer

    work.mkdir(parents=True, exist_ok=True)
    tokenizer_dir, model_dir = work / "tiny-tokenizer", work / "tiny-model"
    started = time.time()
    print(f"[1/5] building a tiny tokenizer and a tiny random Qwen2 model in {work}/")
    build_tiny_tokenizer(tokenizer_dir)
    build_tiny_model(model_dir, tokenizer_dir=tokenizer_dir, architecture="qwen2", hidden_size=64, num_layers=2)
    # Prepare with the model directory's tokenizer: refs and train check that the fingerprints match.
    out, checkpoint = _stages(work, examples, model_dir, max_steps, "tokenizer")
    print(f"\ndone in {time.time() - started:.0f}s")
    print(f"  dataset:    {out}/  (datasets.load_from_disk; manifest.json, dropped.jsonl, quarantine.jsonl)")
    print(f"  report:     {out}/report.html  ({out}/report.md)")
    print(f"  model:      {checkpoint}/  (save_pretrained; metrics: {checkpoint}/metrics.jsonl)")
    print(f"  look at a row with its loss masks: {prefdata_command()} show {out} --row 0")
    return 0


def prefdata_command() -> str:
    """How to run `prefdata` from here: the plain name where PATH finds this interpreter's script,
    else that script's path (`.venv/bin/prefdata` after `make demo`), else `python -m prefdata`."""
    script = Path(sys.executable).parent / "prefdata"
    found = shutil.which("prefdata")
    if found and script.is_file() and os.path.samefile(found, script):
        return "prefdata"
    if script.is_file():
        try:
            return str(script.relative_to(Path.cwd()))
        except ValueError:
            return str(script)
    return f"{sys.executable} -m prefdata"


def run_image_demo(work: Path, examples: Path, max_steps: int = 20) -> int:
    """prepare --processor -> validate -> refs -> train on image pairs, with a tiny random LLaVA."""
    from prefdata.tiny.vision import build_tiny_llava_model, build_tiny_llava_processor

    work = work / "images"  # apart from the text demo's prepared/ and checkpoint/, which the README shows
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "tiny-llava"
    started = time.time()
    print(f"[1/5] building a tiny LLaVA processor and model (CLIP tower + Llama text) in {model_dir}/")
    build_tiny_llava_processor(work / "tiny-llava-processor")
    build_tiny_llava_model(model_dir, work / "tiny-llava-processor")  # saved with its processor
    out, checkpoint = _stages(work, examples, model_dir, max_steps, "processor")
    print(f"\ndone in {time.time() - started:.0f}s")
    print(f"  dataset:    {out}/  (load_from_disk gives decoded images beside the ids; manifest.json records the processor)")
    print(f"  report:     {out}/report.html  ({out}/report.md)")
    print(f"  model:      {checkpoint}/  (save_pretrained, with its processor)")
    print(f"  look at a row with its loss masks: {prefdata_command()} show {out} --row 0")
    return 0


def _stages(work: Path, examples: Path, model_dir: Path, max_steps: int, reader: str) -> tuple[Path, Path]:
    """Stages 2-5 with the model directory as the `--tokenizer` or `--processor` (`reader`)."""
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs
    from prefdata.report.render_text import render_text
    from prefdata.train.recipe import train
    from prefdata.validate.command import validate

    out, checkpoint = work / "prepared", work / "checkpoint"
    print(f"[2/5] prefdata prepare {examples} {out} --{reader} {model_dir} --max-length 256")
    result = prepare(examples, out, max_length=256, overwrite=True, progress=False, **{reader: str(model_dir)})
    print(render_text(result.report))

    check_with = {"processor": str(model_dir)} if reader == "processor" else {}
    print(f"[3/5] prefdata validate {out}" + (f" --processor {model_dir}" if check_with else ""))
    validated = validate(str(out), progress=False, output=str(work / "validate.txt"), **check_with)
    print(f"      exit code {validated.exit_code} (report in {work / 'validate.txt'})")

    print(f"[4/5] prefdata refs {out} --model {model_dir}")
    refs = compute_refs(str(out), model=str(model_dir), device="cpu", progress=False)
    print(f"      {refs.summary()}")

    print(f"[5/5] prefdata train {out} --model {model_dir} --output {checkpoint} --max-steps {max_steps}")
    trained = train(
        str(out), model=str(model_dir), output=str(checkpoint), max_steps=max_steps, batch_pairs=4,
        lr=1e-3, device="cpu", progress=False, stall_steps=max_steps + 1, overwrite=True,  # a rerun replaces its run
    )
    print(f"      {trained.summary()}")
    return out, checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefdata.tiny.demo", description=__doc__)
    parser.add_argument("--work", default="demo-out",
                        help="where everything is written (default: demo-out/ in the current directory; --images: its images/ folder)")
    parser.add_argument("--examples", default=None,
                        help="the input (default: the bundled examples/pairs, or examples/images/pairs.jsonl with --images)")
    parser.add_argument("--max-steps", type=int, default=None, help="training steps (default: 30; 20 with --images)")
    parser.add_argument("--images", action="store_true",
                        help="image preference pairs with a tiny LLaVA and its processor (the [vision] extra)")
    args = parser.parse_args(argv)
    from prefdata.core.quiet import quiet_libraries

    with quiet_libraries(True):  # the demo prints its own lines; library bars would bury them
        if args.images:
            examples = Path(args.examples or EXAMPLES / "images" / "pairs.jsonl")
            return run_image_demo(Path(args.work), examples, args.max_steps or 20)
        return run_demo(Path(args.work), Path(args.examples or EXAMPLES / "pairs"), args.max_steps or 30)


if __name__ == "__main__":
    sys.exit(main())
