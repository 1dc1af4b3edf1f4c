"""Agent trajectories and multi-turn conversations as pairs: where two message lists split, what
their divergence says about the pair, and tool results checked against the calls they answer.

A preference pair compares the model's decisions from one shared state. Two trajectories split at
their first differing message; the messages before it are the prompt. When that message is one the
model did not write (a tool result, a user turn), the halves differ by what the environment or the
user said, not by what the model chose: such pairs are flagged (`environment_differs`,
`diverges_at_non_model_turn`, dropped by the default policy) instead of trained on silently.
"""

from __future__ import annotations

from prefdata.core import flags
from prefdata.core.errors import RecordError
from prefdata.core.records import Message

MODEL_ROLE = "assistant"
# One half with this many times the other's assistant turns (and UNEQUAL_TURNS_MIN_GAP more) is flagged.
UNEQUAL_TURNS_RATIO = 3
UNEQUAL_TURNS_MIN_GAP = 3
# A completion's turn spans come from renders of the conversation up to and through each assistant turn:
# built from short windows where the template allows it (tokenize.turn_windows: a 999-message Qwen3 pair
# prepares in ~4 s), else rendered whole, a cost that grows with the square of the length. Far longer
# completions are refused, one record, instead of holding a worker for minutes.
MAX_COMPLETION_MESSAGES = 1024


def first_difference(chosen: list[Message], rejected: list[Message]) -> int:
    """Index of the first message where the two lists differ (the shorter length when one list is a
    prefix of the other)."""
    limit = min(len(chosen), len(rejected))
    index = 0
    while index < limit and chosen[index] == rejected[index]:
        index += 1
    return index


def split_point(chosen: list[Message], rejected: list[Message]) -> int:
    """How many leading messages the pair's prompt takes: all the shared ones, up to the first
    differing message. When one list is a prefix of the other (or they are equal), nothing differs
    to split at: the cut moves back to the last assistant turn both lists have there, so that each
    completion still holds a turn (0 when none does)."""
    shared = first_difference(chosen, rejected)
    if shared < min(len(chosen), len(rejected)):
        return shared
    while shared > 0 and not (
        shared < len(chosen) and shared < len(rejected)
        and chosen[shared]["role"] == MODEL_ROLE and rejected[shared]["role"] == MODEL_ROLE
    ):
        shared -= 1
    return shared


def shared_lead(chosen: list[Message], rejected: list[Message]) -> int:
    """Leading messages two completion lists share while both still differ after them (0 when they
    are equal or one is a prefix of the other: nothing to move into the prompt)."""
    shared = first_difference(chosen, rejected)
    return shared if shared < min(len(chosen), len(rejected)) else 0


def divergence_flags(prompt: list[Message], chosen: list[Message], rejected: list[Message]) -> list[str]:
    """Flags of a split pair: where it diverges, and whether its halves' turn counts are far apart."""
    found: list[str] = []
    if chosen and rejected and chosen[0] != rejected[0]:
        roles = {chosen[0]["role"], rejected[0]["role"]}
        if roles != {MODEL_ROLE}:
            if roles == {"tool"} and _answers_a_call(prompt):
                found.append(flags.ENVIRONMENT_DIFFERS)  # the same call, answered differently
            else:
                found.append(flags.DIVERGES_AT_NON_MODEL_TURN)
    if unequal_turns(model_turns(chosen), model_turns(rejected)):
        found.append(flags.UNEQUAL_TURNS)
    return found


def _answers_a_call(prompt: list[Message]) -> bool:
    """Whether a tool result after `prompt` answers a call of its last assistant turn (parallel calls:
    the results already given to the others sit between them)."""
    for message in reversed(prompt):
        if message["role"] != "tool":
            return message["role"] == MODEL_ROLE and bool(message.get("tool_calls"))
    return False


def model_turns(messages: list[Message]) -> int:
    return sum(1 for m in messages if m["role"] == MODEL_ROLE)


def unequal_turns(a: int, b: int) -> bool:
    low, high = sorted((a, b))
    return high - low >= UNEQUAL_TURNS_MIN_GAP and high >= UNEQUAL_TURNS_RATIO * max(low, 1)


def holds_non_model_turns(messages: list[Message] | None) -> bool:
    """Whether a completion holds a turn the model did not write (a tool result, a user turn)."""
    return bool(messages) and any(m["role"] != MODEL_ROLE for m in messages)


def check_completion_length(messages: list[Message], field: str) -> None:
    """RecordError for a completion holding non-model turns with more than MAX_COMPLETION_MESSAGES messages."""
    if len(messages) > MAX_COMPLETION_MESSAGES and holds_non_model_turns(messages):
        raise RecordError(
            f"field {field!r}: {len(messages)} messages after the split, more than the {MAX_COMPLETION_MESSAGES} "
            "whose turns prefdata masks one by one: split the trajectory into shorter pairs"
        )


def check_tool_results(messages: list[Message], field: str, prompt_field: str, prompt_len: int) -> None:
    """RecordError (one line, naming the message) for a tool result that answers no call: one with no
    assistant turn before it, or whose `tool_call_id` names none of the calls of the assistant turn
    it follows (when those calls carry ids). The first `prompt_len` messages are named as items of
    `prompt_field`, the rest as items of `field`."""
    calls: set[str] | None = None  # ids of the calls the tool results being read answer
    seen_model = False
    for i, message in enumerate(messages):
        role = message["role"]
        if role == MODEL_ROLE:
            seen_model = True
            ids = {call["id"] for call in message.get("tool_calls") or () if "id" in call}
            calls = ids or None
        elif role == "tool":
            where = f"{prompt_field}[{i}]" if i < prompt_len else f"{field}[{i - prompt_len}]"
            if not seen_model:
                raise RecordError(f"field {where!r}: a tool result with no assistant turn (no call) before it")
            wanted = message.get("tool_call_id")
            if calls is not None and wanted is not None and wanted not in calls:
                raise RecordError(
                    f"field {where!r}: tool_call_id {wanted[:60]!r} matches no call of the assistant turn before it"
                )
        else:
            seen_model = False
            calls = None
