"""`benchmark_overlap` (--decontaminate-against): normalization as lm-eval-harness's Janitor, run
hashes against a brute-force set of word n-grams, item text found in common fields, and prepare /
validate end to end (report, dropped.jsonl, policies, both write paths)."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.core.records import Pair
from prefdata.sets.decontaminate import (
    MIN_SHORT_WORDS,
    build_benchmarks,
    normalize_words,
    run_hashes,
    text_run_hashes,
)

GSM = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
       "How many clips did Natalia sell altogether in April and May?")


def _janitor_words(text: str) -> list[str]:
    """lm-eval-harness's Janitor.normalize_string (ASCII lowercase, string.punctuation deleted), split."""
    table = str.maketrans(string.ascii_lowercase + string.ascii_uppercase, string.ascii_lowercase * 2, string.punctuation)
    return text.translate(table).split()


def _ngrams(words: list[str], n: int) -> set[str]:
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _pair(prompt: str, chosen: str = "yes", rejected: str = "no") -> Pair:
    return Pair("train.jsonl", 1, prompt, chosen, rejected)


# ------------------------------------------------------------------ normalization and hashing


@given(st.text(alphabet=string.printable, max_size=200))
def test_ascii_words_are_the_lm_eval_janitors(text: str) -> None:
    assert normalize_words(text) == _janitor_words(text)


def test_unicode_is_lowercased_and_its_punctuation_deleted() -> None:
    assert normalize_words("L’ÉTÉ — «Don’t» stop…") == normalize_words("l'été don't stop") == ["lété", "dont", "stop"]


@given(st.lists(st.integers(0, 2**64 - 1), max_size=40), st.integers(1, 15))
def test_run_hash_is_the_polynomial_of_its_word_hashes(words: list[int], k: int) -> None:
    """Independent: Σ w[j]·M**(k-1-j) mod 2**64 over each window, in Python integers."""
    mult = 0x9E3779B97F4A7C15
    expected = [sum(w * pow(mult, k - 1 - j, 1 << 64) for j, w in enumerate(words[i : i + k])) % (1 << 64)
                for i in range(len(words) - k + 1)]
    got = run_hashes(np.array(words, dtype=np.uint64), [k])
    assert (got[0][1].tolist() if got else []) == expected


def test_a_run_hashes_the_same_wherever_it_sits() -> None:
    run = " ".join(f"w{i}" for i in range(13))
    assert text_run_hashes(run, 13).tolist() == text_run_hashes("a b c " + run + " d", 13)[3:4].tolist()


# ------------------------------------------------------------------ matching


WORDS = st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=30)


@settings(max_examples=150, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=4), WORDS, st.integers(3, 6))
def test_flagged_exactly_when_a_brute_force_ngram_set_shares_a_run(tmp_path_factory, items, prompt, n) -> None:
    """Items of >= n words (short ones are matched whole only from MIN_SHORT_WORDS on, above n here)."""
    path = tmp_path_factory.mktemp("bench") / "b.jsonl"
    rows = [{"question": " ".join(words)} for words in items]
    if not any(words for words in items):
        rows.append({"question": "x " * 20})
    index, _ = build_benchmarks([_write_jsonl(path, rows)], ngram=n)
    bench: set[str] = set()
    for words in items:
        bench |= _ngrams(words, n)
    match = index.match(_pair(" ".join(prompt)))
    assert (match is not None) == bool(_ngrams(prompt, n) & bench)
    if match is not None:
        assert match.overlap in bench and match.overlap in " ".join(prompt)
        first = next(i for i, words in enumerate(items) if match.overlap in _ngrams(words, n))
        assert match.item_line == first + 1  # the first item that has the run


def test_prompt_overlap_is_flagged_with_the_item_and_the_words(tmp_path) -> None:
    bench = _write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "What is 2 + 2?"}, {"question": GSM, "answer": "72"}])
    index, catalog = build_benchmarks([bench])
    match = index.match(_pair("Solve this: natalia sold CLIPS to 48 of her friends in april, and then she sold half!"))
    assert match is not None
    assert (match.benchmark, match.item_file, match.item_line, match.half) == (bench, bench, 2, "prompt")
    assert match.overlap == "natalia sold clips to 48 of her friends in april and then she"
    assert catalog.excerpt(match.item).startswith("Natalia sold clips")
    # twelve words of the run are not enough
    assert index.match(_pair("natalia sold clips to 48 of her friends in april and then")) is None


def test_completions_only_when_asked(tmp_path) -> None:
    bench = _write_jsonl(tmp_path / "b.jsonl", [{"question": GSM}])
    pair = _pair("Hi", chosen=GSM + " The answer is 72.")
    assert build_benchmarks([bench])[0].match(pair) is None
    match = build_benchmarks([bench], completions=True)[0].match(pair)
    assert match is not None and match.half == "chosen"


