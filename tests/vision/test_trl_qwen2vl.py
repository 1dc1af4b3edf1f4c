"""The TRL hand-off with Qwen2-VL: image grids (`image_grid_thw`) and the image-token types Qwen2-VL
computes its 3-D positions from, through `prefdata.trl.DPOTrainer`, against TRL's own trainer and
TRL's own vision collator on the same raw rows.

A tiny random Qwen2-VL (`prefdata.tiny.build_tiny_qwen2vl_model`) and its tiny processor, loaded
with Pillow alone (TRL's own trainer gets it from prefdata.tokenize.processor: AutoProcessor wants
Qwen2-VL's torchvision video processor). The refs are `prefdata refs`' (test_qwen2vl_refs_train.py
checks them against a plain forward).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen2VLForConditionalGeneration"):
    pytest.skip("this transformers has no Qwen2-VL", allow_module_level=True)

import datasets  # noqa: E402
import torch  # noqa: E402

from prefdata.tokenize.processor import load_processor  # noqa: E402
from vision_helpers import (  # noqa: E402
    as_content_parts, dpo_config, first_batch_token_logps, image_row, kept, prepare_with_refs, raw_image_dataset,
    write_jsonl, write_pngs
)

MAX_LENGTH = 128
# Grids of several shapes (merged 28px cells): 2x2, 3x1, 3x4, and 1x1 for an image that is not a multiple of 28.
SIZES = {"square": (56, 56), "tall": (12, 70), "large": (100, 80), "odd": (37, 23)}


def _rows() -> list[dict]:
    """TRL's vision layout, every content a list of parts (one Arrow type per column for TRL's trainer):
    one image, two images of other grids (in both orders), an image after the text, a system turn, and
    a text-only row in a batch with images."""
    after_text = image_row("", ["img/odd.png"], placeholders=0, chosen="Purple, mostly.", rejected="Green.")
    after_text["prompt"][0]["content"] = [{"type": "text", "text": "Here is a picture:"}, {"type": "image"},
                                          {"type": "text", "text": "What color dominates?"}]
    system = image_row("Describe it.", ["img/large.png"], chosen="A large flat rectangle.", rejected="A cat.")
    system["prompt"].insert(0, {"role": "system", "content": "You describe images."})
    rows = [
        image_row("What color is it?", ["img/square.png"]),
        image_row("Compare the two pictures.", ["img/large.png", "img/tall.png"], placeholders=2,
                  chosen="The first is wide, the second is tall.", rejected="Same."),
        after_text,
        system,
        image_row("Compare the two pictures.", ["img/tall.png", "img/large.png"], placeholders=2,
                  chosen="Tall, then wide.", rejected="Same."),
        image_row("Say hello.", [], placeholders=0, chosen="Hello!", rejected="No."),
    ]
    return as_content_parts(rows)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-qwen2vl")
    write_pngs(root / "data" / "img", SIZES, lambda i: (50 * i, 200 - 35 * i, 80))
    return write_jsonl(root / "data" / "pairs.jsonl", _rows())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, qwen2vl_processor_dir) -> str:
    from prefdata.tiny import build_tiny_qwen2vl_model

    path = tmp_path_factory.mktemp("qwen2vl-model")
    build_tiny_qwen2vl_model(path, qwen2vl_processor_dir)
    return str(path)


@pytest.fixture(scope="module")
def prepared(raw, model_dir):
    """OUT prepared with the model directory's processor, plus `prefdata refs` from the same model."""
    return prepare_with_refs(raw.parent.parent, _rows(), model_dir, MAX_LENGTH)


def _raw_rows(raw) -> datasets.Dataset:
    return raw_image_dataset(raw, _rows())


def _config(tmp_path, **overrides):
    return dpo_config(tmp_path, MAX_LENGTH, 3, len(_rows()), **overrides)


