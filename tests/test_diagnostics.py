"""The bias-against-the-oracle diagnostic (hgpo_jax/rl/diagnostics.py) and full-history group ids."""

from __future__ import annotations

import inspect
import math
import os
import sys
from statistics import fmean, pstdev

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, os.path.dirname(__file__))

from test_advantages import batches, columns, validity  # noqa: E402

from hgpo_jax.rl import (  # noqa: E402
    ESTIMATORS,
    compute_step_advantages,
    full_history_ids,
    oracle_advantages,
    oracle_deviation,
    prepare_batch,
)
from hgpo_jax.rl.grouping import step_level_ids  # noqa: E402

EPS = 1e-6
TOL = 1e-5


def row_of(rows, traj, step):
    return next(i for i, r in enumerate(rows) if r[1] == traj and r[2] == step)


def assert_stats(got, bias, abs_dev, rmse, coverage):
    assert got == {"bias": pytest.approx(bias, abs=TOL), "abs_dev": pytest.approx(abs_dev, abs=TOL),
                   "rmse": pytest.approx(rmse, abs=TOL), "coverage": pytest.approx(coverage, abs=1e-12)}


# ----------------------------------------------------------------------------------------------
# 1. Every step an oracle step, and hgpo's levels all agree with the full history


def shared_path_rows():
    """Task T1: A, B, C all see x, y, z and get 1, 0, .5 at step 2. Task T2: D, E both see p, q
    and get 10, 0 at step 1. Within a task every step of every trajectory has the same anchors
    so far, so every hgpo level (any depth) is the full-history group: all 13 steps are oracle
    steps and every level of hgpo gives the oracle value."""
    rows = []
    for traj, final in (("A", 1.0), ("B", 0.0), ("C", 0.5)):
        rows += [("T1", traj, t, "xyz"[t], final if t == 2 else 0.0) for t in range(3)]
    for traj, final in (("D", 10.0), ("E", 0.0)):
        rows += [("T2", traj, t, "pq"[t], final if t == 1 else 0.0) for t in range(2)]
    return rows


def test_every_step_oracle_and_hgpo_with_deep_K_equals_the_oracle():
    rows = shared_path_rows()
    cols = columns(rows)
    oracle, is_oracle = oracle_advantages(*cols)
    assert oracle.dtype == np.float32 and is_oracle.dtype == bool and is_oracle.all()
    # T1 at step t: R = c {1, 0, .5} with c = .95^(2 - t): mean .5 c, population std c sqrt(1/6)
    # -> A = +-.5 c / (c sqrt(1/6) + eps), C at the mean gives 0.
    # T2: step 1 R = {10, 0} -> +-5 / (5 + eps); step 0 R = {9.5, 0} -> +-4.75 / (4.75 + eps).
    expected = {("D", 1): 5 / (5 + EPS), ("E", 1): -5 / (5 + EPS),
                ("D", 0): 4.75 / (4.75 + EPS), ("E", 0): -4.75 / (4.75 + EPS)}
    for t in range(3):
        c = 0.95 ** (2 - t)
        a = 0.5 * c / (c * math.sqrt(1 / 6) + EPS)
        expected.update({("A", t): a, ("B", t): -a, ("C", t): 0.0})
    for (traj, t), value in expected.items():
        assert oracle[row_of(rows, traj, t)] == pytest.approx(value, abs=1e-6), (traj, t)
    assert oracle[row_of(rows, "C", 2)] == 0.0  # {1, 0, .5}: the mean .5 is exact

    for K in (2, 3):  # K >= the longest trajectory's last step index
        # the paper's weights: sum_d w A / sum_d w with every A_d equal -> A exactly (float32)
        got = oracle_deviation(*cols, K=K, level_weights="paper", estimators=("hgpo",))["hgpo"]
        assert_stats(got, 0.0, 0.0, 0.0, 1.0)
        np.testing.assert_allclose(compute_step_advantages("hgpo", *cols, K=K, level_weights="paper"),
                                   oracle, atol=1e-6)
        # the authors' weights: A * W / (W + eps), W >= 2 -> within 1e-6 of the oracle
        got = oracle_deviation(*cols, K=K)
        assert got["hgpo"]["abs_dev"] < 1e-6 and got["hgpo"]["coverage"] == 1.0
        # grpo normalizes the episode scores with other statistics (unbiased, over 9 or 4 rows);
        # gigpo adds its step term to that
        assert got["grpo"]["abs_dev"] > 0.01 and got["gigpo"]["abs_dev"] > 0.5


