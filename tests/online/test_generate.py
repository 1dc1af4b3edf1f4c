"""`prefdata generate`: one line per sample, prompts rendered as prepare renders them, left padding."""

from __future__ import annotations

import importlib.util
import json

import pytest

from prefdata.cli import main
from prefdata.core.errors import PrefdataError
from prefdata.online.generate import Sample, _decode, generate, render_prompts
from prefdata.online.prompts import PromptRow, read_prompts


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_line_per_sample_with_provenance(tmp_path, tiny_model_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "What is the capital of France?"}\n'
        '{"prompt": [{"role": "user", "content": "Write a poem."}]}\n'
        '{"nothing": 1}\n'
        '{"prompt": "Translate: good morning", "chosen": "Guten Morgen", "rejected": "Hallo"}\n'
    )
    result = generate(prompts, tmp_path / "gen", model=tiny_model_dir, samples=3, max_new_tokens=5, batch_size=2,
                      progress=False)
    rows = _lines(tmp_path / "gen" / "generations.jsonl")
    assert result.prompts == 3 and result.samples == 9 and result.skipped_rows == 1
    assert [(r["source_line"], r["sample"]) for r in rows] == [(line, k) for line in (1, 2, 4) for k in range(3)]
    assert rows[0]["prompt"] == "What is the capital of France?"
    assert rows[3]["prompt"] == [{"role": "user", "content": "Write a poem."}]  # as given
    assert rows[6]["prompt"] == "Translate: good morning"  # a preference row gives its prompt
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for row in rows:
        assert set(row) == {"prompt", "completion", "sample", "source_file", "source_line", "finished", "prompt_ids",
                            "completion_ids"}
        assert isinstance(row["completion"], str) and isinstance(row["finished"], bool)
        # The sampled ids: through the stop token when finished, max_new_tokens of them otherwise, and
        # their text is the completion.
        ids = row["completion_ids"]
        assert (ids[-1] == tokenizer.eos_token_id) == row["finished"] and (row["finished"] or len(ids) == 5)
        assert tokenizer.decode(ids[:-1] if row["finished"] else ids, skip_special_tokens=True) == row["completion"]
    assert rows[0]["prompt_ids"] == rows[1]["prompt_ids"] != rows[3]["prompt_ids"]
    with pytest.raises(PrefdataError, match="--overwrite"):  # generations may hold rewards by now
        generate(prompts, tmp_path / "gen", model=tiny_model_dir, samples=1, max_new_tokens=2, progress=False)


def test_prompt_ids_are_the_ids_prepare_trains_on(tiny_model_dir):
    from transformers import AutoTokenizer

    from prefdata.core.records import Pair
    from prefdata.tokenize.pairs import PairTokenizer
    from prefdata.tokenize.settings import TokenizeSettings

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
    rows = [PromptRow(messages, "f", 1), PromptRow("Say hello.", "f", 2)]
    for chat_template in (False, True):
        ids = render_prompts(tokenizer, rows, chat_template)
        pair_tokenizer = PairTokenizer(tiny_model_dir, TokenizeSettings(chat_template=chat_template))
        pairs = [
            Pair("f", 1, "", "a", "b", prompt_messages=messages, chosen_messages=[{"role": "assistant", "content": "a"}],
                 rejected_messages=[{"role": "assistant", "content": "b"}]),
            Pair("f", 2, "Say hello.", "a", "b"),
        ]
        assert ids == [t.prompt_ids for t in pair_tokenizer.tokenize_pairs(pairs)]


def test_greedy_samples_do_not_depend_on_batch_size(tmp_path, varied_policy_dir, prompts_file):
    """Left padding with correct positions: a prompt's completion is the same alone or padded in a batch."""
    outs = []
    for batch_size in (1, 5):
        generate(prompts_file, tmp_path / f"b{batch_size}", model=varied_policy_dir, samples=1, max_new_tokens=6,
                 temperature=0.0, batch_size=batch_size, progress=False, device="cpu")
        outs.append([r["completion"] for r in _lines(tmp_path / f"b{batch_size}" / "generations.jsonl")])
    assert outs[0] == outs[1]
    assert len(set(outs[0])) > 1  # different prompts, different completions: the test can fail


def test_decode_stops_at_the_first_eos():
    class Tok:
        def decode(self, ids, skip_special_tokens):
            return " ".join(map(str, ids))

    assert _decode(Tok(), [5, 6, 2, 7], [2]) == Sample("5 6", True, [5, 6, 2])  # ids through the EOS
    assert _decode(Tok(), [5, 6, 7], [2]) == Sample("5 6 7", False, [5, 6, 7])


def test_prompts_from_a_directory_of_preference_data():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples" / "pairs"
    prompt_set = read_prompts(examples)
    assert prompt_set.rows and prompt_set.skipped >= 1  # the examples hold a few broken rows on purpose
    assert any(row.is_conversational for row in prompt_set.rows) and any(not row.is_conversational for row in prompt_set.rows)


def test_no_usable_prompt_is_one_line(tmp_path, tiny_model_dir, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "sft row"}\n')
    code = main(["generate", str(bad), str(tmp_path / "o"), "--model", tiny_model_dir, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "no usable prompts" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed: the message test is moot")
def test_vllm_engine_without_vllm_says_so(tmp_path, tiny_model_dir, prompts_file, capsys):
    code = main(["generate", str(prompts_file), str(tmp_path / "o"), "--model", tiny_model_dir, "--engine", "vllm"])
    err = capsys.readouterr().err
    assert code == 2 and "needs vLLM" in err and len(err.strip().splitlines()) == 1


def _vllm_ready() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _vllm_ready(), reason="needs vLLM and a CUDA GPU")
def test_vllm_engine_writes_the_same_shape(tmp_path, tiny_model_dir, prompts_file):
    generate(prompts_file, tmp_path / "v", model=tiny_model_dir, samples=2, max_new_tokens=8, engine="vllm",
             progress=False)
    rows = _lines(tmp_path / "v" / "generations.jsonl")
    assert len(rows) == 32 and {r["sample"] for r in rows} == {0, 1}
