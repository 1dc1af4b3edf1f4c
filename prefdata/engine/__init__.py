"""Runs stage functions over batches: in worker processes on one machine (local) or on a Ray cluster
(ray); select.py picks one. Imports none of the stages: it is handed the stage object."""
