"""validate --trainer llamafactory runs LLaMA-Factory 0.9.5's own DPO preprocessing in its own venv
(.venv-llamafactory, scripts/trainer-venv.sh) and reports what it will train on; the ids it reports are
LLaMA-Factory's own (DESIGN.md invariant 7), checked against its get_dataset(stage="rm") run independently
(llamafactory_reference.py). Each LLaMA-Factory run starts a child process (seconds of imports): the rows
are grouped so the file makes four."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.validate.command import validate

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv-llamafactory" / "bin" / "python"
REFERENCE = Path(__file__).with_name("llamafactory_reference.py")
WORDS = ("Please read this long question about the weather in the mountains near the lake, the clouds that "
         "gather over the valley in the afternoon and the wind that follows them, then tell me whether it "
         "is a good day for a walk.")
LONG = {"prompt": WORDS, "system": "",
        "chosen": "The weather is nice today and the sun is out, so a walk by the lake is a fine idea.",
        "rejected": "The weather is nice today and the sun is out, so a walk by the lake is a bad idea."}
TWO = {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}
SAME = {"prompt": "Hi", "chosen": "Same.", "rejected": "Same."}


@pytest.fixture(scope="module")
def venv_python() -> str:
    if not VENV_PYTHON.is_file():
        pytest.skip(".venv-llamafactory is missing (bash scripts/trainer-venv.sh llamafactory builds it)")
    return str(VENV_PYTHON)


def reference(jobs: list[dict], tmp_path: Path) -> list[list[dict]]:
    """LLaMA-Factory's get_dataset(stage="rm") on each job's dataset_dir, in its venv."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "1",
           "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(VENV_PYTHON), "-I", str(REFERENCE)], input=json.dumps(jobs), capture_output=True,
                          text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def dataset_dir(tmp_path: Path, rows: list[dict], entry: dict, name: str = "pairs") -> Path:
    """A dataset_dir as a LLaMA-Factory user writes it: the rows, and dataset_info.json naming them."""
    folder = tmp_path / f"lf-{name}"
    folder.mkdir()
    (folder / f"{name}.json").write_text(json.dumps(rows), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({name: {"file_name": f"{name}.json", **entry}}),
                                              encoding="utf-8")
    return folder


