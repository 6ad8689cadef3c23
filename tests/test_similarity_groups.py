"""GiGPO's similarity-based step groups (`algo.similarity_thresh`, docs/advantages.md): the
authors' own functions on random cases, the greedy semantics on hand-made ones, the exact
shortcuts of `hgpo_jax.rl.similarity` against plain `SequenceMatcher.ratio()`, hgpo's clusters of
histories, and the option's checks.

The fixture tests/data/gigpo_similarity_reference.json holds inputs and the outputs of the
authors' code (verl-agent at 20bd331, `gigpo/core_gigpo.py` with their reward manager and invalid-
action penalty), produced outside the repository with

    python tests/data/gigpo_similarity_reference.py <copy of verl-agent 20bd331> \\
        tests/data/gigpo_similarity_reference.json

(torch 2.13, NumPy, Python 3.11; the script's docstring says what it drives and how). Advantages
must agree within 1e-4, step groups exactly (as partitions: their group ids are uuids).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import sys
from collections import Counter
from difflib import SequenceMatcher

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

sys.path.insert(0, os.path.dirname(__file__))

from reference_advantages import reference_step_advantages  # noqa: E402

from hgpo_jax.algo_specs import GroupOptions  # noqa: E402
from hgpo_jax.config import load_config  # noqa: E402
from hgpo_jax.config_checks import ConfigError  # noqa: E402
from hgpo_jax.rl import (  # noqa: E402
    index_step_groups,
    compute_step_advantages,
    hierarchy_stats,
    prepare_batch,
    similarity,
)
from hgpo_jax.rl.grouping import authors_order, cluster_ids  # noqa: E402

FIXTURE = json.loads((pathlib.Path(__file__).parent / "data" / "gigpo_similarity_reference.json")
                     .read_text())
ATOL = 1e-4


def ratio(a: str, b: str) -> float:
    return SequenceMatcher(None, a, b).ratio()


def naive_clusters(task_ids, traj_ids, anchors, t: float) -> list[str]:
    """The semantics, plainly: rows visited trajectory by trajectory in order of first appearance
    (each trajectory's rows by step), each joining the first cluster of its task whose first
    anchor `rep` has ratio(anchor, rep) >= t. Returns each row's representative, input order.
    Rows must be given with each trajectory's steps in order."""
    first = {}
    for i, traj in enumerate(traj_ids):
        first.setdefault(traj, len(first))
    visit = sorted(range(len(anchors)), key=lambda i: first[traj_ids[i]])  # stable: steps kept
    reps: dict = {}
    out = [None] * len(anchors)
    for i in visit:
        mine = reps.setdefault(task_ids[i], [])
        out[i] = next((rep for rep in mine if ratio(anchors[i], rep) >= t), None)
        if out[i] is None:
            mine.append(anchors[i])
            out[i] = anchors[i]
    return out


def same_partition(a, b) -> bool:
    a, b = list(a), list(b)
    return len(set(zip(a, b))) == len(set(a)) == len(set(b))


def step_groups(task_ids, traj_ids, step_ids, anchors, t, K=0, prefix_anchors=None) -> np.ndarray:
    """Step groups [N, K+1] in input order (-1: none)."""
    batch = prepare_batch(task_ids, traj_ids, step_ids, anchors, prefix_anchors=prefix_anchors,
                          keep_anchor_values=True)
    ids = index_step_groups(batch, K, t).ids
    out = np.empty_like(ids)
    out[batch.order] = ids
    return out


# ---------------------------------------------------------------------------------- the authors


def fixture_columns(case):
    rows = case["rows"]
    return (np.array([case["tasks"][r[0]] for r in rows]),  # NumPy str: ids sort, unlike the
            np.array([case["trajs"][r[1]] for r in rows]),  # batch order the authors visit
            [r[2] for r in rows], [case["anchors"][r[3]] for r in rows],
            [float(r[4]) for r in rows]), [bool(r[5]) for r in rows]


def test_fixture_covers_what_it_should():
    cases = FIXTURE["cases"]
    assert "verl-agent 20bd331" in FIXTURE["source"]
    assert {c["t"] for c in cases} == {0.5, 0.8, 0.9, 0.95}
    assert sum(c["penalty"] > 0 for c in cases) > 40 and sum(c["penalty"] == 0 for c in cases) > 40
    # groups that only the similarity rule makes: some hold different anchors
    mixed = sum(len({c["rows"][i][3] for i, g2 in enumerate(c["groups"]) if g2 == g}) > 1
                for c in cases for g in set(c["groups"]))
    assert mixed > 100


@pytest.mark.parametrize("index", range(len(FIXTURE["cases"])))
def test_authors_similarity_gigpo(index):
    case = FIXTURE["cases"][index]
    cols, valid = fixture_columns(case)
    got = compute_step_advantages("gigpo", *cols, valid=valid, invalid_penalty=case["penalty"],
                                  gamma=FIXTURE["gamma"], eps=FIXTURE["eps"], mode=FIXTURE["mode"],
                                  similarity_thresh=case["t"])
    np.testing.assert_allclose(got, case["adv"], rtol=0, atol=ATOL)
    assert same_partition(step_groups(*cols[:4], case["t"])[:, 0], case["groups"])
    # the project's reading of the same rule, plainly written
    reps = naive_clusters(*cols[:2], cols[3], case["t"])
    assert same_partition(zip(cols[0], reps), case["groups"])


def test_the_authors_order_matters_in_the_fixture():
    """Clustering the trajectories in sorted-id order (not the batch order) changes the groups of
    many cases: the fixture pins the order down."""
    changed = 0
    for case in FIXTURE["cases"]:
        cols, _ = fixture_columns(case)
        order = np.argsort(cols[1], kind="stable")  # rows by sorted trajectory id, steps kept
        resorted = [np.asarray(c)[order].tolist() for c in cols[:4]]
        groups = step_groups(*resorted, case["t"])[:, 0]
        changed += not same_partition(groups, np.asarray(case["groups"])[order])
    assert changed > 20


# ------------------------------------------------------------------------------ greedy semantics


def test_a_row_similar_to_two_clusters_joins_the_first():
    c1, c2, x = "abcdefgh", "ijklmnop", "abcdijkl"
    assert ratio(x, c1) == ratio(x, c2) == 0.5 and ratio(c2, c1) == 0.0
    cols = (["T"] * 3, ["a", "b", "c"], [0, 0, 0])
    g = step_groups(*cols, [c1, c2, x], 0.5)[:, 0]
    assert g[2] == g[0] != g[1]
    g = step_groups(*cols, [c2, c1, x], 0.5)[:, 0]  # the other cluster first
    assert g[2] == g[0] != g[1]


def test_similarity_is_to_the_representative_not_the_latest_member():
    a, b, c = "abcdefgh", "abcdefXY", "abcdXYZW"
    assert ratio(b, a) == 0.75 and ratio(c, b) == 0.75 and ratio(c, a) == 0.5
    g = step_groups(["T"] * 3, ["r", "s", "u"], [0, 0, 0], [a, b, c], 0.75)[:, 0]
    assert g[0] == g[1] != g[2]  # {a, b}, {c}: c is like b but not like a, the representative
    g = step_groups(["T"] * 3, ["r", "s", "u"], [0, 0, 0], [b, a, c], 0.75)[:, 0]
    assert g[0] == g[1] == g[2]  # b first: it represents all three


def test_trajectories_are_visited_in_order_of_first_appearance():
    c1, c2, x, other = "abcdefgh", "ijklmnop", "abcdijkl", "qqqqqqqq"
    task = ["T"] * 4
    # step by step (both step 0s, then both step 1s); trajectory "z" appears first although "a"
    # sorts first (NumPy ids are sorted into the canonical order)
    traj, step = np.array(["z", "a", "z", "a"]), [0, 0, 1, 1]
    g = step_groups(task, traj, step, [c1, c2, x, other], 0.5)[:, 0]
    assert g[2] == g[0] != g[1]  # z's x joins z's c1, the first cluster
    # the same rows trajectory by trajectory: the same first appearances, the same groups
    order = [0, 2, 1, 3]
    g2 = step_groups(task, traj[order], np.take(step, order), np.take([c1, c2, x, other], order), 0.5)
    assert same_partition(g[order], g2[:, 0])
    # "a" first: x joins a's c2
    g = step_groups(task, np.array(["a", "z", "a", "z"]), step, [c2, c1, x, other], 0.5)[:, 0]
    assert g[2] == g[0] != g[1]


def test_steps_of_a_trajectory_are_visited_in_step_order_whatever_the_row_order():
    c1, c2, x = "abcdefgh", "ijklmnop", "abcdijkl"
    # one trajectory: c1 at step 0, c2 at step 1, x at step 2; rows given backwards
    g = step_groups(["T"] * 3, ["a"] * 3, [2, 1, 0], [x, c2, c1], 0.5)[:, 0]
    assert g[0] == g[2] != g[1]


def test_tasks_never_share_a_cluster():
    g = step_groups(["T", "U"], ["a", "b"], [0, 0], ["same text", "same text"], 0.5)[:, 0]
    assert g[0] != g[1]


def test_argument_order_of_the_ratio_is_the_authors():
    """ratio(a, rep) and ratio(rep, a) differ for long strings (difflib's autojunk looks at the
    second one); the row placed is the first argument, the representative the second."""
    found = 0
    for case in FIXTURE["cases"][::8]:
        t = case["t"]
        long = [a for a in case["anchors"] if len(a) >= 200]
        for rep in long:
            for row in long:
                forward, backward = ratio(row, rep), ratio(rep, row)
                if (forward >= t) != (backward >= t):
                    found += 1
                    g = step_groups(["T"] * 2, ["a", "b"], [0, 0], [rep, row], t)[:, 0]
                    assert (g[0] == g[1]) == (forward >= t)
    assert found >= 5


def test_prefix_anchors_are_clustered_after_the_rows():
    """Replayed-prefix anchors (history only) take the cluster of their task they are similar to;
    hgpo's level 1 of step 0 then groups trajectories whose prefixes are similar."""
    task, traj, step = ["T"] * 2, ["a", "b"], [0, 0]
    anchors = ["kitchen counter", "kitchen counter"]
    prefix = {"a": ["you are in a room with a table"], "b": ["you are in a room with a tablX"]}
    g = step_groups(task, traj, step, anchors, 0.9, K=1, prefix_anchors=prefix)
    assert g[0, 1] == g[1, 1] >= 0
    fractions = hierarchy_stats(task, traj, step, anchors, K=1, prefix_anchors=prefix)
    similar = hierarchy_stats(task, traj, step, anchors, K=1, prefix_anchors=prefix,
                              similarity_thresh=0.9)
    np.testing.assert_array_equal(fractions, [1.0, 0.0])
    np.testing.assert_array_equal(similar, [1.0, 1.0])
    # a prefix anchor never changes the rows' clusters: a row like it starts its own
    g = step_groups(["T"] * 2, ["a", "b"], [0, 0], ["abcdefgh", "abcdefgX"], 0.8,
                    prefix_anchors={"a": ["zzzzzzzz"]})
    assert g[0, 0] == g[1, 0]


# ------------------------------------------------------------------------------ random batches


def near_duplicates(draw):
    base = draw(st.text("abcdef xyz", min_size=6, max_size=24))
    long_base = draw(st.text("abcdef xyz{}:", min_size=200, max_size=240))
    pool = [base, long_base]
    for source in (base, long_base) * 3:
        chars = list(source)
        for _ in range(draw(st.integers(1, 6))):
            k = draw(st.integers(0, len(chars) - 1))
            chars[k] = draw(st.sampled_from("abcdefQ"))
        pool.append("".join(chars))
    return pool


@st.composite
def similar_batches(draw):
    """Rows in batch order (trajectory by trajectory): 1-3 tasks, 1-4 trajectories, 1-5 steps,
    anchors from near duplicates of a short and a long string."""
    pool = near_duplicates(draw)
    rows = []
    for task in range(draw(st.integers(1, 3))):
        for traj in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, 5))
            for t in range(length):
                rows.append((f"T{task}", f"T{task}-{traj}", t, draw(st.sampled_from(pool)),
                             draw(st.sampled_from((0.0, 0.0, 1.0)))))
    return [list(c) for c in zip(*rows)]


