"""Stage 3: pair checks, dataset-wide checks (duplicates, conflicts, MinHash), and the policy."""
