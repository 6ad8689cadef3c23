"""The guidance unit's interface, and the kind `none` (`hgpo_jax.rl.guides`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


class Guidance:
    """The unit of `guidance.kind=none` and the base of every kind.

    prepare (a classmethod, before the run's weights load): what the kind needs of the env or a
    resumed checkpoint (`saved`: the newest checkpoint's `guidance` state, None when not
    resuming), handed to the constructor as `prepared`; check there what a resume needs, so a
    mismatch is refused before anything heavy loads. drawn_tasks() -> the distinct tasks the
    run's iterations draw, in first-drawn order.

    retries: redraws of an iteration's rollouts in which no env left the policy a turn (the
    trainer collects the same tasks again with new plans). sft_coef: the weight of the
    supervised rows `sft_rows` returns (0: none; the trainer compiles their update only then).
    """

    name = "none"
    retries = 0
    sft_coef = 0.0

    def __init__(self, cfg, prepared: Any = None, *, tokenizer=None, agent=None):
        self.cfg = cfg

    @classmethod
    def prepare(cls, cfg, *, drawn_tasks: Callable[[], list], progress: bool,
                saved: Mapping | None) -> Any:
        return None

    def plan(self, tasks: Sequence, group_size: int) -> list | None:
        """One plan per rollout of the iteration's `tasks` (rollout i of task j at
        j * group_size + i), drawn alike on every process; None: nothing planned."""
        return None

    def pool(self, env_pool, plans: Sequence | None, max_steps: int):
        """The env pool this process's rollouts play in (`plans`: theirs): `env_pool` itself, or
        a wrapper of it whose reset hands the envs over with turns played (`EnvReply.prior`)."""
        return env_pool

    def update(self, plans: Sequence | None, episode_traj: Sequence[int],
               episode_won: Sequence[bool]) -> dict[str, float]:
        """Learn from the iteration's kept episodes (every process's, in batch order: their
        rollout index into `plans` and whether they were won) -> metrics."""
        return {}

    def sft_rows(self, batch):
        """Supervised rows of this process's batch for the policy's update (`rl.prefix_sft.
        PrefixSft`, weighed by `sft_coef`), or None."""
        return None

    def state_dict(self) -> dict | None:
        """The state to keep with the run's checkpoints (meta `guidance`; None: nothing)."""
        return None

    def load_state_dict(self, state: Mapping) -> None:
        """Resume from `state_dict()`'s value; refuse (ValueError) one this run cannot take."""
