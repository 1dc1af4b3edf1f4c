"""Which tokens of a completion the model wrote: per-token loss masks for completions that hold
turns the model did not write (tool results, user turns, HH's Human turns).

The spans come from the template itself, as characters of the rendered completion:

- `{% generation %}` blocks, where the template has them (SmolLM3), read through transformers'
  `render_jinja_template(return_assistant_tokens_mask=True)`, used when its render equals ours;
- otherwise incremental renders (batched across rows, `render_chunks`): assistant turn j of the
  completion starts where the render of the conversation up to it with the generation prompt ends,
  and ends where the render of the conversation through it ends (for long completions those renders
  are built from short windows of the full render where the template allows: tokenize.turn_windows,
  linear in turns instead of quadratic). Where a template renders a turn
  differently once later messages follow, those renders are not prefixes of the full render, and
  the turn is located in the full render instead (prefdata.tokenize.locate): Qwen3's last turn adds
  an empty think block, Phi-3's adds <|endoftext|>, Mistral moves the system message to the last
  user turn. A turn that cannot be located flags the row `turn_renders_differently`: its mask may
  miss part of that turn, never silently. Whitespace after a turn's final special token (ChatML's
  '\\n' after <|im_end|>) is the separator of the next turn, out of the span.

Characters become tokens through the offsets of the completion as it is tokenized (behind the
anchor): a token is trained when any of its characters lies in a trained span. Role headers,
tool results and user turns stay in the sequence as context, with mask 0.
"""

from __future__ import annotations

import re
from itertools import repeat
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from prefdata.core.records import Message
from prefdata.io.formats import HH_ASSISTANT, HH_HUMAN
from prefdata.io.trajectory import MODEL_ROLE, holds_non_model_turns
from prefdata.tokenize.locate import common_prefix, locate_end, only_specials, outside_special

TRAIN_TURNS = ("all", "last")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")

Span = tuple[int, int]
# Messages rendered by one batched call of incremental renders (a conversation of M messages counts M).
MAX_MESSAGES_PER_RENDER = 50_000


def needs_turn_masks(completions: Sequence[list[Message] | None], train_turns: str) -> bool:
    """Whether a pair needs loss masks: a completion holds a turn the model did not write, or (with
    `--train-turns last`) more than one assistant turn."""
    for messages in completions:
        if holds_non_model_turns(messages) or (train_turns == "last" and messages and len(messages) > 1):
            return True
    return False


def trained_turns(messages: list[Message], train_turns: str) -> list[int]:
    """Indices of the completion's assistant messages in the loss: all of them, or only the last."""
    turns = [i for i, m in enumerate(messages) if m["role"] == MODEL_ROLE]
    return turns[-1:] if train_turns == "last" else turns


def has_generation_blocks(chat_template: Any) -> bool:
    return isinstance(chat_template, str) and bool(_GENERATION_TAG.search(chat_template))


@dataclass
class TurnRenders:
    """One completion whose turn spans come from renders up to and through each trained turn."""

    texts: Any  # the row's texts (tokenize.pairs._Texts), which the spans are written to
    half: str  # "chosen" or "rejected"
    prompt: list[Message]
    completion: list[Message]
    full: str  # the render of prompt + completion
    turns: list[int]  # the completion's trained assistant messages
    cut: int  # where the completion starts in `full`

    @property
    def messages_rendered(self) -> int:
        return len(self.turns) * 2 * (len(self.prompt) + len(self.completion))


def render_chunks(jobs: list[TurnRenders], max_messages: int = MAX_MESSAGES_PER_RENDER) -> list[list[TurnRenders]]:
    """Jobs grouped for batched render calls, each call rendering at most `max_messages` messages in all
    (a job above it alone): few calls for many short chats, bounded memory for long trajectories."""
    chunks: list[list[TurnRenders]] = []
    size = 0
    for job in jobs:
        if not job.turns:
            continue
        if chunks and size + job.messages_rendered <= max_messages:
            chunks[-1].append(job)
            size += job.messages_rendered
        else:
            chunks.append([job])
            size = job.messages_rendered
    return chunks


