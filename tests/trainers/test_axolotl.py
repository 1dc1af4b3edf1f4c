"""validate --trainer axolotl runs axolotl 0.19.0's own DPO preprocessing in its venv (.venv-axolotl, built by
scripts/trainer-venv.sh axolotl) and reports what it will train on; the ids prefdata reports are axolotl's
own (DESIGN.md invariant 7): a reference script here runs axolotl's loader from a plain YAML config, as a
user does, and must give the same ids and masks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from prefdata.core.errors import PrefdataError
from prefdata.trainers.axolotl import outcome_from_answer, parse_axolotl_args
from prefdata.trainers.worker_process import run_worker

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-axolotl" / "bin" / "python"
SKIP_TOKENIZERS = {"gpt2": "no chat template: axolotl's chat_template strategy cannot render it"}

needs_venv = pytest.mark.skipif(not PYTHON.is_file(), reason="no .venv-axolotl (bash scripts/trainer-venv.sh axolotl)")

# The reference: axolotl as its users run it, from a YAML file (no row column, no rewritten config), then TRL's
# tokenize step through AxolotlDPOTrainer and TRL's collator. The rows are kept in order (no shuffle) and none is
# long enough to be dropped, so row i of the file is pair i.
REFERENCE = r'''
import json, sys
from axolotl.cli.config import load_cfg
from axolotl.core.trainers.dpo.trainer import AxolotlDPOTrainer
from axolotl.loaders import load_tokenizer
from axolotl.utils.data.rl import prepare_preference_datasets
from trl import DPOConfig
from trl.trainer.dpo_trainer import DataCollatorForPreference

def main():
    import datasets, functools, uuid
    for name in ("map", "filter"):  # a random cache name instead of hashing the tokenizer each time (same data)
        original = getattr(datasets.Dataset, name)
        def fresh(self, *a, _original=original, **k):
            k["new_fingerprint"] = k.get("new_fingerprint") or uuid.uuid4().hex
            return _original(self, *a, **k)
        setattr(datasets.Dataset, name, functools.wraps(original)(fresh))
    out = {}
    for name, path in json.loads(sys.argv[1]).items():
        cfg = load_cfg(path)
        tok = load_tokenizer(cfg)
        train, _ = prepare_preference_datasets(cfg, tok)
        args = DPOConfig(output_dir=cfg.output_dir, max_length=cfg.sequence_len, use_cpu=True, bf16=False, report_to=[])
        trainer = AxolotlDPOTrainer.__new__(AxolotlDPOTrainer)
        trainer._tokenizer = tok
        data = trainer._prepare_dataset(train, tok, args, "train")
        collate = DataCollatorForPreference(pad_token_id=tok.convert_tokens_to_ids(tok.pad_token or tok.eos_token),
                                            max_length=args.max_length)
        pairs = []
        for ex in data:
            b = collate([{k: ex[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}])
            n = b["attention_mask"].sum(dim=1).tolist()
            pairs.append([b["input_ids"][0][:n[0]].tolist(), b["completion_mask"][0][:n[0]].tolist(),
                          b["input_ids"][1][:n[1]].tolist(), b["completion_mask"][1][:n[1]].tolist()])
        out[name] = pairs
    print("ANSWER" + json.dumps(out))

if __name__ == "__main__":
    main()
'''

ULTRA = {"type": "chat_template.default", "field_messages": "prompt"}
# The other two data sets in ../shared are not read by chat_template.default under rl: dpo: axolotl's DPO dataset
# schema drops message_property_mappings and roles (ShareGPT's from/value), and OpenAI's input.messages is no list.


def _rows(shared_dir: Path) -> dict[str, tuple[list[dict], dict]]:
    ultra = [json.loads(line) for line in
             (shared_dir / "assets/data/ultrafeedback-sample/train.jsonl").read_text(encoding="utf-8").splitlines()]
    ultra = [r for r in ultra if r["chosen"].strip() and r["rejected"].strip()  # axolotl stops on an empty half
             and len(r["prompt"] + r["chosen"] + r["rejected"]) < 1500][:5]
    return {"ultrafeedback": (ultra, ULTRA)}


def _config(entry: dict, data: Path, tokenizer: str, work: Path, model: Path) -> dict:
    return {"base_model": str(model), "tokenizer_config": tokenizer, "rl": "dpo",
            "chat_template": "tokenizer_default", "datasets": [{**entry, "path": str(data), "ds_type": "json"}],
            "sequence_len": 8192, "shuffle_merged_datasets": False, "dataset_num_proc": 1,
            "dataset_prepared_path": str(work / "prepared"), "output_dir": str(work / "out"),
            "learning_rate": 1e-6, "micro_batch_size": 1, "num_epochs": 1}


@needs_venv
def test_reported_ids_are_axolotls_own_for_each_real_tokenizer(shared_dir, tmp_path):
    import yaml

    tokenizers = sorted(p for p in (shared_dir / "assets/tokenizers").iterdir() if p.name not in SKIP_TOKENIZERS)
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    configs, ours = {}, {}
    for data_name, (rows, entry) in _rows(shared_dir).items():
        data = tmp_path / f"{data_name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        for tok in tokenizers:
            work = tmp_path / f"{data_name}-{tok.name}"
            path = tmp_path / f"{data_name}-{tok.name}.yaml"
            path.write_text(yaml.safe_dump(_config(entry, data, str(tok), work, tmp_path / "model")), encoding="utf-8")
            configs[f"{data_name}/{tok.name}"] = str(path)
        # What --trainer axolotl runs (the worker, one run per tokenizer, in one child process).
        settings = parse_axolotl_args([f"{k}={json.dumps(v)}" for k, v in
                                       {**{f"datasets.0.{k}": v for k, v in entry.items()}, "sequence_len": 8192}.items()])
        request = {"config": settings.config, "dataset": 0, "rows": rows, "tokenizer": "", "trust_remote_code": False,
                   "workdir": str(tmp_path / f"w-{data_name}"),
                   "runs": {tok.name: {"tokenizer": str(tok)} for tok in tokenizers}}
        answer = run_worker("axolotl_worker.py", str(PYTHON), request, "axolotl")
        for tok in tokenizers:
            ours[f"{data_name}/{tok.name}"] = (outcome_from_answer(answer["runs"][tok.name]), len(rows))
    done = subprocess.run([str(PYTHON), "-c", REFERENCE, json.dumps(configs)], capture_output=True, text=True,
                          cwd=tmp_path, env={"AXOLOTL_DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
                                             "PATH": "/usr/bin:/bin"}, timeout=900)
    answer = [line for line in done.stdout.splitlines() if line.startswith("ANSWER")]
    assert answer, done.stderr[-2000:]
    reference = json.loads(answer[-1].removeprefix("ANSWER"))
    for key, (outcome, count) in ours.items():
        assert not outcome.dropped and len(reference[key]) == count, key
        for row, (c_ids, c_mask, r_ids, r_mask) in enumerate(reference[key]):
            pair = outcome.pairs[row]
            assert (pair.chosen.ids, pair.chosen.loss_mask) == (c_ids, c_mask), (key, row)
            assert (pair.rejected.ids, pair.rejected.loss_mask) == (r_ids, r_mask), (key, row)


def test_settings_read_the_users_config_and_overrides(tmp_path):
    path = tmp_path / "axolotl.yaml"
    path.write_text("rl: dpo\nsequence_len: 2048\ndatasets:\n  - path: x.jsonl\n    type: chatml.intel\n",
                    encoding="utf-8")
    settings = parse_axolotl_args([f"config={path}", "sequence_len=64", "datasets.0.type=chat_template.default"])
    assert settings.sequence_len == 64 and settings.entry == {"path": "x.jsonl", "type": "chat_template.default"}
    assert "sequence_len: 64" in settings.given() and "datasets[0].type: chat_template.default" in settings.given()
    with pytest.raises(PrefdataError, match="rl: dpo or ipo"):
        parse_axolotl_args([f"config={path}", "rl=kto"])
    with pytest.raises(PrefdataError, match="cannot read it"):
        parse_axolotl_args([f"config={tmp_path / 'missing.yaml'}"])
    with pytest.raises(PrefdataError, match="KEY=VALUE"):
        parse_axolotl_args(["sequence_len"])
