"""`prefdata export OUT DIR --trainer openrlhf`: OpenRLHF's own loader (blending_datasets, then
RewardDataset, as train_dpo.py runs them) reads exactly OUT's kept pairs from DIR with the flags export
prints, and the ids it makes from them are the ids `validate --trainer openrlhf` reports for the raw rows."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.prepare import prepare
from prefdata.trainers.export import export_for_trainer
from prefdata.trainers.export_openrlhf import ARGS_NAME, DATA_NAME

STRINGS = [
    {"prompt": "Good afternoon.", "chosen": "The weather is nice today.", "rejected": "It rains."},
    {"prompt": "Hi", "chosen": "Same.", "rejected": "Same."},  # identical: prepare drops it
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "Name a colour.", "chosen": "Blue", "rejected": "Seven"},
]
CONVERSATIONS = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
     "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5, I think."}]},
    {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Same."}],
     "rejected": [{"role": "assistant", "content": "Same."}]},
    {"prompt": [{"role": "user", "content": "Name a colour."}], "chosen": [{"role": "assistant", "content": "Blue"}],
     "rejected": [{"role": "assistant", "content": "Seven"}]},
]


@pytest.fixture
def openrlhf():
    pytest.importorskip("openrlhf.datasets", reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2)")


def _raw(tmp_path: Path, rows: list[dict], bad_line: bool = True) -> Path:
    path = tmp_path / "raw.jsonl"
    lines = [json.dumps(row) for row in rows] + (["not json"] if bad_line else [])  # quarantined
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "loose.toml"  # the dropped pair must not fail prepare (max_dropped_share)
    path.write_text("[thresholds]\nmax_dropped_share = 1.0\n", encoding="utf-8")
    return path


def _out(tmp_path: Path, rows: list[dict], tokenizer: str) -> Path:
    result = prepare(_raw(tmp_path, rows), tmp_path / "out", tokenizer=tokenizer, policy=str(_policy(tmp_path)),
                     progress=False)
    assert result.exit_code == 0, result.problem
    return tmp_path / "out"


def _settings_from_flags(flags: list[str]):
    """The --data.* flags export printed, as OpenRLHF's train_dpo.py would parse them."""
    from prefdata.trainers.openrlhf import parse_openrlhf_args

    items = [flag.removeprefix("--").replace(" ", "=", 1) for flag in flags if not flag.startswith("--data.dataset ")]
    return parse_openrlhf_args(items), next(f.split(" ", 1)[1] for f in flags if f.startswith("--data.dataset "))


def _openrlhf_reads(flags: list[str], tokenizer: str):
    """train_dpo.py's data path: blending_datasets(--data.dataset), then RewardDataset(..., is_dpo=True)."""
    from openrlhf.datasets.utils import blending_datasets

    from prefdata.trainers.openrlhf import _rows_table, _strategy, load_openrlhf
    from prefdata.trainers.openrlhf_adapter import openrlhf_tokenizer

    settings, dataset_path = _settings_from_flags(flags)
    strategy = types.SimpleNamespace(print=lambda *a: None, is_rank_0=lambda: False,
                                     args=types.SimpleNamespace(use_ms=False))
    data = blending_datasets(dataset_path, None, strategy, 42, max_count=1_000_000, dataset_split="train")
    RewardDataset, _ = load_openrlhf()
    # The same rows in a table whose map does not hash the tokenizer for a cache name (nothing else differs).
    dataset = RewardDataset(_rows_table(data.to_list()), openrlhf_tokenizer(tokenizer, False), settings.max_len,
                            _strategy(settings), input_template=settings.input_template, is_dpo=True,
                            num_processors=None)
    return data, dataset, settings