def spans_from_renders(heads: Iterable[str], ends: Iterable[str], full: str, specials: tuple[str, ...],
                       bases: Iterable[str | None] | None = None, turns: list[int] | None = None,
                       cut: int = 0) -> tuple[list[Span], bool]:
    """Character spans in `full` (the render of prompt + completion, whose completion starts at `cut`)
    of the completion's assistant turns `turns` (indices in the completion, in order), from the
    renders of the conversation up to each turn with the generation prompt (`heads`), the same without
    it where a head is not a prefix of `full` (`bases`), and through the turn (`ends`); and whether
    every turn was located (False: a turn renders differently once later messages follow in a way
    `locate_end` does not accept, and its span may miss part of it)."""
    spans = []
    located = True
    floor = cut  # where the previous turn ends in `full`: what lies between is tool results or user turns
    if not turns:
        heads = list(heads)
        turns = list(range(len(heads)))
    # The renders may be built one at a time (tokenize.turn_windows): each is read once, in order.
    for j, head, base, end in zip(turns, heads, bases or repeat(None), ends):
        if j == 0:  # the completion's first message: it starts where the completion does
            start, found_start = (len(head) if full.startswith(head) else cut), True
        else:
            start, found_start = _turn_start(head, base, full, specials, floor)
        stop, found_stop = _turn_end(end, full, start, head, specials)
        located = located and found_start and found_stop
        spans.append((start, stop))
        floor = max(floor, stop)
    return spans, located


def _turn_start(head: str, base: str | None, full: str, specials: tuple[str, ...], floor: int) -> tuple[int, bool]:
    """Where a turn starts in `full`: after its head, or, where the full render differs, after the
    preceding messages (located in `full`: what follows the previous turn, from `floor`, ends `base`)
    and as much of the generation prompt as `full` repeats (DeepSeek-R1's ends '<think>\n', which a
    rendered turn does not have)."""
    if full.startswith(head):
        return len(head), True
    if base is None or not head.startswith(base):
        return common_prefix(head, full), False
    at = len(base) if full.startswith(base) else locate_end(base, full, specials, floor)
    if at is None:  # the preceding messages render differently in `full` (cannot place the turn)
        return common_prefix(head, full), False
    header = head[len(base):]
    return outside_special(full, at + common_prefix(header, full[at : at + len(header)]), specials), True


def _turn_end(end: str, full: str, start: int, head: str, specials: tuple[str, ...]) -> tuple[int, bool]:
    """Where a turn ends in `full`, given the render of the conversation through it (`end`): the turn's
    own text (`end` past `head`) aligned from where the turn starts, so that earlier turns rendered
    differently too (Qwen3 drops their reasoning once a later user turn follows) do not matter; else
    the whole render aligned."""
    if full.startswith(end):
        return len(end), True
    if end.startswith(head):
        stop = _end_in(end[len(head) :], full[start:], 0, specials)
        if stop is not None:
            return start + stop, True
    stop = _end_in(end, full, start, specials)
    if stop is not None:
        return stop, True
    return max(_after_last_special(full, start, common_prefix(end, full), specials), start), False


def _end_in(render: str, full: str, start: int, specials: tuple[str, ...]) -> int | None:
    """Where `render` (which `full` continues differently) ends in `full`, past `start`, or None."""
    if full.startswith(render):
        return len(render)
    diverge = common_prefix(render, full)
    if diverge > start:  # the last turn only adds an end of sequence (Phi-3's <|endoftext|>)
        stop = _after_last_special(full, start, diverge, specials)
        if stop > start and only_specials(render[stop:], specials):
            return stop
    located = locate_end(render, full, specials)  # the last turn adds a block (Qwen3's empty think block)
    return located if located is not None and located > start else None


