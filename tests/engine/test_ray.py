"""The Ray engine on a two-node cluster (CPU only, started here): same output as the local engine.

prepare, validate and refs with `--engine ray` against the local engine on the same input; the
scale-out dataset-wide checks against the local tables; a killed refs worker is retried."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from prefdata.core.errors import PrefdataError

ray = pytest.importorskip("ray", reason='Ray is not installed (pip install "prefdata[ray]")')
pytest.importorskip("ray.data", reason='Ray Data is not installed (pip install "prefdata[ray]")')


@pytest.fixture(scope="module")
def cluster():
    """Two nodes with one CPU each; the driver connects to the head."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    # Workers import this worktree's prefdata, as the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")] if p)
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, logging_level="ERROR", log_to_driver=False)
    # This module's stage classes travel by value: workers cannot import a test module by name.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield nodes
    ray.shutdown()
    nodes.shutdown()


def _rows() -> list[str]:
    """Pairs with every dataset-wide case (duplicates, swaps, near-duplicate prompts), drops and bad lines."""
    lines = []
    for i in range(40):
        lines.append(json.dumps({"prompt": f"Question {i % 13}: how do plants make food from light?",
                                 "chosen": f"By photosynthesis, step {i}.", "rejected": f"They eat soil {i}.", "id": i}))
    lines.append(lines[3])  # exact duplicate
    swapped = json.loads(lines[5])
    swapped["chosen"], swapped["rejected"] = swapped["rejected"], swapped["chosen"]
    lines.append(json.dumps(swapped))  # conflicting
    lines.append(json.dumps({"prompt": "p", "chosen": "same", "rejected": "same"}))  # identical: dropped
    lines.append("{not json")  # quarantined
    lines.append(json.dumps({"prompt": "QUESTION 1: How do plants make food from light??", "chosen": "a", "rejected": "b"}))
    return lines


@pytest.fixture
def small_chunks(monkeypatch) -> None:
    """Chunks of ~1 KiB, so the small input spreads over many units and both nodes."""
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 1024)
    monkeypatch.setattr("prefdata.io.chunks.CHUNK_BYTES", 1024)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray-raw") / "pairs.jsonl"
    path.write_text("\n".join(_rows()) + "\n", encoding="utf-8")
    return path


def _without_run_details(report: dict) -> dict:
    report = json.loads(json.dumps(report))
    for key in ("generated_at", "seconds"):
        report.pop(key, None)
    return report


class _Square:
    """A stage that records which process set it up."""

    def setup(self) -> None:
        self.pid = os.getpid()

    def run(self, unit: int) -> tuple[int, int]:
        if unit < 0:
            raise PrefdataError(f"unit {unit} is negative")
        return unit * unit, self.pid


def test_map_ordered_keeps_input_order_across_nodes(cluster) -> None:
    from prefdata.engine.ray import RayEngine

    engine = RayEngine(window=40)
    results = []
    with pytest.raises(PrefdataError, match="^unit -1 is negative$"):  # the stage's own one line
        for item in engine.map_ordered(_Square(), [*range(59), -1]):  # two windows, the error last
            results.append(item)
    assert [unit for unit, _ in results] == list(range(59))  # every result before the error, in order
    assert [value for _, (value, _) in results] == [u * u for u in range(59)]
    assert len({pid for _, (_, pid) in results}) >= 2  # actors on both nodes worked


def test_windows_read_units_lazily_and_keep_a_units_error_for_last() -> None:
    from prefdata.engine.ray import _take_windows

    def units():
        yield from range(5)
        raise PrefdataError("input broke after 5 units")

    windows = list(_take_windows(units(), 2))
    assert [w for w, _ in windows] == [[0, 1], [2, 3], [4]]
    assert [e is None for _, e in windows] == [True, True, False]
    assert str(windows[-1][1]) == "input broke after 5 units"
    assert [w for w, _ in _take_windows(range(4), 2)] == [[0, 1], [2, 3]]


