"""The TRL hand-off for image OUTs: `prefdata.trl.DPOTrainer` trains a vision-language model on OUT's
stored ids (image tokens expanded) and the images' pixel values, with OUT's reference log-probs.

A tiny random LLaVA (CLIP tower + Llama text, `prefdata.tiny.build_tiny_llava_model`) and its tiny
processor, CPU only. The ref columns are written here by a plain forward of the model, one sequence at
a time (`prefdata refs` for image OUTs is another branch's work).
"""

from __future__ import annotations

import inspect
import math

import pytest

pytest.importorskip("trl")

import datasets  # noqa: E402
import torch  # noqa: E402

from prefdata.core.errors import PrefdataError  # noqa: E402
from vision_helpers import (  # noqa: E402
    as_content_parts, dpo_config, first_batch_token_logps, image_row, kept, prepare_all, raw_image_dataset,
    write_jsonl, write_pngs
)

MAX_LENGTH = 96
SIZES = {"square": (28, 28), "wide": (64, 20), "tall": (10, 90), "large": (120, 80)}


def _rows() -> list[dict]:
    """TRL's vision layout, every content a list of parts: one image, two images, a system turn, and
    a text-only row in a batch with images."""
    system = image_row("Describe it.", ["img/large.png"], chosen="A large flat rectangle.", rejected="A cat.")
    system["prompt"].insert(0, {"role": "system", "content": "You describe images."})
    rows = [
        image_row("What color is it?", ["img/square.png"]),
        image_row("Compare the two pictures.", ["img/wide.png", "img/tall.png"], placeholders=2,
                  chosen="The first is wide, the second is tall.", rejected="Same."),
        system,
        image_row("Is it tall?", ["img/tall.png"], chosen="Yes, very tall.", rejected="No."),
        image_row("Say hello.", [], placeholders=0, chosen="Hello!", rejected="No."),  # text-only, in a batch with images
    ]
    return as_content_parts(rows)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-vision")
    write_pngs(root / "data" / "img", SIZES, lambda i: (60 * i, 180 - 40 * i, 70))
    return write_jsonl(root / "data" / "pairs.jsonl", _rows())


@pytest.fixture(scope="module")
def prepared(raw, llava_processor_dir):
    return prepare_all(raw.parent.parent, _rows(), llava_processor_dir, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, llava_processor_dir) -> str:
    from prefdata.tiny import build_tiny_llava_model

    path = tmp_path_factory.mktemp("llava-model")
    build_tiny_llava_model(path, llava_processor_dir)
    return str(path)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory, llava_processor_dir) -> str:
    from prefdata.tiny import build_tiny_llava_model

    path = tmp_path_factory.mktemp("llava-other")
    build_tiny_llava_model(path, llava_processor_dir, seed=1)
    return str(path)


def _decoded_rows(dataset: datasets.Dataset) -> list[dict]:
    """Rows with their images decoded (row access decodes the Image feature; `to_list` does not)."""
    return [dataset[i] for i in range(len(dataset))]


