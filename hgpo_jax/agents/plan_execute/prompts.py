"""HiPER's plan-execute prompts (the text of the authors' templates, byte for byte, under the
project's own names) and how their placeholders are filled.

Four templates, each a string that begins with one "\\n" and ends with "\\n":

| env | first turn (`current_subgoal` "None") | later turns |
|---|---|---|
| alfworld | ALFWORLD_PLAN_NO_HISTORY | ALFWORLD_PLAN_WITH_HISTORY |
| toy, toy-history, toy-lock | TOY_PLAN_NO_HISTORY | TOY_PLAN_WITH_HISTORY |
| webshop | WEBSHOP_PLAN_NO_HISTORY | WEBSHOP_PLAN_WITH_HISTORY |

The toy envs' templates are ALFWorld's with the first sentence (ALFWORLD_INTRO) replaced by the
toy's (TOY_INTRO), as the toy's verl-agent prompt does: the sentence is the templates' only
mention of ALFRED, so the substitution is clean.

Placeholders (the authors' env managers):
- the current sub-goal is the sub-goal the previous turn's reply carried (`Turn.plan`), whatever
  its validity ("" included); "None" on the first turn. With `memory_len` 0 every turn uses the
  first-turn template with "None" (the authors' `history_length <= 0` branch: no sub-goal is
  carried then);
- the memory lines are verl-agent's (`verl_agent.alfworld.format_memory`: the last `memory_len`
  turns as "[Observation k: '...', Action k: '...']", k from the episode's start; the
  observation shown then, the projected action);
- ALFWorld: raw observations; admissible actions quoted, joined by a newline and one space,
  "help" left out; the task line only in the template with history;
- WebShop: observations reduced to what follows the instruction, each part quoted (the env's
  `format_observation`); admissible actions quoted, each followed by a comma, one per line; a
  prompt with history over 13,000 characters falls back to the first-turn template, which then
  shows the carried sub-goal (not "None").
"""

from __future__ import annotations

from collections.abc import Sequence

from hgpo_jax.agents.base import Turn, check_memory_len
from hgpo_jax.agents.verl_agent.alfworld import (ALFWORLD_INTRO, TOY_INTRO, format_actions,
                                             format_memory)
from hgpo_jax.agents.verl_agent.webshop import MAX_PROMPT_CHARS
from hgpo_jax.envs.webshop.prompts import format_observation

FIRST_SUBGOAL = "None"  # the current sub-goal shown on the first turn

# Text the four templates share (the authors' wording, whitespace exact).
_SUBGOAL_RULE = (
    "You will complete the task by maintaining a SHORT-TERM SUB-GOAL at each step. A sub-goal is "
    "a small high-level objective that can typically be achieved in a few actions. A sub-goal is "
    "NOT the full task and NOT a low-level action.\n"
    "\n"
    "At every step, you reconsider your current sub-goal based on the latest observation, and may "
    "continue it or switch to a new short-term sub-goal.\n"
    "\n")
_THREE_BLOCKS = (
    "At EVERY step, you MUST output EXACTLY THREE blocks, in the order shown below:\n"
    "1) A <switch> block          (KEEP or SWITCH)\n"
    "2) A <subgoal> block         (the sub-goal to follow next)\n"
    "3) An <action> block         (one admissible action)\n"
    "\n")
_STRICT = (
    "STRICT FORMAT REQUIREMENTS:\n"
    "- <switch> MUST contain ONLY \"KEEP\" or \"SWITCH\".\n"
    "- <subgoal> MUST appear at EVERY step:\n")
_ACTION_RULE_AND_FORMAT = (
    "- <action> MUST contain EXACTLY ONE action verbatim copied AS IS from the admissible actions "
    "list.\n"
    "\n"
    "NOW RESPOND IN THIS EXACT FORMAT (no extra text):\n"
    "\n"
    "<switch>KEEP or SWITCH</switch>\n"
    "<subgoal>the sub-goal you will follow next</subgoal>\n"
    "<action>EXACTLY one ADMISSIBLE action</action>\n")
# the rules of the first-turn templates ...
_RULES_NO_HISTORY = (
    _THREE_BLOCKS
    + "NO other text, comments, or reasoning is allowed before, after, or between these blocks.\n"
    "\n"
    + _STRICT
    + "    * If <switch>KEEP</switch>, you MUST copy the EXACT current sub-goal.\n"
    "    * If <switch>SWITCH</switch>, you MUST write a NEW short sub-goal achievable in a few "
    "actions.\n"
    + _ACTION_RULE_AND_FORMAT)
# ... and those of the templates with history
_RULES_WITH_HISTORY = (
    _THREE_BLOCKS
    + "NO other text, comments, or reasoning is permitted anywhere in the output.\n"
    "\n"
    + _STRICT
    + "    * If you KEEP, copy the EXACT current sub-goal into <subgoal>.\n"
    "    * If you SWITCH, write a NEW short sub-goal achievable in a few actions and NOT the "
    "entire task.\n"
    + _ACTION_RULE_AND_FORMAT)

ALFWORLD_PLAN_NO_HISTORY = (
    "\n"
    + ALFWORLD_INTRO + "\n"
    "\n"
    + _SUBGOAL_RULE
    + "Your current observation is:\n"
    "{current_observation}\n"
    "\n"
    "Your current sub-goal is:\n"
    "{current_subgoal}\n"
    "(If this is the first step of the episode, this will be \"None\".)\n"
    "\n"
    "Your admissible actions are:\n"
    "[{admissible_actions}]\n"
    "\n"
    + _RULES_NO_HISTORY)
