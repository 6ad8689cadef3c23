"""What WebShop's text observations say, as verl-agent reads them: the task, the page shown to a
policy, the actions the page offers (used by the env, `hgpo_jax.envs.webshop.env`, and by the
agents' WebShop prompts, `hgpo_jax.agents`; envs build no prompts).

- The task is the instruction: the third " [SEP] " part of the first observation.
- A page is shown reduced to what follows the instruction, each part quoted:
  "'Back to Search' [SEP] 'Page 1 ...' ..."; the done page, which has no instruction, is shown
  as is. This reduced text is also the anchor that gigpo/hgpo group steps by.
- The admissible actions are "search[<your query>]" when the page has a search box, then
  "click[x]" for every clickable x.
"""

from __future__ import annotations

SEP = " [SEP] "


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