def test_short_items_match_whole_from_eight_words(tmp_path) -> None:
    eight = "name the largest planet in our solar system"  # 8 words
    seven = "what is the capital city of france"
    bench = _write_jsonl(tmp_path / "b.jsonl", [{"question": eight}, {"question": seven}])
    index, catalog = build_benchmarks([bench])
    assert len(eight.split()) == MIN_SHORT_WORDS
    assert index.match(_pair(f"Quiz: {eight.upper()}? Thanks")) is not None
    assert index.match(_pair("name the largest planet in our solar")) is None  # part of it is not enough
    assert index.match(_pair(f"Quiz: {seven}?")) is None  # too short to index
    assert catalog.benchmarks[0]["items_short"] == 1 and catalog.benchmarks[0]["items_indexed"] == 1


# ------------------------------------------------------------------ reading benchmarks


@pytest.mark.parametrize("field", ["prompt", "question", "problem", "instruction", "input", "text"])
def test_common_fields_are_found_without_being_named(tmp_path, field) -> None:
    bench = _write_jsonl(tmp_path / "b.jsonl", [{"id": 1, field: GSM}])
    assert build_benchmarks([bench])[0].match(_pair(GSM)) is not None


def test_other_fields_need_decontaminate_field(tmp_path) -> None:
    bench = _write_jsonl(tmp_path / "b.jsonl", [{"Question": GSM}])  # GPQA spells it with a capital
    with pytest.raises(PrefdataError, match="--decontaminate-field"):
        build_benchmarks([bench])
    assert build_benchmarks([bench], fields=["Question"])[0].match(_pair(GSM)) is not None


def test_message_lists_parquet_json_arrays_and_preference_rows(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["filler " * 3, GSM]}), tmp_path / "math.parquet")
    (tmp_path / "arr.json").write_text(json.dumps([{"prompt": [{"role": "user", "content": GSM}]}]), encoding="utf-8")
    hh = _write_jsonl(tmp_path / "hh.jsonl", [{"chosen": f"\n\nHuman: {GSM}\n\nAssistant: 72", "rejected": f"\n\nHuman: {GSM}\n\nAssistant: 7"}])
    for path, line in ((tmp_path / "math.parquet", 2), (tmp_path / "arr.json", 1), (hh, 1)):
        match = build_benchmarks([str(path)])[0].match(_pair(GSM))
        assert match is not None and match.item_line == line, path


def test_missing_benchmark_is_one_line(tmp_path) -> None:
    with pytest.raises(PrefdataError, match="no such file"):
        build_benchmarks([str(tmp_path / "nope.jsonl")])


def test_index_takes_twelve_bytes_per_run(tmp_path) -> None:
    words = [f"w{i}" for i in range(2000)]
    bench = _write_jsonl(tmp_path / "b.jsonl", [{"text": " ".join(words)}])
    index, catalog = build_benchmarks([bench])
    assert catalog.runs == 2000 - 13 + 1 and index.nbytes == 12 * catalog.runs


# ------------------------------------------------------------------ prepare and validate


def _train(tmp_path) -> str:
    return _write_jsonl(tmp_path / "train.jsonl", [
        {"prompt": "Please solve: " + GSM, "chosen": "72", "rejected": "50"},
        {"prompt": "Tell me a joke about cats and dogs, please.", "chosen": "Why did the cat...", "rejected": "No."},
        {"prompt": "Hi there", "chosen": GSM, "rejected": "no"},
        {"prompt": "Write a haiku about autumn leaves falling.", "chosen": "Leaves drift...", "rejected": "ok"},
        {"prompt": "Summarize the plot of Hamlet in one line.", "chosen": "A prince avenges.", "rejected": "?"},
        {"prompt": "Name three primary colors for me.", "chosen": "Red, blue, yellow.", "rejected": "Green."},
    ])


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_drops_overlapping_pairs_and_names_the_item(tmp_path, tiny_tokenizer_dir, workers) -> None:
    import datasets

    from prefdata.prepare import prepare

    bench = _write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "What is 2 + 2?"}, {"question": GSM}])
    result = prepare(_train(tmp_path), tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=workers, progress=False,
                     decontaminate_against=[bench])
    assert result.exit_code == 0 and result.rows_dropped == 1 and result.flag_counts[F.BENCHMARK_OVERLAP] == 1
    dropped = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert [d["source_line"] for d in dropped] == [1]
    assert dropped[0]["benchmark_overlap"] == {"benchmark": bench, "item_file": bench, "item_line": 2, "half": "prompt",
                                               "overlap": "natalia sold clips to 48 of her friends in april and then she"}
    assert len(datasets.load_from_disk(str(tmp_path / "out"))) == 5
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    section = report["decontamination"]
    assert section["pairs_flagged"] == 1 and section["benchmarks"][0]["pairs_flagged"] == 1
    assert section["matches"][0]["source_line"] == 1 and section["matches"][0]["item_line"] == 2
    assert section["matches"][0]["item_excerpt"].startswith("Natalia sold clips")
    assert "### Decontamination" in (tmp_path / "out" / "report.md").read_text()
    assert "<h2>Decontamination</h2>" in (tmp_path / "out" / "report.html").read_text()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["decontaminate"]["ngram"] == 13 and manifest["config"]["decontaminate"]["against"] == [bench]


