"""LLaMA-Factory's DPO preprocessing (stage "rm"), run with its own code in its own environment.

Run by prefdata.trainers.llamafactory through worker_process.run_worker: one JSON request on stdin, one
JSON answer line on stdout. Imports only the standard library and LLaMA-Factory (nothing of prefdata).
Request: {"tokenizer", "trust_remote_code", "data_args": {template, cutoff_len, ...}, "dataset_info": the
dataset_info.json entry LLaMA-Factory reads the rows with, "rows": [...]}.
What runs, per row: its dataset_info parser (get_dataset_list), its converter (formatting alpaca / sharegpt
/ openai), then PairwiseDatasetProcessor.preprocess_dataset, with the tokenizer from its load_tokenizer and
the template from get_template_and_fix_tokenizer, once at the given cutoff_len and once with no limit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import types
from typing import Any

UNLIMITED = 1 << 30  # a cutoff_len that cuts nothing: what the row is without the limit
IGNORE_INDEX = -100  # LLaMA-Factory's label for positions out of the loss (extras.constants)


def _stand_ins() -> None:
    """data/mm_plugin.py imports torchaudio at module level (for audio inputs only); a CPU install of
    LLaMA-Factory's data path has none, so an empty module stands in. Text rows never call it."""
    import importlib.machinery

    for name in ("torchaudio",):
        if importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec(name) must not fail
            sys.modules[name] = module


