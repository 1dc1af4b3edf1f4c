"""Runs stage functions over batches: in worker processes on one machine (local)."""
