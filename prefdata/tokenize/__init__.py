"""Stage 2: chat rendering, tokenization and truncation of pairs; loss masks and position ids."""
