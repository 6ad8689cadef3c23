"""verl-agent's WebShop prompt and reply projection (the text the paper's WebShop numbers were
produced with; the templates are quoted byte for byte, U+2011 in "e‑commerce" included).

- The task is the instruction: the third " [SEP] " part of the first observation.
- Every observation the prompt shows (the current one and those in the memory) is reduced to
  what follows the instruction, each part quoted: "'Back to Search' [SEP] 'Page 1 ...' ...";
  the done page, which has no instruction, is shown as is. This reduced text is also the
  anchor that gigpo/hgpo group steps by.
- The admissible actions are "search[<your query>]" when the page has a search box, then
  "click[x]" for every clickable x, one per line, each quoted and followed by a comma.
- Step 0, or every step when memory_len is 0, uses the template without history; later steps
  the one with the last memory_len (observation, action) turns, unless that prompt exceeds
  13,000 characters, when the one without history is used.
- Projection: ALFWorld's verl-agent rules (`hgpo_jax.envs.prompts.project_action`) except that a
  reply without both action tags gives its last 20 characters (ALFWorld: 30).
"""

from __future__ import annotations

from collections.abc import Sequence

from hgpo_jax.envs.prompts import Turn, format_memory, project_action

SEP = " [SEP] "
FALLBACK_CHARS = 20
MAX_PROMPT_CHARS = 13000  # a longer prompt with history falls back to the one without

_INSTRUCTIONS = (
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully "
    "which admissible action best advances the shopping goal. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags.\n")
TEMPLATE_NO_HISTORY = (
    "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment. \n"
    "Your task is to: {task_description}.\n"
    "Your current observation is: {current_observation}.\n"
    "Your admissible actions of the current situation are: \n[\n{available_actions}\n].\n\n"
    + _INSTRUCTIONS)
TEMPLATE_WITH_HISTORY = (
    "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment.\n"
    "Your task is to: {task_description}.\n"
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}.\n"
    "Your admissible actions of the current situation are: \n[\n{available_actions}\n].\n\n"
    + _INSTRUCTIONS)


def task_from_observation(observation: str) -> str:
    """The instruction of a search or results page (its third " [SEP] " part)."""
    parts = observation.split(SEP)
    if len(parts) < 3 or parts[1] != "Instruction:":
        raise ValueError(f"not a WebShop page with an instruction: {observation[:120]!r}")
    return parts[2]


def format_observation(observation: str, task: str) -> str:
    """What follows the instruction, each part quoted; the observation as is when it holds no
    part equal to the instruction (the done page)."""
    parts = observation.split(SEP)
    if task not in parts:
        return observation
    return SEP.join(f"'{p}'" for p in parts[parts.index(task) + 1:])


def admissible_actions(available: dict) -> list[str]:
    """{'has_search_bar', 'clickables'} -> the action strings the prompt lists."""
    unknown = set(available) - {"has_search_bar", "clickables"}
    if unknown:
        raise ValueError(f"unknown keys in WebShop available actions: {sorted(unknown)}")
    return (["search[<your query>]"] if available["has_search_bar"] else []) + \
        [f"click[{c}]" for c in available["clickables"]]


def build_prompt(task: str, observation: str, admissible: Sequence[str],
                 history: Sequence[Turn] = (), memory_len: int = 2) -> str:
    """The user message for one step (raw observations in; see the module docstring)."""
    if memory_len < 0:
        raise ValueError(f"memory_len must be >= 0, got {memory_len}")
    actions = "\n".join(f"'{a}'," for a in admissible)
    current = format_observation(observation, task)
    no_history = TEMPLATE_NO_HISTORY.format(task_description=task, current_observation=current,
                                            available_actions=actions)
    if not history or memory_len == 0:
        return no_history
    shown = [Turn(format_observation(t.observation, task), t.action) for t in history]
    memory, valid = format_memory(shown, memory_len)
    prompt = TEMPLATE_WITH_HISTORY.format(
        task_description=task, step_count=len(history), history_length=valid,
        action_history=memory, current_step=len(history) + 1, current_observation=current,
        available_actions=actions)
    return no_history if len(prompt) > MAX_PROMPT_CHARS else prompt


def project(reply: str, rules: str = "verl-agent") -> tuple[str, bool]:
    """Model reply -> (action, valid): verl-agent's WebShop rules (20-character fallback)."""
    return project_action(reply, rules, fallback_chars=FALLBACK_CHARS)