def test_prepare_on_ray_writes_what_the_local_engine_writes(cluster, raw, tmp_path, tiny_tokenizer_dir, small_chunks) -> None:
    from prefdata.prepare import prepare

    local = prepare(raw, tmp_path / "local", tokenizer=tiny_tokenizer_dir, workers=1, progress=False, batch_size=8)
    on_ray = prepare(raw, tmp_path / "ray", tokenizer=tiny_tokenizer_dir, engine="ray", progress=False, batch_size=8)
    names = ("local", "ray")
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in names]
    assert manifests[0]["row_accounting"]["rows_quarantined"] == 1
    assert manifests[0]["flag_counts"]["duplicate_pair"] >= 1 and manifests[0]["flag_counts"]["conflicting_pair"] == 1
    assert manifests[1]["config"]["engine"] == "ray"
    for manifest, result, name in zip(manifests[1:], (on_ray,), names[1:]):
        assert manifest["content_hash"] == manifests[0]["content_hash"]
        assert manifest["row_accounting"] == manifests[0]["row_accounting"]
        assert manifest["flag_counts"] == manifests[0]["flag_counts"]
        for file in ("dropped.jsonl", "quarantine.jsonl"):
            assert (tmp_path / "local" / file).read_bytes() == (tmp_path / name / file).read_bytes()
        assert _without_run_details(local.report) == _without_run_details(result.report)


def test_prepare_on_ray_workers_write_the_shards_and_the_driver_writes_no_row(
    cluster, tmp_path, tiny_tokenizer_dir, small_chunks, monkeypatch
) -> None:
    """The workers on both nodes write the Arrow shards; the driver only joins digests, dropped
    and quarantine lines and the report. OUT equals the local engine's, and the manifest lists
    the shards that load_from_disk and polars read."""
    import datasets
    import polars as pl

    from prefdata.io import writer as W
    from prefdata.prepare import prepare
    from prefdata.pipeline import shards as S

    raw = tmp_path / "pairs.jsonl"
    raw.write_text("\n".join(_rows() * 3) + "\n", encoding="utf-8")  # repeats: many duplicates
    local = prepare(raw, tmp_path / "local", tokenizer=tiny_tokenizer_dir, workers=1, progress=False, batch_size=8)
    monkeypatch.setattr(S, "SHARD_BYTES", 2048)
    writers: set[int] = set()
    joined = S._add_to_report

    def spy(report, shard):  # which processes wrote the shards
        writers.add(shard.writer_pid)
        return joined(report, shard)

    def refuse(*_args, **_kwargs):
        raise AssertionError("the driver wrote dataset rows")

    monkeypatch.setattr(S, "_add_to_report", spy)
    monkeypatch.setattr(W.DatasetWriter, "write_rows", refuse)  # the driver's copy only: Ray workers import their own
    on_ray = prepare(raw, tmp_path / "ray", tokenizer=tiny_tokenizer_dir, engine="ray", progress=False, batch_size=8)
    assert os.getpid() not in writers and len(writers) >= 2  # actors on both nodes wrote shards
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("local", "ray")]
    assert manifests[1]["config"]["worker_writes"] is True
    for key in ("content_hash", "row_accounting", "flag_counts", "columns"):
        assert manifests[1][key] == manifests[0][key]
    for file in ("dropped.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "local" / file).read_bytes() == (tmp_path / "ray" / file).read_bytes()
    assert _without_run_details(local.report) == _without_run_details(on_ray.report)
    shards = manifests[1]["shards"]
    assert len(shards) >= 3 and sum(s["rows"] for s in shards) == on_ray.rows_out
    state = json.loads((tmp_path / "ray" / "state.json").read_text())
    assert [s["file"] for s in shards] == [f["filename"] for f in state["_data_files"]]
    loaded = datasets.load_from_disk(str(tmp_path / "ray"))
    assert loaded.to_list() == datasets.load_from_disk(str(tmp_path / "local")).to_list()
    frame = pl.concat([pl.read_ipc_stream(tmp_path / "ray" / s["file"]) for s in shards])
    assert frame.height == on_ray.rows_out and frame["source_line"].to_list() == loaded["source_line"]


def test_decontamination_on_ray_flags_what_the_local_engine_flags(cluster, raw, tmp_path, tiny_tokenizer_dir, small_chunks) -> None:
    """--decontaminate-against: the benchmark's run table travels to the actors; the same pairs are
    dropped (dropped.jsonl names the same benchmark item) and OUT has the same content hash."""
    from prefdata.prepare import prepare
    from prefdata.validate.command import validate

    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question": "Question 7: how do plants make food from light? Explain it to a child."}) + "\n"
                     + json.dumps({"question": "By photosynthesis, step 12."}) + "\n", encoding="utf-8")
    kwargs = {"progress": False, "batch_size": 8, "decontaminate_against": [str(bench)], "decontaminate_ngram": 8,
              "decontaminate_completions": True}
    local = prepare(raw, tmp_path / "local", tokenizer=tiny_tokenizer_dir, workers=1, **kwargs)
    on_ray = prepare(raw, tmp_path / "ray", tokenizer=tiny_tokenizer_dir, engine="ray", **kwargs)
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("local", "ray")]
    assert manifests[0]["flag_counts"]["benchmark_overlap"] >= 3
    for key in ("content_hash", "row_accounting", "flag_counts"):
        assert manifests[1][key] == manifests[0][key]
    assert (tmp_path / "local" / "dropped.jsonl").read_bytes() == (tmp_path / "ray" / "dropped.jsonl").read_bytes()
    assert _without_run_details(local.report) == _without_run_details(on_ray.report)
    assert local.report["decontamination"]["pairs_flagged"] == manifests[0]["flag_counts"]["benchmark_overlap"]
    reports = [validate(raw, engine=engine, progress=False, **{k: v for k, v in kwargs.items() if k != "progress"}).report
               for engine in ("local", "ray")]
    assert reports[0]["decontamination"] == reports[1]["decontamination"] == local.report["decontamination"] | {
        "matches": reports[0]["decontamination"]["matches"]}


