"""The RL run's state: on the devices (`TrainState`, one pytree) and on the host (`LoopState`:
iterations done, the training tasks' order (`TaskSampler`), the mini-batches' generator), each
saved with the run's checkpoints (`trainers.rl.Trainer.checkpoint_tree`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import numpy as np


class TaskSampler:
    """Draws training tasks without replacement, reshuffling per pass; its state is JSON-able."""

    def __init__(self, tasks: list, seed: int):
        self.tasks = list(tasks)
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(len(self.tasks))
        self.cursor = 0

    def next(self, n: int) -> list:
        out = []
        for _ in range(n):
            if self.cursor >= len(self.order):
                self.order, self.cursor = self.rng.permutation(len(self.tasks)), 0
            out.append(self.tasks[int(self.order[self.cursor])])
            self.cursor += 1
        return out

    def state(self) -> dict:
        return {"cursor": self.cursor, "order": self.order.tolist(),
                "rng": self.rng.bit_generator.state}

    def load(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
        self.order = np.asarray(state["order"], np.int64)
        self.rng.bit_generator.state = state["rng"]


def drawn_tasks(tasks: list, cfg) -> list:
    """The distinct tasks a run's `TaskSampler` (seeded by train.seed) draws over its
    train.iterations x rollout.num_groups, in first-drawn order."""
    sampler = TaskSampler(tasks, cfg.train.seed)
    return list(dict.fromkeys(sampler.next(cfg.train.iterations * cfg.rollout.num_groups)))


@flax.struct.dataclass
class TrainState:
    """The RL run's device state, one pytree: the policy's params and AdamW state, the frozen
    reference policy (the initial one: model.path gives it back, so checkpoints leave it out),
    the rollout PRNG key, and the algorithm's own state (`Algorithm.init_state`, whatever the
    algorithm keeps: a critic's params and optimizer state for PPO and HiPER; None for the group
    estimators)."""

    params: Any
    opt_state: Any
    ref_params: Any
    key: jax.Array
    algo_state: Any = None


@dataclasses.dataclass
class LoopState:
    """The RL run's host state, JSON-able in a checkpoint's meta: iterations done, the training
    tasks' order, the NumPy generator that draws the mini-batches."""

    iteration: int
    tasks: TaskSampler
    np_rng: np.random.Generator

    def to_meta(self) -> dict:
        return {"iteration": self.iteration, "sampler": self.tasks.state(),
                "np_rng": self.np_rng.bit_generator.state}

    def load_meta(self, meta: dict) -> None:
        self.iteration = int(meta["iteration"])
        self.tasks.load(meta["sampler"])
        self.np_rng.bit_generator.state = meta["np_rng"]
