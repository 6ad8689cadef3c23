"""HiPER's token-level parse of a reply, as training reads it (the authors'
`make_hae_masks_and_switch(include_tags_mask=True)` and the low head's read position of
`compute_value_mask`).

Input: `pieces`, the reply's tokens decoded one at a time (special tokens kept, the end-of-turn
token included: the valid response tokens). The text is their concatenation and token i covers
the characters [start_i, start_i + len(piece_i)).

- A block `<x>...</x>` is found from the first "<x>"; it closes at the earliest of the close
  variants found from the content's start: "</x>", "</x>\\n", "]</x>", "]</x>\\n", ".</x>",
  ".</x>\\n", ")</x>", ")</x>\\n" for the sub-goal and the action, "</switch>", "</switch>\\n" for
  the switch; a tie goes to the earlier variant (so the block ends where its first "</x>" ends:
  a newline after it is not part of the block's characters).
- A block's token mask runs from the first token that ends after the "<" of the open tag to the
  last token that starts before the end of the close tag: tokens straddling either edge are in
  (a token ">\\n" puts the newline in the mask; a token "><" is in two masks). No block: an empty
  mask, except the action's, which is then the whole reply (end-of-turn token included).
- The switch decision: the switch block's text, stripped and upper-cased; a missing block or an
  empty text reads KEEP; any other word than KEEP reads SWITCH (`<switch>maybe</switch>` starts
  a new segment here, while the env projection marks it invalid).
- The low head's read position: the first token that starts at or after the end of the sub-goal
  block (normally the "<" of "<action>"); if there is no sub-goal block or no token after it,
  the same after the switch block; otherwise 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import accumulate

from hgpo_jax.agents.plan_execute.projection import KEEP


def close_variants(tag: str) -> tuple[str, ...]:
    """The close tags accepted for a sub-goal or action block `tag`, in priority order."""
    return tuple(f"{lead}</{tag}>{tail}" for lead in ("", "]", ".", ")") for tail in ("", "\n"))


SWITCH_CLOSE = ("</switch>", "</switch>\n")
SUBGOAL_CLOSE = close_variants("subgoal")
ACTION_CLOSE = close_variants("action")


@dataclasses.dataclass(frozen=True)
class ReplySpans:
    """The training-side parse of one reply (one entry per token in the masks).

    action, subgoal, switch: token masks of the three blocks, tags included (the action's: the
    whole reply when it has no action block); new_segment: the reply's switch decision (True:
    SWITCH, a new sub-goal segment starts at this turn; the first turn of a trajectory starts one
    whatever it says, which is the estimator's business); low_value_index: the token position
    whose value the low-level head reads."""

    action: tuple[bool, ...]
    subgoal: tuple[bool, ...]
    switch: tuple[bool, ...]
    new_segment: bool
    low_value_index: int


@dataclasses.dataclass(frozen=True)
class TagBlock:
    """A tag block's characters: the open tag's "<", the content's start and end, the close
    tag's end."""

    start: int
    content_start: int
    content_end: int
    end: int


def find_block(text: str, tag: str, closes: Sequence[str]) -> TagBlock | None:
    """The block `<tag>...` of `text` closed by the earliest of `closes` (ties: the earlier in
    `closes`), searched after the first open tag; None when the open or every close is missing."""
    open_tag = f"<{tag}>"
    start = text.find(open_tag)
    if start == -1:
        return None
    content_start = start + len(open_tag)
    best: tuple[int, int] | None = None
    for close in closes:
        at = text.find(close, content_start)
        if at != -1 and (best is None or at < best[0]):
            best = (at, len(close))
    if best is None:
        return None
    return TagBlock(start, content_start, best[0], best[0] + best[1])


def _first_start_at_or_after(starts: Sequence[int], char: int) -> int:
    """The first token starting at or after character `char` (len(starts) if none)."""
    return next((i for i, s in enumerate(starts) if s >= char), len(starts))


def _token_span(starts: Sequence[int], ends: Sequence[int],
                block: TagBlock | None) -> tuple[int, int] | None:
    """[first, stop) of the tokens overlapping the block's characters [start, end), straddlers
    included; None when there is no block or no such token."""
    if block is None or block.start >= block.end:
        return None
    first = next((i for i, e in enumerate(ends) if e > block.start), None)
    stop = _first_start_at_or_after(starts, block.end)
    if first is None or first >= stop:
        return None
    return first, stop


def _mask(n: int, span: tuple[int, int] | None) -> tuple[bool, ...]:
    """n flags, True on [first, stop) of `span` (none when None)."""
    return tuple(span is not None and span[0] <= i < span[1] for i in range(n))


def _token_after(starts: Sequence[int], block: TagBlock | None) -> int | None:
    """The first token starting at or after the block's end, None when there is no block or no
    such token."""
    if block is None:
        return None
    i = _first_start_at_or_after(starts, block.end)
    return i if i < len(starts) else None


def reply_spans(pieces: Sequence[str]) -> ReplySpans:
    """The token masks, switch decision and low-value position of one reply, given as its tokens
    decoded one at a time (the module docstring gives the rules)."""
    pieces = list(pieces)
    if not all(isinstance(p, str) for p in pieces):
        raise TypeError("pieces must be the reply's tokens decoded one at a time (strs)")
    ends = list(accumulate(len(p) for p in pieces))
    starts = [e - len(p) for e, p in zip(ends, pieces)]
    text = "".join(pieces)
    switch = find_block(text, "switch", SWITCH_CLOSE)
    subgoal = find_block(text, "subgoal", SUBGOAL_CLOSE)
    action = find_block(text, "action", ACTION_CLOSE)

    n = len(pieces)
    action_span = _token_span(starts, ends, action)
    action_mask = _mask(n, action_span) if action_span else (True,) * n
    decision = text[switch.content_start:switch.content_end].strip().upper() if switch else ""
    low = _token_after(starts, subgoal)
    if low is None:
        low = _token_after(starts, switch)
    return ReplySpans(action=action_mask, subgoal=_mask(n, _token_span(starts, ends, subgoal)),
                      switch=_mask(n, _token_span(starts, ends, switch)),
                      new_segment=decision not in ("", KEEP),
                      low_value_index=0 if low is None else low)