def test_worker_counts_and_batch_sizes_give_the_same_out(tmp_path, tiny_tokenizer_dir) -> None:
    from prefdata.prepare import prepare

    bench = _write_jsonl(tmp_path / "b.jsonl", [{"question": GSM}])
    runs = {}
    for name, kwargs in {"one": {"workers": 1}, "two": {"workers": 2}, "batch": {"workers": 1, "batch_size": 5}}.items():
        prepare(_train(tmp_path), tmp_path / name, tokenizer=tiny_tokenizer_dir, progress=False, **{"batch_size": 2, **kwargs},
                decontaminate_against=bench, decontaminate_completions=True)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        report = json.loads((tmp_path / name / "report.json").read_text())
        runs[name] = (manifest["content_hash"], manifest["flag_counts"], report["decontamination"],
                      (tmp_path / name / "dropped.jsonl").read_bytes())
    assert runs["one"] == runs["two"] == runs["batch"]
    assert runs["one"][1][F.BENCHMARK_OVERLAP] == 2


def test_pr_policy_makes_an_overlap_an_error(tmp_path) -> None:
    from prefdata.validate.command import validate

    bench = _write_jsonl(tmp_path / "b.jsonl", [{"question": GSM}])
    train = _train(tmp_path)
    assert validate(train, progress=False, workers=1).report["flags"] == {}
    result = validate(train, policy="pr", progress=False, workers=2, decontaminate_against=bench)
    assert result.exit_code == 1 and result.report["flags"][F.BENCHMARK_OVERLAP]["severity"] == "error"
    match = result.report["decontamination"]["matches"][0]
    assert (match["source_line"], match["item_line"]) == (1, 1)  # the bulk text path re-matches its detail rows


def test_validate_paths_agree_and_a_prepared_out_is_checked(tmp_path, tiny_tokenizer_dir) -> None:
    from prefdata.prepare import prepare
    from prefdata.validate.command import validate

    bench = _write_jsonl(tmp_path / "b.jsonl", [{"question": GSM}])
    train = _train(tmp_path)
    kwargs = {"progress": False, "decontaminate_against": bench, "decontaminate_completions": True}
    sections = [validate(train, workers=w, **kwargs).report["decontamination"] for w in (1, 2)]
    sections.append(validate(train, workers=1, tokenizer=tiny_tokenizer_dir, **kwargs).report["decontamination"])
    assert sections[0] == sections[1] == sections[2] and sections[0]["pairs_flagged"] == 2
    prepare(train, tmp_path / "out", tokenizer=tiny_tokenizer_dir, workers=1, progress=False)  # not decontaminated
    again = validate(tmp_path / "out", **kwargs).report
    assert again["flags"][F.BENCHMARK_OVERLAP]["count"] == 2
    assert [m["source_line"] for m in again["decontamination"]["matches"]] == [1, 3]


def test_cli_flags_and_config_file(tmp_path, tiny_tokenizer_dir, capsys) -> None:
    from prefdata.cli import main

    bench = _write_jsonl(tmp_path / "b.jsonl", [{"question": GSM}])
    train = _train(tmp_path)
    code = main(["validate", train, "--decontaminate-against", bench, "--format", "json", "--no-progress"])
    assert code == 0  # the default policy drops it: 1 of 6 pairs, within max_dropped_share
    out = json.loads(capsys.readouterr().out)
    assert out["flags"][F.BENCHMARK_OVERLAP]["count"] == 1
    config = tmp_path / "prefdata.toml"
    config.write_text(f'decontaminate_against = ["{bench}"]\ndecontaminate_completions = true\n'
                      f'[prepare]\ntokenizer = "{tiny_tokenizer_dir}"\n', encoding="utf-8")
    assert main(["prepare", train, str(tmp_path / "out"), "--config", str(config), "--no-progress", "--workers", "1"]) == 1  # 2 of 6 dropped
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["flag_counts"][F.BENCHMARK_OVERLAP] == 2
    assert main(["validate", train, "--decontaminate-ngram", "5"]) == 2  # needs --decontaminate-against
    assert "need --decontaminate-against" in capsys.readouterr().err
