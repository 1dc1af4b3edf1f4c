"""Tiny processors (LLaVA, Qwen2-VL, Gemma 3, Idefics3, SmolVLM) and matching tiny random
vision-language models, built from code for image pairs' demos and tests (tokenizers: prefdata.tiny.text).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from prefdata.tiny.text import build_tiny_tokenizer

# ChatML that renders content parts: each {"type": "image"} part is the processor's `<image>`.
LLAVA_CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_llava_processor(out_dir: str | Path, image_size: int = 28, patch_size: int = 14):
    """A LLaVA-style processor built in code and saved: the tiny tokenizer plus an `<image>` token, a
    CLIP image processor (its Pillow class: no torchvision), and LlavaProcessor settings under which
    one `<image>` expands to (image_size / patch_size)**2 tokens (the CLS token is added, then
    removed by the "default" feature strategy). Returns the loaded processor."""
    from transformers import AutoProcessor, CLIPImageProcessorPil, LlavaProcessor

    out = Path(out_dir)
    tokenizer = build_tiny_tokenizer(out / "_tokenizer", chat_template=LLAVA_CHATML_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=LLAVA_CHATML_TEMPLATE,
    )
    processor.save_pretrained(str(out))

    shutil.rmtree(out / "_tokenizer", ignore_errors=True)
    return AutoProcessor.from_pretrained(str(out))


def build_tiny_llava_model(out_dir: str | Path, processor_dir: str | Path, hidden_size: int = 64,
                           num_layers: int = 2, seed: int = 0):
    """A tiny random-init LLaVA (CLIP vision tower + Llama text model) for the processor saved at
    `processor_dir` by `build_tiny_llava_processor`, saved with that processor beside it (so the
    model directory is also the `--processor`). Returns the model."""
    from transformers import (
        AutoProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    processor = AutoProcessor.from_pretrained(str(processor_dir))
    tokenizer = processor.tokenizer
    image_size = int(processor.image_processor.crop_size["height"])
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=image_size, patch_size=int(processor.patch_size), projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids(processor.image_token),
        vision_feature_select_strategy="default", vision_feature_layer=-1,
    )
    return _save_beside_processor(LlavaForConditionalGeneration, config, seed, out_dir, processor_dir)


# ChatML that renders image parts as Qwen2-VL's template does: <|vision_start|><|image_pad|><|vision_end|>.
QWEN2VL_CHATML_TEMPLATE = LLAVA_CHATML_TEMPLATE.replace(
    "'<image>'", "'<|vision_start|><|image_pad|><|vision_end|>'"
)
QWEN2VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def build_tiny_qwen2vl_processor(out_dir: str | Path, min_pixels: int = 28 * 28, max_pixels: int = 28 * 28 * 16):
    """A Qwen2-VL-style processor saved from code: the tiny tokenizer plus Qwen2-VL's vision tokens,
    a Qwen2-VL image processor with tiny pixel bounds (images stay small: 1 to 16 merged 28px cells,
    so a few image tokens each, depending on the image's size) and a ChatML template that renders an
    image part as `<|vision_start|><|image_pad|><|vision_end|>`.

    Written as files (tokenizer, preprocessor_config.json naming Qwen2VLProcessor, chat template),
    because Qwen2VLProcessor will not be built in code without its torchvision video processor;
    returns it loaded the way prepare loads it (prefdata.tokenize.processor: Pillow only)."""
    import json

    from transformers import Qwen2VLImageProcessorPil

    from prefdata.tokenize.processor import load_processor

    out = Path(out_dir)
    tokenizer = build_tiny_tokenizer(out, chat_template=QWEN2VL_CHATML_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN2VL_TOKENS})
    tokenizer.save_pretrained(str(out))
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    image_processor.save_pretrained(str(out))
    config_path = out / "preprocessor_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["processor_class"] = "Qwen2VLProcessor"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2VL_CHATML_TEMPLATE}, indent=2) + "\n",
                                            encoding="utf-8")
    return load_processor(str(out))


# Gemma 3's turn layout, rendering an image part as `<start_of_image>`, which Gemma3Processor expands.
GEMMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}


def build_tiny_gemma3_processor(out_dir: str | Path, image_size: int = 28, image_seq_length: int = 4):
    """A Gemma 3 processor built in code and saved: the tiny tokenizer plus Gemma 3's turn and image
    tokens, a Gemma 3 image processor at `image_size` pixels (its Pillow class) and Gemma3Processor
    with `image_seq_length` soft tokens per image. Its template renders `<start_of_image>`, which the
    processor expands to "\\n\\n<start_of_image>" + N x `<image_soft_token>` + "<end_of_image>\\n\\n":
    the placeholder is not the image token, and fixed text surrounds the run. Returns it loaded."""

    from transformers import AutoProcessor, AutoTokenizer, Gemma3ImageProcessorPil, Gemma3Processor

    out = Path(out_dir)
    scratch = out / "_tokenizer"
    tokenizer = build_tiny_tokenizer(scratch, chat_template=GEMMA3_TEMPLATE)
    turns = ["<start_of_turn>", "<end_of_turn>"]
    tokenizer.add_special_tokens({"additional_special_tokens": [*GEMMA3_TOKENS.values(), *turns]})
    tokenizer.save_pretrained(str(scratch))
    # Gemma3Processor reads boi/eoi/image tokens (and their ids) off the tokenizer, as Gemma's own declares them.
    tokenizer = AutoTokenizer.from_pretrained(str(scratch), extra_special_tokens=GEMMA3_TOKENS)
    image_processor = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, chat_template=GEMMA3_TEMPLATE,
                                image_seq_length=image_seq_length)
    processor.save_pretrained(str(out))
    shutil.rmtree(scratch, ignore_errors=True)
    return AutoProcessor.from_pretrained(str(out))


IDEFICS3_TOKENS = ["<global-img>", *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]


def build_tiny_idefics3_processor(out_dir: str | Path, tile: int = 28, longest_edge: int = 84,
                                  image_seq_len: int = 4, splitting: bool = True):
    """An Idefics3 (SmolVLM's layout) processor built in code and saved: the tiny tokenizer plus the
    row/col and global-image tokens, an Idefics3 image processor (its Pillow class) that resizes an
    image's longest edge to `longest_edge` and, with `splitting`, cuts it into `tile`-pixel tiles
    (up to 3 x 3 here), and Idefics3Processor with `image_seq_len` `<image>` tokens per tile. The
    template renders an image part as `<image>`, which the processor expands to one
    `<fake_token_around_image><row_r_col_c>` + N x `<image>` per tile and a global block: the layout
    changes with the image's size. Returns it loaded."""

    from transformers import AutoProcessor, Idefics3ImageProcessorPil, Idefics3Processor

    out = Path(out_dir)
    scratch = out / "_tokenizer"
    tokenizer = build_tiny_tokenizer(scratch, chat_template=LLAVA_CHATML_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": IDEFICS3_TOKENS})
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=splitting, size={"longest_edge": longest_edge},
                                                max_image_size={"longest_edge": tile})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=image_seq_len,
                                  chat_template=LLAVA_CHATML_TEMPLATE)
    processor.save_pretrained(str(out))
    shutil.rmtree(scratch, ignore_errors=True)
    return AutoProcessor.from_pretrained(str(out))


# SmolVLM's own turn layout ("User:<image>...<end_of_utterance>", then "Assistant:"), taking plain
# string contents too; an image part renders as `<image>`, which the processor expands to tiles.
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{{ ':' if message['content'][0]['type'] == 'image' else ': ' }}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_utterance>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
SMOLVLM_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", *IDEFICS3_TOKENS]


def build_tiny_smolvlm_processor(out_dir: str | Path, tile: int = 28, longest_edge: int = 84,
                                 image_seq_len: int = 4, splitting: bool = True):
    """A SmolVLM processor saved from code: the tiny tokenizer plus SmolVLM's image tokens (its turn
    end `<end_of_utterance>` as EOS), a SmolVLM image processor (its Pillow class) that resizes an
    image's longest edge to `longest_edge` and, with `splitting`, cuts it into `tile`-pixel tiles (up
    to 3 x 3 here), `image_seq_len` `<image>` tokens per tile, and SmolVLM's own turn layout. An image
    part expands as in Idefics3 (`build_tiny_idefics3_processor`).

    Written as files (tokenizer, processor_config.json naming SmolVLMProcessor, chat template) with no
    video processor, because SmolVLMProcessor will not be built in code without its torchvision one;
    returns it loaded the way prepare loads it (prefdata.tokenize.processor: Pillow only)."""
    import json

    from transformers import SmolVLMImageProcessorPil

    from prefdata.tokenize.processor import load_processor

    out = Path(out_dir)
    tokenizer = build_tiny_tokenizer(out, chat_template=SMOLVLM_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": SMOLVLM_TOKENS})
    tokenizer.eos_token = "<end_of_utterance>"
    tokenizer.save_pretrained(str(out))
    image_processor = SmolVLMImageProcessorPil(do_image_splitting=splitting, size={"longest_edge": longest_edge},
                                               max_image_size={"longest_edge": tile})
    config = {"image_processor": image_processor.to_dict(), "image_seq_len": image_seq_len,
              "processor_class": "SmolVLMProcessor"}
    (out / "processor_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return load_processor(str(out))


def build_tiny_qwen2vl_model(out_dir: str | Path, processor_dir: str | Path, hidden_size: int = 64,
                             num_layers: int = 2, seed: int = 0):
    """A tiny random-init Qwen2-VL (a one-block vision tower, a Qwen2-VL text model with 3-D mrope
    positions) for the processor saved at `processor_dir` by `build_tiny_qwen2vl_processor`: its
    patch, merge and temporal patch sizes are the image processor's, its vision/image token ids the
    tokenizer's. Saved with the processor's files copied beside it (so the model directory is also
    the `--processor`). Returns the model."""

    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from prefdata.tokenize.processor import load_processor

    processor = load_processor(str(processor_dir))
    tokenizer, images = processor.tokenizer, processor.image_processor
    heads = 4
    half_head = hidden_size // heads // 2  # the rotary frequencies per head, split over (t, h, w)
    mrope_section = [half_head - 2 * (half_head // 3), half_head // 3, half_head // 3]
    vision = dict(
        depth=1, embed_dim=32, hidden_size=hidden_size, num_heads=2, mlp_ratio=2, in_channels=3,
        patch_size=int(images.patch_size), spatial_merge_size=int(images.merge_size),
        temporal_patch_size=int(images.temporal_patch_size),
    )
    text = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=2,
        max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section},
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        vision_config=vision, text_config=text, image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"), vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"), tie_word_embeddings=False,
        # Weights large enough that a token's 3-D position visibly moves its log-prob (at 0.02 a random
        # tiny model attends almost uniformly): tests can tell wrong positions from right ones.
        initializer_range=0.1,
    )
    return _save_beside_processor(Qwen2VLForConditionalGeneration, config, seed, out_dir, processor_dir)


def build_tiny_gemma3_model(out_dir: str | Path, processor_dir: str | Path, hidden_size: int = 64,
                            num_layers: int = 4, sliding_window: int = 8, seed: int = 0):
    """A tiny random-init Gemma 3 (a one-layer SigLIP tower + a Gemma 3 text model) for the
    processor saved at `processor_dir` by `build_tiny_gemma3_processor`: the tower's image size is
    the image processor's, its 7px patches pooled to the processor's `image_seq_length` soft tokens,
    its image/boi/eoi ids the tokenizer's. The text model alternates sliding-window layers (window
    `sliding_window`, short enough that a prompt outgrows it) and full ones, as Gemma 3 does; its
    image tokens attend each other both ways (the model's own mask, from `token_type_ids`). Saved
    with the processor beside it (so the model directory is also the `--processor`). Returns the model."""
    from transformers import AutoProcessor, Gemma3Config, Gemma3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(processor_dir))
    tokenizer = processor.tokenizer
    image_size = int(processor.image_processor.size["height"])
    tokens = int(processor.image_seq_length)
    vision = dict(
        model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, image_size=image_size, patch_size=7, vision_use_head=False,
    )
    pattern = ["sliding_attention", "full_attention"]
    text = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, sliding_window=sliding_window,
        layer_types=[pattern[i % 2] for i in range(num_layers)],
    )
    token_id = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(
        vision_config=vision, text_config=text, mm_tokens_per_image=tokens,
        image_token_index=token_id(GEMMA3_TOKENS["image_token"]), boi_token_index=token_id(GEMMA3_TOKENS["boi_token"]),
        eoi_token_index=token_id(GEMMA3_TOKENS["eoi_token"]), tie_word_embeddings=False,
        # Weights large enough that whether an image token sees the later ones visibly moves the
        # log-probs (at 0.02 a random tiny model attends almost uniformly).
        initializer_range=0.1,
    )
    return _save_beside_processor(Gemma3ForConditionalGeneration, config, seed, out_dir, processor_dir)


