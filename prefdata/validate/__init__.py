"""`prefdata validate`: the command (command.py), prepared OUT/ re-checks, and the parallel text path
(scan.py in worker processes, merge.py in input order)."""

from prefdata.validate.command import ValidateResult, validate

__all__ = ["ValidateResult", "validate"]
