"""Rollout batches without a model: a scripted policy plays real envs through an EnvPool.

Used by the experiments that study the advantage estimators on realistic batches
(exact_zero_frequency.py, oracle_diagnostic.py). At each step, with probability `invalid` the
reply is invalid (the env gets a piece of text that does nothing, as the authors' projection
gives it: the reply's last 30 characters), with probability `expert` the next action of the
task's plan is taken (ALFWorld: the game's walkthrough; toy envs: the scripted solution), otherwise
a random admissible action. Anchors are the env's anchors (the raw observations for ALFWorld).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

NOOP_REPLY_TAIL = "i am not sure what to do next."  # what an invalid reply executes (30 chars)


def collect(pool, tasks: Sequence, group_size: int, max_steps: int, expert: float, invalid: float,
            rng: np.random.Generator, plan_of: Callable[[object], list[str]]) -> dict:
    """One batch: env i plays tasks[i // group_size]. Returns the per-step columns that
    compute_step_advantages takes (task_ids, traj_ids, step_ids, anchors, rewards, valid)."""
    n = pool.num_envs
    assigned = [tasks[i // group_size] for i in range(n)]
    plans = {i: plan_of(task) for i, task in enumerate(assigned)}
    replies = pool.reset(assigned)
    anchor = [r.info.get("anchor", r.obs) for r in replies]
    admissible = [r.info["admissible_actions"] for r in replies]
    pointer = [0] * n
    running = [not r.failed for r in replies]
    cols = defaultdict(list)
    for t in range(max_steps):
        actions, valid = {}, {}
        for i in (i for i in range(n) if running[i]):
            u = rng.random()
            if u < invalid:
                actions[i], valid[i] = NOOP_REPLY_TAIL, False
            elif u < invalid + expert and pointer[i] < len(plans[i]):
                actions[i], valid[i] = plans[i][pointer[i]], True
                pointer[i] += 1
            else:
                actions[i], valid[i] = str(rng.choice(admissible[i])), True
        if not actions:
            break
        for i, r in pool.step(actions).items():
            if r.failed:
                running[i] = False
                continue
            for key, value in (("task_ids", i // group_size), ("traj_ids", i), ("step_ids", t),
                               ("anchors", anchor[i]), ("rewards", r.reward), ("valid", valid[i])):
                cols[key].append(value)
            anchor[i], admissible[i] = r.info.get("anchor", r.obs), r.info["admissible_actions"]
            running[i] = running[i] and not r.done
    return dict(cols)


def alfworld_plan(game: str) -> list[str]:
    from hgpo_jax.envs.alfworld import walkthrough

    return walkthrough(game)


def toy_plan(env_name: str) -> Callable[[int], list[str]]:
    """The scripted solution of a toy task (press the first button, walk, open its door)."""
    from hgpo_jax.envs.toy import ToyMemoryEnv, env_kwargs

    def plan(task: int) -> list[str]:
        env = ToyMemoryEnv(**env_kwargs(env_name))
        env.reset(task)
        return env.solution()

    return plan
