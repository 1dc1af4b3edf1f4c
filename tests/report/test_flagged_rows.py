"""report.compact.FlaggedRows gives back exactly the tuples it was given, in order."""

from prefdata.report.compact import FlaggedRows

ROWS = [
    ("00ff00ff00ff00ff", 0, 12, ("identical",), "drop", "dropped", "What is \ud800 the…"),
    ("ffffffffffffffff", 3, 1, (), None, "quarantined", None),
    ("0000000000000001", 0, 7, ("identical", "prompt_boundary_mismatch"), "warn", "kept", ""),
    ("not-a-hex-digest", 1, None, ("x",), "warn", "kept", "odd row kept as given"),
    ("00ff00ff00ff00ff", 0, 13, ("identical",), "drop", "dropped", "é ü 中文"),
]


def test_round_trip_in_order() -> None:
    flagged = FlaggedRows()
    for row in ROWS:
        flagged.append(row)
    assert len(flagged) == len(ROWS)
    assert list(flagged) == ROWS
    assert list(flagged) == ROWS  # iterating again gives the same rows


def test_empty() -> None:
    assert len(FlaggedRows()) == 0 and list(FlaggedRows()) == []
