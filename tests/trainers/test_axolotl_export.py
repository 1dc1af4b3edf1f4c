"""`prefdata export OUT DIR --trainer axolotl`: axolotl 0.19.0's own loader (load_cfg on the config lines export
writes, then prepare_preference_datasets, in .venv-axolotl) reads exactly OUT's kept pairs from DIR, in order."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from prefdata.prepare import prepare
from prefdata.trainers.export import export_for_trainer
from prefdata.trainers.export_axolotl import CONFIG_NAME, DATA_NAME

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-axolotl" / "bin" / "python"

STRINGS = [
    {"prompt": "Good afternoon.", "chosen": "The weather is nice today.", "rejected": "It rains."},
    {"prompt": "Hi", "chosen": "Same.", "rejected": "Same."},  # identical: prepare drops it
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
]
CONVERSATIONS = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
     "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5, I think."}]},
    {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Same."}],
     "rejected": [{"role": "assistant", "content": "Same."}]},
    {"prompt": [{"role": "user", "content": "Name a colour."}], "chosen": [{"role": "assistant", "content": "Blue"}],
     "rejected": [{"role": "assistant", "content": "Seven"}]},
]

# axolotl's loader as a user's run reaches it: the config lines from DIR/axolotl.yaml plus a model and training keys.
LOADER = r'''
import json, sys, yaml
from axolotl.cli.config import load_cfg
from axolotl.loaders import load_tokenizer
from axolotl.utils.data.rl import prepare_preference_datasets
from axolotl.utils.dict import DictDefault

out = {}
for name, (snippet, tokenizer, work) in json.loads(sys.argv[1]).items():
    raw = yaml.safe_load(open(snippet, encoding="utf-8"))
    raw.update({"base_model": work + "/model", "tokenizer_config": tokenizer, "shuffle_merged_datasets": False,
                "dataset_prepared_path": work + "/prepared", "output_dir": work + "/out", "learning_rate": 1e-6,
                "micro_batch_size": 1, "num_epochs": 1, "dataset_num_proc": 1})
    cfg = load_cfg(DictDefault(raw))
    train, _ = prepare_preference_datasets(cfg, load_tokenizer(cfg))
    out[name] = [{k: r[k] for k in ("prompt", "chosen", "rejected", "source_line")} for r in train]
print("ANSWER" + json.dumps(out))
'''


def _out(tmp_path: Path, name: str, rows: list[dict], tokenizer: str) -> Path:
    raw = tmp_path / f"{name}.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n", encoding="utf-8")  # one quarantined
    policy = tmp_path / "loose.toml"
    policy.write_text("[thresholds]\nmax_dropped_share = 1.0\n", encoding="utf-8")
    result = prepare(raw, tmp_path / f"out-{name}", tokenizer=tokenizer, policy=str(policy), progress=False)
    assert result.exit_code == 0, result.problem
    return tmp_path / f"out-{name}"


def test_export_writes_the_kept_pairs_and_the_config_lines(tmp_path, tiny_tokenizer_dir):
    out = _out(tmp_path, "strings", STRINGS, tiny_tokenizer_dir)
    result = export_for_trainer(out, tmp_path / "dir", trainer="axolotl")
    lines = [json.loads(line) for line in (tmp_path / "dir" / DATA_NAME).read_text(encoding="utf-8").splitlines()]
    assert [(r["prompt"], r["source_line"]) for r in lines] == [("Good afternoon.", 1), ("What is 2+2?", 3)]
    config = (tmp_path / "dir" / CONFIG_NAME).read_text(encoding="utf-8")
    assert "rl: dpo" in config and "    type:" not in config and "reference log-probs" in config
    assert "cannot take precomputed" in result.summary()


@pytest.mark.skipif(not PYTHON.is_file(), reason="no .venv-axolotl (bash scripts/trainer-venv.sh axolotl)")
def test_axolotls_own_loader_reads_exactly_the_kept_pairs(tmp_path, shared_dir):
    tokenizer = str(shared_dir / "assets/tokenizers/qwen2.5-instruct")
    jobs, kept = {}, {}
    for name, rows in (("strings", STRINGS), ("messages", CONVERSATIONS)):
        out = _out(tmp_path, name, rows, tokenizer)
        export_for_trainer(out, tmp_path / f"dir-{name}", trainer="axolotl")
        work = tmp_path / f"work-{name}"
        (work / "model").mkdir(parents=True)
        (work / "model/config.json").write_text(json.dumps({"model_type": "qwen2"}), encoding="utf-8")
        jobs[name] = [str(tmp_path / f"dir-{name}" / CONFIG_NAME), tokenizer, str(work)]
        from datasets import load_from_disk

        kept[name] = load_from_disk(str(out)).select_columns(["prompt", "chosen", "rejected", "source_line"]).to_list()
    done = subprocess.run([str(PYTHON), "-c", LOADER, json.dumps(jobs)], capture_output=True, text=True, cwd=tmp_path,
                          env={"AXOLOTL_DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
                               "PATH": "/usr/bin:/bin"}, timeout=600)
    answer = [line for line in done.stdout.splitlines() if line.startswith("ANSWER")]
    assert answer, done.stderr[-2000:]
    loaded = json.loads(answer[-1].removeprefix("ANSWER"))
    assert loaded["strings"] == kept["strings"]  # strings reach TRL as they are, in OUT's order
    assert [r["source_line"] for r in loaded["messages"]] == [r["source_line"] for r in kept["messages"]] == [1, 3]
    for ours, theirs in zip(kept["messages"], loaded["messages"]):
        # chat_template.default renders the prompt and cuts each response out of its render
        assert theirs["prompt"].endswith("<|im_start|>assistant\n") and ours["prompt"][-1]["content"] in theirs["prompt"]
        assert theirs["chosen"] == ours["chosen"][-1]["content"] + "<|im_end|>"
        assert theirs["rejected"] == ours["rejected"][-1]["content"] + "<|im_end|>"
