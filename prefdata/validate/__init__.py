"""`prefdata validate`: the command (command.py), raw input (raw.py) with its parallel text path
(scan.py in worker processes, merge.py in input order), prepared OUT/ re-checks (prepared.py), and
the report going out (output.py)."""

from prefdata.validate.command import ValidateResult, validate

__all__ = ["ValidateResult", "validate"]