def build_tiny_idefics3_model(out_dir: str | Path, processor_dir: str | Path, hidden_size: int = 64,
                              num_layers: int = 2, seed: int = 0):
    """A tiny random-init Idefics3 (SmolVLM's architecture: a one-layer SigLIP-like tower, a pixel
    shuffle connector, a Llama text model) for the processor saved at `processor_dir` by
    `build_tiny_idefics3_processor`: the tower's image size is the processor's tile, its patches and
    scale factor chosen so each tile gives the processor's `image_seq_len` `<image>` tokens, its image
    token id the tokenizer's. Saved with the processor's files copied beside it (so the model
    directory is also the `--processor`). Returns the model."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    config = Idefics3Config(**_tiled_config(processor_dir, hidden_size, num_layers))
    return _save_beside_processor(Idefics3ForConditionalGeneration, config, seed, out_dir, processor_dir)


def build_tiny_smolvlm_model(out_dir: str | Path, processor_dir: str | Path, hidden_size: int = 64,
                             num_layers: int = 2, seed: int = 0):
    """A tiny random-init SmolVLM (Idefics3's layout: a one-layer SigLIP-like tower, a pixel shuffle
    connector, a Llama text model) for the processor saved at `processor_dir` by
    `build_tiny_smolvlm_processor`, sized as `build_tiny_idefics3_model` sizes Idefics3. Saved with
    the processor's files copied beside it (so the model directory is also the `--processor`).
    Returns the model."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    config = SmolVLMConfig(**_tiled_config(processor_dir, hidden_size, num_layers))
    return _save_beside_processor(SmolVLMForConditionalGeneration, config, seed, out_dir, processor_dir)


