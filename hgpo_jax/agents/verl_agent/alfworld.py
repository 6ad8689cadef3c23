"""verl-agent's ALFWorld prompt, byte for byte (the text the paper's numbers were produced with),
and the toy envs' variant of it.

Step 0, or every step when `memory_len` is 0, uses the template without history (the current
observation and the admissible actions; the task is part of ALFWorld's first observation). Later
steps use the template with history: the task, the number of steps taken, the last `memory_len`
(observation, action) turns, the step number and the current observation. Both ask for reasoning
inside <think> </think> and the answer inside <action> </action>. The first sentence is `intro`:
ALFWORLD_INTRO for ALFWorld, TOY_INTRO for the toy envs (`hgpo_jax.envs.toy`), LOCK_INTRO for
the toy lock (`toy-lock`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hgpo_jax.agents.base import Turn, check_memory_len
from hgpo_jax.agents.verl_agent.formats import VerlFormat

ALFWORLD_INTRO = "You are an expert agent operating in the ALFRED Embodied Environment."
SYSTEM_INTRO = ALFWORLD_INTRO  # older name, kept for importers
TOY_INTRO = "You are an agent in a small text world."  # the toy envs' first sentence
LOCK_INTRO = ("You are opening a lock of several stages; at each stage, turn the dial to the "
              "colour the next pin is marked with.")  # toy-lock's first sentence

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


def format_memory(history: Sequence[Turn], memory_len: int) -> tuple[str, int]:
    """(the last `memory_len` turns as "[Observation n: '...', Action n: '...']" lines numbered
    from the episode's start, how many are shown): verl-agent's memory text."""
    recent = list(history)[-memory_len:] if memory_len > 0 else []
    first = len(history) - len(recent) + 1
    text = "\n".join(f"[Observation {first + i}: '{t.observation}', Action {first + i}: "
                     f"'{t.action}']" for i, t in enumerate(recent))
    return text, len(recent)


def format_actions(admissible_actions: Sequence[str]) -> str:
    """The authors' ALFWorld list of admissible actions: each quoted, newline + one space between,
    'help' left out."""
    return "\n ".join(f"'{a}'" for a in admissible_actions if a != "help")


def build_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                 history: Sequence[Turn] = (), memory_len: int = 2, *,
                 intro: str = ALFWORLD_INTRO) -> str:
    """The user message for one step.

    task: the episode's goal (shown by the history template only); observation: the current
    observation, raw; history: all past turns of the episode (the last `memory_len` are shown;
    with no history, or memory_len 0, the template without history is used). 'help' is left out
    of the admissible actions.
    """
    check_memory_len(memory_len)
    actions = format_actions(admissible_actions)
    if not history or memory_len == 0:
        return TEMPLATE_NO_HISTORY.format(intro=intro, current_observation=observation,
                                          admissible_actions=actions)
    memory, shown = format_memory(history, memory_len)
    return TEMPLATE_WITH_HISTORY.format(
        intro=intro, task_description=task, step_count=len(history),
        history_length=shown, action_history=memory, current_step=len(history) + 1,
        current_observation=observation, admissible_actions=actions)


def build_toy_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                     history: Sequence[Turn] = (), memory_len: int = 2) -> str:
    """`build_prompt` with TOY_INTRO as its first sentence: the toy envs' prompt."""
    return build_prompt(task, observation, admissible_actions, history, memory_len,
                        intro=TOY_INTRO)


def build_lock_prompt(task: str, observation: str, admissible_actions: Sequence[str],
                      history: Sequence[Turn] = (), memory_len: int = 2) -> str:
    """`build_prompt` with LOCK_INTRO as its first sentence: the toy lock's prompt."""
    return build_prompt(task, observation, admissible_actions, history, memory_len,
                        intro=LOCK_INTRO)


# the envs this module serves (gathered by the package: `env_formats()`)
_TOY = VerlFormat(build_prompt=build_toy_prompt)
FORMATS = {"alfworld": VerlFormat(build_prompt=build_prompt), "toy": _TOY, "toy-history": _TOY,
           "toy-lock": VerlFormat(build_prompt=build_lock_prompt)}
