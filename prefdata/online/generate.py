"""`prefdata generate`: K sampled completions per prompt from a policy, one JSONL line per sample.

Prompts are rendered as `prepare` renders them, so the ids the policy is sampled from are the ids it
is later trained on: message-list prompts (and string prompts with `chat_template=True`, as one user
turn) through the tokenizer's chat template with the generation prompt, tokenized without special
tokens; plain string prompts with the tokenizer's own leading special tokens (BOS).

The transformers engine samples in batches with a KV cache on left-padded prompts (its own decode
loop, prefdata.online.decode: `model.generate`'s sampler dominates on CPU); the vLLM
engine (`engine="vllm"`) needs vLLM and a GPU. `finished` says a sample ended with EOS; one that hit
`max_new_tokens` is unfinished, and its pair is flagged `completion_truncated` downstream.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.reasoning import THINK_CLOSE, THINK_OPEN
from prefdata.io.out_dir import refuse_inputs_inside
from prefdata.online.decode import Sample
from prefdata.online.jsonl import write_jsonl
from prefdata.online.prompts import PromptRow, read_prompts
from prefdata.online.sample_settings import SamplingSettings
from prefdata.settings.commands import GenerateSettings
from prefdata.settings.declare import settings_command
from prefdata.tokenize.template import (
    TemplateSettings,
    parse_template_kwargs,
    pinned_clock,
    template_messages,
)

GENERATIONS_FILE = "generations.jsonl"
@dataclass
class GenerateResult:
    path: Path
    prompts: int
    samples: int
    finished: int  # samples that ended with EOS
    skipped_rows: int  # input rows with no usable prompt
    seconds: float

    def summary(self) -> str:
        share = self.finished / self.samples if self.samples else 0.0
        text = (f"generated {self.samples} samples for {self.prompts} prompts in {self.seconds:.1f}s "
                f"({share:.0%} ended with EOS) -> {self.path}")
        if self.skipped_rows:
            text += f"\nskipped {self.skipped_rows} rows with no usable prompt"
        return text


@settings_command(GenerateSettings)  # settings=GenerateSettings(...) or flat keywords: prefdata.settings
def generate(prompts: str | Path, out: str | Path, settings: GenerateSettings) -> GenerateResult:
    """Sample `samples` completions per prompt of PROMPTS with MODEL and write OUT/generations.jsonl.
    The template settings render prompts exactly as `prepare` will (prefdata.tokenize.template).
    Each setting is declared once, in `prefdata.settings.commands.GenerateSettings` (`prefdata generate --help`);
    pass `settings=GenerateSettings(...)`, flat keywords (`model="policy"`), or both."""
    s = settings
    if s.model is None:
        raise TypeError("generate() missing the required setting 'model'")
    started = time.time()
    path = Path(out) / GENERATIONS_FILE
    if path.exists() and not s.overwrite:
        raise PrefdataError(f"{path} exists (it may hold rewards already): pass --overwrite to replace it")
    refuse_inputs_inside(path, [prompts], "replaces")  # --overwrite must not replace the prompts it reads
    template = TemplateSettings(parse_template_kwargs(s.template_kwargs),
                                str(s.chat_template_file) if s.chat_template_file else None, date=s.template_date)
    sampling = SamplingSettings(s.samples, s.max_new_tokens, s.temperature, s.top_p, s.seed, s.batch_size,
                                s.chat_template, s.engine, s.device, template)
    prompt_set = read_prompts(prompts)
    if prompt_set.first_problem:
        print(f"warning: skipped {prompt_set.skipped} rows with no usable prompt (first: {prompt_set.first_problem})",
              file=sys.stderr)
    rows = generate_rows(prompt_set.rows, s.model, sampling, progress=s.progress, trust_remote_code=s.trust_remote_code)
    write_jsonl(path, rows)
    return GenerateResult(path, len(prompt_set.rows), len(rows), sum(r["finished"] for r in rows),
                          prompt_set.skipped, time.time() - started)


def generate_rows(
    prompts: list[PromptRow],
    model: str | Path,
    settings: SamplingSettings,
    *,
    progress: bool = True,
    trust_remote_code: bool = False,
    loaded_model: Any = None,
) -> list[dict[str, Any]]:
    """The generation rows (prompt, completion, sample, source_file, source_line, finished, prompt_ids,
    completion_ids), prompt by prompt in input order, samples 0..K-1 of a prompt next to each other.
    `completion_ids` are the sampled ids through the stop token (all of them when unfinished): what
    online rounds train on, so training sees exactly what the policy sampled. `loaded_model` is the
    model at `model` already in memory (online rounds: the policy the last round trained); it is used
    where it has the dtype generation runs in (fp32 on CPU), else the directory is loaded."""
    model_dir = Path(model)
    if not model_dir.is_dir():
        raise PrefdataError(f"--model {model} is not a local model directory")
    # Only a replacement template changes the tokenizer (render_prompts): otherwise the cached one is shared.
    tokenizer = _load_tokenizer(model_dir, trust_remote_code, read_only=settings.template.chat_template_text is None)
    prompt_ids = render_prompts(tokenizer, prompts, settings.chat_template, settings.template)
    keep = think_tag_tokens(tokenizer)
    if settings.engine == "vllm":
        from prefdata.online.vllm_engine import vllm_generate

        decode = (lambda ids: decode_completion(tokenizer, ids, keep)) if keep else None
        outputs = vllm_generate(model_dir, prompt_ids, settings, trust_remote_code, decode)
    else:
        outputs = _transformers_generate(model_dir, tokenizer, prompt_ids, settings, progress, trust_remote_code, keep,
                                         loaded_model)
    rows: list[dict[str, Any]] = []
    for row, ids, samples in zip(prompts, prompt_ids, outputs):
        for k, sample in enumerate(samples):
            rows.append({"prompt": row.prompt, "completion": sample.text, "sample": k, "source_file": row.source_file,
                         "source_line": row.source_line, "finished": sample.finished, "prompt_ids": ids,
                         "completion_ids": sample.ids})
    return rows


def render_prompts(tokenizer: Any, prompts: list[PromptRow], chat_template: bool,
                   template: TemplateSettings | None = None) -> list[list[int]]:
    """Prompt token ids, rendered as `prepare` renders prompts (see the module doc), with the same
    template settings (variables, replacement template, pinned date)."""
    template = template or TemplateSettings()
    if template.chat_template_text is not None:
        tokenizer.chat_template = template.chat_template_text
    templated = [i for i, row in enumerate(prompts) if row.is_conversational or chat_template]
    if templated and not tokenizer.chat_template:
        raise PrefdataError("message-list prompts (or --chat-template) need a tokenizer with a chat template")
    ids: list[list[int]] = [[] for _ in prompts]
    if templated:
        conversations = [
            prompts[i].prompt if prompts[i].is_conversational else [{"role": "user", "content": prompts[i].prompt}]
            for i in templated
        ]
        with pinned_clock(template.day()):
            texts = tokenizer.apply_chat_template(
                [template_messages(c) for c in conversations], tokenize=False, add_generation_prompt=True,
                **template.render_kwargs(),
            )
        encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        for i, row_ids in zip(templated, encoded):
            ids[i] = list(row_ids)
    templated_set = set(templated)
    plain = [i for i in range(len(prompts)) if i not in templated_set]
    if plain:
        encoded = tokenizer([prompts[i].prompt for i in plain], add_special_tokens=True)["input_ids"]
        for i, row_ids in zip(plain, encoded):
            ids[i] = list(row_ids)
    return ids


def stop_ids(tokenizer: Any, generation_config: Any) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation EOS ids."""
    found: list[int] = []
    for value in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        for token in value if isinstance(value, list) else [value]:
            if token is not None and int(token) not in found:
                found.append(int(token))
    if not found:
        raise PrefdataError("the policy's tokenizer has no EOS token: a completion could never finish")
    return found


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PrefdataError(f"--device {device}: CUDA is not available")
    return device


