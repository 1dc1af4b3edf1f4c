"""What another trainer will actually train on: its own preprocessing run on the rows, prefdata's pair
checks applied to the ids and masks it produces (`prefdata validate INPUT --trainer NAME`).

Each trainer has an adapter module (prefdata.core.trainer_names lists them) with two functions:
`parse_args(items)` turns `--trainer-arg`s into that trainer's settings, and `run(rows, tokenizer_path,
trust_remote_code, settings)` runs its real code and returns a `common.TrainerRun` (its ids, masks and
findings). run.py ties any adapter into the report's `trainer` section; compare.py sets the trainer's
ids beside prefdata's; export.py writes OUT in the trainer's input format.
"""

from prefdata.core.trainer_names import EXPORT_TRAINERS, TRAINERS

__all__ = ["TRAINERS", "EXPORT_TRAINERS"]
