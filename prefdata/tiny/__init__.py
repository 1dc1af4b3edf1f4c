"""Tiny tokenizers, processors and random models built from code, and the demos that run on them.

They keep the demos, tests and benchmarks self-contained: no download, real chat templates, real
architectures small enough to train on a CPU in seconds. `python -m prefdata.tiny.demo` runs the
whole pipeline on the shipped examples; `python -m prefdata.tiny.online_demo` runs online DPO.
Nothing outside this package imports it: it stands on top, beside the CLI.
"""

from prefdata.tiny.text import CHATML_TEMPLATE, REASONING_TEMPLATE, SPECIAL_TOKENS, build_tiny_model, build_tiny_tokenizer
from prefdata.tiny.vision import (
    LLAVA_CHATML_TEMPLATE,
    SMOLVLM_TEMPLATE,
    build_tiny_gemma3_model,
    build_tiny_gemma3_processor,
    build_tiny_idefics3_model,
    build_tiny_idefics3_processor,
    build_tiny_llava_model,
    build_tiny_llava_processor,
    build_tiny_qwen2vl_model,
    build_tiny_qwen2vl_processor,
    build_tiny_smolvlm_model,
    build_tiny_smolvlm_processor,
)

__all__ = [
    "CHATML_TEMPLATE", "LLAVA_CHATML_TEMPLATE", "REASONING_TEMPLATE", "SMOLVLM_TEMPLATE", "SPECIAL_TOKENS",
    "build_tiny_gemma3_model", "build_tiny_gemma3_processor", "build_tiny_idefics3_model",
    "build_tiny_idefics3_processor", "build_tiny_llava_model", "build_tiny_llava_processor", "build_tiny_model",
    "build_tiny_qwen2vl_model", "build_tiny_qwen2vl_processor", "build_tiny_smolvlm_model",
    "build_tiny_smolvlm_processor", "build_tiny_tokenizer",
]
