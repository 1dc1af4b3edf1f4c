"""Set building: which records and pairs make the dataset. Mixtures of sources (mix), seeded
subsampling (sampling), pairs made from scored completions (pairing, scored), benchmark overlap
(decontaminate) and length balance (balance). Stands on io/; tokenize/, checks/ and the commands use it."""
