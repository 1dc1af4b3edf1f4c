"""LLaMA-Factory's own data path, as its DPO workflow (train/dpo/workflow.py) runs it: load_tokenizer,
get_template_and_fix_tokenizer, get_dataset(stage="rm") on a dataset_dir with a dataset_info.json. The tests'
independent reference: run with the Python of .venv-llamafactory, never through prefdata's worker.
stdin: a JSON list of jobs {tokenizer, dataset_dir, dataset, data_args, aligned?}; stdout: one JSON line, per job
the train_dataset's rows (chosen/rejected input ids and labels), in order; with `aligned`, {"rows": those,
"aligned": the rows as its converter gave them to the processor (_prompt, _response, _system)}.
"""

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import sys
import tempfile
import types

if importlib.util.find_spec("torchaudio") is None:  # data/mm_plugin.py imports it; text rows never use it
    stub = types.ModuleType("torchaudio")
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    sys.modules["torchaudio"] = stub

KEYS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


def run(job, output_dir):
    from transformers import Seq2SeqTrainingArguments

    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.data.loader import _get_merged_dataset
    from llamafactory.hparams import DataArguments, ModelArguments
    from llamafactory.model import load_tokenizer

    model_args = ModelArguments(model_name_or_path=job["tokenizer"])
    data_args = DataArguments(dataset=job["dataset"], dataset_dir=job["dataset_dir"], overwrite_cache=True,
                              **job["data_args"])
    training_args = Seq2SeqTrainingArguments(output_dir=output_dir, report_to="none")
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    module = get_dataset(template, model_args, data_args, training_args, stage="rm", **tokenizer_module)
    rows = [{key: row[key] for key in KEYS} for row in module["train_dataset"]]
    if not job.get("aligned"):
        return rows
    merged = _get_merged_dataset(data_args.dataset, model_args, data_args, training_args, stage="rm")
    return {"rows": rows, "aligned": [{key: row[key] for key in ("_prompt", "_response", "_system")} for row in merged]}


def main():
    jobs = json.loads(sys.stdin.read())
    with tempfile.TemporaryDirectory() as output_dir, contextlib.redirect_stdout(io.StringIO()):
        out = [run(job, output_dir) for job in jobs]
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
