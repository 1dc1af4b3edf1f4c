"""RAW as a Hub dataset id with a split, read offline from a local directory laid out like a Hub
dataset repository (datasets reads a local `org/name` directory in place of the Hub repo)."""

from __future__ import annotations

import json

import pytest

from prefdata.core.errors import PrefdataError
from prefdata.io.hub import HubSource, parse_hub_id
from prefdata.prepare import prepare

QUESTIONS = ["What is 2 + 2?", "Name a cat.", "Is the sea blue?", "Say hi.", "Count to three."]


@pytest.fixture
def hub_repo(tmp_path, monkeypatch):
    """tmp/org/name/data/{train_prefs,test_prefs}-00000-of-00001.parquet (UltraFeedback-binarized rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "org" / "name" / "data"
    data.mkdir(parents=True)
    rows = [
        {"prompt": q, "score_chosen": 8.0,
         "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": f"A good answer to {q}"}],
         "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": "No."}]}
        for q in QUESTIONS
    ]
    pq.write_table(pa.Table.from_pylist(rows), data / "train_prefs-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:2]), data / "test_prefs-00000-of-00001.parquet")
    (tmp_path / "org" / "name" / "README.md").write_text("# a preference dataset\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    import datasets.config
    import huggingface_hub.constants

    # Offline, whatever the environment: the libraries read HF_HUB_OFFLINE once, at import.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return tmp_path


def test_hub_ids_parse_and_an_existing_path_wins(tmp_path, monkeypatch):
    assert parse_hub_id("HuggingFaceH4/ultrafeedback_binarized:train_prefs") == HubSource(
        "HuggingFaceH4/ultrafeedback_binarized", "train_prefs")
    assert parse_hub_id("org/name@v1.0:test") == HubSource("org/name", "test", "v1.0")
    assert parse_hub_id("data/train.jsonl") is None and parse_hub_id("org/name") is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name:train").write_text("{}\n", encoding="utf-8")
    assert parse_hub_id("org/name:train") is None  # a file with that name is read as a file


def test_prepare_reads_a_hub_split_and_records_where_it_came_from(hub_repo, tiny_model_dir):
    import datasets

    result = prepare("org/name:train_prefs", hub_repo / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    assert result.rows_in == len(QUESTIONS) and result.rows_out == len(QUESTIONS)
    rows = datasets.load_from_disk(str(hub_repo / "out")).to_list()
    assert [r["source_line"] for r in rows] == [1, 2, 3, 4, 5]
    assert {r["source_file"] for r in rows} == {"org/name:train_prefs"}
    assert rows[0]["prompt"] == [{"role": "user", "content": QUESTIONS[0]}]  # TRL's message format
    assert rows[0]["score_chosen"] == 8.0  # pass-through columns survive
    manifest = json.loads((hub_repo / "out" / "manifest.json").read_text(encoding="utf-8"))
    [entry] = manifest["inputs"]
    assert entry["hub_id"] == "org/name" and entry["split"] == "train_prefs" and entry["revision"] is None
    assert entry["local_path"] == str((hub_repo / "org" / "name").resolve())
    assert manifest["config"]["raw"] == "org/name:train_prefs"

    other = prepare("org/name:test_prefs", hub_repo / "test", tokenizer=tiny_model_dir, progress=False, workers=1)
    assert other.rows_in == 2


def test_workers_read_a_hub_split_the_same_way(hub_repo, tiny_model_dir, monkeypatch):
    """The Hub's record chunks go through the workers' two passes too (one chunk per shard here)."""
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_LINES", 2)
    monkeypatch.setattr("prefdata.pipeline.shards.SHARD_CHUNKS", 1)
    here = prepare("org/name:train_prefs", hub_repo / "here", tokenizer=tiny_model_dir, progress=False, workers=1)
    split = prepare("org/name:train_prefs", hub_repo / "split", tokenizer=tiny_model_dir, progress=False, workers=2)
    manifests = [json.loads((hub_repo / name / "manifest.json").read_text(encoding="utf-8")) for name in ("here", "split")]
    assert manifests[1]["content_hash"] == manifests[0]["content_hash"] and split.rows_out == here.rows_out
    assert len(manifests[1]["shards"]) == 3 and manifests[1]["inputs"] == manifests[0]["inputs"]


def test_a_missing_split_is_one_line(hub_repo, tiny_model_dir):
    with pytest.raises(PrefdataError, match="cannot read the Hub dataset org/name:nosuch") as error:
        prepare("org/name:nosuch", hub_repo / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    assert "\n" not in str(error.value)


def test_validate_reads_a_hub_split_too(hub_repo):
    from prefdata.validate.command import validate

    result = validate("org/name:train_prefs", format="json", progress=False, workers=2)
    assert result.exit_code == 0
    assert result.report["accounting"]["rows_in"] == len(QUESTIONS)


# --- issue 40, item 9: a path is never taken for a Hub id; no network fails fast, in one line ------


def test_a_path_that_looks_like_a_file_is_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_id("data/train.jsonl:train") is None  # a data file's name
    assert parse_hub_id("data/train.parquet@v1:test") is None
    (tmp_path / "data").mkdir()
    assert parse_hub_id("data/train:train") is None  # `data` is a local directory without `train` in it
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_hub_id("org/name:train") == HubSource("org/name", "train")  # a local repo laid out like the Hub's
    assert parse_hub_id("Qwen/Qwen2.5-data:train") == HubSource("Qwen/Qwen2.5-data", "train")  # dots in a repo name


def test_prepare_of_a_missing_file_with_a_split_suffix_says_not_found(tmp_path, tiny_tokenizer_dir, capsys, monkeypatch):
    from prefdata.cli import main
    from prefdata.io import hub

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(hub, "_open", lambda source: pytest.fail(f"{source} was taken for a Hub id"))
    code = main(["prepare", "data/train.jsonl:train", "out", "--tokenizer", tiny_tokenizer_dir, "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "data/train.jsonl:train" in err and "no such file" in err, err


def test_an_unreachable_hub_fails_at_once_in_one_line_without_retries(tmp_path, monkeypatch):
    """No network: one probe, then the local cache only (offline mode, no retries), then one line. It
    used to retry for 27 s, printing 11 lines."""
    import time

    import datasets.config
    import huggingface_hub
    import huggingface_hub.constants

    from prefdata.io.hub import iter_hub_records

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")

    def no_network(self, repo_id, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    seen = []
    loader = datasets.load_dataset

    def load_offline(*args, **kwargs):
        seen.append((datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE))
        return loader(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", no_network)
    monkeypatch.setattr(datasets, "load_dataset", load_offline)
    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    with pytest.raises(PrefdataError) as caught:
        next(iter_hub_records(HubSource("prefdata-tests/no-such-dataset", "train")))
    assert time.perf_counter() - started < 20
    assert seen == [(True, True)]  # the cache only: nothing to retry
    message = str(caught.value)
    assert "\n" not in message and "cannot be reached" in message and "not in the local cache" in message
    assert (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE) == (False, False)  # put back