def _load_tokenizer(model_dir: Path, trust_remote_code: bool, read_only: bool = False) -> Any:
    from prefdata.core.tokenizer_cache import load_pretrained_tokenizer

    try:
        return load_pretrained_tokenizer(model_dir, trust_remote_code=trust_remote_code, read_only=read_only)
    except (OSError, ValueError) as exc:
        raise PrefdataError(f"cannot load a tokenizer from {model_dir}: {str(exc).splitlines()[0]}") from None


def _transformers_generate(model_dir: Path, tokenizer: Any, prompt_ids: list[list[int]], settings: SamplingSettings,
                           progress: bool, trust_remote_code: bool,
                           keep: dict[int, str] | None = None, loaded: Any = None) -> list[list[Sample]]:
    """Batched sampling with a KV cache: left-padded prompts, `samples` sequences per prompt."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    device = resolve_device(settings.device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if loaded is not None and next(loaded.parameters()).dtype == dtype:
        policy = loaded
    else:
        try:
            policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                          trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise PrefdataError(f"cannot load a causal LM from {model_dir}: {str(exc).splitlines()[0]}") from None
    policy.to(device).eval()
    eos = stop_ids(tokenizer, policy.generation_config)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    from prefdata.online.decode import sample

    generator = torch.Generator(device=device).manual_seed(settings.seed)
    outputs: list[list[Sample]] = []
    starts = range(0, len(prompt_ids), settings.batch_size)
    for start in tqdm(starts, desc="generate", unit=" batches", disable=not progress or None):
        batch = prompt_ids[start : start + settings.batch_size]
        width = max(len(ids) for ids in batch)
        # Left padding: every prompt ends at the same position, where generation starts.
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=device)
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
        # Each prompt runs once; its `samples` rows come next to each other (as num_return_sequences lays them out).
        completions = sample(
            policy, input_ids, mask, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
            top_p=settings.top_p, stop_ids=eos, pad_id=pad, generator=generator, samples=settings.samples,
        ).tolist()
        for p in range(len(batch)):
            outputs.append([_decode(tokenizer, completions[p * settings.samples + k], eos, keep)
                            for k in range(settings.samples)])
    return outputs


def _decode(tokenizer: Any, ids: list[int], eos: list[int], keep: dict[int, str] | None = None) -> Sample:
    """The sample up to its first EOS (the padding after it is not part of it); think tags in `keep`
    stay in the text."""
    end = next((i for i, token in enumerate(ids) if token in eos), None)
    text = decode_completion(tokenizer, ids if end is None else ids[:end], keep or {})
    return Sample(text, end is not None, ids if end is None else ids[: end + 1])


def think_tag_tokens(tokenizer: Any) -> dict[int, str]:
    """Token ids of `<think>`/`</think>` that `skip_special_tokens` would drop from decoded text (a
    tokenizer that marks them special); most reasoning tokenizers (Qwen3, DeepSeek-R1, SmolLM3) do not."""
    tags: dict[int, str] = {}
    for tag in (THINK_OPEN, THINK_CLOSE):
        token_id = tokenizer.convert_tokens_to_ids(tag)
        if (isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == tag
                and tag not in tokenizer.decode([token_id], skip_special_tokens=True)):
            tags[token_id] = tag
    return tags


def decode_completion(tokenizer: Any, ids: list[int], keep: dict[int, str]) -> str:
    """Completion text without special tokens, but with the think tags in `keep`: the reasoning block
    is part of what the policy produced and is trained on, so it must survive decoding."""
    if not any(token in keep for token in ids):
        return tokenizer.decode(ids, skip_special_tokens=True)
    parts: list[str] = []
    run: list[int] = []
    for token in ids:
        if token in keep:
            parts += [tokenizer.decode(run, skip_special_tokens=True), keep[token]]
            run = []
        else:
            run.append(token)
    parts.append(tokenizer.decode(run, skip_special_tokens=True))
    return "".join(parts)


