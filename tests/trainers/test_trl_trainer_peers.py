"""Peer test (DESIGN.md invariant 7): for each real tokenizer in ../shared and real rows, TRL's own
`trl.DPOTrainer`, built independently here (a tiny random model, its own __init__, _prepare_dataset and
data collator), gives the ids, completion masks and dropped rows `--trainer trl` reports."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install \"prefdata[trl]\")")

from prefdata.core.errors import PrefdataError  # noqa: E402
from prefdata.trainers.trl_adapter import parse_args, run  # noqa: E402

TOKENIZERS = ["qwen2.5-instruct", "mistral-7b-instruct-v0.3", "phi-3-mini-4k-instruct", "smollm2-135m-instruct",
              "gpt2", "deepseek-r1-distill-qwen", "smollm3-3b", "cogito-v1-preview-qwen-14b"]
MAX_LENGTH = 160  # cuts some halves and drops some rows of the sample
ROWS = 12


def _rows(shared_data) -> tuple[list[dict], list[dict]]:
    """The sample's first rows as they are (strings, with their metadata), and as conversations."""
    lines = shared_data("ultrafeedback-sample/train.jsonl").read_text(encoding="utf-8").splitlines()[:ROWS]
    strings = [json.loads(line) for line in lines]
    conversations = [{"prompt": [{"role": "user", "content": r["prompt"]}],
                      "chosen": [{"role": "assistant", "content": r["chosen"]}],
                      "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in strings]
    return strings, conversations


def _trl_trainer(tokenizer_dir: str, train: list[dict], evaluate: list[dict] | None, tmp_path, **settings):
    """TRL's DPOTrainer as a user builds it, on a random model with the tokenizer's vocabulary."""
    import datasets
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1)
    args = DPOConfig(output_dir=str(tmp_path / "trl-out"), use_cpu=True, bf16=False, report_to="none",
                     max_length=MAX_LENGTH, **settings)
    with_row = lambda rows: datasets.Dataset.from_list([{**r, "row": i} for i, r in enumerate(rows)])  # noqa: E731
    return DPOTrainer(model=Qwen2ForCausalLM(config), ref_model=Qwen2ForCausalLM(config), args=args,
                      train_dataset=with_row(train), eval_dataset=with_row(evaluate) if evaluate else None,
                      processing_class=tokenizer)


def _assert_same(reported, trainer, prepared) -> None:
    """Each row TRL keeps, collated by TRL's own collator, is the pair reported; the rows it drops are the
    rows reported dropped."""
    kept = {int(example["row"]): example for example in prepared}
    assert sorted(reported.pairs) == sorted(kept) and reported.dropped == reported.rows - len(kept)
    for row, example in kept.items():
        batch = trainer.data_collator([example])
        ids, mask = batch["input_ids"], batch["completion_mask"]
        labels = ids.masked_fill(mask == 0, -100)[:, 1:]  # _compute_loss's labels, shifted as its fused head does
        for b, half in enumerate((reported.pairs[row].chosen, reported.pairs[row].rejected)):
            width = int(batch["attention_mask"][b].sum())
            assert half.ids == ids[b, :width].tolist() and half.completion_mask == mask[b, :width].tolist()
            assert half.trained == labels[b][labels[b] != -100].tolist()


@pytest.mark.parametrize("name", TOKENIZERS)
def test_trls_own_trainer_gives_the_ids_trainer_trl_reports(name, shared_tokenizer, shared_data, tmp_path):
    tokenizer_dir = shared_tokenizer(name)
    strings, conversations = _rows(shared_data)
    templated = name != "gpt2"  # gpt2 has no chat template: TRL cannot render conversations with it
    trainer = _trl_trainer(tokenizer_dir, strings, conversations if templated else None, tmp_path)
    settings = parse_args([f"max_length={MAX_LENGTH}"])
    reported = run(strings, tokenizer_dir, False, settings)
    _assert_same(reported, trainer, trainer.train_dataset)
    cut = [p for p in reported.pairs.values() if MAX_LENGTH in (len(p.chosen.ids), len(p.rejected.ids))]
    assert reported.dropped or cut  # the limit bites
    if templated:
        _assert_same(run(conversations, tokenizer_dir, False, settings), trainer, trainer.eval_dataset)
    else:
        with pytest.raises(PrefdataError, match="under trl: TRL's DPOTrainer stops on this input"):
            run(conversations, tokenizer_dir, False, settings)


def test_keep_end_rows_are_trls_own(shared_tokenizer, shared_data, tmp_path):
    """keep_end: no row dropped, each half's end kept; the reported halves are TRL's trainer's."""
    tokenizer_dir = shared_tokenizer("qwen2.5-instruct")
    strings, _ = _rows(shared_data)
    with pytest.warns(FutureWarning, match="keep_end"):  # TRL 1.16 deprecates it
        trainer = _trl_trainer(tokenizer_dir, strings, None, tmp_path, truncation_mode="keep_end")
    reported = run(strings, tokenizer_dir, False, parse_args([f"max_length={MAX_LENGTH}", "truncation_mode=keep_end"]))
    assert reported.dropped == 0 and len(trainer.train_dataset) == ROWS
    _assert_same(reported, trainer, trainer.train_dataset)
