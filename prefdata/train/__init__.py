"""`prefdata train`: the lean DPO trainer (recipe.py, read top to bottom; loop, step, data, metrics, checkpoint, runtime hold its steps) and its stall detector."""

from prefdata.train.recipe import TrainResult, train

__all__ = ["TrainResult", "train"]