def _validate_ids(monkeypatch, raw: Path, tokenizer: str, settings) -> dict[int, object]:
    """The pairs `validate --trainer openrlhf` reports for the raw rows, by source line."""
    import prefdata.trainers.openrlhf_adapter as run
    from prefdata.validate.command import validate

    seen = []
    real = run.run_openrlhf

    def spy(rows, *args, **kwargs):
        outcome = real(rows, *args, **kwargs)
        seen.append(outcome)
        return outcome

    monkeypatch.setattr(run, "run_openrlhf", spy)
    args = [f"data.max_len={settings.max_len}", "data.prompt_key=prompt"]
    args += ["data.apply_chat_template"] if settings.apply_chat_template else []
    validate(raw, tokenizer=tokenizer, progress=False, trainer="openrlhf", trainer_args=args)
    parsed = [n + 1 for n, line in enumerate(raw.read_text(encoding="utf-8").splitlines()) if line.startswith("{")]
    return {parsed[row]: pair for row, pair in seen[0].pairs.items()}


@pytest.fixture(params=["tiny", "qwen2.5-instruct"])
def tokenizer_dir(request, tiny_tokenizer_dir) -> str:
    if request.param == "tiny":
        return tiny_tokenizer_dir
    return str(request.getfixturevalue("shared_tokenizer")(request.param))


@pytest.mark.parametrize("rows", [STRINGS, CONVERSATIONS], ids=["strings", "conversations"])
def test_openrlhfs_loader_reads_exactly_the_kept_pairs_and_validates_ids(rows, tmp_path, tokenizer_dir, openrlhf,
                                                                       monkeypatch):
    import datasets

    out = _out(tmp_path, rows, tokenizer_dir)
    kept = datasets.load_from_disk(str(out))
    result = export_for_trainer(out, tmp_path / "export", trainer="openrlhf", trainer_args=["data.max_len=64"])
    assert result.rows == len(kept) == len(rows) - 1 and result.conversational == (rows is CONVERSATIONS)
    data, dataset, settings = _openrlhf_reads(result.flags, tokenizer_dir)
    # exactly OUT's rows, in order, nothing dropped or quarantined among them
    assert len(data) == len(dataset) == len(kept)
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in data] == [
        (r["prompt"], r["chosen"], r["rejected"]) for r in kept]
    assert [r["source_line"] for r in data] == [r["source_line"] for r in kept] == [1, 3] + ([4] if rows is STRINGS else [])
    dropped = [json.loads(line)["source_line"] for line in (out / "dropped.jsonl").read_text().splitlines()]
    assert dropped == [2] and 2 not in data["source_line"]
    # the ids OpenRLHF makes from the export are those validate --trainer openrlhf reports for the raw rows
    reported = _validate_ids(monkeypatch, tmp_path / "raw.jsonl", tokenizer_dir, settings)
    assert set(reported) - set(data["source_line"]) == {2}  # from the raw file OpenRLHF would train the dropped pair
    for k, line in enumerate(data["source_line"]):
        c_ids, _, r_ids, _, prompt_len = dataset[k]
        pair = reported[line]
        assert (c_ids[0].tolist(), r_ids[0].tolist(), prompt_len) == (pair.chosen.ids, pair.rejected.ids, pair.prompt_len)


def test_refs_pass_through_as_columns_and_the_output_says_openrlhf_cannot_read_them(tmp_path, tiny_model_dir, openrlhf,
                                                                                  capsys):
    from prefdata.refs import compute_refs

    out = _out(tmp_path, STRINGS, tiny_model_dir)
    compute_refs(out, model=tiny_model_dir, progress=False)
    assert main(["export", str(out), str(tmp_path / "export"), "--trainer", "openrlhf"]) == 0
    printed = capsys.readouterr().out
    assert "cannot read precomputed ones" in printed and "live reference model" in printed
    assert "ref_chosen_logps and ref_rejected_logps are written as columns" in printed
    args_text = (tmp_path / "export" / ARGS_NAME).read_text(encoding="utf-8")
    assert "cannot read precomputed ones" in args_text and "--data.prompt_key prompt" in args_text
    import datasets

    kept = datasets.load_from_disk(str(out))
    written = [json.loads(line) for line in (tmp_path / "export" / DATA_NAME).read_text(encoding="utf-8").splitlines()]
    for name in ("ref_chosen_logps", "ref_rejected_logps"):
        assert [row[name] for row in written] == pytest.approx(kept[name])
    data, dataset, _ = _openrlhf_reads(_printed_flags(args_text), tiny_model_dir)  # extra columns do not disturb it
    assert len(dataset) == len(kept)


