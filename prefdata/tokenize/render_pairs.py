"""Rendering pairs for tokenization: messages through the chat template into the prompt and completion
texts (prefdata.tokenize.pairs tokenizes them). Split from pairs.py, whose docstring describes the
conventions: the completion is the full render minus the prompt render, a completion ends where the
template ends the assistant turn, and the trained turns of agent trajectories are located in the full render.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError, RecordError, first_line
from prefdata.core.reasoning import carries_reasoning_or_tools
from prefdata.core.records import Message, Pair
from prefdata.tokenize import turn_windows
from prefdata.tokenize.locate import locate_end, outside_special
from prefdata.tokenize.template import Rendered, lost_fields, pinned_clock, system_lost, template_messages
from prefdata.tokenize.turn_windows import windowed_renders
from prefdata.tokenize.turns import (
    Span,
    completion_spans,
    generation_header,
    generation_spans,
    has_generation_blocks,
    TurnRenders,
    hh_spans,
    needs_turn_masks,
    render_chunks,
    spans_from_renders,
    trained_turns,
    without_header,
)


@dataclass
class _Texts:
    """The three texts of one row to tokenize, and how."""

    prompt: str
    chosen: str
    rejected: str
    prompt_prefix_ids: bool  # plain text: put the tokenizer's own leading special tokens (BOS) first
    # Whether the template ended each completion with a special token (its end of turn): then no EOS
    # is appended. Plain text ends with nothing, so it gets the EOS.
    chosen_ends_turn: bool = False
    rejected_ends_turn: bool = False
    flags: tuple[str, ...] = ()  # found while rendering (reasoning_lost)
    images: bool = False  # the prompt holds expanded image tokens (truncation must not cut them)
    image_tokens: list[int] | None = None  # tokens each image expanded to (None: not expanded)
    image_sizes: list[tuple[int, int]] | None = None  # (width, height) of each image expanded (spans by size)
    # Completions holding turns the model did not write: the character spans of each half's trained
    # turns (None: the whole completion is trained), and whether an EOS appended after it is trained.
    chosen_spans: list[Span] | None = None
    rejected_spans: list[Span] | None = None
    chosen_tail: int = 1
    rejected_tail: int = 1


_NEEDS_PROCESSOR = "row has images: prepare image pairs with --processor (an AutoProcessor directory), not --tokenizer"


# Blocks a template may move out of the prompt once the completion follows (Mistral: the system text
# and the tools list go to the last user turn).
_MOVED_BLOCKS = 3


def _rendered(prompt: str, full_chosen: str, full_rejected: str, specials: tuple[str, ...] = ()) -> Rendered:
    """A row's renders and where its completions start: after the prompt's render; where a template
    renders the prompt differently once the completion follows, where the prompt's render ends in
    both full renders alike (Mistral moves the system message to the last user turn: tokenize.locate);
    else after the three renders' common prefix (a generation prompt the full render does not repeat),
    never inside a special token ('<' is common to DeepSeek-R1's '<think>' and '<｜end▁of▁sentence｜>')."""
    cut = len(prompt)
    if not (full_chosen.startswith(prompt) and full_rejected.startswith(prompt)):
        cut = outside_special(full_chosen, len(os.path.commonprefix([prompt, full_chosen, full_rejected])), specials)
        located = locate_end(prompt, full_chosen, specials, blocks=_MOVED_BLOCKS)
        if located is not None and located == locate_end(prompt, full_rejected, specials, blocks=_MOVED_BLOCKS) \
                and full_chosen[:located] == full_rejected[:located]:
            cut = located
    return Rendered(prompt, (full_chosen, full_rejected), cut)


class PairRendering:
    """The rendering half of PairTokenizer: a pair's messages through the chat template into the three
    texts to tokenize (_Texts), with the trained turns' character spans and the flags rendering finds
    (reasoning_lost, system_lost, turn_renders_differently). PairTokenizer inherits it; it reads the
    tokenizer, settings and special strings PairTokenizer.setup loads."""

    def _plain_texts(self, pair: Pair) -> _Texts | RecordError:
        """A plain-text row's texts, tokenized as written (no template). Tools cannot reach a model
        through plain text: that is a loss to report."""
        lost = (F.REASONING_LOST,) if pair.tools else ()
        texts = _Texts(pair.prompt, pair.chosen, pair.rejected, prompt_prefix_ids=True, flags=lost)
        if pair.shape == "hh" and F.MULTI_TURN_COMPLETION in pair.flags:  # its Human turns stay out of the loss
            texts.chosen_spans, ends = hh_spans(pair.chosen, self.settings.train_turns)
            texts.chosen_tail = int(ends)
            texts.rejected_spans, ends = hh_spans(pair.rejected, self.settings.train_turns)
            texts.rejected_tail = int(ends)
        return texts

    def _render_rows(self, pairs: list[Pair]) -> list[_Texts | RecordError]:
        """Render prompt (with generation prompt) once per row, and prompt + completion per half.

        Rows without tools are rendered in one batched call per kind of render; a row with tools
        needs its own call (a template takes one `tools` list per call)."""
        if not self.tokenizer.chat_template:
            raise PrefdataError(
                f"conversational rows need a chat template, and the tokenizer at {self.tokenizer_path} has none"
            )
        out: list[_Texts | RecordError | None] = [None] * len(pairs)
        plain = [i for i, pair in enumerate(pairs) if not pair.tools]
        conversations = [self._conversation(pairs[i]) for i in plain]
        try:  # a failing row sends the batch to per-row rendering
            prompts = self._render([c[0] for c in conversations], generation_prompt=True)
            fulls_c = self._render([c[0] + c[1] for c in conversations], generation_prompt=False)
            fulls_r = self._render([c[0] + c[2] for c in conversations], generation_prompt=False)
            jobs = []
            for i, conversation, p, c, r in zip(plain, conversations, prompts, fulls_c, fulls_r):
                out[i] = self._split_render(p, c, r, conversation, None)
                jobs.append((out[i], conversation, _rendered(p, c, r, self._special_strings)))
            self._add_turn_spans(jobs, None)  # the batch's turn renders in a few batched calls
        except Exception:
            for i, conversation in zip(plain, conversations):
                out[i] = self._render_one(conversation, None)
        for i, pair in enumerate(pairs):
            if pair.tools:
                out[i] = self._render_one(self._conversation(pair), pair.tools)
        return out  # type: ignore[return-value]

    def _conversation(self, pair: Pair) -> tuple[list[Message], list[Message], list[Message]]:
        if pair.is_conversational:
            return list(pair.prompt_messages or []), list(pair.chosen_messages or []), list(pair.rejected_messages or [])
        return (
            [{"role": "user", "content": pair.prompt}],
            [{"role": "assistant", "content": pair.chosen}],
            [{"role": "assistant", "content": pair.rejected}],
        )

    def _render(self, conversations: list[list[Message]], generation_prompt: bool,
                tools: list[Any] | None = None) -> list[str]:
        if not conversations:
            return []
        with pinned_clock(self._day):
            rendered = self.tokenizer.apply_chat_template(
                [template_messages(c) for c in conversations], tokenize=False, add_generation_prompt=generation_prompt,
                tools=tools, **self._render_kwargs,
            )
        return list(rendered)

    def _render_one(self, conversation: tuple[list[Message], list[Message], list[Message]],
                    tools: list[Any] | None) -> _Texts | RecordError:
        prompt, chosen, rejected = conversation
        try:
            p = self._render([prompt], True, tools)[0]
            c = self._render([prompt + chosen], False, tools)[0]
            r = self._render([prompt + rejected], False, tools)[0]
            texts = self._split_render(p, c, r, conversation, tools)
            self._add_turn_spans([(texts, conversation, _rendered(p, c, r, self._special_strings))], tools)
        except Exception as exc:  # this row's template renders fail (a partial conversation too): this row only
            first = first_line(exc)
            return RecordError(f"chat template failed: {first}")
        return texts

    def _split_render(self, prompt: str, full_chosen: str, full_rejected: str,
                      conversation: tuple[list[Message], list[Message], list[Message]],
                      tools: list[Any] | None) -> _Texts:
        """Completion text = full render minus the prompt render. When a template renders the prompt
        differently on its own (e.g. a system message moved next to the last user turn, or a think
        block the full render drops), fall back to the longest common prefix of the three renders,
        shared by both halves."""
        rendered = _rendered(prompt, full_chosen, full_rejected, self._special_strings)
        prompt = full_chosen[: rendered.cut]  # the prompt as the full renders have it (both halves alike)
        chosen, chosen_ends = self._end_of_turn(full_chosen[rendered.cut :])
        rejected, rejected_ends = self._end_of_turn(full_rejected[rendered.cut :])
        found: tuple[str, ...] = ()
        if tools or any(carries_reasoning_or_tools(m) for m in conversation):
            if self._lost_fields(conversation, tools, rendered):
                found = (F.REASONING_LOST,)
        if any(m["role"] == "system" for part in conversation for m in part):
            if system_lost(conversation[0], (conversation[1], conversation[2]), tools, rendered, self._render):
                found += (F.SYSTEM_LOST,)
        return _Texts(prompt, chosen, rejected, False, chosen_ends, rejected_ends, found)

    def _add_turn_spans(self, jobs: list[tuple[_Texts, tuple[list[Message], list[Message], list[Message]], Rendered]],
                        tools: list[Any] | None) -> None:
        """For the rows whose completions need loss masks (tokenize.turns), the character spans of each
        half's trained assistant turns: from the template's `{% generation %}` blocks where it has them,
        else from renders up to and through each turn: built from windows for long completions
        (tokenize.turn_windows), else made whole for many rows per call (`render_chunks`)."""
        train_turns = self.settings.train_turns
        pending: list[TurnRenders] = []
        for texts, conversation, rendered in jobs:
            if not needs_turn_masks(conversation[1:], train_turns):
                continue
            prompt = conversation[0]
            header: str | None = None  # the generation prompt's header, rendered once when needed
            for half, completion, full in (("chosen", conversation[1], rendered.fulls[0]),
                                           ("rejected", conversation[2], rendered.fulls[1])):
                turns = trained_turns(completion, train_turns)
                blocks = None
                if has_generation_blocks(self.tokenizer.chat_template):
                    with pinned_clock(self._day):
                        blocks = generation_spans(self.tokenizer, template_messages(prompt + completion), full, tools,
                                                  self._render_kwargs)
                if blocks is None:
                    pending.append(TurnRenders(texts, half, prompt, completion, full, turns, rendered.cut))
                    continue
                if header is None:
                    header = generation_header(rendered.prompt, self._render([prompt], False, tools)[0])
                blocks = without_header([b for b in blocks if b[1] > rendered.cut], full, header)
                self._put_spans(texts, half, completion, turns, blocks[-1:] if train_turns == "last" else blocks,
                                rendered.cut, full)
        whole: list[TurnRenders] = []
        for job in pending:
            windowed = None
            if job.turns and len(job.turns) >= turn_windows.WINDOWED_MIN_TURNS:  # long completions: linear, not quadratic
                windowed = windowed_renders(job.prompt, job.completion, job.full, job.turns, self._render, tools)
            if windowed is None:
                whole.append(job)
            else:
                heads, bases, ends = windowed
                self._spans_of(job, heads, ends, bases)
        for chunk in render_chunks(whole):
            convs = [job.prompt + job.completion[:j] for job in chunk for j in job.turns]
            heads = self._render(convs, True, tools)
            ends = self._render([job.prompt + job.completion[: j + 1] for job in chunk for j in job.turns], False, tools)
            fulls = [job.full for job in chunk for _ in job.turns]
            # Heads that are not a prefix of the full render (a system message moved, a generation
            # prompt the turn does not repeat): the same conversations without the generation prompt.
            odd = [i for i, (head, full) in enumerate(zip(heads, fulls)) if not full.startswith(head)]
            bases: list[str | None] = [None] * len(heads)
            for i, base in zip(odd, self._render([convs[i] for i in odd], False, tools)):
                bases[i] = base
            k = 0
            for job in chunk:
                n = len(job.turns)
                self._spans_of(job, heads[k : k + n], ends[k : k + n], bases[k : k + n])
                k += n

    def _spans_of(self, job: TurnRenders, heads: Iterable[str], ends: Iterable[str],
                  bases: Iterable[str | None]) -> None:
        """A job's turn spans from the renders up to and through each of its trained turns."""
        spans, located = spans_from_renders(heads, ends, job.full, self._special_strings, bases, job.turns, job.cut)
        self._put_spans(job.texts, job.half, job.completion, job.turns, spans, job.cut, job.full)
        if not located and F.TURN_RENDERS_DIFFERENTLY not in job.texts.flags:
            job.texts.flags += (F.TURN_RENDERS_DIFFERENTLY,)

    def _put_spans(self, texts: _Texts, half: str, completion: list[Message], turns: list[int], spans: list[Span],
                   cut: int, full: str) -> None:
        """A half's trained spans, relative to its completion text, and whether its end is trained."""
        text = getattr(texts, half)
        setattr(texts, f"{half}_spans", completion_spans(spans, cut, len(text), self._special_strings, full))
        ends_trained = bool(completion) and completion[-1]["role"] == "assistant" and len(completion) - 1 in turns
        setattr(texts, f"{half}_tail", int(ends_trained))

    def _lost_fields(self, conversation: tuple[list[Message], list[Message], list[Message]],
                     tools: list[Any] | None, rendered: Rendered) -> list[str]:
        # Fields whose text is there are confirmed by rendering the row without them.
        prompt, chosen, rejected = conversation
        return lost_fields(prompt, (chosen, rejected), tools, rendered, self._render)

    def lost_fields(self, pair: Pair) -> list[str]:
        """Which of a conversational pair's fields the template does not render, by name
        ("reasoning", "tool_calls", "tool_results", "tools"): what `reasoning_lost` flags."""
        self.setup()
        conversation = self._conversation(pair)
        prompt, chosen, rejected = conversation
        p, c, r = (self._render([messages], generation_prompt, pair.tools)[0]
                   for messages, generation_prompt in ((prompt, True), (prompt + chosen, False), (prompt + rejected, False)))
        return self._lost_fields(conversation, pair.tools, _rendered(p, c, r, self._special_strings))

    def _end_of_turn(self, completion: str) -> tuple[str, bool]:
        """(completion, whether the template ended it with a special token).

        Whitespace a template puts after its final special token (ChatML's '\\n' after <|im_end|>)
        is dropped: the turn ends at that token; the separator belongs to a next turn."""
        stripped = completion.rstrip()
        if stripped.endswith(self._special_strings):
            return stripped, True
        return completion, False
