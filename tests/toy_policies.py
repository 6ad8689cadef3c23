"""Scripted toy-env policies shared by tests/test_rollout.py and tests/test_evaluation.py,
`ReplayPolicy` (fixed replies through a one-token-per-character tokenizer; tests/test_rollout.py,
tests/test_agents.py), and `RecordingPool`, an in-process stand-in for EnvPool over toy envs
(tests/test_rollout.py, tests/test_start_checks.py, tests/test_agents.py).

`ScriptedToyPolicy` reads the current observation out of each prompt and answers in the policy's
format; `pick_door(doors) -> colour` decides at the junction (doors in the listed order).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

from hgpo_jax.envs.pool import EnvReply
from hgpo_jax.envs.toy import ToyMemoryEnv
from hgpo_jax.rl.policy import Policy


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


class CharTokenizer:
    """One token per character, so prompts decode back to their exact text."""

    eos_token_ids = ()

    def decode(self, ids):
        return "".join(map(chr, ids))


@dataclasses.dataclass
class ReplayPolicy:
    """Gives the same scripted reply to every env at step t; records the prompt texts."""

    replies: list
    tokenizer: CharTokenizer = dataclasses.field(default_factory=CharTokenizer)
    prompts: list = dataclasses.field(default_factory=list)

    def encode_prompt(self, text):
        self.prompts.append(text)
        return [ord(c) for c in text]

    def generate(self, prompts, rng, row_ids=None):
        reply = self.replies[len(self.prompts) // len(prompts) - 1]
        tokens = [[ord(c) for c in reply] for _ in prompts]
        return Out(tokens, [[-0.5] * len(t) for t in tokens])


class RecordingPool:
    """In-process stand-in for EnvPool over toy envs; records the action strings each env gets."""

    def __init__(self, num_envs, max_steps=50):
        self.envs = [ToyMemoryEnv(max_steps=max_steps) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.received = [[] for _ in range(num_envs)]

    def reset(self, tasks):
        replies = []
        for env, task in zip(self.envs, tasks):
            obs, info = env.reset(task)
            replies.append(EnvReply(obs, 0.0, False, info))
        return replies

    def step(self, actions):
        out = {}
        for i, action in actions.items():
            self.received[i].append(action)
            out[i] = EnvReply(*self.envs[i].step(action))
        return out
