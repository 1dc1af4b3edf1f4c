"""What every layer shares: the record types that flow between stages, the flag names, the errors,
OUT's column contract, reasoning traces in text, and small process facts (rank, quiet output).
Nothing here imports another part of prefdata."""