@settings(max_examples=60, deadline=None)
@given(cols=similar_batches(), t=st.sampled_from((0.3, 0.5, 0.8, 0.9, 0.95)))
def test_clusters_equal_the_plain_greedy_loop(cols, t):
    similarity.forget()  # decide every pair afresh, not from an earlier example's memo
    task, traj, step, anchors, _ = cols
    plain = list(zip(task, naive_clusters(task, traj, anchors, t)))  # (task, representative)
    assert same_partition(step_groups(task, traj, step, anchors, t)[:, 0], plain)
    assert same_partition(step_groups(task, traj, step, anchors, t)[:, 0], plain)  # memo


@settings(max_examples=40, deadline=None)
@given(cols=similar_batches(), t=st.sampled_from((0.5, 0.8, 0.9)), K=st.integers(0, 3),
       stats=st.sampled_from(("verl-agent", "paper")))
def test_estimators_group_by_the_representatives(cols, t, K, stats):
    """With a threshold, gigpo and hgpo equal the exact-anchor reference given each row's
    cluster representative as its anchor (hgpo's level k: the clusters of a_t, ..., a_{t-k})."""
    task, traj, step, anchors, rewards = cols
    reps = naive_clusters(task, traj, anchors, t)
    for estimator in ("gigpo", "hgpo"):
        kw = dict(K=K, stats=stats)
        got = compute_step_advantages(estimator, task, traj, step, anchors, rewards,
                                      similarity_thresh=t, **kw)
        want = reference_step_advantages(estimator, task, traj, step, reps, rewards, **kw)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(cols=similar_batches(), t=st.sampled_from((0.5, 0.9)), K=st.integers(1, 3))
