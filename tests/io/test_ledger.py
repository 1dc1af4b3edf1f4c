"""io.ledger: rows, records, pairs and completions balance for any mix of records (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.checks.checker import pair_flags, verdict
from prefdata.checks.policy import load_policy
from prefdata.core.records import CheckedRow, RawRecord
from prefdata.io.ledger import Ledger
from prefdata.sets.pairing import STRATEGIES, PairingSettings
from prefdata.tokenize.batch import normalize_and_tokenize
from prefdata.tokenize.settings import TokenizeSettings

POLICY = load_policy(None)

scored_record = st.builds(
    lambda texts, scores: {"prompt": "p", "completions": texts, "scores": scores[: len(texts)] + [0.0] * (len(texts) - len(scores))},
    st.lists(st.sampled_from(["a", "b", "c", "same", "same"]), min_size=1, max_size=5),
    st.lists(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.0, 2.5])), max_size=5),
)
plain_pair = st.sampled_from([{"prompt": "q", "chosen": "x", "rejected": "y"}, {"prompt": "q", "chosen": "z", "rejected": "z"}])
broken = st.sampled_from([{"prompt": "q"}, {"prompt": "q", "completions": ["a", "b"], "scores": [1]}])


@settings(max_examples=150, deadline=None)
@given(records=st.lists(st.one_of(scored_record, plain_pair, broken), max_size=12),
       strategy=st.sampled_from(STRATEGIES), margin=st.sampled_from([0.0, 1.0]))
def test_ledgers_balance_for_any_mix_of_records(records, strategy, margin) -> None:
    raws = [RawRecord("f.jsonl", i + 1, value=r) for i, r in enumerate(records)]
    rows = normalize_and_tokenize(raws, None, TokenizeSettings(), PairingSettings(strategy, min_margin=margin))
    ledger = Ledger()
    for done in rows:
        raw = raws[done.record]
        if done.error is not None:
            row = CheckedRow(raw, None, None, [], None, "quarantined", error=done.error)
        elif done.pair is None:
            row = CheckedRow(raw, None, None, [], None, "unpaired", scored=done.scored)
        else:
            row = CheckedRow(raw, done.pair, None, *verdict(pair_flags(done.pair, None, POLICY, None), POLICY), scored=done.scored)
        ledger.add(row)
    acc = ledger.accounting()
    assert acc["records_in"] == len(records)  # counted from record starts, not derived
    assert acc["records_in"] == acc["records_paired"] + acc["records_unpaired"] + acc["records_quarantined"]
    assert acc["pairs_made"] == acc["pairs_kept"] + acc["pairs_dropped"] == sum(1 for d in rows if d.pair is not None)
    assert acc["rows_in"] == len(rows) == acc["rows_out"] + acc["rows_dropped"] + acc["rows_quarantined"]
    assert acc["completions_in"] == acc["completions_paired"] + acc["completions_unpaired"]
    assert acc["completions_in"] == sum(len(r["completions"]) for r in records
                                        if "completions" in r and len(r.get("scores", [])) == len(r["completions"]))
    # Every record's rows are consecutive and a record is quarantined, unpaired or paired: never two of them.
    kinds: dict[int, set[str]] = {}
    for done in rows:
        kinds.setdefault(done.record, set()).add("q" if done.error else "u" if done.pair is None else "p")
    assert sorted(kinds) == list(range(len(records))) and all(len(k) == 1 for k in kinds.values())
    assert [d.record for d in rows] == sorted(d.record for d in rows)


def test_a_ledger_that_does_not_balance_fails_loudly() -> None:
    ledger = Ledger(records_started=3, records_paired=1)  # one record missing from every ledger
    with pytest.raises(AssertionError):
        ledger.accounting()