def test_validate_on_ray_reports_what_the_local_engine_reports(cluster, raw, small_chunks) -> None:
    from prefdata.validate.command import validate

    local = validate(raw, format="json", progress=False, workers=2)
    # Dataset-wide checks by partitioning: digests to the object store, the shuffle on the cluster.
    on_ray = validate(raw, format="json", progress=False, engine="ray")
    assert on_ray.exit_code == local.exit_code
    assert _without_run_details(on_ray.report) == _without_run_details(local.report)
    assert local.report["dataset"]["duplicate_pairs"]["groups"] >= 1


def _scored_rows() -> list[str]:
    """Records of scored completions of every kind: pairs, ties, one completion, a rank list, a bad row."""
    lines = []
    for i in range(30):
        lines.append(json.dumps({"prompt": f"Question {i % 11}: which is best?", "completions": [f"c{i}-{k}" for k in range(4)],
                                 "scores": [float((i + k) % 4) for k in range(4)], "id": i}))
    lines.append(json.dumps({"prompt": "tie", "completions": ["a", "b"], "scores": [1, 1]}))
    lines.append(json.dumps({"prompt": "one", "completions": ["a"], "scores": [1]}))
    lines.append(json.dumps({"instruction": "rank", "generations": ["x", "y", "z"], "ranks": [2, 1, 3]}))
    lines.append(json.dumps({"prompt": "bad", "completions": ["a", "b"], "scores": [1]}))
    return lines