# ----------------------------------------------------------------------------------------------
# 2. The paper's situation: two histories reach the same anchor, with different futures


def paper_rows(extra_fail=False):
    """Task T: A: x -> z (success), B: x -> z (success), C: y -> z (fail), D: y -> z (fail);
    reward 10 at step 1 on success. With gamma .95: R(A) = R(B) = [9.5, 10], R(C) = R(D) = [0, 0].
    With extra_fail, D is dropped (A, B, C only)."""
    trajs = (("A", "x", 10.0), ("B", "x", 10.0), ("C", "y", 0.0)) + (() if extra_fail else (("D", "y", 0.0),))
    return [("T", traj, t, first if t == 0 else "z", reward if t == 1 else 0.0)
            for traj, first, reward in trajs for t in range(2)]


def test_context_inconsistent_group_biases_gigpo_more_than_hgpo():
    rows = paper_rows()
    cols = columns(rows)
    # Full-history groups: step 0 {A, B} (x) and {C, D} (y); step 1 {A, B} (x, z) and {C, D}
    # (y, z). Every group holds equal returns: all 8 steps are oracle steps with oracle value 0,
    # so d is the estimator's own value.
    oracle, is_oracle = oracle_advantages(*cols)
    assert is_oracle.all() and oracle.tolist() == [0.0] * 8
    got = oracle_deviation(*cols, estimators=ESTIMATORS)
    assert list(oracle_deviation(*cols)) == ["grpo", "gigpo", "hgpo"]
    # Every estimator's values sum to 0 over the 8 rows here (4 rows +v, 4 rows -v): bias 0.
    # grpo (authors' stats): 8 rows of scores {10 x4, 0 x4}: mean 5, unbiased std sqrt(200/7)
    # -> +-g on every row.
    g = 5 / (math.sqrt(200 / 7) + EPS)  # 0.93541
    assert_stats(got["grpo"], 0.0, g, g, 1.0)
    # rloo: (x - 5) * 8 / 7 = +-40/7 on every row.
    assert_stats(got["rloo"], 0.0, 40 / 7, 40 / 7, 1.0)
    # gigpo: +-g plus the step term. Step 0: groups x {9.5, 9.5} and y {0, 0} add 0. Step 1: the
    # context-inconsistent group z {10, 10, 0, 0}, unbiased std sqrt(100/3) -> +-s.
    # |d| = g on the 4 step-0 rows, g + s on the 4 step-1 rows.
    s = 5 / (math.sqrt(100 / 3) + EPS)  # 0.86603
    assert_stats(got["gigpo"], 0.0, g + s / 2, math.sqrt((g * g + (g + s) ** 2) / 2), 1.0)
    # hgpo (K=2, weights (d+2) / (sum + eps)): step 0: depth 0 groups x and y are exactly 0 -> 0.
    # Step 1: depth 0 group z {10, 10, 0, 0}, population std 5 -> +-5/(5 + eps); depth 1 groups
    # (z, x) {10, 10} and (z, y) {0, 0} are exactly 0 and skipped (the authors' rule), so
    # A = 2 * 5/(5 + eps) / (2 + eps): the consistent level cannot pull it back to 0.
    h = 2 * (5 / (5 + EPS)) / (2 + EPS)
    assert_stats(got["hgpo"], 0.0, h / 2, h / math.sqrt(2), 1.0)
    assert got["hgpo"]["abs_dev"] < got["grpo"]["abs_dev"] < got["gigpo"]["abs_dev"]
    # K = 0 leaves hgpo only the inconsistent level: the same numbers (nothing was skipped at K=2)
    assert_stats(oracle_deviation(*cols, K=0, estimators="hgpo")["hgpo"], 0.0, h / 2, h / math.sqrt(2), 1.0)


