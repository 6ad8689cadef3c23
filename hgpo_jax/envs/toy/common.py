"""What the toy envs share: their splits of task ints and their scripted episodes.

    tasks = list_tasks(env_cfg, "valid_unseen")                 # [200000, ..., 200059]
    episodes = scripted_episodes(env, tasks, "random", seed=0, max_steps=12, name="toy")
    experts = winning_solutions(env, tasks)                      # {task: (action, ...)}

A toy env is deterministic given its task int and knows its own optimal actions
(`env.solution()` after `env.reset(task)`); everything here is built on those two facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hgpo_jax.envs.episodes import Episode, play_episode

SPLITS = ("train", "valid_seen", "valid_unseen", "valid_train")
# each split's first task int; a split's tasks are consecutive ints from there (disjoint)
SPLIT_OFFSET = {"train": 0, "valid_seen": 100_000, "valid_unseen": 200_000, "valid_train": 300_000}
SPLIT_SIZE = {"train": 1000, "valid_seen": 60, "valid_unseen": 60, "valid_train": 60}
KINDS = ("expert", "random")  # the episode kinds scripted_episodes records
EXPERT_MAX_STEPS = 50  # the step budget a scripted solution is checked under (they take 3-7)


def list_tasks(env_cfg, split: str) -> list[int]:
    """Task ints of a split, disjoint per split: 1000 for train, 60 for each other split.
    env_cfg is unused (the registry's signature)."""
    if split not in SPLITS:
        raise ValueError(f"unknown toy split {split!r}; use one of {SPLITS}")
    return [SPLIT_OFFSET[split] + i for i in range(SPLIT_SIZE[split])]


def scripted_episodes(env, tasks: Iterable[int], kind: str, *, seed: int, max_steps: int,
                      name: str) -> list[Episode]:
    """One episode of `env` per task: kind "expert" plays `env.solution()` (always wins),
    "random" a uniformly random admissible action at every step (one NumPy generator seeded by
    `seed` over all the tasks, in order). Each episode's source is "<name>:<task>"."""
    import numpy as np

    if kind not in KINDS:
        raise ValueError(f"unknown toy episode kind {kind!r}; use 'expert' or 'random'")
    rng = np.random.default_rng(seed)
    out = []
    for task in tasks:
        choose: Callable[[str, dict, int], str]
        if kind == "expert":
            env.reset(task)
            plan = env.solution()
            choose = lambda obs, info, t, plan=plan: plan[t]  # noqa: E731
        else:
            choose = lambda obs, info, t: str(rng.choice(info["admissible_actions"]))  # noqa: E731
        out.append(play_episode(env, task, choose, max_steps, source=f"{name}:{task}"))
    return out


def winning_solutions(env, tasks: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """{task: its `env.solution()` actions} for each task whose solution, played through `env`,
    wins; a task whose solution does not win is absent."""
    out = {}
    for task in tasks:
        env.reset(task)
        plan = env.solution()
        episode = play_episode(env, task, lambda obs, info, t: plan[t], len(plan))
        if episode.won:
            out[task] = tuple(plan)
    return out


def expert_trajectories(make: Callable[[], object], env_cfg, split: str, *,
                        tasks=None) -> dict[int, tuple[str, ...]]:
    """A toy env's registry `expert_trajectories`: each task of `split` (or of `tasks`, a subset)
    mapped to its scripted solution, played in `make()` (an env with EXPERT_MAX_STEPS) to check it
    wins. Instant, so nothing is kept on disk."""
    from hgpo_jax.envs.experts import chosen_tasks

    split_tasks = list_tasks(env_cfg, split)
    return winning_solutions(make(), chosen_tasks(split_tasks, tasks, env_cfg.name, split))
