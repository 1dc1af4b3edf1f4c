"""Peer check against TRL 1.16's own vision path: for the same image rows (TRL's conversational layout,
`{"type": "image"}` parts and an `images` list), `prefdata prepare --processor` gives per pair the
token ids `DataCollatorForVisionPreference` gives with the same processor (its input_ids split by
completion_mask into prompt / chosen / rejected, padding removed).

One difference, the same as on TRL's text path (docs/trl.md): TRL's completions keep the `\\n` the
ChatML template renders after `<|im_end|>`; prefdata's end at `<|im_end|>`, the EOS the model emits.
The test asserts exactly that relation, so any other difference fails it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from vision_helpers import image_row, png_bytes, write_jsonl  # noqa: E402

SIZES = {"square": (28, 28), "wide": (64, 20), "tall": (10, 90), "large": (200, 150), "odd": (37, 23)}


def _rows() -> list[dict]:
    """Several layouts: one image, two images of other sizes, an image after the text, a system turn,
    a multi-turn prompt, a completion long enough to differ in length from its twin."""
    after_text = image_row("", ["img/odd.png"], placeholders=0, chosen="Purple, mostly.", rejected="Green.")
    after_text["prompt"][0]["content"] = [{"type": "text", "text": "Here is a picture:"}, {"type": "image"},
                                          {"type": "text", "text": "What color dominates?"}]
    system = image_row("Describe it.", ["img/large.png"], chosen="A large flat rectangle.", rejected="A cat.")
    system["prompt"].insert(0, {"role": "system", "content": "You are a careful describer of images."})
    turns = image_row("And now?", ["img/square.png", "img/tall.png"], placeholders=1, chosen="Taller.", rejected="Same.")
    turns["prompt"] = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Look at this."}]},
        {"role": "assistant", "content": "It is a small square."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And now?"}]},
    ]
    return [
        image_row("What color is it?", ["img/square.png"]),
        image_row("Compare the two pictures.", ["img/wide.png", "img/tall.png"], placeholders=2,
                  chosen="The first is wide, the second is tall.", rejected="They are the same."),
        after_text,
        system,
        turns,
    ]


@pytest.fixture(scope="module")
def peer(tmp_path_factory, llava_processor_dir):
    """(OUT rows, TRL's per-pair (prompt, chosen, rejected) ids, processor) for the same rows."""
    import datasets
    import torch
    from PIL import Image
    from transformers import AutoProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from prefdata.prepare import prepare

    root = tmp_path_factory.mktemp("trl-vision-peer")
    (root / "data" / "img").mkdir(parents=True)
    for i, (name, size) in enumerate(SIZES.items()):
        (root / "data" / "img" / f"{name}.png").write_bytes(png_bytes(size, (40 * i, 200 - 30 * i, 90)))
    rows = _rows()
    raw = write_jsonl(root / "data" / "pairs.jsonl", rows)
    result = prepare(raw, root / "out", processor=str(llava_processor_dir), progress=False, workers=1)
    assert result.rows_out == len(rows), (root / "out" / "dropped.jsonl").read_text()
    out = datasets.load_from_disk(str(root / "out")).to_list()

    processor = AutoProcessor.from_pretrained(str(llava_processor_dir))
    collator = DataCollatorForVisionPreference(processor=processor)
    examples = [{"prompt": row["prompt"], "chosen": row["chosen"], "rejected": row["rejected"],
                 "images": [Image.open(root / "data" / path).convert("RGB") for path in row["images"]]} for row in rows]
    batch = collator(examples)
    theirs = []
    for i in range(len(rows)):
        halves = {}
        for half, j in (("chosen", i), ("rejected", i + len(rows))):
            keep = batch["attention_mask"][j].bool()
            ids, completion = batch["input_ids"][j][keep], batch["completion_mask"][j][keep].bool()
            assert torch.all(completion[completion.nonzero()[0, 0]:])  # the completion is one run at the end
            halves["prompt" if half == "chosen" else "prompt_rejected"] = ids[~completion].tolist()
            halves[half] = ids[completion].tolist()
        theirs.append(halves)
    return out, theirs, processor


def test_prompt_ids_equal_trls_including_every_expanded_image_token(peer):
    out, theirs, processor = peer
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    for row, trl_row in zip(out, theirs):
        assert row["prompt_ids"] == trl_row["prompt"] == trl_row["prompt_rejected"]
        assert row["prompt_ids"].count(image_id) == 4 * len(row["images"])  # 28px crops, 14px patches


def test_completion_ids_equal_trls_up_to_the_newline_trl_keeps_after_the_eos(peer):
    out, theirs, processor = peer
    tokenizer = processor.tokenizer
    newline = tokenizer.encode("\n", add_special_tokens=False)
    for row, trl_row in zip(out, theirs):
        for half in ("chosen", "rejected"):
            ours = row[f"{half}_ids"]
            assert ours[-1] == tokenizer.eos_token_id  # prefdata ends at the EOS the model emits
            assert trl_row[half] == ours + newline, (half, tokenizer.decode(trl_row[half]), tokenizer.decode(ours))


def test_standard_string_rows_give_trls_ids_and_the_eos_trls_text_path_appends(tmp_path, llava_processor_dir):
    """TRL's standard (non-conversational) image rows: a string prompt with the model's own
    placeholder. The prompt ids (the image's tokens expanded) equal TRL's vision collator's; each
    completion is TRL's plus the EOS, which TRL's text path appends to standard rows and its vision
    collator does not (prefdata ends every completion with the EOS exactly once)."""
    import datasets
    from PIL import Image
    from transformers import AutoProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from prefdata.prepare import prepare

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "wide.png").write_bytes(png_bytes(SIZES["wide"], (200, 0, 0)))
    row = {"prompt": "<image>\nWhat color is it?", "chosen": " Red.", "rejected": " Blue, I think.",
           "images": ["img/wide.png"]}
    prepare(write_jsonl(tmp_path / "pairs.jsonl", [row]), tmp_path / "out", processor=str(llava_processor_dir),
            progress=False, workers=1)
    ours = datasets.load_from_disk(str(tmp_path / "out"))[0]
    processor = AutoProcessor.from_pretrained(str(llava_processor_dir))
    batch = DataCollatorForVisionPreference(processor=processor)(
        [{**row, "images": [Image.open(tmp_path / "img" / "wide.png").convert("RGB")]}])
    eos = processor.tokenizer.eos_token_id
    for half, j in (("chosen", 0), ("rejected", 1)):
        keep = batch["attention_mask"][j].bool()
        ids, completion = batch["input_ids"][j][keep], batch["completion_mask"][j][keep].bool()
        assert ours["prompt_ids"] == ids[~completion].tolist()
        assert ours[f"{half}_ids"] == ids[completion].tolist() + [eos]
