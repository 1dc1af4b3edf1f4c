"""Stage 3: pair checks, dataset-wide checks (duplicates, conflicts, MinHash), and the policy; the
checked-row stream (stream.py) that runs them on an engine for `prepare` and `validate`."""