def test_context_inconsistent_group_with_the_papers_statistics_and_weights():
    cols = columns(paper_rows())
    got = oracle_deviation(*cols, estimators=("gigpo", "hgpo"), stats="paper", level_weights="paper")
    # gigpo: episode term over trajectories {10, 10, 0, 0}, population std 5 -> +-e on every row;
    # step term at step 1, z {10, 10, 0, 0}, population std 5 -> +-e. |d| = e (step 0), 2e (step 1).
    e = 5 / (5 + EPS)
    assert_stats(got["gigpo"], 0.0, 1.5 * e, math.sqrt((e * e + 4 * e * e) / 2), 1.0)
    # hgpo: step 1 depth 0 alone (depth 1 exactly 0, skipped), weights w / sum w -> +-e.
    assert_stats(got["hgpo"], 0.0, e / 2, e / math.sqrt(2), 1.0)


# ----------------------------------------------------------------------------------------------
# 3. Steps with a unique history are excluded; no oracle step; empty batch


def test_steps_with_a_unique_history_are_excluded_but_counted_in_coverage():
    rows = paper_rows(extra_fail=True)  # A, B: x -> z (10); C: y -> z (0)
    cols = columns(rows)
    # C's history (y) and (y, z) is its own: 4 oracle steps (A, B at steps 0 and 1) of 6.
    oracle, is_oracle = oracle_advantages(*cols)
    for traj in "ABC":
        for t in (0, 1):
            assert is_oracle[row_of(rows, traj, t)] == (traj != "C")
    assert oracle.tolist() == [0.0] * 6  # {A, B} hold equal returns; C is not an oracle step
    got = oracle_deviation(*cols, estimators=ESTIMATORS)
    # grpo: rows {10 x4, 0 x2}, mean 20/3, unbiased std sqrt(80/3): A and B get
    # (10/3) / (sqrt(80/3) + eps) on all 4 rows; C's -2x that is not counted -> bias = abs_dev.
    g = (10 / 3) / (math.sqrt(80 / 3) + EPS)  # 0.64550
    assert_stats(got["grpo"], g, g, g, 4 / 6)
    # rloo: (10 - 20/3) * 6/5 = 4 on A's and B's rows
    assert_stats(got["rloo"], 4.0, 4.0, 4.0, 4 / 6)
    # gigpo: + step term at step 1, z {10, 10, 0}, unbiased std sqrt(100/3) -> (10/3)/sqrt(100/3)
    s = (10 / 3) / (math.sqrt(100 / 3) + EPS)  # 0.57735
    assert_stats(got["gigpo"], g + s / 2, g + s / 2, math.sqrt((g * g + (g + s) ** 2) / 2), 4 / 6)
    # hgpo: step 0 exactly 0 (x {9.5, 9.5}); step 1 depth 0 z {10, 10, 0}, population std
    # sqrt(200/9) -> (10/3) / (sqrt(200/9) + eps) = 1/sqrt(2), depth 1 (z, x) {10, 10} skipped.
    h = 2 * ((10 / 3) / (math.sqrt(200 / 9) + EPS)) / (2 + EPS)
    assert_stats(got["hgpo"], h / 2, h / 2, h / math.sqrt(2), 4 / 6)


def test_only_the_full_history_counts_not_the_last_anchors():
    # A: x y w, B: x z w (same task, same rewards). Step 0 (x) is shared; steps 1 and 2 are not:
    # B's step 2 has the same last anchor (and, at depth 0, the same hgpo group) as A's, but a
    # different history. C, in another task, repeats A's anchors: tasks never share a group.
    rows = [("T", "A", t, a, 0.0) for t, a in enumerate("xyw")] + \
           [("T", "B", t, a, 0.0) for t, a in enumerate("xzw")] + \
           [("U", "C", t, a, 0.0) for t, a in enumerate("xyw")]
    _, is_oracle = oracle_advantages(*columns(rows))
    assert [r[1:3] for r, o in zip(rows, is_oracle) if o] == [("A", 0), ("B", 0)]
    assert oracle_deviation(*columns(rows))["hgpo"]["coverage"] == pytest.approx(2 / 9)


