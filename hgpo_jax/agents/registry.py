"""The agents by name: which reply formats exist, for which envs, under which projection rules.

    agent = get_agent("verl-agent", "alfworld", projection="strict")   # an hgpo_jax.agents.Agent
    agent_names()                      # ("verl-agent", ...): `agent.name` values
    projection_names("verl-agent")     # ("verl-agent", "strict"): its `env.projection` values

Each agent declares itself in its own module as `AGENT_SPECS = {name: AgentSpec}`; the modules
are listed once in `PROVIDERS` (imported on first use), as envs are in `hgpo_jax.envs.registry`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import lru_cache

from hgpo_jax.agents.base import Agent
from hgpo_jax.declared import gather, lookup

PROVIDERS = ("hgpo_jax.agents.verl_agent", "hgpo_jax.agents.plan_execute")
DEFAULT_AGENT = "verl-agent"


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    """What the registry knows of one agent.

    make(env_name, projection) -> the Agent for that env; envs: the env names it has a prompt
    for; projections: the reply rules it accepts (`env.projection`), the first the default;
    generic_env: the env (one of `envs`) whose prompt it uses for an env it has none for (a
    rollout of an unregistered env given no agent); None: it has no such prompt.
    """

    name: str
    make: Callable[[str, str], Agent]
    envs: tuple[str, ...]
    projections: tuple[str, ...]
    generic_env: str | None = None


@lru_cache(maxsize=1)
def _specs() -> dict[str, AgentSpec]:
    return gather(PROVIDERS, "AGENT_SPECS", "agent")


def agent_names() -> tuple[str, ...]:
    """The names of every registered agent."""
    return tuple(_specs())


def agent_spec(name: str) -> AgentSpec:
    """The registry entry of agent `name`; a clear error naming the known ones otherwise."""
    return lookup(_specs(), name, "agent")


def projection_names(name: str | None = None) -> tuple[str, ...]:
    """The projection rules agent `name` accepts; None: those any agent accepts (first seen
    first)."""
    if name is not None:
        return agent_spec(name).projections
    return tuple(dict.fromkeys(p for spec in _specs().values() for p in spec.projections))


def get_agent(name: str, env_name: str, *, projection: str = "verl-agent") -> Agent:
    """Agent `name` for env `env_name` under `projection`; an error naming the known agents, the
    envs the agent has prompts for, or the projections it accepts."""
    spec = agent_spec(name)
    if env_name not in spec.envs:
        raise ValueError(f"agent {name!r} has no prompt for env {env_name!r}; it has prompts for "
                         f"{', '.join(spec.envs)} (agent.name, env.name)")
    if projection not in spec.projections:
        raise ValueError(f"agent {name!r} has no projection rules {projection!r}; use one of "
                         f"{', '.join(spec.projections)} (env.projection)")
    return spec.make(env_name, projection)