def write_rows(tmp_path: Path, rows: list[dict], name: str = "pairs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def spy_pairs(monkeypatch) -> list:
    """The outcomes the adapter got from LLaMA-Factory (to compare with the reference)."""
    import prefdata.trainers.llamafactory_adapter as adapter

    seen = []
    real = adapter.run_llamafactory

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(adapter, "run_llamafactory", spy)
    return seen


def trained(labels: list[int]) -> list[int]:
    return [label for label in labels if label != -100]


def test_findings_quote_cutoff_len_and_the_value_that_avoids_them_and_the_ids_are_llamafactorys(
        tmp_path, shared_tokenizer, venv_python, monkeypatch):
    tokenizer = shared_tokenizer("qwen2.5-instruct")
    rows = [LONG, TWO, SAME]
    seen = spy_pairs(monkeypatch)
    result = validate(write_rows(tmp_path, rows), tokenizer=tokenizer, progress=False, trainer="llamafactory",
                      trainer_args=["template=qwen", "cutoff_len=40"], trainer_python=venv_python)
    section = result.report["trainer"]
    assert section["version"] == "0.9.5" and section["settings"] == ["template: qwen", "cutoff_len: 40"]
    groups = {g["flag"]: g for g in section["findings"]}
    assert "identical_after_truncation" not in result.report["flags"]  # prefdata's own ids keep LONG apart
    same = groups["identical_after_truncation"]
    apart = seen[0].pairs[0].apart_at
    assert same["cause"] == ["cutoff_len: 40"] and same["fix"] == [f"cutoff_len: {apart}"] and apart > 40
    assert same["examples"][0]["source_line"] == 1 and "one shared length" in same["examples"][0]["detail"]
    cut = groups["prompt_boundary_mismatch"]  # the prompt keeps its beginning: the assistant header is lost
    assert cut["examples"][0]["source_line"] == 1 and "<|im_start|>assistant" in cut["examples"][0]["detail"]
    system = groups["system_lost"]  # the empty system message becomes Qwen's default
    assert system["rows"] == 1 and system["cause"] == ["template: qwen"]
    assert "You are Qwen" in system["examples"][0]["detail"] and system["fix"] == ['default_system: "" (no system '
                                                                                    'message where a row gives none)']
    assert groups["identical"]["examples"][0]["source_line"] == 3
    assert "under llamafactory" in result.rendered and f"cutoff_len: {apart}" in result.rendered
    # LLaMA-Factory's own get_dataset: the same ids at 40; at the suggested cutoff_len the halves differ,
    # one below it they do not (it is the smallest)
    folder = dataset_dir(tmp_path, rows, {"ranking": True, "columns": {"prompt": "prompt", "chosen": "chosen",
                                                                        "rejected": "rejected", "system": "system"}})
    jobs = [{"tokenizer": tokenizer, "dataset_dir": str(folder), "dataset": "pairs",
             "data_args": {"template": "qwen", "cutoff_len": cutoff}} for cutoff in (40, apart, apart - 1)]
    at_40, at_fix, below = reference(jobs, tmp_path)
    for row, ref in enumerate(at_40):
        pair = seen[0].pairs[row]
        assert (pair.chosen.ids, pair.rejected.ids) == (ref["chosen_input_ids"], ref["rejected_input_ids"])
        assert pair.chosen.trained == trained(ref["chosen_labels"])
        assert pair.rejected.trained == trained(ref["rejected_labels"])
    assert trained(at_40[0]["chosen_labels"]) == trained(at_40[0]["rejected_labels"])
    assert trained(at_fix[0]["chosen_labels"]) != trained(at_fix[0]["rejected_labels"])
    assert trained(below[0]["chosen_labels"]) == trained(below[0]["rejected_labels"])


def test_rows_llamafactory_cannot_pair_are_reported_as_dropped(tmp_path, shared_tokenizer, venv_python):
    # TRL's conversational shape: chosen/rejected are message lists, and LLaMA-Factory's sharegpt converter
    # pairs only single messages, so its processor drops the row with a logged warning.
    rows = [{"prompt": [{"role": "user", "content": "What is 2+2?"}],
             "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}]
    result = validate(write_rows(tmp_path, rows), tokenizer=shared_tokenizer("qwen2.5-instruct"), progress=False,
                      trainer="llamafactory", trainer_args=["template=qwen"], trainer_python=venv_python)
    section = result.report["trainer"]
    assert section["dropped_rows"] == 1 and section["trained_pairs"] == 0
    group = {g["flag"]: g for g in section["findings"]}["no_completion_tokens"]
    assert "Dropped invalid example" in group["examples"][0]["detail"]
    assert any("prefdata export OUT DIR --trainer llamafactory" in fix for fix in group["fix"])
    assert any("formatting sharegpt" in note for note in section["notes"])


@pytest.mark.parametrize("args, words", [
    ([], "needs --trainer-arg template=NAME"),
    (["template=qwen", "mask_history=true"], "does not read mask_history"),
    (["template=qwen", "max_len=3"], "reads cutoff_len"),
    (["template=qwen", "cutoff_len=0"], "expected a positive integer"),
    (["template=qwen", "dataset=x"], "go together"),
])
def test_settings_llamafactory_does_not_read_are_one_line_exit_2(tmp_path, tiny_tokenizer_dir, capsys, args, words):
    argv = ["validate", str(write_rows(tmp_path, [TWO])), "--tokenizer", tiny_tokenizer_dir, "--trainer", "llamafactory"]
    for item in args:
        argv += ["--trainer-arg", item]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_a_python_without_llamafactory_is_one_line_exit_2(tmp_path, tiny_tokenizer_dir, capsys):
    argv = ["validate", str(write_rows(tmp_path, [TWO])), "--tokenizer", tiny_tokenizer_dir, "--trainer",
            "llamafactory", "--trainer-arg", "template=qwen", "--trainer-python", sys.executable]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "LLaMA-Factory is not installed under" in err and len(err.strip().splitlines()) == 1, err


def test_rows_or_an_entry_llamafactory_cannot_read_are_one_line_exit_2(tmp_path, tiny_tokenizer_dir, capsys):
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps({"unpaired": {"file_name": "x.json", "columns": {"prompt": "prompt"}}}), encoding="utf-8")
    openai_dpo = {"input": {"messages": [{"role": "user", "content": "Hi"}]},
                  "preferred_output": [{"role": "assistant", "content": "Hello"}],
                  "non_preferred_output": [{"role": "assistant", "content": "Go"}]}
    cases = [([openai_dpo], [], "LLaMA-Factory reads alpaca or sharegpt rows"),
             ([TWO], [f"dataset_info={tmp_path}", "dataset=nope"], "no such entry"),
             ([TWO], [f"dataset_info={info}", "dataset=unpaired"], "has no `ranking: true`")]
    for rows, args, words in cases:
        argv = ["validate", str(write_rows(tmp_path, rows)), "--tokenizer", tiny_tokenizer_dir, "--trainer",
                "llamafactory", "--trainer-arg", "template=qwen"]
        for item in args:
            argv += ["--trainer-arg", item]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
