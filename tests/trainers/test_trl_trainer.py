"""validate --trainer trl runs TRL's own DPO data preparation (DPOTrainer._prepare_dataset and
DataCollatorForPreference, in prefdata's process, no model) on raw rows, and reports what TRL's own
DPOTrainer will train on, under the DPOConfig settings given (DESIGN.md invariant 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install \"prefdata[trl]\")")

from prefdata.cli import main  # noqa: E402
from prefdata.validate.command import validate  # noqa: E402

SUN = {"prompt": "Good afternoon.", "chosen": "The weather is nice today and the sun is out.",
       "rejected": "The weather is nice today and the sun is gone."}
CLEAN = {"prompt": [{"role": "user", "content": "What is 2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5, I think."}]}


def _write(tmp_path: Path, rows: list[dict], name: str = "pairs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _groups(result) -> dict[str, dict]:
    return {g["flag"]: g for g in result.report["trainer"]["findings"]}


def _trl(tmp_path: Path, rows: list[dict], tokenizer: str, *args: str):
    return validate(_write(tmp_path, rows), tokenizer=tokenizer, progress=False, trainer="trl", trainer_args=list(args))


def test_halves_cut_to_the_same_tokens_are_reported_with_the_shortest_max_length_that_avoids_it(tmp_path,
                                                                                                 tiny_tokenizer_dir):
    from prefdata.trainers.trl_run import run_trl, trl_tokenizer
    from prefdata.trainers.trl_settings import parse_trl_args

    whole = _trl(tmp_path, [SUN], tiny_tokenizer_dir)  # DPOConfig's default max_length 1024 cuts nothing
    assert whole.report["trainer"]["settings"][0] == "max_length=1024"
    assert "identical_after_truncation" not in _groups(whole)
    tokenizer = trl_tokenizer(tiny_tokenizer_dir, False)
    runs = {n: run_trl([SUN], tokenizer, parse_trl_args([f"max_length={n}"])).pairs for n in range(2, 40)}
    # the lengths at which TRL keeps the row but its cut leaves both halves the same trained tokens
    same = [n for n, pairs in runs.items() if pairs and pairs[0].chosen.trained == pairs[0].rejected.trained]
    assert same, "some max_length must cut SUN's halves to the same tokens"
    result = _trl(tmp_path, [SUN], tiny_tokenizer_dir, f"max_length={same[-1]}")
    found = _groups(result)["identical_after_truncation"]
    assert found["cause"] == [f"max_length={same[-1]}"] and found["fix"] == [f"max_length={same[-1] + 1}"]
    assert found["severity"] == "drop" and "ln 2" in found["examples"][0]["detail"]
    assert "identical_after_truncation" not in result.report["flags"]  # prefdata's own ids differ
    again = _trl(tmp_path, [SUN], tiny_tokenizer_dir, f"max_length={same[-1] + 1}")
    assert "identical_after_truncation" not in _groups(again)


def test_a_prompt_that_fills_max_length_is_dropped_by_trl_and_the_policy_sets_the_exit_code(tmp_path,
                                                                                            tiny_tokenizer_dir, capsys):
    path = _write(tmp_path, [{**SUN, "prompt": "word " * 80}, SUN])
    argv = ["validate", str(path), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--trainer", "trl",
            "--trainer-arg", "max_length=32"]
    assert main(argv) == 0  # default policy: no_completion_tokens drops, validate passes
    out = capsys.readouterr().out
    assert "no_completion_tokens under trl" in out and "1 of 2 rows trained, 1 dropped by trl" in out
    assert main([*argv, "--policy", "pr"]) == 1  # pr: an error
    report = validate(path, tokenizer=tiny_tokenizer_dir, progress=False, trainer="trl",
                      trainer_args=["max_length=32"]).report["trainer"]
    dropped = next(g for g in report["findings"] if g["flag"] == "no_completion_tokens")
    assert dropped["examples"][0]["source_line"] == 1 and dropped["cause"] == ["max_length=32"]
    prompt_tokens = int(dropped["examples"][0]["detail"].split("its prompt is ")[1].split(" ")[0])
    assert prompt_tokens >= 32 and dropped["fix"] == [f"max_length={prompt_tokens + 1}"]


@pytest.mark.parametrize("arg, says", [
    ("max_prompt_length=128", "DPOConfig has no max_prompt_length"),  # TRL 1.16 removed it
    ("beta=0.5", "does not change what TRL's data preparation makes"),
    ("max_length=0", "positive integer"),
    ("truncation_mode=keep_middle", "keep_end, keep_start"),
])
def test_settings_trl_does_not_read_are_one_line_errors_naming_those_it_reads(tmp_path, tiny_tokenizer_dir, capsys,
                                                                             arg, says):
    path = _write(tmp_path, [SUN])
    code = main(["validate", str(path), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--trainer", "trl",
                 "--trainer-arg", arg])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    if "=" in arg and not arg.startswith(("max_length", "truncation")):
        assert "max_length, truncation_mode" in err


def test_keep_end_scores_the_halves_after_different_prompts_and_cuts_the_longer_completions_start(tmp_path,
                                                                                                tiny_tokenizer_dir):
    row = {"prompt": [{"role": "system", "content": "Be brief and answer exactly what the user asks."},
                      {"role": "user", "content": "What is 2+2?"}],
           "chosen": [{"role": "assistant", "content": "4"}],
           "rejected": [{"role": "assistant", "content": "5, I think, but I am not so sure about it. " * 4}]}
    assert _groups(_trl(tmp_path, [row], tiny_tokenizer_dir)) == {}  # keep_start at 1024 cuts nothing
    result = _trl(tmp_path, [row], tiny_tokenizer_dir, "max_length=40", "truncation_mode=keep_end")
    groups = _groups(result)
    cut = groups["completion_truncated"]
    assert "rejected: cut from" in cut["examples"][0]["detail"] and "keep_end" in cut["examples"][0]["detail"]
    assert cut["cause"] == ["max_length=40 with truncation_mode='keep_end'"]
    assert any("deprecated" in note for note in result.report["trainer"]["notes"])  # TRL's own warning
    shorter = _trl(tmp_path, [{**row, "rejected": [{"role": "assistant", "content": "5, I think."}]}],
                   tiny_tokenizer_dir, "max_length=20", "truncation_mode=keep_end")
    context = _groups(shorter)["prompt_boundary_mismatch"]
    assert "different contexts" in context["examples"][0]["detail"]
    assert context["cause"] == ["max_length=20 with truncation_mode='keep_end'"]


def test_an_empty_prompt_leaves_the_first_token_out_of_trls_loss(tmp_path, tiny_tokenizer_dir):
    # No prompt and no BOS: "A" and "B" sit at position 0, which TRL's loss never reads (labels ids[1:]),
    # so both halves train on EOS alone.
    result = _trl(tmp_path, [{"prompt": "", "chosen": "A", "rejected": "B"}], tiny_tokenizer_dir)
    same = _groups(result)["identical_after_truncation"]
    assert "position 0" in same["cause"][0] and same["fix"][0].startswith("no DPOConfig setting")


def test_a_row_with_equal_halves_is_identical_and_not_blamed_on_a_setting(tmp_path, tiny_tokenizer_dir):
    result = _trl(tmp_path, [{"prompt": "Hi", "chosen": "Same.", "rejected": "Same."}], tiny_tokenizer_dir)
    same = _groups(result)["identical"]
    assert same["cause"] == ["the row itself: chosen and rejected are the same text"]


def test_a_clean_conversational_pair_gives_no_finding_and_the_comparison_shows_trls_trailing_newline(
        tmp_path, tiny_tokenizer_dir):
    result = _trl(tmp_path, [CLEAN], tiny_tokenizer_dir, "padding_free=true")
    section = result.report["trainer"]
    assert section["findings"] == [] and section["trained_pairs"] == 1 and result.exit_code == 0
    # TRL's completion is the rendering after the prompt's: ChatML's '\n' after <|im_end|> is trained too,
    # where prefdata's completion ends at <|im_end|>. Everything before it is the same.
    comparison = section["comparison"]
    assert comparison["equal"] == 0 and comparison["first_difference_in"] == {"length": 1}
    example = comparison["examples"][0]
    assert example["prefdata"] == [] and example["trainer"] == ["\n"] and example["before"].endswith("<|im_end|>")
    assert any(note.startswith("padding_free=True: TRL 1.16") for note in section["notes"])


def test_string_prompts_whose_end_merges_with_the_completion_are_reported(shared_tokenizer):
    from prefdata.trainers.trl_adapter import parse_args, run

    # Qwen2.5 has one token '.The': TRL's common prefix stops before the prompt's '.'
    outcome = run([SUN], shared_tokenizer("qwen2.5-instruct"), False, parse_args([]))
    pair = outcome.pairs[0]
    flags = {f.flag: f for f in outcome.findings}
    assert pair.prompt_len == len(pair.prompt_alone) - 1
    assert "TRL leaves the prompt's end '.' out of the training sequence" in flags["prompt_boundary_mismatch"].detail
    assert flags["prompt_boundary_mismatch"].cause.startswith("string rows")


def test_prepare_takes_the_same_trainer_flags_and_writes_the_section(tmp_path, tiny_tokenizer_dir):
    path = _write(tmp_path, [{**SUN, "prompt": "word " * 80}, {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}])
    argv = ["prepare", str(path), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--no-progress",
            "--trainer", "trl", "--trainer-arg", "max_length=32"]
    assert main([*argv, "--policy", "pr"]) == 1  # TRL drops the long row: an error under pr
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["trainer"]["trainer"] == "trl" and report["trainer"]["dropped_rows"] == 1
    assert "Under trl" in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")


def test_rows_trl_cannot_read_stop_validate_in_one_line(tmp_path, tiny_tokenizer_dir, capsys):
    sharegpt = {"conversations": [{"from": "human", "value": "Hi"}], "chosen": {"from": "gpt", "value": "Hello"},
                "rejected": {"from": "gpt", "value": "Go away"}}
    path = _write(tmp_path, [sharegpt])
    code = main(["validate", str(path), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--trainer", "trl"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("prefdata") and "under trl" in err and len(err.strip().splitlines()) == 1


def test_a_generation_prompt_the_conversation_does_not_render_is_left_out_by_trl(shared_tokenizer):
    from prefdata.trainers.trl_adapter import parse_args, run

    # DeepSeek-R1's generation prompt ends with '<think>\n'; the rendered conversation has no think block
    outcome = run([CLEAN], shared_tokenizer("deepseek-r1-distill-qwen"), False, parse_args([]))
    boundary = next(f for f in outcome.findings if f.flag == "prompt_boundary_mismatch")
    assert "TRL leaves the prompt's end '<think>\\n' out of the training sequence" in boundary.detail
    assert boundary.cause.startswith("the chat template renders the prompt alone")


def test_image_rows_are_refused_in_one_line(tmp_path, tiny_tokenizer_dir, capsys):
    path = _write(tmp_path, [{**CLEAN, "images": ["cat.png"]}])
    code = main(["validate", str(path), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--trainer", "trl"])
    err = capsys.readouterr().err
    assert code == 2 and "DataCollatorForVisionPreference" in err and len(err.strip().splitlines()) == 1


def test_halves_that_differ_only_in_whitespace_are_reported_as_the_rows_own(tmp_path, tiny_tokenizer_dir):
    result = _trl(tmp_path, [{"prompt": "Hi", "chosen": "Same.", "rejected": "Same. "}], tiny_tokenizer_dir)
    spaces = _groups(result)["whitespace_only"]
    assert spaces["cause"] == ["the row itself: chosen and rejected differ only in whitespace"]


def test_an_implicit_prompt_split_mid_word_by_trl_is_reported(tmp_path, shared_tokenizer):
    # No prompt column: TRL's extract_prompt takes the longest common prefix of the two strings, character by
    # character, so the prompt ends inside the word 'Ye|s' / 'Ye|ah' and 'Ye' + 's' tokenize together.
    row = {"chosen": "\n\nHuman: Can you help me?\n\nAssistant: Yes, sure.",
           "rejected": "\n\nHuman: Can you help me?\n\nAssistant: Yeah, no."}
    result = _trl(tmp_path, [row], shared_tokenizer("qwen2.5-instruct"))
    boundary = _groups(result)["prompt_boundary_mismatch"]
    assert "TRL leaves the prompt's end ' Ye' out of the training sequence" in boundary["examples"][0]["detail"]


def test_a_pad_token_outside_the_vocabulary_is_refused_as_trl_refuses_it(tmp_path, tiny_tokenizer_dir, capsys):
    path = _write(tmp_path, [SUN])
    argv = ["validate", str(path), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--trainer", "trl"]
    assert main([*argv, "--trainer-arg", "pad_token=<no-such-token>"]) == 2
    assert "not in the tokenizer's vocabulary" in capsys.readouterr().err
    assert main([*argv, "--trainer-arg", "pad_token=<|im_end|>"]) == 0  # in it: padding only, the same ids
    assert "pad_token='<|im_end|>': pads the batch only" in capsys.readouterr().out
