"""Scripted toy-env policies shared by tests/test_rollout.py and tests/test_evaluation.py.

`ScriptedToyPolicy` reads the current observation out of each prompt and answers in the policy's
format; `pick_door(doors) -> colour` decides at the junction (doors in the listed order).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from hgpo_jax.rl.rollout import Policy


@dataclasses.dataclass
class Out:
    """What `Policy.generate` returns: token ids and their log-probs per prompt."""

    tokens: list
    logprobs: list


def toy_action(prompt_text: str, pick_door: Callable[[tuple[str, ...]], str]) -> str:
    """The scripted action for a toy prompt's current observation."""
    text = prompt_text.split("current observation is:")[-1]
    if m := re.search(r"room with a (\w+) button", text):
        return f"press {m.group(1)} button"
    if "corridor" in text:
        return "go forward"
    doors = tuple(re.findall(r"(\w+) door", text))
    return f"open {pick_door(doors)} door"


@dataclasses.dataclass
class ScriptedToyPolicy(Policy):
    """Presses the first button, walks, opens `pick_door`'s door; a fixed log-prob per token."""

    pick_door: Callable = lambda doors: doors[0]
    think: str = "ok"
    logprob: float = 0.0
    batch_sizes: list = dataclasses.field(default_factory=list)

    def generate(self, prompts, rng, row_ids=None):
        self.batch_sizes.append(len(prompts))
        tokens = [self.tokenizer.encode(f"<think>{self.think}</think><action>"
                                        f"{toy_action(self.tokenizer.decode(p), self.pick_door)}</action>")
                  for p in prompts]
        return Out(tokens, [[self.logprob] * len(t) for t in tokens])
