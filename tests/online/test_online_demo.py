"""`python -m prefdata.tiny.online_demo`: a newcomer's first online run trains on samples that finish,
and a second run in the same place starts afresh instead of refusing its own earlier run."""

from __future__ import annotations

import re

from prefdata.tiny.online_demo import run_demo


def test_the_online_demo_trains_on_finished_samples_and_reruns_in_place(tmp_path, capsys):
    assert run_demo(tmp_path, passes=1) == 0
    first = capsys.readouterr().out
    finished = [int(n) for n in re.search(r"finished samples .*?: ([\d, ]+)", first).group(1).split(",")]
    assert finished and finished[0] >= 32  # most of the 64 samples end with EOS
    assert "--prompts-per-round" not in first  # fully online, the default
    assert run_demo(tmp_path, passes=1) == 0  # the same work directory again
    assert "done in" in capsys.readouterr().out
