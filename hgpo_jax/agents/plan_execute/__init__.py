"""The "plan-execute" agent: HiPER's reply format (the authors' code, `JonP07/HiPER-agent` at
9d3c118, is the reference; where the paper differs, the code wins).

    agent = get_agent("plan-execute", "alfworld")                    # hgpo_jax.agents
    reply = agent.parse("<switch>SWITCH</switch>\\n<subgoal>find the mug</subgoal>\\n"
                        "<action>go to countertop 1</action>")
    # Reply(action="go to countertop 1", valid=True, plan="find the mug")
    fields = agent.describe(model_text)   # {"action", "valid", "switch", "subgoal"}: for display
    spans = reply_spans(pieces)      # the training-side parse of the reply's decoded tokens

Each reply holds three blocks: <switch>KEEP|SWITCH</switch> (keep the current sub-goal or start
a new one), <subgoal>...</subgoal> (the sub-goal to follow next) and <action>...</action> (one
env action); no <think> block. The sub-goal a reply carries (`Reply.plan`, kept in `Turn.plan`)
is the next prompt's current sub-goal.

- Prompts (`prompts.py`): the authors' option templates, byte for byte; the toy envs use
  ALFWorld's with the toy's first sentence.
- `project(reply, env)` (`projection.py`): the reply -> (action sent to the env, sub-goal carried,
  switch label, valid), the authors' `*_projection_options` rules, ALFWorld's for the toy envs.
- `reply_spans(pieces)` (`spans.py`): the token masks of the three blocks, the switch decision
  and the low-level value position that training reads (not the env's projection).

Projection rules: "verl-agent" only, i.e. the authors' (HiPER is a verl-agent fork, and its
rules are what that name means for every agent), so the default `env.projection` serves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from hgpo_jax.agents.base import Agent, Reply, Turn, check_projection
from hgpo_jax.agents.plan_execute.projection import KEEP, SWITCH, project
from hgpo_jax.agents.plan_execute.prompts import (build_alfworld_prompt, build_toy_prompt,
                                                  build_webshop_prompt)
from hgpo_jax.agents.plan_execute.spans import ReplySpans, reply_spans

NAME = "plan-execute"
PROJECTIONS = ("verl-agent",)
# env name -> its prompt builder (the projection rules are `projection.ENV_RULES`')
PROMPTS: dict[str, Callable[..., str]] = {
    "alfworld": build_alfworld_prompt, "toy": build_toy_prompt, "toy-history": build_toy_prompt,
    "toy-lock": build_toy_prompt, "webshop": build_webshop_prompt}

__all__ = ["NAME", "PROJECTIONS", "PROMPTS", "KEEP", "SWITCH", "PlanExecuteAgent", "ReplySpans",
           "make_agent", "project", "reply_spans", "AGENT_SPECS"]


@dataclasses.dataclass(frozen=True)
class PlanExecuteAgent(Agent):
    """HiPER's switch/sub-goal/action format for env `env` (one of PROMPTS), under projection
    rules `projection` (one of PROJECTIONS). Picklable (plain fields)."""

    env: str = "alfworld"
    projection: str = "verl-agent"
    name: str = NAME

    def __post_init__(self):
        if self.env not in PROMPTS:
            raise ValueError(f"agent {NAME!r} has no prompt for env {self.env!r}; it has prompts "
                             f"for {', '.join(PROMPTS)}")
        check_projection(NAME, self.projection, PROJECTIONS)

    def prompt(self, task: str, observation: str, admissible_actions: Sequence[str],
               history: Sequence[Turn], memory_len: int) -> str:
        """The env's template: the first-turn one (current sub-goal "None") with no history or
        memory_len 0, else the one with history, whose current sub-goal is `history[-1].plan`."""
        return PROMPTS[self.env](task, observation, admissible_actions, history, memory_len)

    def parse(self, reply: str) -> Reply:
        """`project`'s action and validity; the sub-goal it carries is the plan."""
        action, subgoal, _, valid = project(reply, self.env)
        return Reply(action, valid, plan=subgoal)

    def describe(self, reply: str) -> dict[str, str]:
        """The default fields, then `project`'s "switch" (SWITCH, KEEP or "" where none was
        read) and "subgoal" (the sub-goal carried to the next prompt)."""
        _, subgoal, switch, _ = project(reply, self.env)
        return {**super().describe(reply), "switch": switch, "subgoal": subgoal}

    def describe_episode(self, replies: Sequence[str]) -> dict[str, str]:
        """"switch turns", the replies whose `project`ed switch is SWITCH, and "segments", the
        turns that start one (turn 0 or SWITCH, as HAE cuts them; HAE reads the switch from the
        reply's tokens, `reply_spans`, which may differ on a malformed switch block)."""
        switches = [project(reply, self.env)[2] for reply in replies]
        starts = sum(1 for t, switch in enumerate(switches) if t == 0 or switch == SWITCH)
        return {"switch turns": str(switches.count(SWITCH)), "segments": str(starts)}

    def scripted_reply(self, action: str) -> str:
        """What SFT teaches for `action`: the format line by line, SWITCH to the sub-goal `action`
        itself (a scripted step knows its action only, not a longer plan, so every step starts a
        one-step sub-goal; KEEP would have to copy a sub-goal the script never stated). `parse`
        reads it back as (action, valid, plan=action) for any action without CJK characters,
        tags or surrounding blanks, lower case (the projection lower-cases the action)."""
        return (f"<switch>{SWITCH}</switch>\n<subgoal>{action}</subgoal>\n"
                f"<action>{action}</action>")


def make_agent(env_name: str, projection: str = "verl-agent") -> PlanExecuteAgent:
    """The plan-execute agent of env `env_name` under `projection`."""
    return PlanExecuteAgent(env=env_name, projection=projection)


def _agent_specs() -> dict:
    from hgpo_jax.agents.registry import AgentSpec

    return {NAME: AgentSpec(name=NAME, make=make_agent, envs=tuple(PROMPTS),
                            projections=PROJECTIONS)}


AGENT_SPECS = _agent_specs()
