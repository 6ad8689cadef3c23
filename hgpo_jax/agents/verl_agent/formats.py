"""What one env's verl-agent format is made of, as the format modules declare it.

Each format module (`alfworld.py`, `webshop.py`, `search.py`) holds
`FORMATS = {env name: VerlFormat(...)}`; the package gathers them (`env_formats()`), so an env's
prompt, projection and SFT reply are named in its own module and nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hgpo_jax.agents.verl_agent.projection import PROJECTIONS, project_action


def think_action_reply(action: str) -> str:
    """The think/action envs' SFT reply for `action`: a short reasoning line, then the action in
    <action> </action> (read back as `action`, valid, by `project_action` for a lower-case action
    without tags or surrounding blanks)."""
    return f"<think>I will {action}.</think><action>{action}</action>"


@dataclasses.dataclass(frozen=True)
class VerlFormat:
    """One env's verl-agent format.

    build_prompt(task, observation, admissible_actions, history, memory_len) -> the user message;
    project(reply, rules) -> (action, valid); script(action) -> the reply SFT teaches for
    `action`; projections: the rule sets (`env.projection`) this env's projection implements, a
    subset of PROJECTIONS (an env whose authors had one rule set only has just "verl-agent")."""

    build_prompt: Callable[..., str]
    project: Callable[[str, str], tuple[str, bool]] = project_action
    script: Callable[[str], str] = think_action_reply
    projections: tuple[str, ...] = PROJECTIONS

    def __post_init__(self):
        unknown = [p for p in self.projections if p not in PROJECTIONS]
        if not self.projections or unknown:
            raise ValueError(f"a verl-agent format's projections must be a non-empty subset of "
                             f"{PROJECTIONS}; got {self.projections}")
