"""Pre-tokenized ids the tokenizer does not know are quarantined by prepare; refs and train refuse, in
one line naming the pair, ids past the model's embedding and pairs past its positions (a tampered OUT),
before any forward: no IndexError, no terabyte allocation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest

from prefdata import cli
from prefdata.core.errors import PrefdataError
from prefdata.prepare import prepare


def _raw(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _pair(prompt: list[int], chosen: list[int], rejected: list[int]) -> dict:
    return {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}


@pytest.fixture(scope="module")
def vocabulary(tiny_model_dir) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="module")
def good_out(tmp_path_factory, tiny_model_dir) -> Path:
    """A prepared pre-tokenized OUT of six valid pairs."""
    work = tmp_path_factory.mktemp("bounds")
    rows = [_pair([10 + i, 11, 12], [20, 21, 22 + i], [30, 31 + i]) for i in range(6)]
    prepare(_raw(work / "raw.jsonl", rows), work / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    return work / "out"


def _tampered(out: Path, target: Path, row: int, column: str, ids: list[int]) -> Path:
    """OUT with one row's id column replaced (as someone handing it over could)."""
    ds = datasets.load_from_disk(str(out))
    values = list(ds[column])
    values[row] = ids
    ds = ds.remove_columns([column]).add_column(column, values).cast_column(column, ds.features[column])
    ds.save_to_disk(str(target))
    for name in ("manifest.json", "dropped.jsonl", "quarantine.jsonl"):
        if (out / name).exists():
            shutil.copy(out / name, target / name)
    return target