@pytest.mark.parametrize("pairing", ["best-vs-random-lower", "all-pairs"])
def test_scored_completions_on_ray_pair_as_the_local_engine_does(cluster, tmp_path, tiny_tokenizer_dir, small_chunks, pairing) -> None:
    """Records of scored completions become the same pairs on Ray (worker writes) as locally: same
    content hash, ledgers, dropped lines (with the unpaired reasons) and report."""
    from prefdata.prepare import prepare
    from prefdata.validate.command import validate

    raw = tmp_path / "scored.jsonl"
    raw.write_text("\n".join(_scored_rows()) + "\n", encoding="utf-8")
    settings = dict(tokenizer=tiny_tokenizer_dir, progress=False, batch_size=8, pairing=pairing, pairing_seed=3)
    local = prepare(raw, tmp_path / "local", workers=1, **settings)
    on_ray = prepare(raw, tmp_path / "ray", engine="ray", **settings)
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("local", "ray")]
    accounting = manifests[0]["row_accounting"]
    assert accounting["records_in"] == 34 and accounting["records_unpaired"] == 2 and accounting["records_quarantined"] == 1
    assert accounting["pairs_made"] > 31 if pairing == "all-pairs" else accounting["pairs_made"] == 31
    for key in ("content_hash", "row_accounting", "flag_counts", "columns"):
        assert manifests[1][key] == manifests[0][key], key
    for file in ("dropped.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "local" / file).read_bytes() == (tmp_path / "ray" / file).read_bytes()
    assert _without_run_details(local.report) == _without_run_details(on_ray.report)
    checked = [validate(raw, format="json", progress=False, pairing=pairing, pairing_seed=3, **kw).report
               for kw in ({"workers": 2}, {"engine": "ray"})]
    assert _without_run_details(checked[0]) == _without_run_details(checked[1])
    assert checked[0]["accounting"]["pairs_made"] == accounting["pairs_made"]


def test_unknown_engine_is_one_line(raw, tmp_path, tiny_tokenizer_dir) -> None:
    from prefdata.prepare import prepare

    with pytest.raises(PrefdataError, match="--engine must be one of local, ray"):
        prepare(raw, tmp_path / "x", tokenizer=tiny_tokenizer_dir, engine="spark", progress=False)


def test_refs_on_ray_equal_local_refs_and_survive_a_killed_worker(cluster, raw, tmp_path, tiny_model_dir, monkeypatch) -> None:
    import datasets

    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs
    from prefdata.refs.ray import KILL_ONCE_ENV, compute_refs_on_ray

    prepare(raw, tmp_path / "a", tokenizer=tiny_model_dir, workers=1, progress=False)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    compute_refs(tmp_path / "a", tiny_model_dir, device="cpu", batch_tokens=256, shard_batches=1, progress=False)
    marker = tmp_path / "killed-once"
    monkeypatch.setenv(KILL_ONCE_ENV, str(marker))
    result = compute_refs_on_ray(tmp_path / "b", tiny_model_dir, device="cpu", batch_tokens=256, shard_batches=1)
    assert marker.exists()  # the rank-1 worker did die once, and its shards were still computed
    assert result.shards_total > 2 and result.rows == 43
    local, on_ray = (datasets.load_from_disk(str(tmp_path / name)) for name in ("a", "b"))
    for column in ("ref_chosen_logps", "ref_rejected_logps"):
        np.testing.assert_allclose(np.asarray(local[column]), np.asarray(on_ray[column]), rtol=1e-5, atol=1e-5)
    for column in ("chosen_token_count", "rejected_token_count"):
        assert local[column] == on_ray[column]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["refs"]["rows"] == 43 and manifest["refs"]["settings"]["world_size"] == 2


@pytest.mark.parametrize("command", ["prepare", "validate", "refs"])
def test_engine_is_a_config_key_for_every_scaling_command(command, tmp_path, raw, tiny_tokenizer_dir, monkeypatch, capsys) -> None:
    from prefdata.cli import main

    (tmp_path / "pyproject.toml").write_text(
        f'[tool.prefdata]\nengine = "spark"\ntokenizer = "{tiny_tokenizer_dir}"\nmodel = "{tiny_tokenizer_dir}"\n'
    )
    monkeypatch.chdir(tmp_path)
    args = {"prepare": [str(raw), str(tmp_path / "out")], "validate": [str(raw)], "refs": [str(tmp_path)]}[command]
    assert main([command, *args, "--no-progress"]) == 2
    assert "pyproject.toml [tool.prefdata] engine: expected one of local, ray, got the string 'spark'" in capsys.readouterr().err
    assert main(["show", str(tmp_path)]) == 2  # other commands ignore the key
    err = capsys.readouterr().err
    assert "unknown setting" not in err and "--engine" not in err


def _partitioned_test_module():
    """tests/checks/test_partitioned.py: its pair generator and local answers (one source of truth)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "checks" / "test_partitioned.py"
    spec = importlib.util.spec_from_file_location("partitioned_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dataset_wide_checks_scale_out_on_ray_with_the_local_answers(cluster) -> None:
    from prefdata.checks.digests import digest_block
    from prefdata.checks.partitioned import partitioned_dataset_checks
    from prefdata.engine.ray import RayEngine

    cases = _partitioned_test_module()
    pairs = cases.make_pairs(1200, seed=7)
    expected = cases.reference(list(range(len(pairs))), pairs)
    # The digests are computed by tasks on the nodes; the driver only holds their references.
    digest = ray.remote(digest_block)
    blocks = [digest.remote(range(s, min(s + 150, len(pairs))), pairs[s : s + 150]) for s in range(0, len(pairs), 150)]
    result = partitioned_dataset_checks(blocks, 4, shuffler=RayEngine())
    cases.assert_matches(result, expected)
    assert expected["duplicate"] and expected["conflicting"] and expected["groups"]


def test_without_ray_the_engine_says_what_to_install(monkeypatch) -> None:
    from prefdata.engine import ray as ray_engine

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    with pytest.raises(PrefdataError, match=r'^the Ray engine needs Ray: pip install "prefdata\[ray\]"$'):
        ray_engine.import_ray()


def test_a_mix_with_balance_length_on_ray_writes_what_the_local_engine_writes(cluster, tmp_path, tiny_tokenizer_dir, small_chunks) -> None:
    """A mixture's samples and --balance-length's subsample are decided record by record from
    (seed, source, index) and (seed, row): the Ray actors take and remove the very pairs the local
    engine does, so OUT is the same (content hash, dropped lines, report)."""
    from prefdata.prepare import prepare
    from prefdata.validate.command import validate

    lines = _rows()
    (tmp_path / "a.jsonl").write_text("\n".join(lines * 2) + "\n", encoding="utf-8")
    (tmp_path / "b").mkdir()
    longer = [json.dumps({"prompt": f"Tell me about {i}.", "chosen": "A full answer " * (1 + i % 5), "rejected": f"No {i}."})
              for i in range(60)]
    (tmp_path / "b" / "more.jsonl").write_text("\n".join(longer) + "\n", encoding="utf-8")
    mix = tmp_path / "mix.toml"
    mix.write_text('seed = 11\n[[source]]\nname = "a"\npath = "a.jsonl"\nweight = 0.6\n'
                   '[[source]]\nname = "b"\npath = "b"\nweight = 0.4\n', encoding="utf-8")
    local = prepare(mix, tmp_path / "local", tokenizer=tiny_tokenizer_dir, workers=2, progress=False, batch_size=8,
                    balance_length=0.5)
    on_ray = prepare(mix, tmp_path / "ray", tokenizer=tiny_tokenizer_dir, engine="ray", progress=False, batch_size=8,
                     balance_length=0.5)
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("local", "ray")]
    for key in ("content_hash", "row_accounting", "flag_counts", "columns", "mix"):
        assert manifests[1][key] == manifests[0][key], key
    for file in ("dropped.jsonl", "quarantine.jsonl"):
        assert (tmp_path / "local" / file).read_bytes() == (tmp_path / "ray" / file).read_bytes()
    assert _without_run_details(local.report) == _without_run_details(on_ray.report)
    assert local.report["length_balance"]["dropped"] > 0 and [s["name"] for s in local.report["sources"]] == ["a", "b"]
    checked = [validate(mix, format="json", progress=False, **options) for options in ({"workers": 1}, {"engine": "ray"})]
    assert _without_run_details(checked[0].report) == _without_run_details(checked[1].report)