def _plain_logps(model_dir: str, processor, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion log-prob sums by a plain forward, one sequence at a time, pixel values from the processor."""
    from transformers import LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    sums = {"chosen": [], "rejected": []}
    with torch.no_grad():
        for row in rows:
            pixels = processor(images=[row["images"]], return_tensors="pt")["pixel_values"] if row["images"] else None
            for half in sums:
                ids = torch.tensor([row["prompt_ids"] + row[f"{half}_ids"]])
                logits = model(input_ids=ids, pixel_values=pixels).logits[0, :-1].float()
                picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
                sums[half].append(picked[len(row["prompt_ids"]) - 1 :].sum())
    return torch.stack(sums["chosen"]), torch.stack(sums["rejected"])


@pytest.fixture(scope="module")
def refs_of(prepared, model_dir, other_model_dir, llava_processor_dir):
    """OUT with ref columns from the named model (a plain forward), as `prefdata refs` would add them."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(llava_processor_dir))
    rows = _decoded_rows(datasets.load_from_disk(str(prepared)))
    made = {}
    for name, path in (("same", model_dir), ("other", other_model_dir)):
        chosen, rejected = _plain_logps(path, processor, rows)
        made[name] = (chosen, rejected)

    def with_refs(name: str) -> datasets.Dataset:
        dataset = datasets.load_from_disk(str(prepared))
        chosen, rejected = made[name]
        dataset = dataset.add_column("ref_chosen_logps", chosen.tolist(), feature=datasets.Value("float32"))
        return dataset.add_column("ref_rejected_logps", rejected.tolist(), feature=datasets.Value("float32"))

    return with_refs


def _processor(path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(path))


def _config(tmp_path, **overrides):
    return dpo_config(tmp_path, MAX_LENGTH, 2, len(_rows()), **overrides)


def _files(out) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*"))


# --------------------------------------------------------------------------------------------- training


def test_first_batch_logps_equal_trls_own_trainer_on_the_raw_rows(prepared, refs_of, raw, model_dir, tmp_path):
    """Same ids and pixels, same policy log-probs. TRL's completions carry one more token (the newline
    after <|im_end|>, tests/vision/test_trl_vision_peer.py): its log-prob is the only one TRL adds."""
    import trl

    from prefdata.trl import DPOTrainer

    processor = _processor(model_dir)
    newline = processor.tokenizer.encode("\n", add_special_tokens=False)[0]
    ours = DPOTrainer(model_dir, args=_config(tmp_path / "ours"), train_dataset=refs_of("same"))
    rows = _rows()
    raw_rows = raw_image_dataset(raw, rows)
    theirs = trl.DPOTrainer(model_dir, args=_config(tmp_path / "theirs"), train_dataset=raw_rows,
                            processing_class=_processor(model_dir))
    our_batch, our_logps = first_batch_token_logps(ours, ours.train_dataset)
    their_batch, their_logps = first_batch_token_logps(theirs, raw_rows)

    assert torch.equal(our_batch["pixel_values"], their_batch["pixel_values"])  # the same pixels, same order
    assert our_batch["pixel_values"].shape[0] == 2 * sum(len(row["images"]) for row in rows)
    for j in range(2 * len(rows)):
        ids_ours, ids_theirs = kept(our_batch, "input_ids", j), kept(their_batch, "input_ids", j)
        assert ids_theirs == ids_ours + [newline]
        assert kept(their_batch, "completion_mask", j)[:-1] == kept(our_batch, "completion_mask", j)
        torch.testing.assert_close(torch.tensor(their_logps[j][:-1]), torch.tensor(our_logps[j]), rtol=0, atol=1e-5)
    assert all(math.isfinite(value) for logps in our_logps for value in logps)


def test_trains_on_stored_refs_without_a_reference_model(prepared, refs_of, model_dir, tmp_path, monkeypatch):
    """With ref columns in OUT, TRL loads the policy only and reads the refs from each batch; the policy
    equal to the reference starts at ln 2; nothing is written inside OUT."""
    from trl.trainer import dpo_trainer

    from prefdata.trl import DPOTrainer

    loaded = []
    create = dpo_trainer.create_model_from_path
    monkeypatch.setattr(dpo_trainer, "create_model_from_path", lambda path, **kw: loaded.append(path) or create(path, **kw))
    before = _files(prepared)
    dataset = refs_of("same")
    trainer = DPOTrainer(model_dir, args=_config(tmp_path), train_dataset=dataset, eval_dataset=dataset)
    assert trainer.ref_model is None and loaded == [model_dir]  # the policy, and no reference model
    for name in ("prompt_ids", "chosen_ids", "rejected_ids", "ref_chosen_logps", "ref_rejected_logps"):
        assert trainer.train_dataset[name] == dataset[name]
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and trainer.state.global_step == 2
    assert abs(losses[0] - math.log(2)) < 1e-3
    assert abs(trainer.evaluate()["eval_loss"] - math.log(2)) < 1e-2  # two steps at lr 1e-6 barely move it
    assert loaded == [model_dir]
    assert _files(prepared) == before


def test_a_different_policy_is_scored_against_the_stored_refs(prepared, refs_of, model_dir, other_model_dir, tmp_path):
    """The stored refs are what the loss reads: a policy other than the reference gives the loss of
    plain forwards (policy) against the stored values, not ln 2 (recomputed refs would give ln 2)."""
    from prefdata.trl import DPOTrainer

    processor = _processor(model_dir)
    dataset = refs_of("same")
    rows = _decoded_rows(dataset)
    policy_c, policy_r = _plain_logps(other_model_dir, processor, rows)
    ref_c = torch.tensor(dataset["ref_chosen_logps"])
    ref_r = torch.tensor(dataset["ref_rejected_logps"])
    beta = 1.0
    expected = -torch.nn.functional.logsigmoid(beta * ((policy_c - ref_c) - (policy_r - ref_r))).mean().item()
    assert abs(expected - math.log(2)) > 0.02  # the two models really differ: the check below can fail

    trainer = DPOTrainer(other_model_dir, args=_config(tmp_path, beta=beta, max_steps=1, per_device_train_batch_size=len(rows)),
                         train_dataset=dataset, processing_class=processor)
    assert trainer.ref_model is None
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, abs=2e-3)


def test_a_ref_model_can_stand_in_for_missing_refs(prepared, model_dir, tmp_path):
    from transformers import LlavaForConditionalGeneration

    from prefdata.trl import DPOTrainer

    reference = LlavaForConditionalGeneration.from_pretrained(model_dir)
    trainer = DPOTrainer(model_dir, ref_model=reference, args=_config(tmp_path, max_steps=1), train_dataset=str(prepared))
    trainer.train()
    assert abs(trainer.state.log_history[0]["loss"] - math.log(2)) < 1e-3


# --------------------------------------------------------------------------------------------- refusals


def test_refuses_a_tokenizer_for_an_image_out(refs_of, model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError, match=r"holds images.*processor it was prepared with") as error:
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=refs_of("same"),
                   processing_class=_processor(model_dir).tokenizer)
    assert "\n" not in str(error.value)


