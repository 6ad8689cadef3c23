"""Bias against the oracle: how far each estimator's advantages are from full-history advantages.

The HGPO paper (Fig. 2, Prop. 4.1) argues that a step-level group whose members reached the same
anchor through different histories ("context inconsistency") biases the advantage. This module
measures that on any batch of steps (docs/advantages.md, "Bias against the oracle"):

* the *full history* of step t of a trajectory is its task and its anchors a_0, ..., a_t; an
  *oracle step* is a step whose full history is shared by at least one other step;
* the *oracle advantage* of an oracle step is its return R_t (invalid-action penalty placed as
  `penalized_returns` places it) normalized within its full-history group, like one hgpo level
  (population std; mean_std_norm or mean_norm), in float64 on the host, each group shifted by its
  minimum first so a group of equal returns gives exactly 0;
* over the oracle steps, d = A_estimator - A_oracle gives bias = mean(d), abs_dev = mean(|d|),
  rmse = sqrt(mean(d^2)); coverage = oracle steps / N.
"""

from __future__ import annotations

import math

import numpy as np

from hgpo_jax.rl.advantages import (
    ESTIMATORS,
    INVALID_PENALTY,
    AdvantageOptions,
    compute_step_advantages,
    penalized_returns,
    resolve_options,
)
from hgpo_jax.rl.grouping import StepBatch, full_history_ids, prepare_batch
from hgpo_jax.rl.turns import as_1d

DEFAULT_ESTIMATORS = ("grpo", "gigpo", "hgpo")


