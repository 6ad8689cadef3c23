"""A slow, obviously-correct reference for the advantage estimators, written from the semantics in
docs/advantages.md (the authors' code's behaviour as the default, the paper's equations as options).

Plain Python: loops, lists and dicts keyed by tuples of anchors. Used by tests/test_advantages.py
and as the baseline of experiments/benchmarks/bench_advantages.py. It does no validation: give it good input.

Numbers are Python floats (float64). "A value is exactly 0" (hgpo skips such items) is decided
exactly: returns are also computed as fractions.Fraction from the inputs as written in decimal
(gamma 0.95 = 19/20, penalty 0.1 = 1/10), and x equals its group's mean iff n * x == sum.
"""

from __future__ import annotations

import math
from fractions import Fraction


def _trajectories(task_ids, traj_ids, step_ids):
    """{traj: [row at step 0, row at step 1, ...]} and {traj: task}."""
    rows = {}
    task_of = {}
    for i, (task, traj, step) in enumerate(zip(task_ids, traj_ids, step_ids)):
        rows.setdefault(traj, {})[int(step)] = i
        task_of[traj] = task
    return {traj: [by_step[t] for t in range(len(by_step))] for traj, by_step in rows.items()}, task_of


def _discount(rows, r, gamma):
    """{row: sum_{j >= t} gamma^(j-t) r_j} along one trajectory's rows."""
    out = {}
    running = 0 * gamma
    for i in reversed(rows):
        running = r[i] + gamma * running
        out[i] = running
    return out


def _returns_and_scores(traj_rows, rewards, invalid, penalty, gamma, placement, num=float):
    """R_t and the episode score of every row, with the invalid-action penalty placed.

    num=float gives floats; num=_decimal gives exact rationals of the inputs as written (0.95 is
    19/20, not the nearest binary float), used to decide exact zeros.
    """
    rewards = [num(x) for x in rewards]
    penalty, gamma = num(penalty), num(gamma)
    R = [None] * len(rewards)
    score = [None] * len(rewards)
    for rows in traj_rows.values():
        if placement == "row":  # only the invalid row itself sees the penalty, after discounting
            disc = _discount(rows, rewards, gamma)
            total = sum(rewards[i] for i in rows)
            for i in rows:
                R[i] = disc[i] - penalty * invalid[i]
                score[i] = total - penalty * invalid[i]
        else:  # "reward": the penalty is part of the step's reward
            shaped = [x - penalty * v for x, v in zip(rewards, invalid)]
            disc = _discount(rows, shaped, gamma)
            total = sum(shaped[i] for i in rows)
            for i in rows:
                R[i] = disc[i]
                score[i] = total
    return R, score


def _decimal(x) -> Fraction:
    """The exact rational of a number as written in decimal (its shortest float repr)."""
    return Fraction(repr(float(x)))


def _mean_std(values, ddof):
    n = len(values)
    mean = math.fsum(values) / n
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - ddof))


def _normalize(x, values, mode, eps, ddof=0, singleton_raw=False):
    """x normalized within `values`; a group of one gives None, or x as if by mean 0, std 1."""
    if len(values) < 2:
        if not singleton_raw:
            return None
        return x / (1.0 + eps) if mode == "mean_std_norm" else x
    mean, std = _mean_std(values, ddof)
    return x - mean if mode == "mean_norm" else (x - mean) / (std + eps)


def _is_exact_mean(x, values):
    """x (a Fraction) equals the mean of `values` (Fractions) exactly."""
    return x * len(values) == sum(values)


def _episode_units(traj_rows, task_of, score, exact, stats):
    """[(rows of the unit, task, value, exact value)]: one unit per row (verl-agent) or per
    trajectory (paper)."""
    units = []
    for traj, rows in traj_rows.items():
        if stats == "verl-agent":
            units += [([i], task_of[traj], score[i], exact[i]) for i in rows]
        else:
            assert len({score[i] for i in rows}) == 1, "paper stats need one score per trajectory"
            units.append((rows, task_of[traj], score[rows[0]], exact[rows[0]]))
    return units


def _episode_values(units, estimator, mode, eps, stats):
    """{row: (episode-level value or None, whether it is exactly 0)} of the grpo or rloo term."""
    authors = stats == "verl-agent"
    by_task = {}
    for _, task, value, exact in units:
        values, exacts = by_task.setdefault(task, ([], []))
        values.append(value)
        exacts.append(exact)
    out = {}
    for rows, task, x, exact in units:
        group, exact_group = by_task[task]
        if estimator == "rloo":
            if len(group) < 2:
                value = x if authors else 0.0
            else:
                value = x - (math.fsum(group) - x) / (len(group) - 1)
            zero = value == 0.0
        else:
            value = _normalize(x, group, mode, eps, ddof=1 if authors else 0, singleton_raw=authors)
            zero = (exact == 0) if len(group) < 2 else _is_exact_mean(exact, exact_group)
        for i in rows:
            out[i] = (value, zero)
    return out