def test_no_oracle_step_gives_nan_and_zero_coverage():
    unique = [(f"t{i % 2}", f"tr{i}", t, f"obs-{i}-{t}", float(t)) for i in range(4) for t in range(3)]
    alone = [(f"t{i}", f"tr{i}", t, "a", float(t)) for i in range(3) for t in range(2)]  # 1 traj per task
    for rows in (unique, alone):
        oracle, is_oracle = oracle_advantages(*columns(rows))
        assert not is_oracle.any() and oracle.tolist() == [0.0] * len(rows)
        for stats in oracle_deviation(*columns(rows), estimators=ESTIMATORS).values():
            assert math.isnan(stats["bias"]) and math.isnan(stats["abs_dev"]) and math.isnan(stats["rmse"])
            assert stats["coverage"] == 0.0


def test_empty_batch():
    oracle, is_oracle = oracle_advantages([], [], [], [], [])
    assert oracle.shape == (0,) and oracle.dtype == np.float32
    assert is_oracle.shape == (0,) and is_oracle.dtype == bool
    got = oracle_deviation([], [], [], [], [])
    assert set(got) == {"grpo", "gigpo", "hgpo"}
    for stats in got.values():
        assert all(math.isnan(stats[k]) for k in ("bias", "abs_dev", "rmse")) and stats["coverage"] == 0.0
    assert full_history_ids(prepare_batch([], [], [], [])).shape == (0,)
    assert oracle_deviation([], [], [], [], [], estimators=()) == {}


# ----------------------------------------------------------------------------------------------
# 4. Input order


def test_shuffled_input_gives_the_same_stats_and_input_ordered_oracle():
    rng = np.random.default_rng(3)
    rows = [(f"t{i % 3}", f"tr{i}", t, "ab"[rng.integers(2)], float(rng.choice((0.0, 0.0, 1.0, 10.0))),
             bool(rng.random() < 0.8)) for i in range(12) for t in range(rng.integers(1, 6))]
    kw = dict(K=2, estimators=ESTIMATORS, invalid_penalty=0.5)
    base = oracle_deviation(*columns(rows), valid=validity(rows), **kw)
    oracle, is_oracle = oracle_advantages(*columns(rows), valid=validity(rows), invalid_penalty=0.5)
    assert 0 < is_oracle.sum() < len(rows)
    for _ in range(3):
        perm = rng.permutation(len(rows))
        shuffled = [rows[i] for i in perm]
        got = oracle_deviation(*columns(shuffled), valid=validity(shuffled), **kw)
        for estimator in ESTIMATORS:
            for key, value in base[estimator].items():
                assert got[estimator][key] == pytest.approx(value, rel=1e-6, abs=1e-6), (estimator, key)
        o, f = oracle_advantages(*columns(shuffled), valid=validity(shuffled), invalid_penalty=0.5)
        np.testing.assert_array_equal(f, is_oracle[perm])
        np.testing.assert_allclose(o, oracle[perm], rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# 5. The invalid-action penalty reaches the oracle's returns


def test_invalid_action_penalty_reaches_the_oracle_returns():
    # a and b both see x, y and fail (rewards 0); a's step 1 is invalid. Penalty .1, gamma .95.
    rows = [("T", "a", 0, "x", 0.0, True), ("T", "a", 1, "y", 0.0, False),
            ("T", "b", 0, "x", 0.0, True), ("T", "b", 1, "y", 0.0, True)]
    cols, valid = columns(rows), validity(rows)
    # "row": R(a) = [0, -.1], R(b) = [0, 0]. Step 0 {0, 0} -> 0; step 1 {-.1, 0}: mean -.05.
    adv, is_oracle = oracle_advantages(*cols, valid=valid, mode="mean_norm")
    assert is_oracle.all()
    np.testing.assert_allclose(adv, [0.0, -0.05, 0.0, 0.05], atol=1e-7)
    assert adv[0] == 0.0 and adv[2] == 0.0
    adv, _ = oracle_advantages(*cols, valid=valid)  # population std .05
    np.testing.assert_allclose(adv, [0.0, -0.05 / (0.05 + EPS), 0.0, 0.05 / (0.05 + EPS)], atol=1e-6)
    # "reward": the penalty is discounted into a's step 0: R(a) = [-.095, -.1] -> step 0 +-.0475
    adv, _ = oracle_advantages(*cols, valid=valid, mode="mean_norm", penalty_placement="reward")
    np.testing.assert_allclose(adv, [-0.0475, -0.05, 0.0475, 0.05], atol=1e-7)
    # a larger penalty, gamma .5: R(a) = [-.5, -1] -> +-.25, +-.5
    adv, _ = oracle_advantages(*cols, valid=valid, mode="mean_norm", penalty_placement="reward",
                               invalid_penalty=1.0, gamma=0.5)
    np.testing.assert_allclose(adv, [-0.25, -0.5, 0.25, 0.5], atol=1e-7)
    # no penalty: every group equal -> exact zeros, and the estimators see the same returns
    adv, _ = oracle_advantages(*cols, valid=valid, invalid_penalty=0.0)
    assert adv.tolist() == [0.0] * 4
    # the same penalty reaches the estimator: hgpo (K=1) groups are the full-history groups here
    got = oracle_deviation(*cols, valid=valid, K=1, level_weights="paper", estimators="hgpo")
    assert_stats(got["hgpo"], 0.0, 0.0, 0.0, 1.0)


# ----------------------------------------------------------------------------------------------
# 6. Full-history ids


@settings(max_examples=60, deadline=None)
@given(rows=batches())
def test_full_history_ids_group_exactly_task_and_anchor_prefix(rows):
    batch = prepare_batch(*columns(rows)[:4])
    ids = full_history_ids(batch)
    n = len(rows)
    assert ids.dtype == np.int64 and ids.shape == (n,)
    if n:  # dense: every id in [0, G) is used
        assert set(ids.tolist()) == set(range(int(ids.max()) + 1))
    # in canonical order, row i - j is step t - j of the same trajectory
    cols = columns(rows)
    task = [cols[0][i] for i in batch.order]
    anchor = [cols[3][i] for i in batch.order]
    key = [(task[i],) + tuple(anchor[i - int(batch.step[i]):i + 1]) for i in range(n)]
    first = {}
    for i in range(n):
        first.setdefault(key[i], i)
    for i in range(n):  # same key <=> same id
        assert ids[i] == ids[first[key[i]]]
    assert len(set(key)) == len(set(ids.tolist()))
    # the same grouping as hgpo's level-t group of a step t (built the other way round)
    if n:
        levels = step_level_ids(batch, int(batch.step.max()))
        for t, (level_rows, level_ids, _) in enumerate(levels):
            at_t = level_rows[batch.step[level_rows] == t]
            pairs = set(zip(ids[at_t].tolist(), level_ids[batch.step[level_rows] == t].tolist()))
            assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})


