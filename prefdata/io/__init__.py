"""Stage 1, reading and writing: files -> raw records -> canonical pairs; OUT/ and its manifest."""
