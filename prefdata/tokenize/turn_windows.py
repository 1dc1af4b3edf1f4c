"""The renders that locate a long completion's turns (tokenize.turns), in time linear in its turns.

Each trained turn j needs the render of the conversation up to it (with and without the generation
prompt) and through it. Rendered whole, those are j messages each: a 999-message trajectory renders
about a million messages (70 s with Qwen3's template). Here each is built from the full render
instead: the text of the messages before the previous trained turn is the full render's (where that
render repeats them), and only a short window is rendered, the conversation's leading messages (the
system message and first turn, which templates render specially) plus the messages from the
previous trained turn on. The result is the same strings, given to the same `spans_from_renders`.

That a window renders like the whole conversation holds for templates whose render of a message
depends on it, its neighbours and the leading messages (ChatML, Qwen3's think blocks, Llama,
Phi-3), not for all (Mistral moves the system text to the last user turn). So nothing is assumed:
every window must continue the full render where the previous one left it, and the turns' own
renders are made whole for the first, middle and last trained turn and compared; any difference
and the caller renders every turn whole, as before.
"""

from __future__ import annotations

from typing import Iterator

from prefdata.core.records import Message
from prefdata.tokenize.template import Render

# Fewer trained turns than this: rendering each whole, batched across rows, costs no more than the
# windows and the checks (measured on batches of 64 Qwen2.5 chats: even at 12 turns, 2x faster at 24).
WINDOWED_MIN_TURNS = 12

Renders = tuple[Iterator[str], Iterator[str], Iterator[str]]


def windowed_renders(prompt: list[Message], completion: list[Message], full: str, turns: list[int],
                     render: Render, tools: object = None) -> Renders | None:
    """(heads, bases, ends) for the completion's trained turns `turns`, equal to the renders of
    prompt + completion[:j] with and without the generation prompt and of prompt + completion[:j+1]
    for each turn j, built lazily from windows; None when the template does not render windows like
    the whole (then render each whole)."""
    kept = _leading(prompt)
    starts = [0] + turns[:-1]  # each window starts at the previous trained turn
    try:
        prompt_full, prompt_kept = render([prompt, kept], False, tools)
        windows = [kept + completion[w:j] for w, j in zip(starts, turns)]
        bases = render(windows, False, tools)
        heads = render(windows, True, tools)
        ends = render([kept + completion[w : j + 1] for w, j in zip(starts, turns)], False, tools)
    except Exception:  # a window the template refuses (alternating roles): render each whole
        return None
    lead = len(prompt_kept)
    if not full.startswith(prompt_full) or not all(r.startswith(prompt_kept) for r in (*bases, *heads, *ends)):
        return None
    # Where each window starts in the full render: each must continue it where the previous one ended.
    at = len(prompt_full)
    offsets = []
    for base in bases:
        offsets.append(at)
        if not full.startswith(base[lead:], at):
            return None
        at += len(base) - lead

    def built(renders: list[str]) -> Iterator[str]:
        return (full[:offset] + text[lead:] for offset, text in zip(offsets, renders))

    if not _whole_renders_agree(prompt, completion, full, turns, offsets, (heads, bases, ends), lead, render, tools):
        return None
    return built(heads), built(bases), built(ends)


def _whole_renders_agree(prompt: list[Message], completion: list[Message], full: str, turns: list[int],
                         offsets: list[int], windows: tuple[list[str], list[str], list[str]], lead: int,
                         render: Render, tools: object) -> bool:
    """Whether the first, middle and last trained turns' renders, made whole, equal those built from
    the windows."""
    sample = sorted({0, len(turns) // 2, len(turns) - 1})
    heads, bases, ends = windows
    try:
        convs = [prompt + completion[: turns[i]] for i in sample]
        whole = (render(convs, True, tools), render(convs, False, tools),
                 render([prompt + completion[: turns[i] + 1] for i in sample], False, tools))
    except Exception:
        return False
    for made, built in zip(whole, (heads, bases, ends)):
        for text, i in zip(made, sample):
            if text != full[: offsets[i]] + built[i][lead:]:
                return False
    return True


def _leading(prompt: list[Message]) -> list[Message]:
    """The prompt's leading messages every window keeps: its system messages and first turn."""
    count = 0
    while count < len(prompt) and prompt[count]["role"] in ("system", "developer"):
        count += 1
    return prompt[: min(count + 1, len(prompt))]
