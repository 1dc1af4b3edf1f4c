"""`prefdata export OUT DIR --trainer llamafactory`: LLaMA-Factory's own loader (get_dataset(stage="rm") on DIR
as dataset_dir, with the dataset, template and cutoff_len export prints) reads exactly OUT's kept pairs, in
order, and the ids it makes are the ids `validate --trainer llamafactory` reports for the exported file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.prepare import prepare
from prefdata.trainers.export import export_for_trainer
from prefdata.trainers.export_llamafactory import DATA_NAME, DATASET, INFO_NAME, YAML_NAME
from tests.trainers.test_llamafactory import reference, spy_pairs, trained, venv_python  # noqa: F401 (fixture)

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
    {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Name a colour."}],
     "chosen": [{"role": "assistant", "content": "Blue"}], "rejected": [{"role": "assistant", "content": "Seven"}]},
]


def _out(tmp_path: Path, rows: list[dict], tokenizer: str, name: str) -> Path:
    raw = tmp_path / f"{name}.jsonl"
    raw.write_text("\n".join([json.dumps(row) for row in rows] + ["not json"]) + "\n", encoding="utf-8")
    policy = tmp_path / "loose.toml"  # the dropped pair must not fail prepare (max_dropped_share)
    policy.write_text("[thresholds]\nmax_dropped_share = 1.0\n", encoding="utf-8")
    result = prepare(raw, tmp_path / name, tokenizer=tokenizer, policy=str(policy), progress=False)
    assert result.exit_code == 0, result.problem
    return tmp_path / name


def _config(export_dir: Path) -> dict[str, str]:
    """The `key: value` lines export wrote for the user's LLaMA-Factory config."""
    lines = (export_dir / YAML_NAME).read_text(encoding="utf-8").splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def _texts(row: dict) -> tuple:
    """A kept row of OUT as (system, prompt turns, chosen, rejected) text."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return "", [prompt], row["chosen"], row["rejected"]
    system = prompt[0]["content"] if prompt[0]["role"] == "system" else ""
    turns = [m["content"] for m in prompt if m["role"] != "system"]
    return system, turns, row["chosen"][0]["content"], row["rejected"][0]["content"]


def test_llamafactorys_loader_reads_exactly_the_kept_pairs_in_order(tmp_path, shared_tokenizer, venv_python,
                                                                    monkeypatch):
    import datasets

    tokenizer = shared_tokenizer("qwen2.5-instruct")
    outs = {"strings": _out(tmp_path, STRINGS, tokenizer, "strings"),
            "conversations": _out(tmp_path, CONVERSATIONS, tokenizer, "conversations")}
    jobs, kept, dirs = [], {}, {}
    for name, out in outs.items():
        kept[name] = datasets.load_from_disk(str(out))
        dirs[name] = tmp_path / f"export-{name}"
        result = export_for_trainer(out, dirs[name], trainer="llamafactory",
                                    trainer_args=["template=qwen", "cutoff_len=1024"])
        assert result.rows == len(kept[name]) == len(STRINGS if name == "strings" else CONVERSATIONS) - 1
        info = json.loads((dirs[name] / INFO_NAME).read_text(encoding="utf-8"))[DATASET]
        assert info["ranking"] is True and info["file_name"] == DATA_NAME
        config = _config(dirs[name])
        assert config["stage"] == "dpo" and config["dataset"] == DATASET and config["dataset_dir"] == str(dirs[name])
        jobs.append({"tokenizer": tokenizer, "dataset_dir": config["dataset_dir"], "dataset": config["dataset"],
                     "data_args": {"template": config["template"], "cutoff_len": int(config["cutoff_len"])},
                     "aligned": True})
    answers = dict(zip(outs, reference(jobs, tmp_path)))
    for name, answer in answers.items():
        # exactly OUT's rows, in order: nothing dropped, nothing added (the identical pair and the bad line are not there)
        assert len(answer["rows"]) == len(answer["aligned"]) == len(kept[name])
        for row, aligned in zip(kept[name], answer["aligned"]):
            system, turns, chosen, rejected = _texts(row)
            assert [m["content"] for m in aligned["_response"]] == [chosen, rejected]
            assert [m["content"] for m in aligned["_prompt"]] == turns and aligned["_system"] == system
    # the ids LLaMA-Factory makes from DIR are those validate --trainer llamafactory reports for DIR's file
    seen = spy_pairs(monkeypatch)
    folder = dirs["conversations"]
    from prefdata.validate.command import validate

    validate(folder / DATA_NAME, tokenizer=tokenizer, progress=False, trainer="llamafactory", trainer_python=venv_python,
             trainer_args=["template=qwen", "cutoff_len=1024", f"dataset_info={folder}", f"dataset={DATASET}"])
    ids = answers["conversations"]["rows"]
    assert sorted(seen[0].pairs) == list(range(len(ids))) and not seen[0].dropped
    for k, ref in enumerate(ids):
        pair = seen[0].pairs[k]
        assert (pair.chosen.ids, pair.rejected.ids) == (ref["chosen_input_ids"], ref["rejected_input_ids"])
        assert (pair.chosen.trained, pair.rejected.trained) == (trained(ref["chosen_labels"]),
                                                                trained(ref["rejected_labels"]))


def test_refs_pass_through_and_the_output_says_llamafactory_cannot_read_them(tmp_path, tiny_model_dir, capsys):
    import datasets

    from prefdata.refs import compute_refs

    out = _out(tmp_path, STRINGS, tiny_model_dir, "out")
    compute_refs(out, model=tiny_model_dir, progress=False)
    assert main(["export", str(out), str(tmp_path / "export"), "--trainer", "llamafactory"]) == 0
    printed = capsys.readouterr().out
    assert "cannot read precomputed ones" in printed and "precompute_ref_log_probs = False" in printed
    assert "#4810" in printed and "template: TEMPLATE" in printed  # no template given: the user fills it in
    yaml_text = (tmp_path / "export" / YAML_NAME).read_text(encoding="utf-8")
    assert "# note: reference log-probs: LLaMA-Factory cannot read precomputed ones" in yaml_text
    kept = datasets.load_from_disk(str(out))
    written = [json.loads(line) for line in (tmp_path / "export" / DATA_NAME).read_text(encoding="utf-8").splitlines()]
    assert [row["source_line"] for row in written] == kept["source_line"]
    for name in ("ref_chosen_logps", "ref_rejected_logps"):
        assert [row[name] for row in written] == pytest.approx(kept[name])


def test_refusals_are_one_line_exit_2(tmp_path, tiny_tokenizer_dir, capsys):
    out = _out(tmp_path, STRINGS, tiny_tokenizer_dir, "out")
    mixed = _out(tmp_path, [STRINGS[0], CONVERSATIONS[0]], tiny_tokenizer_dir, "mixed")
    target = tmp_path / "export"
    assert main(["export", str(out), str(target), "--trainer", "llamafactory"]) == 0
    before = (target / DATA_NAME).read_text(encoding="utf-8")
    capsys.readouterr()
    cases = [
        (["export", str(out), str(target), "--trainer", "llamafactory"], "pass --overwrite"),
        (["export", str(out), str(tmp_path / "x"), "--trainer", "llamafactory", "--trainer-arg", "mask_history=true"],
         "export writes template=NAME and cutoff_len=N"),
        (["export", str(mixed), str(tmp_path / "y"), "--trainer", "llamafactory"], "mixes string and conversational"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert (target / DATA_NAME).read_text(encoding="utf-8") == before
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
