"""The hand-off to TRL: `from prefdata.trl import DPOTrainer` trains on a prepared OUT exactly as written.

trainer.py holds the trainer and the checks it makes on OUT before anything loads; collator.py the
batches for image OUTs (OUT's stored ids plus the images' pixel values). Importing this package
needs TRL (`pip install "prefdata[trl]"`): without it, one ImportError line says so.
"""

from prefdata.trl.trainer import TESTED_TRL, DPOConfig, DPOTrainer, load_out, out_settings

__all__ = ["DPOConfig", "DPOTrainer", "load_out", "out_settings", "TESTED_TRL"]
