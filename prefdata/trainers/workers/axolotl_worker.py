"""axolotl's own DPO preprocessing, run in axolotl's environment (prefdata/trainers/worker_process.py).

Standalone: imports only the standard library and axolotl (with the transformers, datasets and TRL it
pins). Reads one JSON request on stdin, writes one JSON answer line on stdout:

request: {"config": {...} (the user's axolotl config, overrides applied), "dataset": index of the
          datasets entry the rows are read through, "rows": [...], "tokenizer": path,
          "trust_remote_code": bool, "workdir": an empty folder for axolotl's files,
          "runs": {"name": {"changes": {top-level config keys for that run}, "tokenizer": optional path}}}
answer:  {"axolotl": version, "trl": version, "runs": {"name": {"pairs": {"row": pair}, "dropped": [rows]}}}
         pair: {"prompt_text", "chosen_text", "rejected_text" (the strings axolotl's strategy made), "prompt_ids",
         "chosen": {"ids", "mask"}, "rejected": {"ids", "mask"}} (ids and completion masks as TRL's
         DataCollatorForPreference builds them for the loss)
or       {"error": "..."} when axolotl's own code stops on the input (its training would stop too).

What runs, in axolotl's order: `load_cfg` (its validation and defaults), `load_tokenizer`,
`prepare_preference_datasets` (its dataset strategy, then its excess_length_strategy filter), then
TRL's `DPOTrainer._prepare_dataset` through axolotl's `AxolotlDPOTrainer` (EOS added to strings,
tokenized, rows whose prompt fills max_length dropped) and TRL's `DataCollatorForPreference` with the
max_length and truncation_mode axolotl hands TRL. The rows carry one extra column (their position),
so the rows axolotl drops or shuffles are followed; its model is a folder with a config.json only.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

ROW = "_prefdata_row"
# Keys that reach no data step (distributed setup, logging, the Hub, plugins that patch models): left out,
# so a config written for a GPU cluster loads here.
_DROPPED = ("deepspeed", "fsdp", "fsdp_config", "fsdp_version", "plugins", "hub_model_id", "push_dataset_to_hub",
            "resume_from_checkpoint", "wandb_project", "wandb_entity", "wandb_name", "wandb_watch",
            "wandb_log_model", "use_wandb", "mlflow_tracking_uri", "use_mlflow", "comet_api_key", "use_comet",
            "test_datasets", "val_set_size", "hf_use_auth_token", "special_tokens_file", "gpu_memory_limit",
            "lora_model_dir", "unsloth_lora_mlp", "unsloth_lora_qkv", "unsloth_lora_o", "flash_attention",
            "sdp_attention", "xformers_attention", "flex_attention", "sample_packing", "liger_rope",
            "liger_rms_norm", "liger_glu_activation", "liger_layer_norm", "liger_fused_linear_cross_entropy",
            "torch_compile", "tf32", "bf16", "fp16", "fp8", "load_in_8bit", "load_in_4bit", "adapter",
            "dataset_exact_deduplication")
_TRAINING_DEFAULTS = {"learning_rate": 1e-5, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1}
_MODEL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 8,
          "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}


def main() -> None:
    request = json.loads(sys.stdin.read())
    os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # axolotl's banners and logs must not reach the answer line
    try:
        answer = run(request)
    except Exception as error:  # axolotl's own failure, as one line
        traceback.print_exc(file=sys.stderr)
        lines = [line.strip() for line in str(error).strip().splitlines() if not line.strip().startswith("For further")]
        answer = {"error": f"{type(error).__name__}: {' / '.join(lines[:3])}"[:600]}
    sys.stdout = real_stdout
    print(json.dumps(answer))


def run(request: dict[str, Any]) -> dict[str, Any]:
    import logging

    import axolotl
    import datasets
    import trl

    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    fresh_fingerprints(datasets.Dataset)
    work = Path(request["workdir"])
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(_MODEL), encoding="utf-8")
    rows_file = work / "rows.jsonl"
    with open(rows_file, "w", encoding="utf-8") as handle:
        for index, row in enumerate(request["rows"]):
            handle.write(json.dumps({**row, ROW: index}, ensure_ascii=False) + "\n")
    runs = {}
    for name, spec in request["runs"].items():
        config = _config({**request, "tokenizer": spec.get("tokenizer") or request["tokenizer"]}, model, rows_file,
                         work / name, spec.get("changes") or {})
        runs[name] = _one_run(config, len(request["rows"]))
    return {"axolotl": axolotl.__version__, "trl": trl.__version__, "runs": runs}


def fresh_fingerprints(cls: Any) -> None:
    """Each map/filter gets a new random fingerprint instead of one hashed from its function, which pickles the
    whole tokenizer (seconds for large vocabularies, several times per run). Fingerprints only name cache files,
    and each run has its own empty cache folder, so what is computed is the same."""
    import functools
    import uuid

    for name in ("map", "filter"):
        original = getattr(cls, name)

        @functools.wraps(original)
        def fresh(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if kwargs.get("new_fingerprint") is None:
                kwargs["new_fingerprint"] = uuid.uuid4().hex
            return _original(self, *args, **kwargs)

        setattr(cls, name, fresh)


def _config(request: dict[str, Any], model: Path, rows_file: Path, work: Path, changes: dict[str, Any]) -> dict[str, Any]:
    """The user's config with the rows in place of its dataset's files and a throwaway model and cache."""
    config = copy.deepcopy(request["config"])
    for key in _DROPPED:
        config.pop(key, None)
    entry = dict(config["datasets"][request["dataset"]])
    for key in ("data_files", "name", "revision", "split", "ds_type", "shards", "preprocess_shards"):
        entry.pop(key, None)
    entry.update({"path": str(rows_file), "ds_type": "json", "split": "train"})
    for key, value in _TRAINING_DEFAULTS.items():  # required by its schema, read by no data step
        config.setdefault(key, value)
    config.update(changes)
    config.update({
        "base_model": str(model), "tokenizer_config": request["tokenizer"], "datasets": [entry],
        "dataset_prepared_path": str(work / "prepared"), "output_dir": str(work / "out"),
        "dataset_num_proc": 1, "trust_remote_code": bool(request.get("trust_remote_code")),
    })
    config.pop("dataset_processes", None)
    return config


def _one_run(raw: dict[str, Any], rows: int) -> dict[str, Any]:
    from axolotl.cli.config import load_cfg
    from axolotl.core.trainers.dpo.trainer import AxolotlDPOTrainer
    from axolotl.loaders import load_tokenizer
    from axolotl.utils.data.rl import prepare_preference_datasets
    from axolotl.utils.dict import DictDefault
    from trl import DPOConfig
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    cfg = load_cfg(DictDefault(raw))
    tokenizer = load_tokenizer(cfg)
    train, _ = prepare_preference_datasets(cfg, tokenizer)
    if ROW not in train.column_names:
        raise ValueError(f"dataset type {raw['datasets'][0].get('type')!r} removes every column: prefdata "
                         "cannot follow its rows")
    texts = {int(r[ROW]): {f"{k}_text": r.get(k) for k in ("prompt", "chosen", "rejected")} for r in train}
    # What AxolotlDPOTrainer's __init__ hands TRL: max_length = sequence_len (DPOStrategy), TRL's defaults else.
    args = DPOConfig(output_dir=raw["output_dir"], max_length=cfg.sequence_len, dataset_num_proc=None,
                     report_to=[], pad_token=None, use_cpu=True, bf16=False)
    trainer = AxolotlDPOTrainer.__new__(AxolotlDPOTrainer)  # no model: only its dataset step runs
    trainer._tokenizer = tokenizer
    tokenized = trainer._prepare_dataset(train, tokenizer, args, "train")
    pad = tokenizer.pad_token or tokenizer.eos_token
    collator = DataCollatorForPreference(pad_token_id=tokenizer.convert_tokens_to_ids(pad),
                                         max_length=args.max_length, truncation_mode=args.truncation_mode)
    pairs: dict[str, Any] = {}
    for example in tokenized:
        batch = collator([{k: example[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}])
        halves = {}
        for half, b in (("chosen", 0), ("rejected", 1)):
            keep = batch["attention_mask"][b].bool()
            halves[half] = {"ids": batch["input_ids"][b][keep].tolist(),
                            "mask": batch["completion_mask"][b][keep].tolist()}
        row = int(example[ROW])
        pairs[str(row)] = {**texts[row], "prompt_ids": list(example["prompt_ids"]), **halves}
    dropped = sorted(set(range(rows)) - {int(k) for k in pairs})
    return {"pairs": pairs, "dropped": dropped, "settings": {
        "sequence_len": cfg.sequence_len, "excess_length_strategy": cfg.excess_length_strategy or "drop",
        "truncation_mode": args.truncation_mode, "chat_template": str(cfg.chat_template) if cfg.chat_template else None}}


if __name__ == "__main__":  # datasets' worker processes re-run this file: only the parent runs main
    main()
