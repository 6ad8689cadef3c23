"""A sparse-reward lock that random play almost never opens but whose every step is readable:
the "toy-lock" env (task = any int >= 0).

A lock of L = 5 + task % 3 stages (5, 6 or 7). The observation of each stage names the colour its
pin is marked with ("Stage 3 of 6. The next pin is marked green.") and the stage offers C = 4
admissible actions, "turn the dial to <colour>" for each of COLORS, in an order shuffled per stage.
Exactly one is right, the one the pin names:
  - the right action advances a stage (reward 0); at the last stage it opens the lock (reward
    WIN_REWARD = 10, won, done);
  - any other admissible action jams the lock: the episode ends at once (reward 0, not won);
  - an unknown or inadmissible action answers "Nothing happens." and changes nothing;
  - max_steps cuts the episode (done), as the other toy envs'.

Random play over the admissible actions opens a lock of L stages with probability (1/C)^L
(0.098% for L = 5, 0.0061% for L = 7; `random_success`), so unguided RL from a policy that knows
nothing meets no reward; yet the current observation alone says the right action at every step,
so a policy can learn the whole path. Replaying an expert's first steps (expert-prefix guidance,
Agent-G2) leaves fewer stages to the policy, so its rollouts reach the reward: the env shows what
guidance buys where reward is sparse.

Paths (the colour of each stage) and the orders of the admissible lists come from a NumPy
generator seeded by the task int, so they differ between tasks and are the same at every reset.
Held-out paths never occur in training, by construction: the paths of L stages are split in two
classes by the sum of their colour indices modulo C (`is_held_out_path`: sum % C == 0, a quarter
of them). Tasks of valid_unseen's range (`HELD_OUT_TASKS`) draw their path from the held-out class,
every other task (train, valid_seen, valid_train) from the rest (rejection sampling: each path of
a class is equally likely). So no valid_unseen path is a train path, whatever the number of train
tasks; valid_seen draws like train (new task ints and orders, paths that may repeat train's).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

from hgpo_jax.envs.episodes import Episode
from hgpo_jax.envs.toy.common import (EXPERT_MAX_STEPS, KINDS, SPLIT_OFFSET, SPLITS,
                                      expert_trajectories, list_tasks, scripted_episodes)

NAME = "toy-lock"
COLORS = ("red", "blue", "green", "yellow")  # the dial's colours: C = 4 actions per stage
MIN_STAGES = 5  # L = MIN_STAGES + task % STAGE_SPREAD: 5, 6 or 7 stages
STAGE_SPREAD = 3
WIN_REWARD = 10.0
TASK = "open the lock."  # the goal; the rule is what each observation and the prompt say
HELD_OUT_TASKS = range(SPLIT_OFFSET["valid_unseen"], SPLIT_OFFSET["valid_train"])
_SALT = 0x10C4  # mixed into every task's seed, so a lock's draws are not another env's


def action_of(color: str) -> str:
    """The action that turns the dial to `color`."""
    return f"turn the dial to {color}"


def num_stages(task: int) -> int:
    """L, the stages of task `task`'s lock: 5, 6 or 7 (5 + task % 3)."""
    return MIN_STAGES + int(task) % STAGE_SPREAD


def is_held_out_path(path: Iterable[int]) -> bool:
    """Whether a path (colour indices into COLORS) is of the held-out class: sum % C == 0."""
    return sum(int(c) for c in path) % len(COLORS) == 0


@dataclasses.dataclass(frozen=True)
class Lock:
    """One task's lock. path: the right colour of each stage, L of them; orders: the admissible
    colours of each stage in the order shown (L permutations of COLORS)."""

    path: tuple[str, ...]
    orders: tuple[tuple[str, ...], ...]


@functools.lru_cache(maxsize=4096)
def make_lock(task: int) -> Lock:
    """Task `task`'s lock (module docstring): its path from the held-out class for a task of
    HELD_OUT_TASKS, from the other class otherwise; then one shuffled order per stage."""
    import numpy as np

    task = int(task)
    if task < 0:
        raise ValueError(f"a toy-lock task is an int >= 0, got {task}")
    rng = np.random.default_rng([_SALT, task])
    length, held_out = num_stages(task), task in HELD_OUT_TASKS
    while True:  # rejection sampling: accepts a draw with probability 1/4 or 3/4
        path = rng.integers(len(COLORS), size=length)
        if is_held_out_path(path) == held_out:
            break
    orders = tuple(tuple(COLORS[i] for i in rng.permutation(len(COLORS))) for _ in range(length))
    return Lock(tuple(COLORS[i] for i in path), orders)


