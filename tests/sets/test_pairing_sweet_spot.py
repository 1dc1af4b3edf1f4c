"""--pairing sweet-spot: the best against the completion scored nearest mean - 2 sd of the record's
scores (arXiv 2502.16825), checked against that rule computed here, and the rules every strategy keeps."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from prefdata.sets.pairing import PairingSettings, choose_pairs, tied

SWEET = PairingSettings(strategy="sweet-spot")


def test_many_samples_pick_the_rejected_near_mean_minus_two_sd_not_the_worst():
    # 64 samples spread like a normal distribution: the worst lies near -2.4 sd, below the sweet spot
    scores = [statistics.NormalDist().inv_cdf((i + 0.5) / 64) for i in range(64)][::-1]
    target = statistics.fmean(scores) - 2 * statistics.pstdev(scores)
    choice = choose_pairs(scores, SWEET, "record")
    (chosen, rejected), = choice.pairs
    assert chosen == 0
    nearest = min(range(len(scores)), key=lambda i: (abs(scores[i] - target), -scores[i]))
    assert rejected == nearest and scores[rejected] != min(scores)  # not best-worst here


def test_few_samples_are_best_worst():
    scores = [0.2, 0.9, 0.5]
    assert choose_pairs(scores, SWEET, "r").pairs == choose_pairs(scores, PairingSettings(), "r").pairs == [(1, 0)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-10, 10)), min_size=0, max_size=30), st.floats(0, 3))
def test_sweet_spot_keeps_the_rules_of_every_strategy(scores, margin):
    choice = choose_pairs(scores, PairingSettings(strategy="sweet-spot", min_margin=margin), "key")
    assert len(choice.pairs) <= 1
    for chosen, rejected in choice.pairs:
        assert tied(scores[chosen], max(s for s in scores if s is not None))  # one of the equally best
        assert scores[chosen] - scores[rejected] >= margin and scores[chosen] > scores[rejected]
    if not choice.pairs:
        assert choice.reason in ("single_completion", "ties", "below_margin")
    # the same record gives the same pair, whatever else runs
    assert choose_pairs(scores, PairingSettings(strategy="sweet-spot", min_margin=margin), "key").pairs == choice.pairs
