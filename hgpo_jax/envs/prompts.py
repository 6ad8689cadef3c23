"""Agent prompts, action projection and episode metrics (host code; no env or model state).

Prompt: verl-agent's ALFWorld prompt, byte for byte (the text the paper's numbers were produced
with). Step 0, or every step when `memory_len` is 0, uses the template without history (the
current observation and the admissible actions; the task is part of ALFWorld's first
observation). Later steps use the template with history: the task, the number of steps taken, the
last `memory_len` (observation, action) turns, the step number and the current observation. Both
ask for reasoning inside <think> </think> and the answer inside <action> </action>.

Projection (`project_action`): "verl-agent" (default) reproduces the authors' rules: the text
between the first "<action>" and the first "</action>" of the lower-cased reply (no tag: the last
30 characters, invalid); a reply lacking "<think>" or "</think>", or holding a CJK character, is
invalid too. "strict" is this project's earlier rule (last well-formed tag, whitespace collapsed,
empty tag or over-long reply invalid). Validity is reported, not turned into reward here: the
invalid-action penalty belongs to the advantage computation.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Sequence

PROJECTIONS = ("verl-agent", "strict")
MAX_REPLY_CHARS = 4096  # "strict" rules only: longer replies are invalid

ALFWORLD_INTRO = "You are an expert agent operating in the ALFRED Embodied Environment."
SYSTEM_INTRO = ALFWORLD_INTRO  # older name, kept for importers

_INSTRUCTIONS = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags.\n")
# `{intro}` is the first sentence (ALFWORLD_INTRO for ALFWorld); the rest is the authors' text.
TEMPLATE_NO_HISTORY = (
    "\n{intro}\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    + _INSTRUCTIONS)
TEMPLATE_WITH_HISTORY = (
    "\n{intro} Your task is to: {task_description}\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    + _INSTRUCTIONS)

_TASK_MARKER = "Your task is to: "
_STRICT_ACTION = re.compile(r"<action>(.*?)</action>", re.S | re.I)
_CJK = re.compile("[\u4e00-\u9fff]")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One past step of an episode, as the memory shows it: the observation shown at that step
    and the (projected) action taken."""

    observation: str
    action: str


def task_from_observation(observation: str) -> str:
    """Everything after the first "Your task is to: " of an observation, stripped ('' if absent)."""
    at = observation.find(_TASK_MARKER)
    return observation[at + len(_TASK_MARKER):].strip() if at != -1 else ""


def format_memory(history: Sequence[Turn], memory_len: int) -> tuple[str, int]:
    """(the last `memory_len` turns as "[Observation n: '...', Action n: '...']" lines numbered
    from the episode's start, how many are shown): verl-agent's memory text."""
    recent = list(history)[-memory_len:] if memory_len > 0 else []
    first = len(history) - len(recent) + 1
    text = "\n".join(f"[Observation {first + i}: '{t.observation}', Action {first + i}: "
                     f"'{t.action}']" for i, t in enumerate(recent))
    return text, len(recent)


def build_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                 history: Sequence[Turn] = (), memory_len: int = 2, *,
                 intro: str = ALFWORLD_INTRO) -> str:
    """The user message for one step.

    task: the episode's goal (shown by the history template only); observation: the current
    observation, raw; history: all past turns of the episode (the last `memory_len` are shown;
    with no history, or memory_len 0, the template without history is used). 'help' is left out
    of the admissible actions.
    """
    if memory_len < 0:
        raise ValueError(f"memory_len must be >= 0, got {memory_len}")
    actions = "\n ".join(f"'{a}'" for a in admissible_actions if a != "help")
    if not history or memory_len == 0:
        return TEMPLATE_NO_HISTORY.format(intro=intro, current_observation=observation,
                                          admissible_actions=actions)
    memory, shown = format_memory(history, memory_len)
    return TEMPLATE_WITH_HISTORY.format(
        intro=intro, task_description=task, step_count=len(history),
        history_length=shown, action_history=memory, current_step=len(history) + 1,
        current_observation=observation, admissible_actions=actions)


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


def success_rates(task_types: Sequence[str], won: Sequence[bool]) -> dict[str, float]:
    """Episode success overall and per task type: {'all': r, 'pick_and_place_simple': r, ...}."""
    if len(task_types) != len(won):
        raise ValueError(f"{len(task_types)} task types but {len(won)} outcomes")
    by_type = defaultdict(list)
    for t, w in zip(task_types, won):
        by_type[t].append(bool(w))
    rates = {t: sum(v) / len(v) for t, v in sorted(by_type.items())}
    rates["all"] = sum(map(bool, won)) / len(won) if len(won) else 0.0
    return rates
