"""What an agent is: the text side of a policy, between an env and a language model.

An env gives observations, admissible actions and rewards; the model reads and writes text. The
agent turns one into the other:

    text = agent.prompt(task, observation, admissible_actions, history, memory_len)  # user message
    reply = agent.parse(model_reply)            # Reply(action sent to the env, valid, plan carried)
    history.append(agent.remember(observation, reply))                # Turn kept by the memory
    target = agent.scripted_reply(action)       # the reply an SFT sample teaches for `action`
    fields = agent.describe(model_reply)        # {"action": ..., "valid": ...} for display
    totals = agent.describe_episode(replies)    # an episode's totals for display ({} by default)

It owns the prompt template, the reply format (what is sent to the env, what is carried to the
next prompt, whether the reply is well-formed) and what the memory keeps of past turns. It knows
nothing of rewards, tokenizers or training: validity is reported, the invalid-action penalty is
the advantage computation's business. Agents are looked up by name and env in
`hgpo_jax.agents.registry`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Turn:
    """One past step of an episode as the memory shows it: the observation shown at that step,
    the action sent to the env (the parsed one), and `plan`, the sub-goal a plan-execute agent
    carried ("" for agents without one)."""

    observation: str
    action: str
    plan: str = ""


@dataclasses.dataclass(frozen=True)
class Reply:
    """The parse of one model reply: `action`, the text sent to the env (valid or not);
    `valid`, whether the reply kept the agent's format; `plan`, what the reply carries to the
    next prompt (a plan-execute agent's sub-goal; "" otherwise)."""

    action: str
    valid: bool
    plan: str = ""


class Agent(abc.ABC):
    """A reply format and its prompt, for one env. Subclasses set `name` (the registry's name)."""

    name: str = ""

    @abc.abstractmethod
    def prompt(self, task: str, observation: str, admissible_actions: Sequence[str],
               history: Sequence[Turn], memory_len: int) -> str:
        """The user message of one step. task: the episode's goal text; observation: the current
        one, raw; admissible_actions: what the env accepts now; history: every past turn of the
        episode (`remember`'s), of which the prompt shows the last `memory_len`."""

    @abc.abstractmethod
    def parse(self, reply: str) -> Reply:
        """A model reply (any object: a non-str reply is invalid) -> its Reply."""

    def remember(self, observation: str, reply: Reply) -> Turn:
        """What the memory keeps of a step: the observation shown, the action sent and the plan
        carried."""
        return Turn(observation, reply.action, reply.plan)

    def describe(self, reply: str) -> dict[str, str]:
        """A model reply's parse as display fields, name -> text (`hgpo-jax demo --episode`
        prints them, in order): "action", the text sent to the env, and "valid", "True" or
        "False". An agent whose format holds more adds its own fields after these (the
        plan-execute agent: "switch" and "subgoal")."""
        parsed = self.parse(reply)
        return {"action": parsed.action, "valid": str(parsed.valid)}

    def describe_episode(self, replies: Sequence[str]) -> dict[str, str]:
        """An episode's model replies [turns], in order, as display totals, name -> text
        (`hgpo-jax demo --episode` prints them after the reward): none by default; the
        plan-execute agent counts its SWITCH turns and segments."""
        return {}

    @abc.abstractmethod
    def scripted_reply(self, action: str) -> str:
        """The reply an SFT sample teaches for a scripted policy's `action`: a valid reply (under
        `parse`) that sends `action`."""


def check_memory_len(memory_len: int) -> None:
    """A prompt's memory window (the last `memory_len` turns shown) must be >= 0; else a
    ValueError."""
    if memory_len < 0:
        raise ValueError(f"memory_len must be >= 0, got {memory_len}")


def check_projection(agent: str, projection: str, allowed: Sequence[str]) -> None:
    """An agent's projection rules must be one it has (`allowed`); else a ValueError naming them."""
    if projection not in allowed:
        raise ValueError(f"unknown projection rules {projection!r} for agent {agent!r}; "
                         f"use one of {', '.join(allowed)}")
