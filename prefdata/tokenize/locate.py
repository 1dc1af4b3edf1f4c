"""Where a partial render of a conversation ends inside its full render, when it is not a prefix.

Templates render leading messages differently once later ones follow: Qwen3 gives only the last
assistant turn an (empty) think block; Mistral puts the system message into the last user turn, so
a render that stops earlier has it in another turn; Phi-3 ends only the last turn with <|endoftext|>.
The render of the conversation up to (or through) one message is then not a prefix of the full render,
and where that message's render ends in the full one has to be found.

`locate_end` accepts one kind of difference only, the one those templates make: the partial render is
the full render's text with blocks added (a think block, a moved system message or tools list: one,
or a few where the caller allows it), and ends like the full render's text does there (its last
special token and what follows it). Anything else gives None, so that the caller flags the row
instead of guessing.
"""

from __future__ import annotations

_LONGEST_SPECIAL = 64  # characters; special tokens are shorter
# with_blocks_added: places a block may end that are looked at, tried, and characters compared to rank them.
_RESUME_PLACES, _RESUME_TRIES, _AGREE = 256, 4, 256


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings, by halving slices compared in C
    (os.path.commonprefix walks the characters in Python: seconds for long trajectories)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def last_special(text: str, specials: tuple[str, ...], start: int = 0) -> int:
    """Where the last special token in `text[start:]` starts, -1 if it has none."""
    best = -1
    for special in specials:
        found = text.rfind(special, start)
        if found > best:
            best = found
    return best


def locate_end(render: str, full: str, specials: tuple[str, ...], floor: int = 0, blocks: int = 1) -> int | None:
    """The position in `full` where the text of `render` ends, when `render` is `full[:k]` with one
    block of text added (before its last special token), else None. With a `floor` (a position in
    `full` up to which the caller has placed the messages already), the blocks may be several, all
    before it: `full[floor:k]` must end `render`. With `blocks` above 1, up to that many blocks
    anywhere (Mistral moves both the system text and the tools list to the last user turn)."""
    diverge = common_prefix(render, full)
    # Searched from a little before the divergence: an anchor that holds the added block cannot match.
    anchor_at = last_special(render, specials, max(diverge - _LONGEST_SPECIAL, 0))
    if anchor_at < 0 or diverge >= len(render):
        return None
    anchor = render[anchor_at:]  # the render's last special token and what follows it
    lo = max(diverge, floor)
    found = full.find(anchor, max(lo - len(anchor) + 1, 0))
    # Each place the anchor ends, nearest first, while full[:end] can still be shorter than render: the
    # first where full[:end] is render[:diverge] + a suffix of render (one block removed).
    while 0 <= found and found + len(anchor) < len(render):
        end = found + len(anchor)
        if end > lo and render.endswith(full[lo:end]):
            return end
        if blocks > 1 and end > lo and with_blocks_added(render, full[:end], blocks):
            return end
        found = full.find(anchor, found + 1)
    return None


def with_blocks_added(render: str, text: str, blocks: int, i: int = 0, j: int = 0) -> bool:
    """Whether `render[i:]` is `text[j:]` with at most `blocks` blocks of text inserted: walked in step;
    at a mismatch, the block is tried to end at the next place the text resumes and at the places that
    agree with it the longest (a few each, so a long render costs a few walks, not a search)."""
    same = common_prefix(render[i:], text[j:])
    i, j = i + same, j + same
    if j == len(text):
        return i == len(render) or blocks > 0  # what is left of render: one more block
    if blocks == 0:
        return False
    places: list[int] = []
    at = render.find(text[j], i + 1)
    while at >= 0 and len(places) < _RESUME_PLACES:
        places.append(at)
        at = render.find(text[j], at + 1)
    ranked = sorted(places, key=lambda p: -common_prefix(render[p : p + _AGREE], text[j : j + _AGREE]))
    tries = places[:1] + [p for p in ranked[:_RESUME_TRIES] if p != places[0]] if places else []
    return any(with_blocks_added(render, text, blocks - 1, p, j) for p in tries)


def only_specials(text: str, specials: tuple[str, ...]) -> bool:
    """Whether `text` is nothing but whitespace and special tokens (an end of sequence after a turn)."""
    text = text.strip()
    while text:
        special = next((s for s in specials if text.startswith(s)), None)
        if special is None:
            return False
        text = text[len(special):].lstrip()
    return True


def outside_special(text: str, cut: int, specials: tuple[str, ...]) -> int:
    """`cut`, or the start of the special token of `text` that it falls inside of."""
    for special in specials:
        begin = text.find(special, max(cut - len(special) + 1, 0), cut + len(special) - 1)
        if 0 <= begin < cut:
            return begin
    return cut