def _printed_flags(args_text: str) -> list[str]:
    return [line.rstrip(" \\") for line in args_text.splitlines() if line.startswith("--data.")]


def test_refusals_are_one_line_exit_2(tmp_path, tiny_tokenizer_dir, capsys):
    out = _out(tmp_path, STRINGS, tiny_tokenizer_dir)
    target = tmp_path / "export"
    assert main(["export", str(out), str(target), "--trainer", "openrlhf"]) == 0
    before = (target / DATA_NAME).read_text(encoding="utf-8")
    capsys.readouterr()
    cases = [
        (["export", str(out), str(target), "--trainer", "openrlhf"], "pass --overwrite"),
        (["export", str(out), str(out / "inside"), "--trainer", "openrlhf"], "inside OUT"),
        (["export", str(out), str(tmp_path), "--trainer", "openrlhf", "--overwrite"], "lies inside the output"),
        (["export", str(out), str(tmp_path / "x"), "--trainer", "openrlhf", "--trainer-arg", "data.prompt_key=q"],
         "export decides it from OUT"),
        (["export", str(out), str(tmp_path / "x")], "--trainer TRAINER is required"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert (target / DATA_NAME).read_text(encoding="utf-8") == before and not (out / "inside").exists()
    assert main(["export", str(out), str(target), "--trainer", "openrlhf", "--overwrite",
                 "--trainer-arg", "data.max_len=99"]) == 0
    assert "--data.max_len 99" in (target / ARGS_NAME).read_text(encoding="utf-8")


def test_a_symlink_in_out_is_refused_and_nothing_is_written(tmp_path, tiny_tokenizer_dir, capsys):
    out = _out(tmp_path, STRINGS, tiny_tokenizer_dir)
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text("", encoding="utf-8")
    (out / "dropped.jsonl").unlink()
    os.symlink(outside, out / "dropped.jsonl")
    assert main(["export", str(out), str(tmp_path / "export"), "--trainer", "openrlhf"]) == 2
    assert "is a symlink" in capsys.readouterr().err and not (tmp_path / "export").exists()


def test_strings_prepare_rendered_through_the_template_go_out_as_messages(tmp_path, tiny_tokenizer_dir, openrlhf):
    result = prepare(_raw(tmp_path, STRINGS), tmp_path / "out", tokenizer=tiny_tokenizer_dir, chat_template=True,
                     policy=str(_policy(tmp_path)), progress=False)
    assert result.exit_code == 0, result.problem
    export = export_for_trainer(tmp_path / "out", tmp_path / "export", trainer="openrlhf")
    assert export.conversational and "--data.apply_chat_template" in export.flags
    data, dataset, _ = _openrlhf_reads(export.flags, tiny_tokenizer_dir)
    assert data[0]["prompt"] == [{"role": "user", "content": "Good afternoon."}]
    assert data[0]["chosen"] == [{"role": "assistant", "content": "The weather is nice today."}]
    assert len(dataset) == 3


def test_an_out_mixing_strings_and_conversations_is_refused(tmp_path, tiny_tokenizer_dir, capsys):
    out = _out(tmp_path, [STRINGS[0], CONVERSATIONS[0]], tiny_tokenizer_dir)
    assert main(["export", str(out), str(tmp_path / "export"), "--trainer", "openrlhf"]) == 2
    assert "mixes string and conversational rows" in capsys.readouterr().err and not (tmp_path / "export").exists()