def test_hgpo_level_0_is_gigpos_similarity_groups(cols, t, K):
    task, traj, step, anchors, _ = cols
    hgpo = step_groups(task, traj, step, anchors, t, K=K)
    gigpo = step_groups(task, traj, step, anchors, t, K=0)
    assert same_partition(hgpo[:, 0], gigpo[:, 0])
    # and a deeper level refines the one above it
    for k in range(1, K + 1):
        has = hgpo[:, k] >= 0
        assert same_partition(hgpo[has, k], list(zip(hgpo[has, k - 1], hgpo[has, k])))


@settings(max_examples=40, deadline=None)
@given(cols=similar_batches(), estimator=st.sampled_from(("grpo", "rloo", "gigpo", "hgpo")),
       K=st.integers(0, 2))
def test_threshold_none_is_the_exact_grouping(cols, estimator, K):
    task, traj, step, anchors, rewards = cols
    plain = compute_step_advantages(estimator, task, traj, step, anchors, rewards, K=K)
    np.testing.assert_array_equal(
        compute_step_advantages(estimator, task, traj, step, anchors, rewards, K=K,
                                similarity_thresh=None), plain)
    batch = prepare_batch(task, traj, step, anchors)
    a, b = index_step_groups(batch, K), index_step_groups(batch, K, None)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.sizes, b.sizes)
    # grpo and rloo have no step groups: a threshold changes nothing
    if estimator in ("grpo", "rloo"):
        np.testing.assert_array_equal(
            compute_step_advantages(estimator, task, traj, step, anchors, rewards, K=K,
                                    similarity_thresh=0.5), plain)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 4), t=st.sampled_from((0.2, 0.5, 0.99)),
       letters=st.lists(st.sampled_from("xyzw"), min_size=1, max_size=12))
