"""The vLLM engine for `prefdata generate --engine vllm` (vLLM and a CUDA GPU required)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.online.decode import Sample
from prefdata.online.sample_settings import SamplingSettings


def vllm_available() -> str | None:
    """None when the vLLM engine can run here, else the one-line reason it cannot."""
    if importlib.util.find_spec("vllm") is None:
        return "--engine vllm needs vLLM (pip install vllm), which is not installed"
    import torch

    if not torch.cuda.is_available():
        return "--engine vllm needs a CUDA GPU, and none is available"
    return None


def vllm_generate(model_dir: Path, prompt_ids: list[list[int]], settings: SamplingSettings,
                  trust_remote_code: bool,
                  decode: Callable[[list[int]], str] | None = None) -> list[list[Sample]]:
    """`samples` completions per prompt: text without the stop token, finished with EOS/stop, and the
    sampled ids (vLLM's `token_ids`: through the EOS it stopped on).
    `decode` (given when the tokenizer marks think tags special, which vLLM's text would drop) turns
    the token ids into text instead."""
    reason = vllm_available()
    if reason is not None:
        raise PrefdataError(reason)
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), seed=settings.seed, trust_remote_code=trust_remote_code)
    params = SamplingParams(
        n=settings.samples, temperature=settings.temperature, top_p=settings.top_p,
        max_tokens=settings.max_new_tokens, seed=settings.seed,
    )
    # The same prompt ids the transformers engine uses: vLLM does not re-render or add a BOS.
    results = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)

    def text_of(c: Any) -> str:
        if decode is None:
            return c.text
        ids = list(c.token_ids)
        if c.finish_reason == "stop" and not isinstance(c.stop_reason, str) and ids:
            ids = ids[:-1]  # ended on EOS or a stop token id: that token is not text
        return decode(ids)

    return [[Sample(text_of(c), c.finish_reason == "stop", list(c.token_ids))
             for c in sorted(r.outputs, key=lambda c: c.index)] for r in results]
