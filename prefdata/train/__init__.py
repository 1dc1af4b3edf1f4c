"""`prefdata train`: the lean DPO trainer (recipe.py, read top to bottom) and its stall detector."""

from prefdata.train.recipe import TrainResult, train

__all__ = ["TrainResult", "train"]
