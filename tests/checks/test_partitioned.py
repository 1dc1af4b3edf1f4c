"""Partitioned dataset-wide checks give exactly the local tables' answers, whatever the partitioning."""

from __future__ import annotations

import random

import numpy as np
import pytest

from prefdata.checks.dataset import DatasetWideChecks
from prefdata.checks.minhash import NearDuplicatePrompts
from prefdata.checks.partitioned import digest_block, groups_from_edges, partitioned_dataset_checks
from prefdata.core.records import Pair

WORDS = "the a plant light water sun leaf root grow green food energy cell make how why does what".split()


def make_pairs(n: int, seed: int) -> list[Pair]:
    """Pairs with exact and whitespace duplicates, swapped halves, equal halves and near-duplicate prompts."""
    rng = random.Random(seed)
    bases = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(n // 6 + 1)]
    pairs: list[Pair] = []
    for i in range(n):
        roll = rng.random()
        if pairs and roll < 0.15:
            old = rng.choice(pairs)
            prompt, chosen, rejected = old.prompt, old.chosen, old.rejected
            if rng.random() < 0.5:
                chosen, rejected = rejected, chosen  # conflict
            elif rng.random() < 0.5:
                prompt = "  " + prompt.replace(" ", "\n")  # duplicate after whitespace removal
        else:
            prompt = rng.choice(bases)
            if rng.random() < 0.3:  # a near-duplicate: one word changed or the case changed
                words = prompt.split()
                words[rng.randrange(len(words))] = rng.choice(WORDS)
                prompt = " ".join(words).upper() if rng.random() < 0.3 else " ".join(words)
            chosen, rejected = f"answer {rng.randint(0, 30)}", f"answer {rng.randint(0, 30)}"
        if rng.random() < 0.02:
            prompt = "!!"  # no words: never in a near-duplicate group
        pairs.append(Pair("data.jsonl", i + 1, prompt, chosen, rejected))
    return pairs


def local_answers(pairs: list[Pair]) -> tuple[list[int], list[int], DatasetWideChecks, NearDuplicatePrompts]:
    checks = DatasetWideChecks()
    duplicate, conflicting = [], []
    for row, pair in enumerate(pairs):
        found = checks.observe(pair)
        if "duplicate_pair" in found:
            duplicate.append(row)
        if "conflicting_pair" in found:
            conflicting.append(row)
    near = NearDuplicatePrompts(0.8, background=False)
    for start in range(0, len(pairs), 97):
        near.add_batch(list(range(start, min(start + 97, len(pairs)))), [p.prompt for p in pairs[start : start + 97]])
    return duplicate, conflicting, checks, near


@pytest.mark.parametrize(("partitions", "block_rows"), [(1, 5000), (3, 64), (16, 17)])
def test_partitioned_checks_equal_the_local_tables(partitions: int, block_rows: int) -> None:
    pairs = make_pairs(1500, seed=partitions)
    duplicate, conflicting, checks, near = local_answers(pairs)
    blocks = [digest_block(range(s, min(s + block_rows, len(pairs))), pairs[s : s + block_rows])
              for s in range(0, len(pairs), block_rows)]
    result = partitioned_dataset_checks(blocks, partitions)
    assert result.duplicate_rows.tolist() == duplicate and len(duplicate) > 50
    assert result.conflicting_rows.tolist() == conflicting and len(conflicting) > 20
    assert result.rows == checks.rows
    assert result.duplicate_prompt_rows == checks.duplicate_prompt_rows
    assert result.distinct_prompts == checks.distinct_prompts
    groups = near.clusters()
    assert result.near_duplicate_groups == groups and len(groups) > 5
    assert (result.prompts_seen, result.distinct_prompt_texts) == (near.prompts_seen, near.distinct_prompts)


def test_groups_join_chains_and_sort() -> None:
    edges = np.array([[9, 4], [4, 7], [2, 3]], dtype=np.int64)
    assert groups_from_edges(edges) == [[2, 3], [4, 7, 9]]
    assert groups_from_edges(np.zeros((0, 2), dtype=np.int64)) == []


def test_prepare_with_partitioned_checks_writes_the_same_out(tmp_path, tiny_tokenizer_dir) -> None:
    import json

    from prefdata.prepare import prepare

    raw = tmp_path / "pairs.jsonl"
    pairs = make_pairs(300, seed=3)
    raw.write_text("".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n"
                           for p in pairs) + "{broken\n", encoding="utf-8")
    plain = prepare(raw, tmp_path / "plain", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)
    split = prepare(raw, tmp_path / "split", tokenizer=tiny_tokenizer_dir, workers=1, progress=False,
                    partitioned_checks=True)
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("plain", "split")]
    assert manifests[0]["content_hash"] == manifests[1]["content_hash"]
    assert manifests[0]["flag_counts"] == manifests[1]["flag_counts"]
    assert manifests[0]["flag_counts"]["duplicate_pair"] > 10 and manifests[0]["flag_counts"]["conflicting_pair"] > 5
    for report in (plain.report, split.report):
        report.pop("generated_at", None)
    assert plain.report == split.report
    assert plain.report["dataset"]["near_duplicate_prompts"]["clusters"] > 5