# ----------------------------------------------------------------------------------------------
# The diagnostic against a plain reference, options passed through


def reference_oracle(rows, gamma, invalid_penalty, penalty_placement, mode, eps):
    """Dict-based oracle: group by (task, a_0..a_t); R_t from plain loops; equal groups give 0."""
    by_traj = {}
    for i, r in enumerate(rows):
        by_traj.setdefault(r[1], {})[r[2]] = i
    R, key = [0.0] * len(rows), [None] * len(rows)
    for steps in by_traj.values():
        idx = [steps[t] for t in range(len(steps))]
        pen = [invalid_penalty * (not (rows[i][5] if len(rows[i]) > 5 else True)) for i in idx]
        r = [rows[i][4] - (pen[t] if penalty_placement == "reward" else 0.0) for t, i in enumerate(idx)]
        for t, i in enumerate(idx):
            R[i] = sum(gamma ** (j - t) * r[j] for j in range(t, len(idx)))
            R[i] -= pen[t] if penalty_placement == "row" else 0.0
            key[i] = (rows[i][0],) + tuple(rows[j][3] for j in idx[:t + 1])
    groups = {}
    for i, k in enumerate(key):
        groups.setdefault(k, []).append(i)
    adv, is_oracle = [0.0] * len(rows), [False] * len(rows)
    for members in groups.values():
        if len(members) < 2:
            continue
        values = [R[i] for i in members]
        m, s = fmean(values), pstdev(values)
        for i in members:
            is_oracle[i] = True
            if len(set(values)) > 1:
                adv[i] = (R[i] - m) / (s + eps) if mode == "mean_std_norm" else R[i] - m
    return np.array(adv), np.array(is_oracle, bool)


