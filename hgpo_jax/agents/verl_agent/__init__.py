"""The "verl-agent" agent: the reply format the paper's numbers were produced with.

    agent = get_agent("verl-agent", "webshop", projection="verl-agent")   # hgpo_jax.agents

The model reasons inside <think> </think> and answers inside <action> </action>; the action is
read out by the projection rules (`projection.py`: "verl-agent", the authors', or "strict"), the
memory keeps (observation, action) turns and no plan. Its prompts are the authors' templates,
byte for byte, one per env:

| env | prompt (`prompt`) | projection fallback |
|---|---|---|
| alfworld | `alfworld.build_prompt` (ALFWORLD_INTRO) | last 30 characters |
| toy, toy-history | `alfworld.build_toy_prompt` (TOY_INTRO) | last 30 characters |
| webshop | `webshop.build_prompt` | last 20 characters |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from hgpo_jax.agents.base import Agent, Reply, Turn, check_projection
from hgpo_jax.agents.verl_agent import alfworld, webshop
from hgpo_jax.agents.verl_agent.projection import PROJECTIONS, project_action

NAME = "verl-agent"


@dataclasses.dataclass(frozen=True)
class VerlAgent(Agent):
    """verl-agent's think/action format for one env.

    build_prompt(task, observation, admissible_actions, history, memory_len) -> the user message;
    project(reply, rules) -> (action, valid), rules one of PROJECTIONS; projection: the rules
    used. Picklable (module functions, or partials of them: e.g.
    `functools.partial(alfworld.build_prompt, intro=...)` for an unregistered env)."""

    build_prompt: Callable[..., str] = alfworld.build_prompt
    project: Callable[[str, str], tuple[str, bool]] = project_action
    projection: str = "verl-agent"
    name: str = NAME

    def __post_init__(self):
        check_projection(NAME, self.projection, PROJECTIONS)

    def prompt(self, task: str, observation: str, admissible_actions: Sequence[str],
               history: Sequence[Turn], memory_len: int) -> str:
        return self.build_prompt(task, observation, admissible_actions, history, memory_len)

    def parse(self, reply: str) -> Reply:
        action, valid = self.project(reply, self.projection)
        return Reply(action, valid)

    def scripted_reply(self, action: str) -> str:
        """A short reasoning line, then the action."""
        return f"<think>I will {action}.</think><action>{action}</action>"


def env_formats() -> dict[str, tuple[Callable[..., str], Callable[[str, str], tuple[str, bool]]]]:
    """env name -> (prompt builder, projection) of the verl-agent agent (the module table)."""
    toy = (alfworld.build_toy_prompt, project_action)
    return {"alfworld": (alfworld.build_prompt, project_action), "toy": toy, "toy-history": toy,
            "webshop": (webshop.build_prompt, webshop.project)}


def make_agent(env_name: str, projection: str = "verl-agent") -> VerlAgent:
    """The verl-agent agent of env `env_name` (one of `env_formats()`) under `projection`."""
    formats = env_formats()
    if env_name not in formats:
        raise ValueError(f"agent {NAME!r} has no prompt for env {env_name!r}; it has prompts for "
                         f"{', '.join(formats)}")
    build_prompt, project = formats[env_name]
    return VerlAgent(build_prompt=build_prompt, project=project, projection=projection)


def _agent_specs() -> dict:
    from hgpo_jax.agents.registry import AgentSpec

    return {NAME: AgentSpec(name=NAME, make=make_agent, envs=tuple(env_formats()),
                            projections=PROJECTIONS)}


AGENT_SPECS = _agent_specs()
