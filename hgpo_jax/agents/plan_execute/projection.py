"""HiPER's reply projection: one model reply -> (action sent to the env, sub-goal carried to the
next prompt, the env's switch label, valid), the authors' `*_projection_options` rules.

Tags are found with `str.find` (the first occurrence); the action is read from the lower-cased
reply, the switch and the sub-goal from the reply as written (their tags are case-sensitive).

Row by row (reply -> action; sub-goal; switch; valid):
- no "<action>" or no "</action>" -> the lower-cased reply's last 30 characters (WebShop 20);
  ""; ""; invalid. Nothing else is read.
- otherwise the action is the stripped text between the two action tags, and:
  - no "<switch>" or no "</switch>" -> sub-goal: ALFWorld the action's last 30 characters,
    WebShop "None"; switch ""; invalid;
  - the switch text, stripped and upper-cased, neither SWITCH nor KEEP -> sub-goal ""; switch:
    ALFWorld "", WebShop "KEEP"; invalid;
  - switch read, no "<subgoal>" or no "</subgoal>" -> sub-goal ""; switch SWITCH / KEEP; invalid;
  - all three read -> the stripped sub-goal text (case kept); SWITCH / KEEP; valid.

A reply whose action was read is also invalid when it holds a CJK character (U+4E00..U+9FFF).
A closing tag before its opening tag still counts as found: the text between is then empty
(an empty action or sub-goal, valid; an empty switch text, invalid). Admissibility is not
checked. The env's switch label is for memory and logging only; training reads the switch from
the reply's tokens (`spans.reply_spans`).
"""

from __future__ import annotations

import re

ALFWORLD_RULES = "alfworld"
WEBSHOP_RULES = "webshop"
# env name -> the rules it follows (the toy envs follow ALFWorld's)
ENV_RULES = {"alfworld": ALFWORLD_RULES, "toy": ALFWORLD_RULES, "toy-history": ALFWORLD_RULES,
             "toy-lock": ALFWORLD_RULES, "webshop": WEBSHOP_RULES}
FALLBACK_CHARS = {ALFWORLD_RULES: 30, WEBSHOP_RULES: 20}
SWITCH, KEEP = "SWITCH", "KEEP"

_CJK = re.compile("[\u4e00-\u9fff]")


def rules_of(env: str) -> str:
    """The projection rules of env `env` ("alfworld" or "webshop"); an error for another env."""
    if env not in ENV_RULES:
        raise ValueError(f"the plan-execute projection has no rules for env {env!r}; it has rules "
                         f"for {', '.join(ENV_RULES)}")
    return ENV_RULES[env]


def _between(text: str, open_tag: str, close_tag: str) -> str | None:
    """The text between the first `open_tag` and the first `close_tag` (both searched from the
    start; "" when the close tag comes first); None when either is missing."""
    start, end = text.find(open_tag), text.find(close_tag)
    if start == -1 or end == -1:
        return None
    return text[start + len(open_tag):end]


def project(reply: str, env: str) -> tuple[str, str, str, bool]:
    """One model reply -> (action, subgoal, switch, valid) under env `env`'s rules (the module
    docstring's table); a non-str reply gives ("", "", "", False)."""
    rules = rules_of(env)
    if not isinstance(reply, str):
        return "", "", "", False
    lower = reply.lower()
    action = _between(lower, "<action>", "</action>")
    if action is None:
        return lower[-FALLBACK_CHARS[rules]:], "", "", False
    action = action.strip()
    subgoal, switch, valid = "", "", True
    switch_text = _between(reply, "<switch>", "</switch>")
    if switch_text is None:
        subgoal = action[-FALLBACK_CHARS[rules]:] if rules == ALFWORLD_RULES else "None"
        valid = False
    elif switch_text.strip().upper() not in (SWITCH, KEEP):
        switch = KEEP if rules == WEBSHOP_RULES else ""
        valid = False
    else:
        switch = switch_text.strip().upper()
        subgoal_text = _between(reply, "<subgoal>", "</subgoal>")
        if subgoal_text is None:
            valid = False
        else:
            subgoal = subgoal_text.strip()
    if _CJK.search(reply):
        valid = False
    return action, subgoal, switch, valid
