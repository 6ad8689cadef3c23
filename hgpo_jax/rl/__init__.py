"""RL core: hierarchical grouping (host), advantage estimators and the PPO-KL loss (device), the
bias-against-the-oracle diagnostic, and HiPER's hierarchical advantage estimation (`hae`).

See docs/advantages.md.
"""

from hgpo_jax.rl.advantages import (
    ESTIMATORS,
    INVALID_PENALTY,
    LEVEL_WEIGHTS,
    MODES,
    PENALTY_PLACEMENTS,
    STATS,
    AdvantageOptions,
    compute_step_advantages,
    device_step_advantages,
    step_advantages_from_index,
)
from hgpo_jax.rl.diagnostics import oracle_advantages, oracle_deviation
from hgpo_jax.rl.grouping import (
    GroupIndex,
    StepBatch,
    build_row_task_groups,
    index_step_groups,
    build_trajectory_groups,
    discounted_returns,
    episode_returns,
    full_history_ids,
    hierarchy_stats,
    prepare_batch,
)
from hgpo_jax.rl.hae import HAEResult, hae_advantages
from hgpo_jax.rl.loss import AGGS, KL_TYPES, ppo_kl_loss, ppo_kl_loss_jit, softmax_entropy

__all__ = [
    "AGGS",
    "AdvantageOptions",
    "ESTIMATORS",
    "INVALID_PENALTY",
    "KL_TYPES",
    "LEVEL_WEIGHTS",
    "MODES",
    "PENALTY_PLACEMENTS",
    "STATS",
    "GroupIndex",
    "HAEResult",
    "StepBatch",
    "build_row_task_groups",
    "index_step_groups",
    "build_trajectory_groups",
    "compute_step_advantages",
    "device_step_advantages",
    "discounted_returns",
    "episode_returns",
    "full_history_ids",
    "hae_advantages",
    "hierarchy_stats",
    "oracle_advantages",
    "oracle_deviation",
    "ppo_kl_loss",
    "ppo_kl_loss_jit",
    "prepare_batch",
    "softmax_entropy",
    "step_advantages_from_index",
]