def random_success(tasks: Iterable[int]) -> float:
    """The analytic success of uniformly random play over the admissible actions, averaged over
    `tasks`: the mean of (1/C)^L."""
    tasks = list(tasks)
    return sum(len(COLORS) ** -num_stages(t) for t in tasks) / len(tasks)


class ToyLockEnv:
    """The multi-stage lock; `reset(task: int)`. See the module docstring."""

    task_type = "lock"

    def __init__(self, max_steps: int = 50):
        self.max_steps = max_steps
        self._task = None

    # ------------------------------------------------------------------ protocol
    def reset(self, task) -> tuple[str, dict]:
        self.lock = make_lock(task)
        self._task, self.stage, self.steps = int(task), 0, 0
        self.over = self.won = False
        return self._observe(f"You face a lock of {len(self.lock.path)} pins.")

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._task is None:
            raise RuntimeError("call reset(task) before step()")
        if self.over:
            obs, info = self._observe("The episode is over.")
            return obs, 0.0, True, info
        self.steps += 1
        action = " ".join(str(action).lower().split())
        reward = 0.0
        if action not in self._admissible():
            message = "Nothing happens."
        elif action == action_of(self.lock.path[self.stage]):
            self.stage += 1
            if self.stage == len(self.lock.path):
                self.over = self.won = True
                reward, message = WIN_REWARD, "The last pin clicks and the lock opens. You win!"
            else:
                message = "The pin clicks into place."
        else:
            self.over, message = True, "The dial jams and the lock seizes. You lose."
        done = self.over or self.steps >= self.max_steps
        obs, info = self._observe(message)
        return obs, reward, done, info

    def close(self) -> None:
        pass

    def solution(self) -> list[str]:
        """The right action of every stage, from the reset state (the expert)."""
        return [action_of(color) for color in self.lock.path]

    # ------------------------------------------------------------------ helpers
    def _admissible(self) -> list[str]:
        return [] if self.over else [action_of(c) for c in self.lock.orders[self.stage]]

    def _scene(self) -> str:
        """The clue of the current stage (the anchor): all a policy needs to act."""
        if self.over:
            return "The episode is over."
        return (f"Stage {self.stage + 1} of {len(self.lock.path)}. The next pin is marked "
                f"{self.lock.path[self.stage]}.")

    def _observe(self, message: str) -> tuple[str, dict]:
        scene = self._scene()
        info = {"admissible_actions": self._admissible(), "won": self.won,
                "task_type": self.task_type, "anchor": scene, "task": TASK}
        return f"{message} {scene}", info


# --------------------------------------------------------------------------- registry entries
def lock_episodes(tasks: Iterable[int], kind: str = "expert", *, seed: int = 0,
                  max_steps: int = 50) -> list[Episode]:
    """toy-lock episodes, one per task: kind "expert" plays the solution (always wins), "random"
    a uniformly random admissible action at every step (one generator seeded by `seed`)."""
    return scripted_episodes(ToyLockEnv(max_steps=max_steps), tasks, kind, seed=seed,
                             max_steps=max_steps, name=NAME)


def _make_env(env_cfg):
    return functools.partial(ToyLockEnv, max_steps=env_cfg.max_steps)


def _record_episodes(env_cfg, split: str, n: int, kind: str, *, seed: int = 0,
                     progress: bool = False) -> list:
    return lock_episodes(list_tasks(env_cfg, split)[:n], kind, seed=seed,
                         max_steps=env_cfg.max_steps)


def _expert_trajectories(env_cfg, split: str, *, progress: bool = False, workers: int = 1,
                         tasks=None) -> dict[int, tuple[str, ...]]:
    """The registry's expert_trajectories: each task's `solution()`, played to check it wins.
    Instant, so nothing is kept on disk; progress and workers are unused."""
    return expert_trajectories(functools.partial(ToyLockEnv, max_steps=EXPERT_MAX_STEPS),
                               env_cfg, split, tasks=tasks)


def corpus_episodes() -> list:
    """The episodes whose turns train a built toy-lock model's tokenizer: expert and random
    episodes of 300 train tasks."""
    return (lock_episodes(range(300), "expert")
            + lock_episodes(range(300), "random", seed=1, max_steps=12))


def _env_specs() -> dict:
    from hgpo_jax.envs.registry import BuiltModel, EnvSpec

    return {NAME: EnvSpec(
        name=NAME, make_env=_make_env, list_tasks=list_tasks, splits=SPLITS,
        eval_splits=("valid_seen", "valid_unseen"), record_episodes=_record_episodes,
        episode_kinds=KINDS, expert_trajectories=_expert_trajectories,
        built_model=BuiltModel(vocab=1024, episodes=corpus_episodes, memory_len=2))}


ENV_SPECS = _env_specs()