def test_prepare_quarantines_ids_outside_the_tokenizers_vocabulary(tmp_path, tiny_model_dir, vocabulary):
    rows = [_pair([5, 6], [7, 8], [9]), _pair([5, 6], [7, vocabulary], [9]), _pair([5, 6], [7], [9, 10**9]),
            _pair([5, -1], [7], [9]), _pair([vocabulary + 5], [7], [9]), _pair([5, 6], [7, vocabulary - 1], [9])]
    prepare(_raw(tmp_path / "raw.jsonl", rows), tmp_path / "out", tokenizer=tiny_model_dir, progress=False, workers=1)
    quarantined = {q["source_line"]: q["error"]
                   for q in map(json.loads, (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines())}
    assert sorted(quarantined) == [2, 3, 4, 5]
    assert quarantined[2] == (f"field 'chosen_ids[1]' holds token id {vocabulary}, outside the tokenizer's vocabulary "
                              f"of {vocabulary} ids (0-{vocabulary - 1})")
    assert "1000000000" in quarantined[3] and "rejected_ids[1]" in quarantined[3]
    assert "prompt_ids[1]" in quarantined[4]  # negative: not a token id at all
    assert "prompt_ids[0]" in quarantined[5] and str(vocabulary + 5) in quarantined[5]
    kept = datasets.load_from_disk(str(tmp_path / "out"))
    assert kept["source_line"] == [1, 6]


def test_refs_and_train_refuse_an_id_past_the_models_embedding(good_out, tiny_model_dir, tmp_path, capsys):
    from transformers import AutoConfig

    rows = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    bad = _tampered(good_out, tmp_path / "bad", 3, "rejected_ids", [30, rows + 7])
    capsys.readouterr()
    code = cli.main(["refs", str(bad), "--model", tiny_model_dir, "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"raw.jsonl:4 holds token id {rows + 7} in rejected_ids" in err
    assert f"embedding of {rows} ids" in err
    with pytest.raises(PrefdataError, match=f"raw.jsonl:4 holds token id {rows + 7}"):
        from prefdata.train.recipe import train

        train(bad, model=tiny_model_dir, output=tmp_path / "run", loss="simpo", max_steps=1, progress=False,
              device="cpu")
    assert not (tmp_path / "run" / "model.safetensors").exists()
    from prefdata.select import select_pairs

    with pytest.raises(PrefdataError, match=f"raw.jsonl:4 holds token id {rows + 7}"):  # select's model pass too
        select_pairs(bad, tmp_path / "new", by="on_policy", policy_model=tiny_model_dir, device="cpu", progress=False)
    assert not (tmp_path / "new").exists()


def test_a_million_token_pair_is_refused_before_any_forward(good_out, tiny_model_dir, tmp_path, capsys):
    from transformers import AutoConfig

    limit = AutoConfig.from_pretrained(tiny_model_dir).max_position_embeddings
    huge = _tampered(good_out, tmp_path / "huge", 2, "chosen_ids", [21] * 10**6)
    capsys.readouterr()
    code = cli.main(["refs", str(huge), "--model", tiny_model_dir, "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"raw.jsonl:3 is 1,000,003 tokens long (prompt + completion), beyond the {limit:,}" in err
    assert not (huge / ".refs-work").exists() or not any((huge / ".refs-work").rglob("*.npz"))
    with pytest.raises(PrefdataError, match="raw.jsonl:3 is 1,000,003 tokens long"):
        from prefdata.train.recipe import train

        train(huge, model=tiny_model_dir, output=tmp_path / "run", loss="simpo", max_steps=1, progress=False,
              device="cpu")


def test_a_model_without_a_position_limit_gets_prefdatas(tmp_path):
    from types import SimpleNamespace

    import pyarrow as pa

    from prefdata.model.bounds import DEFAULT_MAX_LENGTH, check_pairs_fit_model

    model = SimpleNamespace(config=SimpleNamespace())
    ids = {"prompt_ids": pa.array([[1], [1]]), "chosen_ids": pa.array([[2], [2] * DEFAULT_MAX_LENGTH]),
           "rejected_ids": pa.array([[3], [3]])}
    with pytest.raises(PrefdataError, match=r"the pair at row 1 is 131,073 tokens long .*prefdata's limit"):
        check_pairs_fit_model(model, ids, lambda row: f"row {row}")
    ids["chosen_ids"] = pa.array([[2], [2] * (DEFAULT_MAX_LENGTH - 1)])
    check_pairs_fit_model(model, ids, lambda row: f"row {row}")


def test_rope_scaling_stretches_the_position_limit():
    from types import SimpleNamespace

    from prefdata.model.bounds import position_limit

    def model(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    assert position_limit(model(max_position_embeddings=4096)) == 4096
    # Qwen2.5's YaRN: max_position_embeddings stays at the original 32k, the factor stretches it 4x
    assert position_limit(model(max_position_embeddings=32768, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})) == 131072
    # Llama 3.1 states the stretched length itself
    assert position_limit(model(max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192})) == 131072
    assert position_limit(model(text_config=SimpleNamespace(max_position_embeddings=8192))) == 8192
    assert position_limit(model()) is None


def test_an_id_past_the_embedding_is_found_in_any_chunk_at_its_dataset_row():
    """OUT's columns are memory-mapped in chunks: the check reads them chunk by chunk and names the row
    counted over the whole dataset."""
    from types import SimpleNamespace

    import pyarrow as pa

    from prefdata.model.bounds import check_pairs_fit_model

    embedding = SimpleNamespace(num_embeddings=100)
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64), get_input_embeddings=lambda: embedding)
    ok = pa.chunked_array([pa.array([[1, 2], [3]]), pa.array([[4], [5, 6]])])
    bad = pa.chunked_array([pa.array([[1, 2], [3]]), pa.array([[4], [5, 100]])])
    check_pairs_fit_model(model, {"prompt_ids": ok, "chosen_ids": ok, "rejected_ids": ok}, str)
    with pytest.raises(PrefdataError, match="the pair at 3 holds token id 100 in chosen_ids, outside the model's "
                                            "embedding of 100 ids"):
        check_pairs_fit_model(model, {"prompt_ids": ok, "chosen_ids": bad, "rejected_ids": ok}, str)