def _tiled_config(processor_dir: str | Path, hidden_size: int, num_layers: int) -> dict[str, Any]:
    """Idefics3 / SmolVLM config settings matching a tiled processor: each tile one tower image,
    cut into patches that the pixel shuffle (scale factor 2) turns into `image_seq_len` tokens."""
    import math

    from prefdata.tokenize.processor import load_processor

    processor = load_processor(str(processor_dir))
    tokenizer = processor.tokenizer
    tile = int(processor.image_processor.max_image_size["longest_edge"])
    scale_factor = 2
    side = scale_factor * math.isqrt(int(processor.image_seq_len))  # patches per tile side
    if tile % side:
        raise ValueError(f"a {tile}-px tile cannot be cut into {side} x {side} patches")
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=tile, patch_size=tile // side)
    text = dict(
        model_type="llama", vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
    )
    return dict(
        vision_config=vision, text_config=text, scale_factor=scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids(processor.image_token), tie_word_embeddings=False,
        # Weights large enough that which tile lands where visibly moves the log-probs.
        initializer_range=0.1,
    )


def _save_beside_processor(model_class: Any, config: Any, seed: int, out_dir: str | Path,
                           processor_dir: str | Path) -> Any:
    """A seeded random `model_class(config)` saved in `out_dir` with the processor's own files beside
    it (copied, not re-saved: Qwen2VLProcessor will not save without its torchvision video
    processor), so the model directory is also the `--processor`. Returns the model."""
    import torch

    torch.manual_seed(seed)
    model = model_class(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    for item in Path(processor_dir).iterdir():
        if item.is_file() and not (out / item.name).exists():
            shutil.copy2(item, out / item.name)
    return model