def test_mutually_dissimilar_anchors_give_the_exact_groups(n, t, letters):
    """Single letters: equal ones have ratio 1, different ones 0, so clusters are the anchors."""
    rows = [(f"T{i % (n + 1) % n}", f"tr{i % (n + 1)}", i // (n + 1), a, float(i % 3 == 0))
            for i, a in enumerate(letters)]
    cols = [list(c) for c in zip(*rows)]
    for estimator in ("gigpo", "hgpo"):
        np.testing.assert_array_equal(
            compute_step_advantages(estimator, *cols, similarity_thresh=t),
            compute_step_advantages(estimator, *cols))


# ------------------------------------------------------------------------------ exact shortcuts


def random_pairs(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        alphabet = rng.choice(["ab", "abc ", "abcdefgh {}:", "the quick brown fox"])
        a = "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 3, 20, 150, 199, 200, 260])))
        b = list(a)
        for _ in range(rng.randint(0, 30)):
            if b and rng.random() < 0.3:
                del b[rng.randrange(len(b))]
            else:
                b.insert(rng.randint(0, len(b)), rng.choice(alphabet))
        b = "".join(b) if rng.random() < 0.8 else "".join(rng.choice(alphabet) for _ in range(len(b)))
        yield (a, b) if rng.random() < 0.5 else (b, a)


def test_equal_strings_have_ratio_one():
    """The shortcut 'equal anchors are similar' is exact: ratio(s, s) = 1.0, also where difflib's
    autojunk removes every character of s from its index (200+ characters, all popular)."""
    for s in ["", "a", "ab" * 150, "a" * 300, "abcd" * 60 + "q", *(a for a, _ in random_pairs(1, 300))]:
        assert ratio(s, s) == 1.0


@pytest.mark.parametrize("t", [0.1, 0.5, 0.75, 0.9, 0.95, 0.99])
def test_similarity_decisions_equal_the_ratio(t):
    pairs = list(random_pairs(2, 400))
    texts = sorted({s for p in pairs for s in p})
    code = {s: i for i, s in enumerate(texts)}
    similarity.forget()
    similar = similarity.Similarity(texts, t)
    for a, b in pairs:
        assert similar(code[a], code[b]) == (ratio(a, b) >= t), (a, b)
    assert similar.stats["blocks"] and similar.stats["lengths"]


def test_similarity_counts_are_difflibs_bounds():
    for a, b in random_pairs(3, 200):
        m = SequenceMatcher(None, a, b)
        total = len(a) + len(b)
        overlap = similarity.char_overlap(Counter(a), Counter(b))
        assert similarity.difflib_ratio(overlap, total) == m.quick_ratio()
        assert similarity.difflib_ratio(min(len(a), len(b)), total) == m.real_quick_ratio()
        for t in (0.3, 0.6, 0.9):
            assert similarity.blocks_reach(SequenceMatcher(None, a, b), t) == (m.ratio() >= t)


def test_authors_order_is_the_batch_order_of_trajectory_major_rows():
    traj = np.array(["c", "c", "a", "b", "b", "b"])  # sorted ids would put a first
    batch = prepare_batch(["T"] * 6, traj, [0, 1, 0, 0, 1, 2], list("uvwxyz"))
    np.testing.assert_array_equal(batch.order[authors_order(batch)], np.arange(6))


# ------------------------------------------------------------------------------ the option


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, -0.5, 1.5, float("nan"), True, "0.9"])
def test_threshold_outside_the_open_interval_is_refused(value):
    with pytest.raises(ValueError, match="similarity_thresh"):
        GroupOptions(similarity_thresh=value)
    with pytest.raises(ValueError, match="similarity_thresh"):
        compute_step_advantages("gigpo", ["T"], ["a"], [0], ["x"], [0.0], similarity_thresh=value)


