"""What `refs` and `train` need to run a vision-language model on an image OUT (one prepared with
`--processor`): the processor, checked against the one OUT was prepared with, the model class to
load, and the models refused with one line.

An image OUT's token ids were made by the processor's tokenizer and hold each image's tokens
already expanded; its pixel values must come from the same image processor. So the processor is
checked (its combined fingerprint, tokenize.vision) instead of the model directory's tokenizer.

Models that compute 3-D (mrope) position ids from the image grids (Qwen2-VL and kin) get them from
their own `get_rope_index`, per sequence, placed in the layout (prefdata.model.mrope). Models whose
image tokens attend each other both ways (Gemma 3 and kin: the body's own mask, from token types)
are found by probing the body (`image_type_ids_key`) and get the token types, in right or left
padding (prefdata.model.pairs.choose_layout).

Processors whose images come as tiles under a pixel mask (Idefics3, SmolVLM: `pixel_attention_mask`)
feed each image's real tiles in token order (prefdata.model.vision_inputs); their text model is a
`text_model` (prefdata.model.attention.text_body), so packing and block attention apply.

Refused: a text-only model (it cannot see the images), a model whose image token is not the
processor's, any other tiled image processor (Idefics2: its model's tiles are not checked), a model whose config asks for 3-D positions but whose body offers no
`get_rope_index` prefdata can call (every layout would give it 1-D positions, read wrong), and a
body that reads token types as more than "which tokens are image tokens" (a prefix-LM, PaliGemma).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError, first_line
from prefdata.model.attention import model_body
from prefdata.model.mrope import rope_index
from prefdata.model.vision_inputs import VisionInputs


def is_image_out(manifest: dict[str, Any]) -> bool:
    """Whether OUT was prepared with a processor (`prepare --processor`)."""
    return isinstance(manifest.get("processor"), dict)


def processor_dir(model_dir: Path, processor: str | Path | None, manifest: dict[str, Any]) -> str:
    """`--processor` when given; else the model directory when it holds processor files; else the
    processor recorded in the manifest."""
    from prefdata.tokenize.vision import holds_processor

    if processor:
        return str(processor)
    if holds_processor(model_dir):
        return str(model_dir)
    recorded = str((manifest.get("processor") or {}).get("path") or "")
    if recorded and Path(recorded).is_dir() and holds_processor(recorded):
        return recorded
    raise PrefdataError(
        f"{model_dir} holds no processor and the one OUT was prepared with ({recorded or 'not recorded'}) is not "
        "there: pass --processor DIR"
    )


def load_checked_processor(model_dir: Path, processor: str | Path | None, manifest: dict[str, Any],
                           trust_remote_code: bool) -> tuple[Any, str]:
    """The processor (see `processor_dir`) and its fingerprint; refuses one that differs from the
    processor OUT was prepared with."""
    from prefdata.tokenize.vision import load_processor, processor_fingerprint

    path = processor_dir(model_dir, processor, manifest)
    loaded = load_processor(path, trust_remote_code)
    found = processor_fingerprint(loaded)
    expected = str((manifest.get("processor") or {}).get("fingerprint") or "")
    if found != expected:
        raise PrefdataError(
            f"the processor at {path} ({found[:19]}) differs from the one OUT was prepared with "
            f"({expected[:19]}): refusing to read its token ids and images with another processor"
        )
    return loaded, found


def checked_processor(out: Path | str, model_dir: Path, processor: str | Path | None, manifest: dict[str, Any],
                      trust_remote_code: bool) -> tuple[VisionInputs, Any, str] | None:
    """What refs and train need of an image OUT: the pixel-input settings, the processor and its
    fingerprint, checked against the manifest after the model's config; None for a text OUT, which
    refuses `processor`."""
    if not is_image_out(manifest):
        if processor:
            raise PrefdataError(f"--processor is for image pairs; {out} was prepared with --tokenizer")
        return None
    check_model_config(model_dir, trust_remote_code)
    loaded, fingerprint = load_checked_processor(model_dir, processor, manifest, trust_remote_code)
    return vision_inputs(loaded), loaded, fingerprint


# Tiled image processors whose models drop all-zero tiles and scatter the others' features in token
# order (Idefics3's and SmolVLM's get_image_features): each image's tiles can be laid out exactly.
# Idefics2's (tiles of uneven size, a perceiver over them) has not been checked.
TILED_PROCESSORS: tuple[str, ...] = ("Idefics3ImageProcessor", "SmolVLMImageProcessor")


def vision_inputs(processor: Any) -> VisionInputs:
    """The processor's image processor and image token id, as the pair forward uses them: the token
    its image features replace (`image_token_ids`, what it marks in `mm_token_type_ids`), which for
    Gemma 3 is `<image_soft_token>`, not its placeholder `processor.image_token`; `tiled` for an
    image processor that cuts images into tiles under a pixel mask. Refuses a tiled one other than
    Idefics3's and SmolVLM's (see the module's docstring)."""
    image_processor = processor.image_processor
    tiled = "pixel_attention_mask" in (getattr(image_processor, "model_input_names", None) or ())
    if tiled and not type(image_processor).__name__.startswith(TILED_PROCESSORS):
        raise PrefdataError(
            f"{type(image_processor).__name__} feeds images as tiles with a pixel_attention_mask whose model "
            "prefdata has not checked (it lays out Idefics3 and SmolVLM tiles): refs and train refuse it"
        )
    ids = [i for i in (getattr(processor, "image_token_ids", None) or []) if i is not None]
    token_id = ids[0] if len(ids) == 1 else processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return VisionInputs(image_processor=processor.image_processor, image_token_id=int(token_id), tiled=tiled)


def check_model_config(model_dir: Path, trust_remote_code: bool) -> None:
    """Refuse, before loading weights, a text-only model for an image OUT. A config that cannot be
    read is left to the model loader to report."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return
    if not is_vision_language(config):
        archs = getattr(config, "architectures", None) or [type(config).__name__]
        raise PrefdataError(
            f"{model_dir} is a text-only model ({archs[0]}) but OUT holds image pairs (prepared with --processor): "
            "give a vision-language model (LLaVA- or Qwen2-VL-style)"
        )


def is_vision_language(config: Any) -> bool:
    """A config with a vision tower (`vision_config`) or one transformers maps to image-text-to-text."""
    if getattr(config, "vision_config", None) is not None:
        return True
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as NAMES

    return getattr(config, "model_type", None) in NAMES


def check_loaded_model(model: Any, vision: VisionInputs, model_dir: Path | str) -> VisionInputs:
    """`vision` for this model: with its own 3-D position computation when it has one (Qwen2-VL and
    kin). Refuses a model whose image token differs from the processor's (its features would land
    nowhere), and one that wants 3-D positions prefdata cannot compute its way."""
    rope = rope_index(model, vision.image_token_id)
    if (rope is None and _mrope_config(model.config)) or (rope is not None and not _callable_rope_index(model)):
        raise PrefdataError(_three_d_message(model_dir, getattr(model.config, "model_type", type(model).__name__)))
    config = model.config
    token_id = getattr(config, "image_token_id", None)
    if token_id is None:
        token_id = getattr(config, "image_token_index", None)
    if token_id is not None and int(token_id) != vision.image_token_id:
        raise PrefdataError(
            f"{model_dir}'s image token id is {token_id} but the processor's is {vision.image_token_id}: "
            "the model and the processor do not belong together"
        )
    return replace(vision, rope=rope, type_ids_key=image_type_ids_key(model, model_dir))


# The forward keywords through which a body may read which tokens are image tokens.
TYPE_ID_KEYS: tuple[str, ...] = ("token_type_ids", "mm_token_type_ids")
_PROBE_TYPES = (0, 0, 1, 1, 0, 0)  # text, a two-token image, text
_CHANGED = 1e-3  # relative change of a hidden state that counts as "it sees that token"


def image_type_ids_key(model: Any, model_dir: Path | str = "the model") -> str | None:
    """The keyword through which the body lets an image's tokens attend each other both ways
    (Gemma 3 and kin build that mask from `token_type_ids`), or None when none does. Found by
    asking the body itself, so no model name is listed: six random embeddings, typed as text, a
    two-token image, text, go through it three times, as they are, with the second image token
    changed, and with the text after the image changed. The key is the one under which the first
    image token sees the second. A body under which the text or image before position 4 sees the
    text after it reads the types another way (a prefix-LM, PaliGemma) that prefdata cannot lay
    out: refused. Each comparison is between runs under the same mask, so a token that does not see
    the changed one is bitwise unchanged, in any dtype."""
    body = model_body(model)
    try:
        params = inspect.signature(body.forward).parameters
    except (TypeError, ValueError):
        return None
    for key in (k for k in TYPE_ID_KEYS if k in params):
        base, later_image, later_text = _probe(body, key)
        if _change(base[:4], later_text[:4]) > _CHANGED:
            raise PrefdataError(
                f"{model_dir} ({getattr(model.config, 'model_type', type(model).__name__)}) reads {key} as more than "
                "which tokens are image tokens (text before an image attends past it): prefdata refs and train "
                "cannot lay out its attention"
            )
        if _change(base[2:3], later_image[2:3]) > _CHANGED:
            return key
    return None


def _change(before: Any, after: Any) -> float:
    """The largest relative change of a row of hidden states."""
    return float(((after - before).norm(dim=-1) / before.norm(dim=-1).clamp_min(1e-12)).max())


def _probe(body: Any, key: str) -> tuple[Any, Any, Any]:
    """The body's last hidden states (float32) for six fixed random embeddings typed `_PROBE_TYPES`
    under `key`: as they are, with position 3 (the second image token) replaced, and with position 4
    (the text after the image) replaced."""
    import torch

    param = next(body.parameters())
    config = body.config.get_text_config() if hasattr(body.config, "get_text_config") else body.config
    generator = torch.Generator().manual_seed(0)
    size = (1, len(_PROBE_TYPES), int(config.hidden_size))
    base, other = torch.randn(size, generator=generator), torch.randn(size, generator=generator)
    variants = [base]
    for position in (3, 4):
        changed = base.clone()
        changed[:, position] = other[:, position]
        variants.append(changed)
    extra = {key: torch.tensor([_PROBE_TYPES], device=param.device),
             "position_ids": torch.arange(len(_PROBE_TYPES), device=param.device)[None]}
    was_training = body.training
    body.eval()
    try:
        with torch.no_grad():
            outs = [body(inputs_embeds=v.to(device=param.device, dtype=param.dtype), use_cache=False,
                         **extra).last_hidden_state[0].float() for v in variants]
    finally:
        body.train(was_training)
    return outs[0], outs[1], outs[2]


def load_vision_language_model(model_dir: Path | str, dtype: Any, trust_remote_code: bool) -> Any:
    """AutoModelForImageTextToText from a local directory, or a one-line PrefdataError."""
    from transformers import AutoModelForImageTextToText

    try:
        return AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=dtype,
                                                          trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        first = first_line(exc)
        raise PrefdataError(f"cannot load a vision-language model from {model_dir}: {first}") from None


def refuse_mismatched_rows(table: Any, out_dir: Path | str) -> None:
    """Rows kept with `image_mismatch` (a policy that does not drop it) have unexpanded placeholders:
    no model can match their images to image tokens, so refs and train refuse them up front."""
    import pyarrow.compute as pc

    if "flags" not in table.column_names:
        return
    flat = pc.list_flatten(table.column("flags").combine_chunks())
    count = int(pc.sum(pc.equal(flat, F.IMAGE_MISMATCH)).as_py() or 0)
    if count:
        raise PrefdataError(
            f"{out_dir} keeps {count} rows flagged {F.IMAGE_MISMATCH}: their image tokens do not match their images, "
            f"so no model can score them; prepare again with {F.IMAGE_MISMATCH} dropped (the default policy)"
        )


def _mrope_config(config: Any) -> bool:
    """Rope settings that ask for multimodal (3-D) rotary positions (`mrope_section`, rope type mrope)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for owner in {id(config): config, id(text): text}.values():
        for name in ("rope_parameters", "rope_scaling"):
            value = getattr(owner, name, None)
            if isinstance(value, dict) and "mrope" in json.dumps(value, default=str):
                return True
    return False


def _callable_rope_index(model: Any) -> bool:
    """Whether the body's `get_rope_index` takes what prefdata gives it: ids, image grids, a mask."""
    params = inspect.signature(model_body(model).get_rope_index).parameters
    return all(name in params for name in ("input_ids", "image_grid_thw", "attention_mask"))


def _three_d_message(model_dir: Path | str, model_type: str) -> str:
    return (
        f"{model_dir} ({model_type}) wants 3-D (mrope) position ids but offers no get_rope_index(input_ids, "
        "image_grid_thw, attention_mask) to compute them: prefdata refs and train cannot place its positions"
    )
