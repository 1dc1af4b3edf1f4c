"""multi_turn_completion says what it means (issue 40, item 8): HH transcripts that diverge before
their last Assistant turn. Agent trajectories hold several turns per completion by design (the masks
train exactly the model's turns), so docs/agents.md's own agent example raises no such warning."""

from __future__ import annotations

import json
from pathlib import Path

from prefdata.core import flags as F
from prefdata.core.records import RawRecord
from prefdata.io.formats import normalize_record
from prefdata.report.render_common import FLAG_MEANINGS

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "agent" / "trajectories.jsonl"


def test_agent_trajectories_are_not_flagged_multi_turn():
    flagged = []
    for number, text in enumerate(AGENT.read_text(encoding="utf-8").splitlines(), start=1):
        pair = normalize_record(RawRecord(AGENT.name, number, json.loads(text)))
        assert len([m for m in pair.chosen_messages if m["role"] == "assistant"]) >= 1
        if F.MULTI_TURN_COMPLETION in pair.flags:
            flagged.append(number)
    assert flagged == []


def test_a_conversation_diverging_early_is_not_flagged_but_an_hh_transcript_is():
    user, answer = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}
    conversation = normalize_record(RawRecord("t.jsonl", 1, {
        "chosen": [user, answer, {"role": "user", "content": "A joke?"}, {"role": "assistant", "content": "Sure."}],
        "rejected": [user, {"role": "assistant", "content": "Go away."}, {"role": "user", "content": "A joke?"},
                     {"role": "assistant", "content": "No."}]}))
    assert F.MULTI_TURN_COMPLETION not in conversation.flags
    hh = normalize_record(RawRecord("t.jsonl", 2, {
        "chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: A joke?\n\nAssistant: Sure.",
        "rejected": "\n\nHuman: Hi\n\nAssistant: Go away.\n\nHuman: A joke?\n\nAssistant: No."}))
    assert hh.flags == [F.MULTI_TURN_COMPLETION]


def test_the_reports_meaning_and_the_readme_table_describe_the_same_flag():
    meaning = FLAG_MEANINGS[F.MULTI_TURN_COMPLETION]
    assert "HH" in meaning and "diverge before their last Assistant turn" in meaning
    row = next(line for line in (REPO / "docs" / "checks.md").read_text(encoding="utf-8").splitlines()
               if line.startswith(f"| `{F.MULTI_TURN_COMPLETION}` |"))
    assert "HH" in row and "diverge before their last Assistant turn" in row
