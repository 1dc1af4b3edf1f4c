"""validate --trainer openrlhf runs OpenRLHF's own preprocessing (its RewardDataset and DPOTrainer's mask
methods, CPU only) and reports what it will train on; the ids prefdata reports are OpenRLHF's own
(DESIGN.md invariant 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("openrlhf.datasets", reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2)")

from prefdata.cli import main  # noqa: E402
from prefdata.trainers.openrlhf import OpenRLHFSettings, _rows_table, _strategy, load_openrlhf  # noqa: E402
from prefdata.trainers.openrlhf_adapter import openrlhf_tokenizer  # noqa: E402
from prefdata.validate.command import validate  # noqa: E402

SUN = {"prompt": "Good afternoon.", "chosen": "The weather is nice today and the sun is out.",
       "rejected": "The weather is nice today and the sun is gone."}
CLEAN = {"prompt": [{"role": "user", "content": "What is 2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5, I think."}]}


@pytest.fixture(params=["tiny", "qwen2.5-instruct"])
def tokenizer_dir(request, tiny_tokenizer_dir) -> str:
    if request.param == "tiny":
        return tiny_tokenizer_dir
    return str(request.getfixturevalue("shared_dir") / "assets" / "tokenizers" / request.param)


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _reward_dataset(rows: list[dict], tokenizer_dir: str, settings: OpenRLHFSettings):
    """OpenRLHF's RewardDataset itself, as train_dpo.py builds it (the test's independent reference; the
    rows' table only skips hashing the tokenizer for a cache name)."""
    RewardDataset, _ = load_openrlhf()
    return RewardDataset(_rows_table(rows), openrlhf_tokenizer(tokenizer_dir, False), settings.max_len,
                         _strategy(settings), input_template=settings.input_template, is_dpo=True, num_processors=None)


def test_a_pair_prefdata_keeps_apart_is_identical_under_openrlhf_with_the_setting(tmp_path, tokenizer_dir):
    # Where the halves first differ, with no limit; a max_len one token shorter than that + 2 puts
    # OpenRLHF's EOS over the differing token.
    full = _reward_dataset([SUN], tokenizer_dir, OpenRLHFSettings(max_len=10_000, prompt_key="prompt"))[0]
    chosen, rejected = full[0][0].tolist(), full[2][0].tolist()
    first = next(i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b)
    result = validate(_write(tmp_path, [SUN]), tokenizer=tokenizer_dir, max_length=256, progress=False,
                      trainer="openrlhf", trainer_args=[f"data.max_len={first + 1}", "data.prompt_key=prompt"])
    assert "identical_after_truncation" not in result.report["flags"]  # prefdata's own ids differ
    groups = {g["flag"]: g for g in result.report["trainer"]["findings"]}
    same = groups["identical_after_truncation"]
    assert same["cause"] == [f"--data.max_len {first + 1}"] and same["fix"] == [f"--data.max_len {first + 2}"]
    assert same["examples"][0]["source_line"] == 1 and same["severity"] == "drop"
    assert "under openrlhf" in result.rendered and f"--data.max_len {first + 2}" in result.rendered
    # and at the suggested length OpenRLHF keeps them apart
    again = validate(_write(tmp_path, [SUN]), tokenizer=tokenizer_dir, max_length=256, progress=False,
                     trainer="openrlhf", trainer_args=[f"data.max_len={first + 2}", "data.prompt_key=prompt"])
    assert "identical_after_truncation" not in {g["flag"] for g in again.report["trainer"]["findings"]}


