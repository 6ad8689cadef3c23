"""The "verl-agent" agent: the reply formats the paper's numbers were produced with.

    agent = get_agent("verl-agent", "webshop", projection="verl-agent")   # hgpo_jax.agents

The think/action envs: the model reasons inside <think> </think> and answers inside
<action> </action>; the action is read out by the projection rules (`projection.py`:
"verl-agent", the authors', or "strict"), the memory keeps (observation, action) turns and no
plan. Search QA: the model reasons inside <think> </think>, then searches inside
<search> </search> or answers inside <answer> </answer> (`search.py`, the authors' rules only).
The prompts are the authors' templates, byte for byte, one per env:

| env | prompt (`prompt`) | projection | SFT reply |
|---|---|---|---|
| alfworld | `alfworld.build_prompt` (ALFWORLD_INTRO) | fallback: last 30 chars | think, `<action>` |
| toy, toy-history | `alfworld.build_toy_prompt` (TOY_INTRO) | fallback: last 30 chars | the same |
| toy-lock | `alfworld.build_lock_prompt` (LOCK_INTRO) | fallback: last 30 chars | the same |
| webshop | `webshop.build_prompt` | fallback: last 20 chars | the same |
| search | `search.prompt_from_turns` | `search.project` ("verl-agent" only) | think, action |

Each format module declares the envs it serves as `FORMATS = {env: VerlFormat(...)}`
(`formats.py`); `FORMAT_MODULES` lists the modules once, so adding an env is a module and a line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from hgpo_jax.agents.base import Agent, Reply, Turn, check_projection
from hgpo_jax.agents.verl_agent import alfworld
from hgpo_jax.agents.verl_agent.formats import VerlFormat, think_action_reply
from hgpo_jax.agents.verl_agent.projection import PROJECTIONS, project_action
from hgpo_jax.declared import gather

NAME = "verl-agent"
FORMAT_MODULES = ("alfworld", "webshop", "search")  # each declares FORMATS = {env: VerlFormat}
GENERIC_ENV = "alfworld"  # its think/action prompt serves an env this agent has no prompt for


@dataclasses.dataclass(frozen=True)
class VerlAgent(Agent):
    """verl-agent's format for one env (think/action, or search QA's think/search/answer).

    build_prompt(task, observation, admissible_actions, history, memory_len) -> the user message;
    project(reply, rules) -> (action, valid), rules one of PROJECTIONS; projection: the rules
    used; script(action) -> the reply SFT teaches (default: think + <action>). Picklable (module
    functions, or partials of them: e.g. `functools.partial(alfworld.build_prompt, intro=...)`
    for an unregistered env)."""

    build_prompt: Callable[..., str] = alfworld.build_prompt
    project: Callable[[str, str], tuple[str, bool]] = project_action
    projection: str = "verl-agent"
    name: str = NAME
    script: Callable[[str], str] = think_action_reply

    def __post_init__(self):
        check_projection(NAME, self.projection, PROJECTIONS)

    def prompt(self, task: str, observation: str, admissible_actions: Sequence[str],
               history: Sequence[Turn], memory_len: int) -> str:
        return self.build_prompt(task, observation, admissible_actions, history, memory_len)

    def parse(self, reply: str) -> Reply:
        action, valid = self.project(reply, self.projection)
        return Reply(action, valid)

    def scripted_reply(self, action: str) -> str:
        """`script(action)`: a short reasoning line, then the action in the env's format."""
        return self.script(action)


def env_formats() -> dict[str, VerlFormat]:
    """env name -> its VerlFormat (prompt builder, projection, SFT reply, projection rules), from
    the `FORMATS` of every module in FORMAT_MODULES, in that order; an env declared twice is an
    error."""
    return gather(tuple(f"{__name__}.{module}" for module in FORMAT_MODULES), "FORMATS",
                  "verl-agent env format")


def make_agent(env_name: str, projection: str = "verl-agent") -> VerlAgent:
    """The verl-agent agent of env `env_name` (one of `env_formats()`) under `projection`, which
    must be one of the rule sets the env's format has (search: "verl-agent" only)."""
    formats = env_formats()
    if env_name not in formats:
        raise ValueError(f"agent {NAME!r} has no prompt for env {env_name!r}; it has prompts for "
                         f"{', '.join(formats)}")
    fmt = formats[env_name]
    check_projection(NAME, projection, PROJECTIONS)
    if projection not in fmt.projections:
        raise ValueError(f"agent {NAME!r} has no projection rules {projection!r} for env "
                         f"{env_name!r}; use one of {', '.join(fmt.projections)} (env.projection)")
    return VerlAgent(build_prompt=fmt.build_prompt, project=fmt.project, projection=projection,
                     script=fmt.script)


def _agent_specs() -> dict:
    from hgpo_jax.agents.registry import AgentSpec

    return {NAME: AgentSpec(name=NAME, make=make_agent, envs=tuple(env_formats()),
                            projections=PROJECTIONS, generic_env=GENERIC_ENV)}


AGENT_SPECS = _agent_specs()