def test_first_batch_logps_equal_trls_own_trainer_on_the_raw_rows(prepared, raw, model_dir, tmp_path):
    """Same ids, pixels, grids and image-token types, so the model computes the same 3-D positions
    and gives the same policy log-probs. TRL's completions carry one more token (the newline after
    <|im_end|>, as on the text path): its log-prob is the only one TRL adds."""
    import trl

    from prefdata.trl import DPOTrainer

    processor = load_processor(model_dir)
    newline = processor.tokenizer.encode("\n", add_special_tokens=False)[0]
    ours = DPOTrainer(model_dir, args=_config(tmp_path / "ours"), train_dataset=str(prepared))  # loads its processor
    raw_rows = _raw_rows(raw)
    theirs = trl.DPOTrainer(model_dir, args=_config(tmp_path / "theirs"), train_dataset=raw_rows,
                            processing_class=load_processor(model_dir))
    our_batch, our_logps = first_batch_token_logps(ours, ours.train_dataset)
    their_batch, their_logps = first_batch_token_logps(theirs, raw_rows)

    rows = _rows()
    assert set(our_batch) == set(their_batch) | {"ref_chosen_logps", "ref_rejected_logps"}
    assert torch.equal(our_batch["pixel_values"], their_batch["pixel_values"])  # the same patches, same order
    assert torch.equal(our_batch["image_grid_thw"], their_batch["image_grid_thw"])
    assert our_batch["image_grid_thw"].shape[0] == 2 * sum(len(row["images"]) for row in rows)
    assert len({tuple(g) for g in our_batch["image_grid_thw"].tolist()}) == len(SIZES)  # grids of every shape
    for j in range(2 * len(rows)):
        ids_ours, ids_theirs = kept(our_batch, "input_ids", j), kept(their_batch, "input_ids", j)
        assert ids_theirs == ids_ours + [newline]
        types_ours = kept(our_batch, "mm_token_type_ids", j)
        assert kept(their_batch, "mm_token_type_ids", j) == types_ours + [0]
        assert sum(types_ours) == sum(int(g.prod()) // 4 for g in _grids_of(our_batch, rows, j))
        assert kept(their_batch, "completion_mask", j)[:-1] == kept(our_batch, "completion_mask", j)
        torch.testing.assert_close(torch.tensor(their_logps[j][:-1]), torch.tensor(our_logps[j]), rtol=0, atol=1e-5)
    assert all(math.isfinite(value) for logps in our_logps for value in logps)


def _grids_of(batch, rows, j) -> list[torch.Tensor]:
    """The grids of sequence j of a hand-off batch: its row's images, chosen rows first, then rejected."""
    counts = [len(row["images"]) for row in rows] * 2
    start = sum(counts[:j])
    return list(batch["image_grid_thw"][start : start + counts[j]])


def test_trains_on_stored_refs_from_ln2_without_a_reference_model(prepared, model_dir, tmp_path):
    """`prefdata refs` values are the policy's own log-probs as TRL computes them: the first loss is ln 2."""
    from prefdata.trl import DPOTrainer

    dataset = datasets.load_from_disk(str(prepared))
    trainer = DPOTrainer(model_dir, args=_config(tmp_path), train_dataset=dataset, eval_dataset=dataset)
    assert trainer.ref_model is None
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and abs(losses[0] - math.log(2)) < 1e-4
    assert abs(trainer.evaluate()["eval_loss"] - math.log(2)) < 1e-2


def test_prepared_ids_equal_trls_vision_collator(prepared, raw, model_dir):
    """Peer check: per pair, `prepare --processor` ids equal what TRL's DataCollatorForVisionPreference
    makes of the raw rows with the same Qwen2-VL processor (every image's run of <|image_pad|>, its
    length from the image's grid), up to the newline TRL keeps after the EOS."""
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    processor = load_processor(model_dir)
    tokenizer = processor.tokenizer
    batch = DataCollatorForVisionPreference(processor=processor)(list(_raw_rows(raw)))
    out = datasets.load_from_disk(str(prepared)).to_list()
    image_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    grids = iter(batch["image_grid_thw"][: sum(len(row["images"]) for row in _rows())].tolist())
    for i, row in enumerate(out):
        for half, j in (("chosen", i), ("rejected", i + len(out))):
            keep = batch["attention_mask"][j].bool()
            ids, completion = batch["input_ids"][j][keep], batch["completion_mask"][j][keep].bool()
            assert ids[~completion].tolist() == row["prompt_ids"]
            assert ids[completion].tolist() == row[f"{half}_ids"] + newline
        expected_tokens = sum(t * h * w // 4 for t, h, w in (next(grids) for _ in row["images"] or []))
        assert row["prompt_ids"].count(image_id) == expected_tokens