def test_threshold_needs_text_anchors():
    for anchors in ([1, 2], [("room", 1), ("room", 2)], [b"x", b"y"]):
        with pytest.raises(ValueError, match="must be a str"):
            compute_step_advantages("gigpo", ["T", "T"], ["a", "b"], [0, 0], anchors, [0.0, 1.0],
                                    similarity_thresh=0.9)
        with pytest.raises(ValueError, match="must be a str"):
            hierarchy_stats(["T", "T"], ["a", "b"], [0, 0], anchors, similarity_thresh=0.9)
        compute_step_advantages("gigpo", ["T", "T"], ["a", "b"], [0, 0], anchors, [0.0, 1.0])
    # NumPy strings are text
    compute_step_advantages("hgpo", ["T", "T"], ["a", "b"], [0, 0], np.array(["x", "y"]),
                            [0.0, 1.0], similarity_thresh=0.9)
    with pytest.raises(ValueError, match="keep_anchor_values"):
        index_step_groups(prepare_batch(["T"], ["a"], [0], ["x"]), 0, 0.9)


def test_config_key():
    assert load_config().algo.similarity_thresh is None
    for estimator in ("gigpo", "hgpo"):
        cfg = load_config(None, [f"algo.estimator={estimator}", "algo.similarity_thresh=0.9"])
        assert GroupOptions.of(cfg.algo).similarity_thresh == 0.9
        assert load_config(None, [f"algo.estimator={estimator}", "algo.similarity_thresh=0.9",
                                  "algo.similarity_thresh=null"]).algo.similarity_thresh is None
    for bad in ("1", "0", "1.5", "yes"):
        with pytest.raises(ConfigError, match="similarity_thresh"):
            load_config(None, ["algo.estimator=gigpo", f"algo.similarity_thresh={bad}"])
    for estimator in ("grpo", "rloo"):  # no step groups: not their option
        with pytest.raises(ConfigError, match=rf"algo\.similarity_thresh is not an option of "
                                              rf"algo\.estimator={estimator}"):
            load_config(None, [f"algo.estimator={estimator}", "algo.similarity_thresh=0.9"])


