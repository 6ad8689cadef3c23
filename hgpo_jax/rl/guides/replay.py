"""An env pool that hands its envs over with given actions already played: the rollout side of
a guidance that replays expert prefixes (`rl.guides.g2`).

    pool = ReplayingPool(env_pool, prefixes, max_steps)    # prefixes[i]: env i's actions
    replies = pool.reset(tasks)       # each env reset, then its prefix played
    replies[i].prior                  # ((action, EnvReply), ...): the turns played, in order

The rollout loop (`rl.rollout.play_lockstep`) keeps those turns in the memory as the agent's own
and lets the policy play the steps that are left; everything else (step, close, ...) is the
wrapped pool's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


class ReplayingPool:
    """`env_pool` whose reset plays `prefixes[i]` in env i after resetting it.

    The actions are sent as they are, step j of every env that has one together (one
    `env_pool.step` per step), at most `max_steps` of them; an env stops replaying when the
    episode ends or the pool fails it (the failed answer is its last prior turn, which the
    rollout loop turns into a failed env; so is the answer for an env the pool lost during
    another's step). An env whose reset failed replays nothing."""

    def __init__(self, env_pool, prefixes: Sequence[Sequence[str]], max_steps: int):
        self.env_pool = env_pool
        self.prefixes = [list(p) for p in prefixes]
        self.max_steps = int(max_steps)

    def __getattr__(self, name):
        return getattr(self.env_pool, name)  # step, close, num_envs, stats, ...

    def reset(self, tasks: Sequence) -> list:
        if len(self.prefixes) != len(tasks):
            raise ValueError(f"prefixes: one list of actions per env, {len(tasks)}, not "
                             f"{len(self.prefixes)}")
        replies = self.env_pool.reset(tasks)
        prior: list[list] = [[] for _ in replies]
        running = [not r.failed for r in replies]
        for j in range(min(max(map(len, self.prefixes), default=0), self.max_steps)):
            actions = {i: p[j] for i, p in enumerate(self.prefixes) if running[i] and j < len(p)}
            if not actions:
                break
            for i, answer in self.env_pool.step(actions).items():  # and any env lost meanwhile
                prior[i].append((actions.get(i, ""), answer))
                running[i] = running[i] and not (answer.failed or answer.done)
        return [dataclasses.replace(r, prior=tuple(p)) if p else r for r, p in zip(replies, prior)]