def _quiet() -> None:
    import logging

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    logging.getLogger("llamafactory").setLevel(logging.ERROR)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("llamafactory"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _load(request: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(tokenizer, template, processor, processor with no length limit) as LLaMA-Factory's DPO and RM
    workflows build them (load_tokenizer, get_template_and_fix_tokenizer, the "rm" stage's processor)."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.data.processor import PairwiseDatasetProcessor
    from llamafactory.hparams import DataArguments, ModelArguments
    from llamafactory.model import load_tokenizer

    model_args = ModelArguments(model_name_or_path=request["tokenizer"],
                                trust_remote_code=bool(request.get("trust_remote_code")))
    module = load_tokenizer(model_args)
    tokenizer = module["tokenizer"]
    data_args = DataArguments(**request["data_args"])
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    unlimited = DataArguments(**{**request["data_args"], "cutoff_len": UNLIMITED})
    return (tokenizer, template, PairwiseDatasetProcessor(template, tokenizer, None, data_args),
            PairwiseDatasetProcessor(template, tokenizer, None, unlimited))


def _converter(request: dict[str, Any]) -> tuple[Any, Any]:
    """LLaMA-Factory's converter for the dataset_info entry, and the entry as its own parser joins it."""
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.hparams import DataArguments

    # file_name: the rows come in the request; its parser needs an entry that loads from a file
    entry = {"file_name": "rows.json", **request["dataset_info"]}
    attr = get_dataset_list(["prefdata"], {"prefdata": entry})[0]
    data_args = DataArguments(**request["data_args"])
    return get_dataset_converter(attr.formatting, attr, data_args), attr


def _explicit_empty_system(attr: Any, row: dict[str, Any]) -> bool:
    """The row gives a system message and it is empty (the template then renders its default instead)."""
    if attr.system and row.get(attr.system) == "":
        return True
    messages = row.get(attr.messages) if attr.formatting != "alpaca" and attr.messages else None
    if isinstance(messages, list) and messages and isinstance(messages[0], dict) and attr.system_tag:
        first = messages[0]
        return first.get(attr.role_tag) == attr.system_tag and first.get(attr.content_tag) == ""
    return False


def _thought_added(template: Any, responses: list[dict[str, Any]]) -> list[bool]:
    """A reasoning template with enable_thinking puts an empty think block into the trained response of each
    response that has none (ReasoningTemplate.encode_oneturn)."""
    from llamafactory.data.template import ReasoningTemplate

    if not isinstance(template, ReasoningTemplate) or not template.enable_thinking:
        return [False] * len(responses)
    start, end = (word.strip() for word in template.thought_words)
    return [start not in str(r.get("content")) and end not in str(r.get("content")) for r in responses]


def _encode(processor: Any, aligned: dict[str, Any]) -> dict[str, Any] | None:
    """One aligned row through preprocess_dataset (a batch of one, so a row it drops is known)."""
    batch = {key: [aligned.get(key)] for key in ("_prompt", "_response", "_system", "_tools", "_images",
                                                 "_videos", "_audios")}
    out = processor.preprocess_dataset(batch)
    if not out.get("chosen_input_ids"):
        return None
    return {key: out[key][0] for key in ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")}


def _smallest_cutoff(source: int, target: int, start: int, need_target: int, need_source: int) -> int | None:
    """The smallest cutoff_len >= start at which LLaMA-Factory's infer_seqlen keeps at least need_target
    response tokens and need_source prompt tokens. infer_seqlen is not monotonic in cutoff_len, but it is
    within each of its three branches (both cut: c <= 2*target and c <= 2*source; response cut: 2*source < c
    <= 2*target; prompt cut: c > 2*target), so each branch's range is bisected in order."""
    from llamafactory.data.processor.processor_utils import infer_seqlen

    def enough(cutoff: int) -> bool:
        kept_source, kept_target = infer_seqlen(source, target, cutoff)
        return kept_target >= need_target and kept_source >= need_source

    branches = [(1, min(2 * target, 2 * source)), (2 * source + 1, 2 * target), (2 * target + 1, source + target)]
    for low, high in branches:
        low, high = max(low, start, 1), min(high, source + target)
        if low > high or not enough(high):
            continue
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if enough(middle) else (middle + 1, high)
        return low
    return None


def _row(converter: Any, attr: Any, template: Any, processors: tuple[Any, Any], row: dict[str, Any],
         cutoff_len: int) -> dict[str, Any]:
    processor, full = processors
    aligned = converter(row)
    encoded = _encode(processor, aligned)
    info: dict[str, Any] = {"prompt_messages": len(aligned["_prompt"]), "responses": len(aligned["_response"]),
                            "system": aligned.get("_system") or "",
                            "explicit_empty_system": _explicit_empty_system(attr, row) and not aligned.get("_system"),
                            "thought_added": _thought_added(template, aligned["_response"])}
    if encoded is None:
        return {**info, "dropped": True}
    whole = _encode(full, aligned)
    source = sum(1 for label in whole["chosen_labels"] if label == IGNORE_INDEX)
    chosen, rejected = whole["chosen_input_ids"][source:], whole["rejected_input_ids"][source:]
    target = max(len(chosen), len(rejected))
    first = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
    apart = None if chosen == rejected else _smallest_cutoff(source, target, cutoff_len, first + 1, 0)
    return {**info, **encoded, "full_prompt_ids": whole["chosen_input_ids"][:source], "full_chosen_ids": chosen,
            "full_rejected_ids": rejected, "apart_at": apart,
            "response_whole_at": _smallest_cutoff(source, target, cutoff_len, target, 0),
            "trained_at": _smallest_cutoff(source, target, cutoff_len, 1, 0),
            "prompt_whole_at": _smallest_cutoff(source, target, cutoff_len, 0, source)}


def main() -> None:
    request = json.loads(sys.stdin.read())
    if importlib.util.find_spec("llamafactory") is None:  # said before seconds of importing torch and transformers
        sys.stdout.write(json.dumps({"error": f"LLaMA-Factory is not installed under {sys.executable}; install "
                                              "llamafactory==0.9.5 there, or give the Python of its venv with "
                                              "--trainer-python"}) + "\n")
        return
    _stand_ins()
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise):  # its loggers and prints must not mix with the answer line
            _quiet()
            from importlib.metadata import version

            cutoff_len = int(request["data_args"]["cutoff_len"])
            tokenizer, template, processor, full = _load(request)
            converter, attr = _converter(request)
            import datasets

            # the rows as its loader gives them (load_dataset("json") makes one schema: absent keys are None)
            table = datasets.Dataset.from_list(request["rows"]) if request["rows"] else []
            rows = [_row(converter, attr, template, (processor, full), row, cutoff_len) for row in table]
            answer = {"version": version("llamafactory"), "rows": rows, "default_system": template.default_system,
                      "efficient_eos": bool(template.efficient_eos), "eos_token": tokenizer.eos_token,
                      "template_class": type(template).__name__}
    except ImportError as error:  # a broken LLaMA-Factory environment
        answer = {"error": f"LLaMA-Factory's code does not import under {sys.executable} ({error}); its venv needs "
                           "the releases docs/trainers.md lists"}
    except Exception as error:  # LLaMA-Factory's own failure: its training would stop here too
        first = str(error).splitlines()[0] if str(error) else ""
        answer = {"error": f"{type(error).__name__}: {first}"}
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
