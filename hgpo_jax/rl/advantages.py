"""The four advantage estimators (grpo, rloo, gigpo, hgpo) as jitted segment operations.

Host code (`hgpo_jax.rl.grouping`) validates the batch, computes returns in float64 and builds
`GroupIndex` tensors; this module applies the invalid-action penalty, pads the tensors to
bucketed shapes and runs one jitted float32 function built from `jax.ops.segment_sum` /
`segment_min` / `segment_max`. Semantics are in docs/advantages.md. By default they are those of
the authors' code (verl-agent), which differ from the paper's equations; the paper's versions
are options:

  penalty_placement  "row" (default): the penalty is subtracted from an invalid step's own
                     return R_t and its own episode score, after discounting; "reward": it is
                     part of the step's reward, so it is discounted into earlier steps and summed
                     into the whole trajectory's score.
  stats              "verl-agent" (default): episode-level statistics over step rows (each row
                     carries its trajectory's score), unbiased std (ddof 1), a task with a single
                     row keeps its raw score (mean 0, std 1); rloo is leave-one-out over rows;
                     gigpo's step term uses the unbiased std. "paper": one value per trajectory,
                     population std, a group of one gives 0. hgpo's levels use the population
                     std in both.
  level_weights      "verl-agent" (default): w_d = (d + 2)^alpha for context depth d = 0..K,
                     A = sum w_d A_d / (sum w_d + eps); "paper": w_d = (d + 1)^alpha, A = sum w_d
                     A_d / sum w_d.
  base_group         hgpo only: add the episode-level value as one more item of weight 1.
  similarity_thresh  gigpo and hgpo: None (default): steps group by equal anchors; t in (0, 1):
                     by GiGPO's similarity clusters (difflib ratio >= t to a cluster's first
                     anchor, greedy per task in the authors' row order; `rl.similarity`); hgpo's
                     level k groups the clusters of a_t, ..., a_{t-k}.

For a group g with mean m_g and std s_g: mean_std_norm: A = (x - m_g) / (s_g + eps);
mean_norm: A = x - m_g.

Exact zeros (the one intended difference from the authors' code). hgpo skips a level whose A_k
is exactly 0, and equal values must give exactly 0. Float32 group means are not exact, so each
group's values are first shifted by the group minimum (equal values then become exact zeros), and
a deviation |x - m_g| within float32 rounding of the group's values
(|x - m_g| <= 8 * 2^-24 * (1 + sqrt(n_g)) * max_g |x|) is treated as exactly 0. The authors'
float32 code gives such a group a spurious advantage of about +/-0.3-0.6 instead.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from hgpo_jax.algo_specs import (GROUP_ESTIMATORS, INVALID_PENALTY, LEVEL_WEIGHTS, MODES,
                                  ONE_SCORE_CONFLICT, PENALTY_PLACEMENTS, STATS, GroupOptions,
                                  one_score_conflict)
from hgpo_jax.rl.batching import bucket
from hgpo_jax.rl.grouping import (
    GroupIndex,
    StepBatch,
    build_row_task_groups,
    index_step_groups,
    build_trajectory_groups,
    discounted_returns,
    episode_returns,
    prepare_batch,
)

ESTIMATORS = GROUP_ESTIMATORS  # the estimators this module computes (hgpo_jax.algo_specs)
_ZERO_TOL = 8.0 * 2.0**-24  # float32 unit roundoff times a safety factor


# ----------------------------------------------------------------------------------------------
# Device functions (pure; run under jax.jit)


def group_normalize(values, ids, sizes, *, mode: str, eps, ddof: int = 0, singleton_raw: bool = False):
    """Normalize `values` within groups, all levels at once.

    Args:
      values: float32 [M]. The value of each row (the same value at every level).
      ids: int32 [M, L]. Group of row i at level l, -1 where none (see GroupIndex).
      sizes: int32 [G]. Group sizes; padding groups may have size 0.
      mode: "mean_std_norm" or "mean_norm" (static).
      eps: float32 scalar added to the std.
      ddof: 0 (population std) or 1 (unbiased std), static.
      singleton_raw: static. False: a group of size 1 gives no value. True: it gives the raw
        value, normalized as if by mean 0 and std 1 (x / (1 + eps), or x in mean_norm).
    Returns:
      (adv float32 [M, L], has bool [M, L]): the normalized value, and whether row i has a level-l
      value (a group of size >= 2, or of size 1 with `singleton_raw`); adv is 0 where `has` is
      False.
    """
    m, num_levels = ids.shape
    num_groups = sizes.shape[0]
    trash = num_groups  # invalid (-1) entries go to an extra segment that is never read back
    valid = ids >= 0
    seg = jnp.where(valid, ids, trash).reshape(-1)
    x = jnp.broadcast_to(values[:, None], (m, num_levels)).reshape(-1)
    nseg = num_groups + 1
    n = sizes.astype(jnp.float32)
    lo = jax.ops.segment_min(x, seg, num_segments=nseg)[:num_groups]
    hi = jax.ops.segment_max(x, seg, num_segments=nseg)[:num_groups]
    lo = jnp.where(sizes > 0, lo, 0.0)
    hi = jnp.where(sizes > 0, hi, 0.0)
    safe_seg = jnp.minimum(seg, num_groups - 1)
    d = x - lo[safe_seg]  # equal values in a group -> exactly 0
    mean = jax.ops.segment_sum(d, seg, num_segments=nseg)[:num_groups] / jnp.maximum(n, 1.0)
    dev = d - mean[safe_seg]
    tol = _ZERO_TOL * (1.0 + jnp.sqrt(n)) * jnp.maximum(jnp.abs(lo), jnp.abs(hi))
    dev = jnp.where(jnp.abs(dev) <= tol[safe_seg], 0.0, dev)
    if mode == "mean_std_norm":
        var = jax.ops.segment_sum(dev * dev, seg, num_segments=nseg)[:num_groups] / jnp.maximum(n - ddof, 1.0)
        denom = jnp.sqrt(var)[safe_seg] + eps
        adv = jnp.where(dev != 0.0, dev / jnp.where(denom > 0, denom, 1.0), 0.0)  # eps = 0 safe
        raw = x / (1.0 + eps)
    elif mode == "mean_norm":
        adv = dev
        raw = x
    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    size = sizes[safe_seg]
    valid = valid.reshape(-1)
    has = valid & (size >= 2)
    adv = jnp.where(has, adv, 0.0)
    if singleton_raw:
        alone = valid & (size == 1)
        adv = jnp.where(alone, raw, adv)
        has = has | alone
    return adv.reshape(m, num_levels), has.reshape(m, num_levels)


def rloo_values(values, group, sizes, *, singleton_raw: bool = False):
    """Leave-one-out baseline: A_i = x_i - mean of the other x in i's group.

    Args:
      values: float32 [M]. group: int32 [M] (-1 = no group). sizes: int32 [G].
      singleton_raw: static; a row alone in its group gives x_i (True) or 0 (False).
    Returns:
      float32 [M].
    """
    num_groups = sizes.shape[0]
    seg = jnp.where(group >= 0, group, num_groups)
    safe_seg = jnp.minimum(seg, num_groups - 1)
    lo = jax.ops.segment_min(values, seg, num_segments=num_groups + 1)[:num_groups]
    lo = jnp.where(sizes > 0, lo, 0.0)
    d = values - lo[safe_seg]
    total = jax.ops.segment_sum(d, seg, num_segments=num_groups + 1)[:num_groups]
    n = sizes[safe_seg].astype(jnp.float32)
    adv = (n * d - total[safe_seg]) / jnp.maximum(n - 1.0, 1.0)  # = d - (total - d) / (n - 1)
    in_group = group >= 0
    out = jnp.where(in_group & (n >= 2), adv, 0.0)
    if singleton_raw:
        out = jnp.where(in_group & (n == 1), values, out)
    return out


def hgpo_combine(level_adv, has, alpha, eps, *, level_weights: str, base=None, base_has=None):
    """Weighted mean of the levels' values, over the levels with a value that is not exactly 0.

    verl-agent weights: w_d = (d + 2)^alpha for depth d = 0..K, A = sum w A / (sum w + eps).
    paper weights: w_d = (d + 1)^alpha, A = sum w A / sum w. An optional base item (the
    episode-level value, `base_group`) joins with weight 1.

    Args:
      level_adv: float32 [M, L]. has: bool [M, L]. alpha, eps: float32 scalars.
      level_weights: "verl-agent" or "paper" (static).
      base, base_has: float32 [M] and bool [M], or None.
    Returns:
      float32 [M]; 0 where no item qualifies.
    """
    num_levels = level_adv.shape[1]
    if level_weights == "verl-agent":
        first = 2
    elif level_weights == "paper":
        first = 1
    else:
        raise ValueError(f"unknown level_weights {level_weights!r}; expected one of {LEVEL_WEIGHTS}")
    w = jnp.arange(first, first + num_levels, dtype=jnp.float32) ** alpha
    if base is not None:
        level_adv = jnp.concatenate([base[:, None], level_adv], axis=1)
        has = jnp.concatenate([base_has[:, None], has], axis=1)
        w = jnp.concatenate([jnp.ones((1,), jnp.float32), w])
    use = has & (level_adv != 0.0)
    num = jnp.sum(jnp.where(use, w * level_adv, 0.0), axis=1)
    den = jnp.sum(jnp.where(use, w, 0.0), axis=1)
    if level_weights == "verl-agent":
        den = den + eps
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


@partial(jax.jit, static_argnames=("estimator", "mode", "stats", "level_weights", "base_group"))
def device_step_advantages(returns, step_ids, step_sizes, episode, ep_ids, ep_sizes, ep_of_row,
                           alpha, omega, eps, *, estimator: str, mode: str, stats: str = "verl-agent",
                           level_weights: str = "verl-agent", base_group: bool = False):
    """Per-step advantages from padded group indices (all float32, one compile per bucket).

    Args:
      returns: float32 [N']. Return R_t of each (canonical, padded) row, penalty applied.
      step_ids: int32 [N', L]; step_sizes: int32 [G']. Step hierarchy (gigpo uses level 0).
      episode: float32 [E']. Episode-level values: one per row ("verl-agent" stats) or one per
        trajectory ("paper" stats), penalty applied.
      ep_ids: int32 [E', 1]; ep_sizes: int32 [P']. Episode units -> task grouping.
      ep_of_row: int32 [N']. Episode unit of each row.
      alpha, omega, eps: float32 scalars.
      estimator, mode, stats, level_weights, base_group: static.
    Returns:
      float32 [N'].
    Arguments an estimator does not use may be size-1 dummies.
    """
    if stats not in STATS:
        raise ValueError(f"unknown stats {stats!r}; expected one of {STATS}")
    authors = stats == "verl-agent"
    ddof = 1 if authors else 0

    def episode_term():
        adv, has = group_normalize(episode, ep_ids, ep_sizes, mode=mode, eps=eps, ddof=ddof,
                                   singleton_raw=authors)
        return adv[:, 0][ep_of_row], has[:, 0][ep_of_row]

    if estimator == "grpo":
        return episode_term()[0]
    if estimator == "rloo":
        return rloo_values(episode, ep_ids[:, 0], ep_sizes, singleton_raw=authors)[ep_of_row]
    if estimator == "gigpo":
        step_adv, _ = group_normalize(returns, step_ids[:, :1], step_sizes, mode=mode, eps=eps, ddof=ddof)
        return episode_term()[0] + omega * step_adv[:, 0]
    if estimator == "hgpo":  # the levels use the population std under both stats
        level_adv, has = group_normalize(returns, step_ids, step_sizes, mode=mode, eps=eps)
        base, base_has = episode_term() if base_group else (None, None)
        return hgpo_combine(level_adv, has, alpha, eps, level_weights=level_weights, base=base,
                            base_has=base_has)
    raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")


# ----------------------------------------------------------------------------------------------
# Host wrappers: padding to buckets


def pad_rows(a: np.ndarray, rows: int, fill) -> np.ndarray:
    """`a` [M, ...] padded with `fill` to [rows, ...]."""
    out = np.full((rows,) + a.shape[1:], fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def _pad_index(index: GroupIndex) -> tuple[np.ndarray, np.ndarray]:
    rows = bucket(index.ids.shape[0])
    groups = bucket(index.num_groups)
    return pad_rows(index.ids, rows, -1), pad_rows(index.sizes, groups, 0)


def step_advantages_from_index(estimator: str, returns: np.ndarray, step_index: GroupIndex | None,
                               episode: np.ndarray, episode_index: GroupIndex, ep_of_row: np.ndarray,
                               options: AdvantageOptions | None = None) -> np.ndarray:
    """Pad the host tensors to buckets, run `device_step_advantages`, slice back.

    Args:
      options: the estimators' options (alpha, mode, omega, eps, stats, level_weights and
        base_group are used here); None: the defaults.
      returns: [N] returns R_t (any float dtype; cast to float32).
      step_index: GroupIndex over the N rows (required for gigpo/hgpo).
      episode: [E] episode-level values. episode_index: GroupIndex over the E units (ids [E, 1]).
      ep_of_row: int [N] episode unit of each row.
    Returns:
      float32 [N], rows in the order of `returns`.
    """
    o = AdvantageOptions() if options is None else options
    base_group = o.base_group
    n = int(returns.shape[0])
    rows = bucket(n)
    f32 = np.float32
    if estimator in ("gigpo", "hgpo"):
        if step_index is None:
            raise ValueError(f"estimator {estimator!r} needs a step GroupIndex")
        step_ids, step_sizes = _pad_index(step_index)
        returns_p = pad_rows(np.asarray(returns, f32), rows, 0.0)
    else:  # unused by grpo/rloo: fixed-size dummies keep the compile cache small
        step_ids, step_sizes = np.full((1, 1), -1, np.int32), np.zeros(1, np.int32)
        returns_p = np.zeros(1, f32)
    if estimator == "hgpo" and not base_group:  # no episode term
        episode_p, ep_ids, ep_sizes = np.zeros(1, f32), np.full((1, 1), -1, np.int32), np.zeros(1, np.int32)
        ep_of_row_p = np.zeros(1, np.int32)
    else:
        ep_ids, ep_sizes = _pad_index(episode_index)
        episode_p = pad_rows(np.asarray(episode, f32), ep_ids.shape[0], 0.0)
        ep_of_row_p = pad_rows(np.asarray(ep_of_row, np.int32), rows, 0)
    out = device_step_advantages(returns_p, step_ids, step_sizes, episode_p, ep_ids, ep_sizes,
                                 ep_of_row_p, f32(o.alpha), f32(o.omega), f32(o.eps), estimator=estimator,
                                 mode=o.mode, stats=o.stats, level_weights=o.level_weights,
                                 base_group=bool(base_group and estimator == "hgpo"))
    return np.asarray(out)[:n]


# ----------------------------------------------------------------------------------------------
# Host: the invalid-action penalty


def penalized_returns(batch: StepBatch, gamma: float, invalid_penalty: float,
                      penalty_placement: str) -> tuple[np.ndarray, np.ndarray]:
    """Returns and episode scores of every canonical row, with the invalid-action penalty.

    "row": R_t = discounted env return - p * invalid_t, score_t = episode env return - p * invalid_t
      (only the invalid row itself sees the penalty).
    "reward": the reward of an invalid step is r_t - p; R_t discounts it into earlier steps and
      every row's score is the trajectory's summed penalized reward.

    Returns:
      (R float64 [N], score float64 [N]), canonical order.
    """
    penalty = invalid_penalty * (~batch.valid).astype(np.float64)
    if penalty_placement == "row":
        returns = discounted_returns(batch, gamma) - penalty
        score = episode_returns(batch)[batch.traj] - penalty
    elif penalty_placement == "reward":
        shaped = batch.rewards - penalty
        returns = discounted_returns(batch, gamma, shaped)
        score = episode_returns(batch, shaped)[batch.traj]
    else:
        raise ValueError(f"unknown penalty_placement {penalty_placement!r}; expected one of "
                         f"{PENALTY_PLACEMENTS}")
    return returns, score


# ----------------------------------------------------------------------------------------------
# Public entry point


# Every option of the group estimators (docs/advantages.md), declared and checked once beside its
# fields in `hgpo_jax.algo_specs.GroupOptions`; built in code it raises a ValueError naming the
# option. `AdvantageOptions.of(cfg.algo)` takes a config's.
AdvantageOptions = GroupOptions


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")


def resolve_options(options: AdvantageOptions | None, overrides: dict) -> AdvantageOptions:
    """`options`, or the options built from keyword `overrides` (not both)."""
    if options is None:
        return AdvantageOptions(**overrides)
    if overrides:
        raise TypeError(f"give either options= or the keywords {sorted(overrides)}, not both")
    return options


def compute_step_advantages(estimator: str, task_ids, traj_ids, step_ids, anchors, rewards, *,
                            valid=None, options: AdvantageOptions | None = None,
                            prefix_anchors=None, **overrides) -> np.ndarray:
    """Per-step advantages for a flat batch of steps, in the input order.

    The defaults reproduce the authors' code (verl-agent); see the module docstring and
    docs/advantages.md for every option.

    Args:
      estimator: "grpo", "rloo", "gigpo" or "hgpo".
      task_ids: [N] hashables; the rollouts of one group (one task) share it.
      traj_ids: [N] hashables; unique per trajectory (a trajectory belongs to one task).
      step_ids: [N] ints; each trajectory's steps are exactly 0..n-1.
      anchors: [N] hashables (the raw observation text); str with a `similarity_thresh`.
      rewards: [N] finite floats, the env's reward of each step (no penalty in it).
      valid: [N] bools, whether each step's reply held a valid action; None = all valid.
      options: an `AdvantageOptions`; or, instead, its fields as keywords (e.g. K=2, mode=...).
      prefix_anchors: {traj_id: [anchors]} of the steps an expert-guided rollout replayed
        before step 0 (history for hgpo's levels, no rows; `grouping.prepare_batch`) or None.
    Returns:
      float32 [N]. An empty batch gives an empty array.
    Raises:
      ValueError for bad input or options (see `prepare_batch`); for stats="paper" with
      penalty_placement="row" when a penalized step exists (a trajectory then has no single score).
    """
    check_estimator(estimator)
    o = resolve_options(options, overrides)
    steps = estimator in ("gigpo", "hgpo")
    thresh = o.similarity_thresh if steps else None
    batch = prepare_batch(task_ids, traj_ids, step_ids, anchors, rewards, valid, prefix_anchors,
                          keep_anchor_values=thresh is not None)
    if batch.num_steps == 0:
        return np.zeros(0, np.float32)
    returns, score = penalized_returns(batch, o.gamma, o.invalid_penalty, o.penalty_placement)
    step_index = index_step_groups(batch, o.K if estimator == "hgpo" else 0, thresh) if steps else None
    if o.stats == "verl-agent":  # one episode value per row
        episode, episode_index, ep_of_row = score, build_row_task_groups(batch), np.arange(batch.num_steps)
    else:  # one episode value per trajectory
        if one_score_conflict(estimator, o.stats, o.penalty_placement, o.invalid_penalty,
                              o.base_group) and not batch.valid.all():
            raise ValueError(f"{ONE_SCORE_CONFLICT}: the invalid steps of a trajectory carry "
                             "different scores; use penalty_placement='reward' with stats='paper'")
        episode, episode_index, ep_of_row = score[batch.traj_start], build_trajectory_groups(batch), batch.traj
    canonical = step_advantages_from_index(estimator, returns, step_index, episode, episode_index,
                                           ep_of_row, o)
    out = np.empty(batch.num_steps, np.float32)
    out[batch.order] = canonical
    return out
