"""What another trainer will actually train on: its own preprocessing run on the rows, prefdata's pair
checks applied to the ids and masks it produces (`prefdata validate INPUT --trainer openrlhf`).

openrlhf.py runs OpenRLHF's real code (CPU only, no model); checks.py applies prefdata's pair checks
to its output; compare.py sets its ids beside prefdata's; run.py ties them into the report's section.
"""

TRAINERS = ("openrlhf",)