def _level_key(task, anchors, rows, t, k):
    """(task, a_t, a_{t-1}, ..., a_{t-k}) or None when t < k."""
    if t < k:
        return None
    return (task,) + tuple(anchors[rows[t - j]] for j in range(k + 1))


def _level_groups(traj_rows, task_of, anchors, k):
    """{level-k key: [rows]} over all steps that have level k."""
    groups = {}
    for traj, rows in traj_rows.items():
        for t in range(len(rows)):
            key = _level_key(task_of[traj], anchors, rows, t, k)
            if key is not None:
                groups.setdefault(key, []).append(rows[t])
    return groups


def reference_step_advantages(estimator, task_ids, traj_ids, step_ids, anchors, rewards, *, valid=None,
                              invalid_penalty=0.1, gamma=0.95, K=2, alpha=1.0, mode="mean_std_norm",
                              omega=1.0, eps=1e-6, penalty_placement="row", stats="verl-agent",
                              level_weights="verl-agent", base_group=False, exact_zero=True):
    """Advantages [N] (list of floats, input order), straight from the semantics.

    exact_zero=False replaces hgpo's exact-rational "value == 0" test by the float test
    `value != 0.0` (faster, but float64 rounding can then count a level whose exact value is 0);
    the benchmark reports both.
    """
    n = len(rewards)
    invalid = [0 if valid is None or valid[i] else 1 for i in range(n)]
    traj_rows, task_of = _trajectories(task_ids, traj_ids, step_ids)
    args = (traj_rows, rewards, invalid, invalid_penalty, gamma, penalty_placement)
    R, score = _returns_and_scores(*args)
    # exact values decide "exactly 0"; without exact_zero the float values stand in for them
    R_exact, score_exact = _returns_and_scores(*args, num=_decimal) if exact_zero else (R, score)
    authors = stats == "verl-agent"
    units = _episode_units(traj_rows, task_of, score, score_exact, stats) \
        if estimator != "hgpo" or base_group else []
    episode = _episode_values(units, "rloo" if estimator == "rloo" else "grpo", mode, eps, stats)
    out = [0.0] * n

    if estimator in ("grpo", "rloo"):
        for i in range(n):
            value = episode[i][0]
            out[i] = 0.0 if value is None else value
        return out

    if estimator == "gigpo":
        groups = _level_groups(traj_rows, task_of, anchors, 0)
        for traj, rows in traj_rows.items():
            for t, i in enumerate(rows):
                members = groups[_level_key(task_of[traj], anchors, rows, t, 0)]
                step_value = _normalize(R[i], [R[j] for j in members], mode, eps, ddof=1 if authors else 0)
                ep_value = episode[i][0]
                out[i] = (0.0 if ep_value is None else ep_value) + omega * (0.0 if step_value is None else step_value)
        return out

    if estimator == "hgpo":
        first = 2 if level_weights == "verl-agent" else 1
        levels = [_level_groups(traj_rows, task_of, anchors, k) for k in range(K + 1)]
        exact_sums = [{key: sum(R_exact[j] for j in members) for key, members in groups.items()}
                      for groups in levels] if exact_zero else None
        for traj, rows in traj_rows.items():
            for t, i in enumerate(rows):
                items = []  # (weight, value)
                if base_group:
                    value, zero = episode[i]
                    if value is not None and not zero:
                        items.append((1.0, value))
                for k in range(K + 1):
                    key = _level_key(task_of[traj], anchors, rows, t, k)
                    if key is None:  # t < k: the level does not exist
                        continue
                    members = levels[k][key]
                    if len(members) < 2:  # a group of size 1 gives no value
                        continue
                    if exact_zero and R_exact[i] * len(members) == exact_sums[k][key]:
                        continue  # the level's value is exactly 0: skipped
                    a_k = _normalize(R[i], [R[j] for j in members], mode, eps)  # population std
                    if not exact_zero and a_k == 0.0:
                        continue
                    items.append(((k + first) ** alpha, a_k))
                num = math.fsum(w * a for w, a in items)
                den = math.fsum(w for w, _ in items)
                if not items:
                    out[i] = 0.0
                elif level_weights == "verl-agent":
                    out[i] = num / (den + eps)
                else:
                    out[i] = num / den
        return out

    raise ValueError(f"unknown estimator {estimator!r}")


def reference_hierarchy_stats(task_ids, traj_ids, step_ids, anchors, K=2):
    """Per level k, (number of steps in a level-k group of size >= 2) / (all steps)."""
    traj_rows, task_of = _trajectories(task_ids, traj_ids, step_ids)
    n = len(task_ids)
    out = []
    for k in range(K + 1):
        groups = _level_groups(traj_rows, task_of, anchors, k)
        grouped = sum(len(members) for members in groups.values() if len(members) >= 2)
        out.append(grouped / n if n else 0.0)
    return out