def test_reported_ids_are_openrlhfs_and_the_comparison_counts_follow_from_them(tmp_path, tokenizer_dir):
    from prefdata.tokenize.select import select_pair_tokenizer
    from prefdata.tokenize.settings import TokenizeSettings
    from prefdata.io.formats import normalize_record
    from prefdata.core.records import RawRecord
    from prefdata.trainers.openrlhf import run_openrlhf

    rows = [CLEAN, {**CLEAN, "chosen": [{"role": "assistant", "content": "Four.\n\n"}]},
            {"prompt": [{"role": "user", "content": "Name a colour."}], "chosen": [{"role": "assistant", "content": "Blue"}],
             "rejected": [{"role": "assistant", "content": "Seven"}]}]
    settings = OpenRLHFSettings(max_len=64, prompt_key="prompt", apply_chat_template=True)
    args = ["data.max_len=64", "data.prompt_key=prompt", "data.apply_chat_template"]
    result = validate(_write(tmp_path, rows), tokenizer=tokenizer_dir, progress=False, trainer="openrlhf",
                      trainer_args=args)
    dataset = _reward_dataset(rows, tokenizer_dir, settings)
    # Invariant 7: the ids and masks prefdata takes from OpenRLHF are its RewardDataset's items, and the
    # loss mask is the attention mask past the prompt, shifted to the labels (_get_batch_logps).
    outcome = run_openrlhf(rows, openrlhf_tokenizer(tokenizer_dir, False), settings)
    pair_tokenizer = select_pair_tokenizer(tokenizer_dir, None, TokenizeSettings())
    equal = 0
    for index, row in enumerate(rows):
        c_ids, c_mask, r_ids, r_mask, prompt_len = dataset[index]
        got = outcome.pairs[index]
        assert got.chosen.ids == c_ids[0].tolist() and got.rejected.ids == r_ids[0].tolist()
        for half, mask in ((got.chosen, c_mask), (got.rejected, r_mask)):
            expected = [int(on and j >= prompt_len) for j, on in enumerate(mask[0].tolist())][1:]
            assert half.loss_mask == expected
        ours = pair_tokenizer.tokenize_pairs([normalize_record(RawRecord("pairs.jsonl", index + 1, row))])[0]
        equal += (ours.prompt_ids + ours.chosen_ids == c_ids[0].tolist()
                  and ours.prompt_ids + ours.rejected_ids == r_ids[0].tolist())
    comparison = result.report["trainer"]["comparison"]
    assert comparison["pairs"] == len(rows) and comparison["equal"] == equal
    assert comparison["differ"] == len(rows) - equal == len(comparison["examples"])


def test_a_clean_pair_gives_no_openrlhf_finding(tmp_path, tokenizer_dir):
    result = validate(_write(tmp_path, [CLEAN]), tokenizer=tokenizer_dir, progress=False, trainer="openrlhf",
                      trainer_args=["data.prompt_key=prompt", "data.apply_chat_template"])
    section = result.report["trainer"]
    assert section["findings"] == [] and section["errors"] == 0 and section["trained_pairs"] == 1
    assert result.exit_code == 0


def test_exit_code_follows_the_policys_severity(tmp_path, tiny_tokenizer_dir, capsys):
    long_prompt = {**SUN, "prompt": "word " * 80}  # OpenRLHF drops it at max_len 32: no_completion_tokens
    path = _write(tmp_path, [long_prompt])
    argv = ["validate", str(path), "--tokenizer", tiny_tokenizer_dir, "--no-progress", "--trainer", "openrlhf",
            "--trainer-arg", "data.max_len=32", "--trainer-arg", "data.prompt_key=prompt"]
    assert main(argv) == 0  # default policy: no_completion_tokens drops, validate passes
    assert "no_completion_tokens under openrlhf" in capsys.readouterr().out
    assert main([*argv, "--policy", "pr"]) == 1  # pr: it is an error
    assert main([*argv[:-4], "--trainer-arg", "data.maxlen=32"]) == 2  # a name OpenRLHF does not read
    assert "data.max_len" in capsys.readouterr().err