def test_refuses_a_processor_other_than_outs(refs_of, tmp_path):
    """Another image size: the same tokenizer, other pixel values and token counts."""
    from prefdata.tiny import build_tiny_llava_processor
    from prefdata.tokenize.vision import processor_fingerprint
    from prefdata.trl import DPOTrainer

    other = build_tiny_llava_processor(tmp_path / "other-processor", image_size=42)
    dataset = refs_of("same")
    with pytest.raises(PrefdataError, match="the processor") as error:
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=dataset, processing_class=other)
    assert processor_fingerprint(other) in str(error.value)
    assert out_fingerprint(dataset) in str(error.value)


def out_fingerprint(dataset) -> str:
    from prefdata.trl import out_settings

    return out_settings(dataset)["tokenizer_fingerprint"]


def test_the_processor_fingerprint_is_the_one_prepare_recorded(refs_of, model_dir):
    from prefdata.tokenize.vision import processor_fingerprint

    processor = _processor(model_dir)
    assert processor_fingerprint(processor) == out_fingerprint(refs_of("same"))
    assert processor.tokenizer.chat_template == _processor(model_dir).tokenizer.chat_template  # left untouched


def test_refuses_a_max_length_other_than_outs(refs_of, model_dir, tmp_path):
    from prefdata.trl import DPOTrainer

    with pytest.raises(PrefdataError, match=rf"max_length=64.*max_length={MAX_LENGTH}"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path, max_length=64), train_dataset=refs_of("same"),
                   processing_class=_processor(model_dir))


def test_refuses_loss_on_answer_for_an_image_out(refs_of, model_dir, tmp_path):
    from prefdata.io.handoff import describe
    from prefdata.trl import DPOTrainer, out_settings

    dataset = refs_of("same")
    dataset.info.description = describe({**out_settings(dataset), "loss_on": "answer"})
    with pytest.raises(PrefdataError, match="--loss-on answer"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=dataset,
                   processing_class=_processor(model_dir))


def test_refuses_image_rows_that_break_outs_schema_in_one_line(refs_of, model_dir, tmp_path):
    """The schema report names the failing row; the image bytes beside it must not break the report
    (polars cannot write binary data as JSON, and panicked)."""
    from prefdata.trl import DPOTrainer

    dataset = refs_of("same")
    columns = dataset.data.table.to_pydict()
    columns["chosen_ids"][1] = []  # no loss token, and not flagged `no_completion_tokens`
    broken = datasets.Dataset.from_dict(columns, features=dataset.features)
    broken.info.description = dataset.info.description
    with pytest.raises(PrefdataError, match=r"ScoredTokenPairs.*completions_have_tokens_unless_flagged.*pairs.jsonl:2"):
        DPOTrainer("/nonexistent/model", args=_config(tmp_path), train_dataset=broken,
                   processing_class=_processor(model_dir))


# --------------------------------------------------------------------------------------------- TRL itself


def test_trl_vision_internals_the_hand_off_relies_on(llava_processor_dir):
    """A TRL upgrade that changes how it tells vision datasets apart, or what its vision collator
    returns, breaks here rather than training silently on re-rendered text."""
    import trl
    from PIL import Image
    from trl.trainer import dpo_trainer

    from prefdata.trl import DPOTrainer
    from prefdata.trl.collator import ImagePairCollator

    init = inspect.getsource(trl.DPOTrainer.__init__)
    assert 'self._is_vision_dataset = "image" in dataset_sample or "images" in dataset_sample' in init
    assert "skip_prepare_dataset = self._is_vision_dataset" in init
    assert "if self._is_vision_dataset and args.precompute_ref_log_probs:" in init
    assert "if self._is_vision_dataset" in inspect.getsource(trl.DPOTrainer._set_signature_columns_if_needed)
    assert isinstance(inspect.getattr_static(DPOTrainer, "_is_vision_dataset"), property)
    # The vision collator's batch and ours carry the same keys (ours adds the stored refs).
    processor = _processor(llava_processor_dir)
    image = Image.new("RGB", (30, 20), (10, 200, 30))
    row = image_row("What is it?", [image])
    theirs = dpo_trainer.DataCollatorForVisionPreference(processor=processor)([dict(row)])
    ids = processor(text=[processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)],
                    images=[image])["input_ids"][0]
    ours = ImagePairCollator(processor=processor, pad_token_id=processor.tokenizer.pad_token_id)(
        [{"prompt_ids": list(ids), "chosen_ids": [5, 2], "rejected_ids": [6, 2], "images": [image],
          "ref_chosen_logps": -1.0, "ref_rejected_logps": -2.0}])
    assert set(theirs) | {"ref_chosen_logps", "ref_rejected_logps"} == set(ours)
    assert torch.equal(theirs["pixel_values"], ours["pixel_values"])
    assert ours["ref_chosen_logps"].tolist() == [-1.0] and ours["ref_rejected_logps"].tolist() == [-2.0]