ALFWORLD_PLAN_WITH_HISTORY = (
    "\n"
    + ALFWORLD_INTRO + "\n"
    "Your overall task is: {task_description}\n"
    "\n"
    + _SUBGOAL_RULE
    + "You have already taken {step_count} step(s).\n"
    "Most recent {history_length} observations and actions:\n"
    "{action_history}\n"
    "\n"
    "Your current observation is:\n"
    "{current_observation}\n"
    "\n"
    "Your current sub-goal is:\n"
    "{current_subgoal}\n"
    "\n"
    "Your admissible actions are:\n"
    "[{admissible_actions}]\n"
    "\n"
    + _RULES_WITH_HISTORY)

_WEBSHOP_INTRO = (
    "\n"
    "You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. "
    "Your task is to: {task_description}.\n"
    "\n"
    + _SUBGOAL_RULE)
_WEBSHOP_SUBGOAL_AND_ACTIONS = (
    "Your current sub-goal is: {current_subgoal}.\n"
    "\n"
    "Your admissible actions of the current situation are: \n"  # one space before the newline
    "[\n"
    "{available_actions}\n"
    "].\n"
    "\n")
WEBSHOP_PLAN_NO_HISTORY = (
    _WEBSHOP_INTRO
    + "Your current observation is: {current_observation}.\n"
    "\n"
    + _WEBSHOP_SUBGOAL_AND_ACTIONS
    + _RULES_NO_HISTORY)
WEBSHOP_PLAN_WITH_HISTORY = (
    _WEBSHOP_INTRO
    + "You have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: "
    "{current_observation}.\n"
    "\n"
    + _WEBSHOP_SUBGOAL_AND_ACTIONS
    + _RULES_WITH_HISTORY)


def _with_intro(template: str, intro: str) -> str:
    """`template` with its first sentence ALFWORLD_INTRO (present exactly once) replaced by
    `intro`."""
    if template.count(ALFWORLD_INTRO) != 1:
        raise ValueError("the template must hold ALFWORLD_INTRO exactly once")
    return template.replace(ALFWORLD_INTRO, intro)


TOY_PLAN_NO_HISTORY = _with_intro(ALFWORLD_PLAN_NO_HISTORY, TOY_INTRO)
TOY_PLAN_WITH_HISTORY = _with_intro(ALFWORLD_PLAN_WITH_HISTORY, TOY_INTRO)


def current_subgoal(history: Sequence[Turn]) -> str:
    """The sub-goal shown as current: the last turn's plan; "None" when there is no turn yet."""
    return history[-1].plan if history else FIRST_SUBGOAL


def build_alfworld_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                          history: Sequence[Turn] = (), memory_len: int = 2, *,
                          templates: tuple[str, str] = (ALFWORLD_PLAN_NO_HISTORY,
                                                        ALFWORLD_PLAN_WITH_HISTORY)) -> str:
    """The user message of one ALFWorld step; `templates`: (first turn, with history), ALFWorld's
    unless given (the toy envs pass theirs). task: shown by the template with history only (on
    the first turn it is part of ALFWorld's observation); history: every past turn."""
    check_memory_len(memory_len)
    no_history, with_history = templates
    actions = format_actions(admissible_actions)
    if not history or memory_len == 0:
        return no_history.format(current_observation=observation, current_subgoal=FIRST_SUBGOAL,
                                 admissible_actions=actions)
    memory, shown = format_memory(history, memory_len)
    return with_history.format(
        task_description=task, step_count=len(history), history_length=shown,
        action_history=memory, current_observation=observation,
        current_subgoal=current_subgoal(history), admissible_actions=actions)


def build_toy_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                     history: Sequence[Turn] = (), memory_len: int = 2) -> str:
    """`build_alfworld_prompt` with the toy's templates (first sentence TOY_INTRO)."""
    return build_alfworld_prompt(task, observation, admissible_actions, history, memory_len,
                                 templates=(TOY_PLAN_NO_HISTORY, TOY_PLAN_WITH_HISTORY))


def build_webshop_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                         history: Sequence[Turn] = (), memory_len: int = 2) -> str:
    """The user message of one WebShop step (raw observations in; the module docstring says how
    they are shown)."""
    check_memory_len(memory_len)
    actions = "\n".join(f"'{a}'," for a in admissible_actions)
    current = format_observation(observation, task)
    if not history or memory_len == 0:
        return WEBSHOP_PLAN_NO_HISTORY.format(
            task_description=task, current_observation=current, current_subgoal=FIRST_SUBGOAL,
            available_actions=actions)
    subgoal = current_subgoal(history)
    shown = [Turn(format_observation(t.observation, task), t.action) for t in history]
    memory, valid = format_memory(shown, memory_len)
    prompt = WEBSHOP_PLAN_WITH_HISTORY.format(
        task_description=task, step_count=len(history), history_length=valid,
        action_history=memory, current_step=len(history) + 1, current_observation=current,
        current_subgoal=subgoal, available_actions=actions)
    if len(prompt) > MAX_PROMPT_CHARS:
        return WEBSHOP_PLAN_NO_HISTORY.format(
            task_description=task, current_observation=current, current_subgoal=subgoal,
            available_actions=actions)
    return prompt
