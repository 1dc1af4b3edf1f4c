"""Peer test: for each real tokenizer in ../shared that LLaMA-Factory has a template for, rows from
../shared/assets/data run through LLaMA-Factory's own get_dataset(stage="rm") (llamafactory_reference.py, in its
venv, not through prefdata) give exactly the ids and labels `--trainer llamafactory` reports.
One reference run for every tokenizer, one adapter run per tokenizer (each a child process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainers.test_llamafactory import dataset_dir, reference, trained, venv_python  # noqa: F401 (fixture)

# The template a LLaMA-Factory user names for each tokenizer (its README's model table).
TEMPLATES = {"qwen2.5-instruct": "qwen", "mistral-7b-instruct-v0.3": "mistral", "phi-3-mini-4k-instruct": "phi",
             "smollm2-135m-instruct": "smollm2", "deepseek-r1-distill-qwen": "deepseekr1"}
NO_TEMPLATE = {"gpt2": "no chat model: LLaMA-Factory would render it with a template no gpt2 was trained on",
               "smollm3-3b": "LLaMA-Factory 0.9.5 has no smollm3 template",
               "cogito-v1-preview-qwen-14b": "LLaMA-Factory 0.9.5 has no cogito template"}
CUTOFF = 512  # small enough that several UltraFeedback rows are cut
SHAREGPT = {"formatting": "sharegpt", "ranking": True,
            "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
ALPACA = {"ranking": True, "columns": {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}}


def _demo_rows(shared: Path) -> list[dict]:
    """LLaMA-Factory's own demo rows: the first six and the first two with earlier turns."""
    rows = json.loads((shared / "assets/data/llamafactory-demo/dpo_en_demo.json").read_text(encoding="utf-8"))
    return rows[:6] + [row for row in rows if len(row["conversations"]) > 1][:2]


def _ultrafeedback_rows(shared: Path) -> list[dict]:
    lines = (shared / "assets/data/ultrafeedback-sample/train.jsonl").read_text(encoding="utf-8").splitlines()[:8]
    return [{key: json.loads(line)[key] for key in ("prompt", "chosen", "rejected")} for line in lines]


@pytest.fixture(scope="module")
def data(shared_dir, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("lf-peer")
    return {"demo": (_demo_rows(shared_dir), dataset_dir(tmp, _demo_rows(shared_dir), SHAREGPT, "demo")),
            "ultrafeedback": (_ultrafeedback_rows(shared_dir),
                              dataset_dir(tmp, _ultrafeedback_rows(shared_dir), ALPACA, "ultrafeedback"))}


def _runs() -> list[tuple[str, str]]:
    """(tokenizer, data) pairs: LLaMA-Factory's demo with every tokenizer, UltraFeedback with Qwen's."""
    return [(name, "demo") for name in TEMPLATES] + [("qwen2.5-instruct", "ultrafeedback")]


@pytest.fixture(scope="module")
def references(data, shared_dir, venv_python, tmp_path_factory) -> dict:
    """LLaMA-Factory's get_dataset for every run, in one child process."""
    jobs = [{"tokenizer": str(shared_dir / "assets/tokenizers" / name), "dataset_dir": str(data[which][1]),
             "dataset": which, "data_args": {"template": TEMPLATES[name], "cutoff_len": CUTOFF}}
            for name, which in _runs()]
    return dict(zip(_runs(), reference(jobs, tmp_path_factory.mktemp("lf-ref"))))


@pytest.mark.parametrize("name, which", _runs())
def test_the_ids_validate_reports_are_llamafactorys_own(name, which, data, references, shared_tokenizer, venv_python):
    from prefdata.trainers import llamafactory_adapter as adapter

    rows, _ = data[which]
    settings = adapter.parse_args([f"template={TEMPLATES[name]}", f"cutoff_len={CUTOFF}"])
    result = adapter.run(rows, shared_tokenizer(name), False, settings, python=venv_python)
    expected = references[(name, which)]
    assert result.dropped == 0 and len(result.pairs) == len(expected) == len(rows)
    for row, ref in enumerate(expected):
        pair = result.pairs[row]
        assert (pair.chosen.ids, pair.rejected.ids) == (ref["chosen_input_ids"], ref["rejected_input_ids"]), row
        assert (pair.chosen.trained, pair.rejected.trained) == (trained(ref["chosen_labels"]),
                                                                trained(ref["rejected_labels"])), row
    flags = {finding.flag for finding in result.findings}
    if name == "deepseek-r1-distill-qwen":  # no think block in the demo's responses: its template trains an empty one
        assert {f.row for f in result.findings if f.flag == "reasoning_mismatch"} == set(range(len(rows)))
    else:
        assert "reasoning_mismatch" not in flags
    if which == "ultrafeedback":  # long responses at cutoff_len 512: cut, with the cutoff_len that keeps them
        cut = [f for f in result.findings if f.flag == "completion_truncated"]
        assert cut and all(f.cause == f"cutoff_len: {CUTOFF}" and f.fix > CUTOFF for f in cut)


@pytest.mark.parametrize("name", sorted(NO_TEMPLATE))
def test_tokenizers_llamafactory_has_no_template_for(name, shared_tokenizer):
    shared_tokenizer(name)
    pytest.skip(f"{name}: {NO_TEMPLATE[name]}")
