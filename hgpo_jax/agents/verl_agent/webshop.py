"""verl-agent's WebShop prompt and reply projection (the text the paper's WebShop numbers were
produced with; the templates are quoted byte for byte, U+2011 in "e‑commerce" included).

- The task is the instruction (`hgpo_jax.envs.webshop.prompts.task_from_observation`).
- Every observation the prompt shows (the current one and those in the memory) is reduced to
  what follows the instruction, each part quoted (`format_observation`, the env's); the done
  page, which has no instruction, is shown as is.
- The admissible actions (`admissible_actions`, the env's) are listed one per line, each quoted
  and followed by a comma.
- Step 0, or every step when memory_len is 0, uses the template without history; later steps
  the one with the last memory_len (observation, action) turns, unless that prompt exceeds
  13,000 characters, when the one without history is used.
- Projection: ALFWorld's verl-agent rules (`hgpo_jax.agents.verl_agent.projection`) except that
  a reply without both action tags gives its last 20 characters (ALFWorld: 30).
"""

from __future__ import annotations

from collections.abc import Sequence

from hgpo_jax.agents.base import Turn, check_memory_len
from hgpo_jax.agents.verl_agent.alfworld import format_memory
from hgpo_jax.agents.verl_agent.formats import VerlFormat
from hgpo_jax.agents.verl_agent.projection import project_action
from hgpo_jax.envs.webshop.prompts import format_observation

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


def build_prompt(task: str, observation: str, admissible: Sequence[str],
                 history: Sequence[Turn] = (), memory_len: int = 2) -> str:
    """The user message for one step (raw observations in; see the module docstring)."""
    check_memory_len(memory_len)
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


# the env this module serves (gathered by the package: `env_formats()`)
FORMATS = {"webshop": VerlFormat(build_prompt=build_prompt, project=project)}
