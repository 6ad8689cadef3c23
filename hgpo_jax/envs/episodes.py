"""Recorded episodes: what an env showed at each step and what a scripted policy did.

    ep = play_episode(env, task, choose, max_steps=15, score_key="task_score")
    save_episodes([ep], path); load_episodes(path)

Each env records its own scripted policies' episodes (its registry entry's `record_episodes`,
e.g. ALFWorld's walkthroughs, WebShop's shoppers); the supervised data (`hgpo_jax.sft.data`)
turns them into prompt/response turns. Nothing here knows about training.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import numpy as np

from hgpo_jax.metrics import write_atomically


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a recorded episode: what the env showed and what was done."""

    observation: str
    admissible: tuple[str, ...]
    action: str


@dataclasses.dataclass(frozen=True)
class Episode:
    """A recorded episode. task: the text the prompts show as the task; source: where it came
    from (e.g. 'toy:3', 'alfworld:<game path>'); score: the env's episode score where it has one
    (e.g. WebShop's task score of the purchase; None otherwise)."""

    task: str
    steps: tuple[Step, ...]
    won: bool
    source: str
    score: float | None = None


def play_episode(env, task, choose: Callable[[str, dict, int], str], max_steps: int,
                 source: str = "", score_key: str | None = None) -> Episode:
    """Run one episode of `env` on `task`; choose(observation, info, t) -> action string.
    score_key: the info key of the env's episode score (its last value is the episode's score)."""
    obs, info = env.reset(task)
    task_text = info.get("task", "")
    steps, won, score = [], False, None
    for t in range(max_steps):
        action = choose(obs, info, t)
        steps.append(Step(obs, tuple(info["admissible_actions"]), action))
        obs, _, done, info = env.step(action)
        won = bool(info.get("won", False))
        if score_key is not None:
            score = float(info.get(score_key, 0.0))
        if done:
            break
    return Episode(task_text, tuple(steps), won, source, score)


def spread(items: Sequence, n: int) -> list:
    """`n` items evenly spaced over `items` (all of them when n <= 0 or n >= len)."""
    if n <= 0 or n >= len(items):
        return list(items)
    return [items[int(i)] for i in np.linspace(0, len(items) - 1, n).round().astype(int)]


def save_episodes(episodes: Sequence[Episode], path: str) -> str:
    """Write episodes as JSON lines (atomically)."""
    write_atomically(path, "".join(json.dumps(dataclasses.asdict(ep)) + "\n"
                                   for ep in episodes).encode("utf-8"))
    return path


def load_episodes(path: str) -> list[Episode]:
    with open(path, encoding="utf-8") as f:
        return [Episode(d["task"], tuple(Step(s["observation"], tuple(s["admissible"]), s["action"])
                                         for s in d["steps"]), d["won"], d["source"], d.get("score"))
                for d in map(json.loads, f)]