semantics = st.fixed_dictionaries({
    "gamma": st.sampled_from((0.95, 0.5, 1.0)),
    "K": st.integers(0, 3),
    "mode": st.sampled_from(("mean_std_norm", "mean_norm")),
    "invalid_penalty": st.sampled_from((0.1, 1.0)),
    "penalty_placement": st.just("reward") | st.just("row"),
    "level_weights": st.sampled_from(("verl-agent", "paper")),
    "base_group": st.booleans(),
})


@settings(max_examples=30, deadline=None)
@given(rows=batches(with_valid=True), kw=semantics)
def test_matches_a_plain_reference_and_passes_options_to_the_estimators(rows, kw):
    cols, valid = columns(rows), validity(rows)
    oracle_kw = {k: kw[k] for k in ("gamma", "invalid_penalty", "penalty_placement", "mode")}
    want_adv, want_flag = reference_oracle(rows, eps=EPS, **oracle_kw)
    adv, flag = oracle_advantages(*cols, valid=valid, eps=EPS, **oracle_kw)
    np.testing.assert_array_equal(flag, want_flag)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-6, atol=1e-6)
    got = oracle_deviation(*cols, valid=valid, estimators=ESTIMATORS, eps=EPS, **kw)
    for estimator in ESTIMATORS:
        est = compute_step_advantages(estimator, *cols, valid=valid, eps=EPS, **kw).astype(np.float64)
        d = (est - want_adv)[want_flag]
        assert got[estimator]["coverage"] == pytest.approx(want_flag.mean() if len(rows) else 0.0)
        if d.size:
            want = {"bias": d.mean(), "abs_dev": np.abs(d).mean(), "rmse": math.sqrt((d * d).mean())}
            for k, v in want.items():
                assert got[estimator][k] == pytest.approx(v, rel=1e-5, abs=1e-5), (estimator, k)
        else:
            assert math.isnan(got[estimator]["bias"])


# ----------------------------------------------------------------------------------------------
# Validation and API


GOOD = (["t", "t", "t"], ["a", "a", "b"], [0, 1, 0], ["x", "y", "x"], [0.0, 1.0, 0.0])


def test_unknown_estimator_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'ppo'.*'grpo', 'rloo', 'gigpo', 'hgpo'"):
        oracle_deviation(*GOOD, estimators=("hgpo", "ppo"))


def test_bad_input_and_options_raise_like_compute_step_advantages():
    bad = (GOOD[0], GOOD[1], [0, 0, 0], GOOD[3], GOOD[4])
    for fn in (oracle_advantages, oracle_deviation):
        with pytest.raises(ValueError, match="duplicate"):
            fn(*bad)
        with pytest.raises(ValueError, match="finite"):
            fn(*GOOD[:4], [0.0, float("nan"), 0.0])
        with pytest.raises(ValueError, match="unknown mode"):
            fn(*GOOD, mode="zscore")
        with pytest.raises(ValueError, match="unknown penalty_placement"):
            fn(*GOOD, penalty_placement="episode")
        with pytest.raises(ValueError, match="gamma"):
            fn(*GOOD, gamma=2.0)
    with pytest.raises(ValueError, match="K"):
        oracle_deviation(*GOOD, K=-1, estimators=())
    with pytest.raises(ValueError, match="unknown stats"):
        oracle_deviation(*GOOD, stats="torch")
    # an error of the estimator as configured comes through
    with pytest.raises(ValueError, match="penalty_placement='reward'"):
        oracle_deviation(*GOOD, valid=[True, False, True], stats="paper", estimators="grpo")


def test_defaults_are_those_of_compute_step_advantages():
    want = {k: p.default for k, p in inspect.signature(compute_step_advantages).parameters.items()
            if p.default is not inspect.Parameter.empty}
    for fn in (oracle_deviation, oracle_advantages):
        params = inspect.signature(fn).parameters
        for name, p in params.items():
            if name in want:
                assert p.default == want[name], (fn.__name__, name)
    assert set(want) <= set(inspect.signature(oracle_deviation).parameters)


def test_one_shot_iterables_are_read_once():
    rows = paper_rows()
    cols = columns(rows)
    want = oracle_deviation(*cols)
    got = oracle_deviation(iter(cols[0]), iter(cols[1]), cols[2], (a for a in cols[3]), cols[4])
    assert got == want