def test_benchmark_runs():
    from experiments.benchmarks import bench_similarity as bench

    out = bench.main(["--tasks", "3", "--thresh", "0.5", "0.9", "--naive"])
    assert all(r["same_partition"] for r in out.values())


def test_the_trainers_group_unit_reads_the_threshold():
    """`algo.similarity_thresh` reaches the advantages, the diagnostics and the level statistics
    the trainer logs (anchors "obs0" and "obs1": ratio 0.75, one cluster at 0.5)."""
    from test_algorithms import BATCH, rollout_batch, step_rows

    from hgpo_jax.rl.algorithms import build_algorithm

    b = rollout_batch(**BATCH)
    rows = step_rows(b)
    cols = (b.task_id, b.traj_id, b.step_id, b.anchor, b.reward)
    for name in ("gigpo", "hgpo"):
        cfg = load_config("tiny_cpu_toy", [f"algo.estimator={name}", "algo.similarity_thresh=0.5",
                                           "train.diagnostics=true"])
        adv = build_algorithm(cfg).advantages(rows, None, None)
        options = GroupOptions.of(cfg.algo)
        want = compute_step_advantages(name, *cols, valid=b.valid, options=options)
        np.testing.assert_array_equal(adv.row_adv, want)
        exact = compute_step_advantages(name, *cols, valid=b.valid, K=options.K)
        assert not np.allclose(want, exact)
        levels = hierarchy_stats(*cols[:4], K=options.K, similarity_thresh=0.5)
        assert adv.row_means["hierarchy/level0_grouped_fraction"] == levels[0] == 1.0
        assert f"diag/{name}/bias" in adv.row_means