def test_rejected_with_other_earlier_turns_is_reported_without_a_prompt_key(tmp_path, tiny_tokenizer_dir):
    row = {"chosen": [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello! How can I help?"}],
           "rejected": [{"role": "user", "content": "Hi there, friend."}, {"role": "assistant", "content": "Go away."}]}
    result = validate(_write(tmp_path, [row]), tokenizer=tiny_tokenizer_dir, progress=False, trainer="openrlhf",
                      trainer_args=["data.apply_chat_template"])
    groups = {g["flag"]: g for g in result.report["trainer"]["findings"]}
    assert groups["prompt_boundary_mismatch"]["fix"] == ["a prompt column both halves share, given as --data.prompt_key"]


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "mistral-7b-instruct-v0.3", "smollm2-135m-instruct",
                                  "phi-3-mini-4k-instruct", "gpt2"])
def test_peer_rows_from_shared_data_give_openrlhfs_own_ids(name, shared_dir):
    """Invariant 7 on real rows and tokenizers: every pair, mask and dropped row prefdata reports is what
    OpenRLHF's RewardDataset gives (at a max_len that cuts some halves and drops some rows)."""
    from prefdata.trainers.openrlhf import run_openrlhf

    lines = (shared_dir / "assets" / "data" / "ultrafeedback-sample" / "train.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in lines.splitlines()[:16]]
    rows = [{key: row[key] for key in ("prompt", "chosen", "rejected")} for row in rows]
    tokenizer_dir = str(shared_dir / "assets" / "tokenizers" / name)
    settings = OpenRLHFSettings(max_len=192, prompt_key="prompt")
    outcome = run_openrlhf(rows, openrlhf_tokenizer(tokenizer_dir, False), settings)
    dataset = _reward_dataset(rows, tokenizer_dir, settings)
    assert len(outcome.pairs) == len(dataset) and len(outcome.pairs) + len(outcome.dropped) == len(rows)
    assert outcome.dropped and any(len(p.chosen.ids) == 192 for p in outcome.pairs.values())  # the limit bites
    for k, row in enumerate(sorted(outcome.pairs)):
        c_ids, c_mask, r_ids, r_mask, prompt_len = dataset[k]
        got = outcome.pairs[row]
        assert (got.chosen.ids, got.rejected.ids, got.prompt_len) == (c_ids[0].tolist(), r_ids[0].tolist(), prompt_len)
        assert got.chosen.attention_mask == c_mask[0].int().tolist()
        assert got.rejected.loss_mask == [int(on and j >= prompt_len) for j, on in enumerate(r_mask[0].tolist())][1:]


def test_prepare_takes_the_same_trainer_flags_and_writes_the_section(tmp_path, tiny_tokenizer_dir):
    path = _write(tmp_path, [{**SUN, "prompt": "word " * 80}, {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}])
    argv = ["prepare", str(path), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--no-progress",
            "--trainer", "openrlhf", "--trainer-arg", "data.max_len=32", "--trainer-arg", "data.prompt_key=prompt"]
    assert main([*argv, "--policy", "pr"]) == 1  # OpenRLHF drops the long row: an error under pr
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["trainer"]["dropped_rows"] == 1 and report["trainer"]["errors"] == 1 and report["status"] == "fail"
    for name in ("report.md", "report.html"):
        assert "Under openrlhf" in (tmp_path / "out" / name).read_text(encoding="utf-8")


def test_halves_openrlhfs_newline_strip_makes_equal_are_told_apart_from_equal_rows(tmp_path, tiny_tokenizer_dir):
    rows = [{"prompt": "Hi", "chosen": "Same.", "rejected": "Same."},  # the row's own problem
            {"prompt": "Hi", "chosen": "Same.\n", "rejected": "Same."}]  # OpenRLHF's .rstrip("\n") makes it
    result = validate(_write(tmp_path, rows), tokenizer=tiny_tokenizer_dir, progress=False, trainer="openrlhf",
                      trainer_args=["data.prompt_key=prompt"])
    groups = {g["flag"]: g for g in result.report["trainer"]["findings"]}
    assert [e["source_line"] for e in groups["identical"]["examples"]] == [1]
    assert [e["source_line"] for e in groups["identical_after_truncation"]["examples"]] == [2]
    assert groups["identical_after_truncation"]["cause"] == ["OpenRLHF's processing (it strips trailing newlines, "
                                                             "then adds ' ' + EOS)"]