def _after_last_special(text: str, start: int, stop: int, specials: tuple[str, ...]) -> int:
    """The end of the last special token wholly inside text[start:stop], else `stop`: a common prefix
    can end inside the next turn's marker ('<|end|>\n<|' of '<|endoftext|>' and '<|user|>')."""
    ends = [found + len(special) for special in specials if (found := text.rfind(special, start, stop)) >= 0]
    return max(ends) if ends else stop


def generation_header(prompt_with_header: str, prompt_alone: str) -> str:
    """What the generation prompt adds to the prompt's render (ChatML's '<|im_start|>assistant\n')."""
    return prompt_with_header[len(prompt_alone):] if prompt_with_header.startswith(prompt_alone) else ""


def without_header(spans: list[Span], full: str, header: str) -> list[Span]:
    """`{% generation %}` blocks that open with the role header (SmolLM3's) start after it: a header is
    the template's text, not the model's decision, and is out of the loss in every turn alike."""
    if not header:
        return spans
    return [(start + len(header), stop) if full.startswith(header, start) else (start, stop) for start, stop in spans]


def generation_spans(tokenizer: Any, conversation: list[Message], full: str, tools: Any,
                     kwargs: dict[str, Any]) -> list[Span] | None:
    """The `{% generation %}` blocks' character spans in the render of `conversation`, or None when
    the template's render through this path differs from `full` (then incremental renders decide)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, indices = render_jinja_template(
            conversations=[conversation], tools=tools, chat_template=tokenizer.chat_template,
            return_assistant_tokens_mask=True, add_generation_prompt=False,
            **{**tokenizer.special_tokens_map, **kwargs},
        )
    except Exception:  # the ordinary render worked: let the incremental renders decide
        return None
    if rendered[0] != full:
        return None
    return [(int(start), int(end)) for start, end in indices[0]]


def completion_spans(spans: list[Span], cut: int, length: int, specials: tuple[str, ...], full: str) -> list[Span]:
    """Spans of the full render made relative to the completion (which starts at `cut` and is
    `length` characters long), each ending at its turn's final special token when whitespace
    follows it; empty spans left out."""
    out: list[Span] = []
    for start, stop in spans:
        text = full[start:stop]
        stripped = text.rstrip()
        if stripped != text and stripped.endswith(specials):
            stop = start + len(stripped)
        start, stop = max(start - cut, 0), min(stop - cut, length)
        if stop > start:
            out.append((start, stop))
    return out


def hh_spans(text: str, train_turns: str) -> tuple[list[Span], bool]:
    """An HH transcript completion (" answer\\n\\nHuman: q\\n\\nAssistant: answer"): the character spans
    of its Assistant text, and whether it ends in one (the EOS appended then belongs to it)."""
    spans: list[Span] = []
    start = 0
    ends_in_model = True
    while True:
        human = text.find(HH_HUMAN, start)
        if human < 0:
            spans.append((start, len(text)))
            break
        spans.append((start, human))
        marker = text.find(HH_ASSISTANT, human)
        if marker < 0:
            ends_in_model = False
            break
        start = marker + len(HH_ASSISTANT)
    if train_turns == "last":
        spans = spans[-1:] if ends_in_model else []
    return [(a, b) for a, b in spans if b > a], ends_in_model


def token_mask(offsets: Sequence[tuple[int, int]], spans: list[Span], shift: int = 0) -> list[int]:
    """1 for each token (character offsets, minus `shift`) that has a character in one of `spans`
    (sorted, disjoint), else 0."""
    mask = []
    k = 0
    for begin, end in offsets:
        begin, end = begin - shift, end - shift
        while k < len(spans) and spans[k][1] <= begin:
            k += 1
        mask.append(1 if k < len(spans) and spans[k][0] < end and end > begin else 0)
    return mask


def fit_mask(mask: list[int], length: int, tail: int) -> list[int]:
    """A mask cut or grown to `length` ids: an EOS appended after the text takes `tail` (1 when the
    completion ends in a trained turn); ids cut at the end lose their entries."""
    if len(mask) >= length:
        return mask[:length]
    return mask + [tail] * (length - len(mask))