def oracle_from_batch(batch: StepBatch, *, gamma: float, invalid_penalty: float, penalty_placement: str,
                      mode: str, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Oracle advantages of a prepared batch, canonical order (options assumed validated).

    Returns:
      (adv float64 [N], 0 where not an oracle step; is_oracle bool [N]).
    """
    n = batch.num_steps
    if n == 0:
        return np.zeros(0, np.float64), np.zeros(0, bool)
    returns, _ = penalized_returns(batch, gamma, invalid_penalty, penalty_placement)
    ids = full_history_ids(batch)  # dense: every id in [0, G) has a row
    num_groups = int(ids.max()) + 1
    sizes = np.bincount(ids, minlength=num_groups)
    is_oracle = sizes[ids] >= 2
    by_group = np.argsort(ids, kind="stable")
    starts = np.searchsorted(ids[by_group], np.arange(num_groups))
    lo = np.minimum.reduceat(returns[by_group], starts)
    d = returns - lo[ids]  # a group of equal returns becomes exact zeros
    mean = np.bincount(ids, d, minlength=num_groups) / sizes
    dev = d - mean[ids]
    if mode == "mean_std_norm":
        std = np.sqrt(np.bincount(ids, dev * dev, minlength=num_groups) / sizes)  # population
        denom = std[ids] + eps
        adv = np.where(dev != 0.0, dev / np.where(denom > 0, denom, 1.0), 0.0)  # eps = 0 safe
    else:  # "mean_norm"
        adv = dev
    return np.where(is_oracle, adv, 0.0), is_oracle


def oracle_advantages(task_ids, traj_ids, step_ids, anchors, rewards, *, valid=None,
                      invalid_penalty: float = INVALID_PENALTY, gamma: float = 0.95,
                      mode: str = "mean_std_norm", eps: float = 1e-6,
                      penalty_placement: str = "row", prefix_anchors=None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Full-history ("oracle") advantages of a flat batch of steps, in the input order.

    Args:
      task_ids, traj_ids, step_ids, anchors, rewards, valid: [N] as for `compute_step_advantages`
        (validated the same way, same errors).
      invalid_penalty, gamma, penalty_placement: the returns R_t, as `penalized_returns`.
      mode: "mean_std_norm" ((R - mean) / (population std + eps)) or "mean_norm" (R - mean),
        within each full-history group. eps: >= 0.
      prefix_anchors: {traj_id: anchors replayed before step 0} (a guided rollout's), part of
        each step's full history; None: none.
    Returns:
      (adv float32 [N]: the oracle advantage, 0 where the step is not an oracle step;
       is_oracle bool [N]: whether another step shares the step's task and anchors a_0..a_t).
    """
    # the estimators' checks and messages (the options the oracle does not use keep their defaults)
    AdvantageOptions(mode=mode, gamma=gamma, eps=eps, invalid_penalty=invalid_penalty,
                     penalty_placement=penalty_placement)
    batch = prepare_batch(task_ids, traj_ids, step_ids, anchors, rewards, valid, prefix_anchors)
    adv, is_oracle = oracle_from_batch(batch, gamma=gamma, invalid_penalty=invalid_penalty,
                                       penalty_placement=penalty_placement, mode=mode, eps=eps)
    out, flag = np.zeros(batch.num_steps, np.float32), np.zeros(batch.num_steps, bool)
    out[batch.order], flag[batch.order] = adv, is_oracle
    return out, flag


def oracle_deviation(task_ids, traj_ids, step_ids, anchors, rewards, *, valid=None,
                     estimators=DEFAULT_ESTIMATORS, options: AdvantageOptions | None = None,
                     prefix_anchors=None, **overrides) -> dict[str, dict[str, float]]:
    """Each estimator's deviation from the oracle advantages over the batch's oracle steps.

    Args:
      task_ids, traj_ids, step_ids, anchors, rewards, valid: [N] as for `compute_step_advantages`.
      estimators: names from `ESTIMATORS` (a single name may be given as a string).
      options: an `AdvantageOptions` (or its fields as keywords, e.g. K=2), passed unchanged to
        `compute_step_advantages` for every estimator, so each is measured as configured; the
        oracle uses invalid_penalty, gamma, penalty_placement, mode and eps (its groups use the
        population std whatever `stats`).
      prefix_anchors: as for `compute_step_advantages` (history of the oracle and of hgpo).
    Returns:
      {estimator: {"bias": mean(d), "abs_dev": mean(|d|), "rmse": sqrt(mean(d^2)),
      "coverage": oracle steps / N}} with d = A_estimator - A_oracle over the oracle steps (float64
      oracle against the estimator's float32 values). bias, abs_dev and rmse are NaN when there is
      no oracle step; coverage is 0 for an empty batch and the same for every estimator.
    Raises:
      ValueError for bad input or options (the errors of `compute_step_advantages`), and for an
      unknown estimator name.
    """
    if isinstance(estimators, str):
        estimators = (estimators,)
    estimators = tuple(estimators)
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown estimator(s) {unknown}; expected names from {ESTIMATORS}")
    # the options are checked up front: also with no estimator, and before any work
    o = resolve_options(options, overrides)
    # The hashable columns are read more than once (oracle, then each estimator): a one-shot
    # iterable becomes a list. (The numeric ones must be array-like for prepare_batch anyway.)
    task_ids, traj_ids, anchors = (as_1d(task_ids, "task_ids"), as_1d(traj_ids, "traj_ids"),
                                   as_1d(anchors, "anchors"))
    batch = prepare_batch(task_ids, traj_ids, step_ids, anchors, rewards, valid, prefix_anchors)
    canonical, canonical_flag = oracle_from_batch(batch, gamma=o.gamma, invalid_penalty=o.invalid_penalty,
                                                  penalty_placement=o.penalty_placement, mode=o.mode,
                                                  eps=o.eps)
    n = batch.num_steps
    oracle, is_oracle = np.zeros(n, np.float64), np.zeros(n, bool)
    oracle[batch.order], is_oracle[batch.order] = canonical, canonical_flag
    coverage = float(is_oracle.sum()) / n if n else 0.0
    result = {}
    for estimator in estimators:
        adv = compute_step_advantages(estimator, task_ids, traj_ids, step_ids, anchors, rewards, valid=valid,
                                      options=o, prefix_anchors=prefix_anchors)
        d = adv[is_oracle].astype(np.float64) - oracle[is_oracle]
        if d.size:
            bias, abs_dev, rmse = float(d.mean()), float(np.abs(d).mean()), math.sqrt(float((d * d).mean()))
        else:
            bias = abs_dev = rmse = math.nan
        result[estimator] = {"bias": bias, "abs_dev": abs_dev, "rmse": rmse, "coverage": coverage}
    return result
