"""verl-agent's reply projection: model reply -> (action, valid), under one of two rule sets.

"verl-agent" (default) reproduces the authors' rules: the text between the first "<action>" and
the first "</action>" of the lower-cased reply (no tag: the last `fallback_chars` characters,
invalid; ALFWorld 30, WebShop 20); a reply lacking "<think>" or "</think>", or holding a CJK
character, is invalid too. "strict" is this project's earlier rule (last well-formed tag,
whitespace collapsed, empty tag or over-long reply invalid). Validity is reported, not turned
into reward here: the invalid-action penalty belongs to the advantage computation.
"""

from __future__ import annotations

import re

PROJECTIONS = ("verl-agent", "strict")
MAX_REPLY_CHARS = 4096  # "strict" rules only: longer replies are invalid

_STRICT_ACTION = re.compile(r"<action>(.*?)</action>", re.S | re.I)
_CJK = re.compile("[\u4e00-\u9fff]")


def project_action(reply: str, rules: str = "verl-agent", *, fallback_chars: int = 30,
                   max_reply_chars: int = MAX_REPLY_CHARS) -> tuple[str, bool]:
    """Model reply -> (action, valid) under `rules` (one of PROJECTIONS).

    "verl-agent": on the lower-cased reply, the stripped text between the first "<action>" and
    the first "</action>" (an empty tag is valid); without both tags, the last `fallback_chars`
    characters (ALFWorld 30, WebShop 20), invalid. Also invalid (the action is kept): no "<think>" or no "</think>" in the reply as
    written (case-sensitive), or any character in U+4E00..U+9FFF.
    "strict": the last <action>...</action> pair, lower-cased, whitespace collapsed; no tag, an
    empty tag or a reply over `max_reply_chars` gives ('', False).
    A non-str reply gives ('', False) under both.
    """
    if rules not in PROJECTIONS:
        raise ValueError(f"unknown projection rules {rules!r}; use one of {PROJECTIONS}")
    if not isinstance(reply, str):
        return "", False
    if rules == "strict":
        return _project_strict(reply, max_reply_chars)
    lower = reply.lower()
    start, end = lower.find("<action>"), lower.find("</action>")
    if start == -1 or end == -1:
        action, valid = lower[-fallback_chars:], False
    else:
        action, valid = lower[start + len("<action>"):end].strip(), True
    if reply.find("<think>") == -1 or reply.find("</think>") == -1:
        valid = False
    if _CJK.search(reply):
        valid = False
    return action, valid


def _project_strict(reply: str, max_reply_chars: int) -> tuple[str, bool]:
    if len(reply) > max_reply_chars:
        return "", False
    matches = _STRICT_ACTION.findall(reply)
    if not matches:
        return "", False
    action = " ".join(matches[-1].lower().split())
    return action, bool(action)
