"""Cost of GiGPO's similarity step groups (`algo.similarity_thresh`) on a search-like batch.

    python -m experiments.benchmarks.bench_similarity                  # 256 tasks x 5 x 4 steps, t = 0.9
    python -m experiments.benchmarks.bench_similarity --thresh 0.5 0.8 0.9 0.95 --naive

A batch like verl-agent's search runs (train_data_size 256, group_size 5, max_steps 4): step 0's
anchor is the task's question (the same for its 5 trajectories); a later step's anchor is the
retrieval result the env returned (~1,500 characters of JSON: 3 documents of ~450 characters from
the task's pool of 8), one of 6 results per task (the same query gives the same text), some with
a one-character change (a near duplicate), drawn with skewed weights so many are identical.

It times the clustering alone (`hgpo_jax.rl.grouping.cluster_ids`) and the whole
`compute_step_advantages("gigpo", ...)`, each with an empty pair memo, then hgpo on the same batch
(its pairs from the memo); with --naive also the authors' loop (every row against
every cluster's representative with `SequenceMatcher(None, a, rep).ratio()`), checks that both
give the same partition, and prints how the pairs were decided.
"""

from __future__ import annotations

import argparse
import json
import time
from difflib import SequenceMatcher

import numpy as np

from hgpo_jax.rl import compute_step_advantages, prepare_batch
from hgpo_jax.rl import similarity
from hgpo_jax.rl.grouping import authors_order, cluster_ids

WORDS = [w for w in (
    "the of and to in a is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "river city film album band season party war church school station village county district "
    "population census university team league species family genus born died known located "
    "american british french german capital president minister released record company founded"
).split()]


def paragraph(rng, chars: int) -> str:
    out = []
    while sum(map(len, out)) + len(out) < chars:
        out.append(str(rng.choice(WORDS)))
    return " ".join(out)


def search_batch(rng, tasks: int, group: int, steps: int) -> dict:
    """Rows in verl-agent's order (task by task, trajectory by trajectory, step by step)."""
    cols = {k: [] for k in ("task_ids", "traj_ids", "step_ids", "anchors", "rewards")}
    for p in range(tasks):
        question = f"Question {p}: who founded the {paragraph(rng, 60)}?"
        docs = [{"id": str(rng.integers(10**6, 10**7)), "title": paragraph(rng, 25).title(),
                 "contents": paragraph(rng, 400)} for _ in range(8)]
        results = []
        for _ in range(6):
            chosen = rng.choice(8, size=3, replace=False)
            results.append(json.dumps({"result": [{"document": docs[i]} for i in chosen]}))
        for r in range(2):  # near duplicates: one character changed
            text = results[r]
            k = int(rng.integers(len(text)))
            results.append(text[:k] + "#" + text[k + 1:])
        weights = np.array([8, 4, 2, 1, 1, 1, 1, 1], float)
        for g in range(group):
            won = float(rng.random() < 0.4)
            for t in range(steps):
                anchor = question if t == 0 else results[rng.choice(len(results), p=weights / weights.sum())]
                cols["task_ids"].append(f"q{p}")
                cols["traj_ids"].append(f"q{p}-{g}")
                cols["step_ids"].append(t)
                cols["anchors"].append(anchor)
                cols["rewards"].append(won if t == steps - 1 else 0.0)
    return cols


def naive_partition(cols, t: float) -> tuple[list[int], int]:
    """The authors' loop: per task, rows in order, each against every representative in turn.
    Returns (each row's cluster, the number of ratio() calls)."""
    labels, clusters, calls = [0] * len(cols["anchors"]), {}, 0
    for i, (task, anchor) in enumerate(zip(cols["task_ids"], cols["anchors"])):
        reps = clusters.setdefault(task, [])
        for rep, label in reps:
            calls += 1
            if SequenceMatcher(None, anchor, rep).ratio() >= t:
                labels[i] = label
                break
        else:
            labels[i] = sum(map(len, clusters.values()))
            reps.append((anchor, labels[i]))
    return labels, calls


def same_partition(a, b) -> bool:
    pairs = set(zip(a, b))
    return len(pairs) == len(set(a)) == len(set(b))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--group", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--thresh", type=float, nargs="+", default=[0.9])
    ap.add_argument("--naive", action="store_true", help="also time the authors' loop")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cols = search_batch(np.random.default_rng(args.seed), args.tasks, args.group, args.steps)
    n = len(cols["anchors"])
    print(f"{n} rows, {len(set(cols['anchors']))} distinct anchors, "
          f"mean length {np.mean([len(a) for a in cols['anchors']]):.0f} characters")
    for estimator in ("gigpo", "hgpo"):  # warm-up: the jitted functions compile
        compute_step_advantages(estimator, **cols)
    out = {}
    for t in args.thresh:
        batch = prepare_batch(cols["task_ids"], cols["traj_ids"], cols["step_ids"], cols["anchors"],
                              keep_anchor_values=True)
        similarity.forget()
        start = time.perf_counter()
        rows, _, num, similar = cluster_ids(batch, t)
        cluster_s = time.perf_counter() - start
        similarity.forget()
        start = time.perf_counter()
        compute_step_advantages("gigpo", **cols, similarity_thresh=t)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()  # the same batch again: the pairs come from the memo
        compute_step_advantages("hgpo", **cols, similarity_thresh=t)
        warm_s = time.perf_counter() - start
        start = time.perf_counter()
        compute_step_advantages("gigpo", **cols)
        exact_s = time.perf_counter() - start
        record = {"clusters": num, "cluster_s": cluster_s, "gigpo_s": cold_s, "hgpo_memo_s": warm_s,
                  "exact_gigpo_s": exact_s, "pairs": dict(similar.stats)}
        line = (f"t={t}: {num} clusters; clustering {cluster_s:.2f} s, gigpo {cold_s:.2f} s, then "
                f"hgpo (K=2, pairs from the memo) {warm_s:.2f} s (gigpo on exact anchors "
                f"{exact_s:.3f} s); pairs decided by lengths / characters / blocks: "
                f"{similar.stats['lengths']} / {similar.stats['characters']} / {similar.stats['blocks']}")
        if args.naive:
            start = time.perf_counter()
            labels, record["naive_calls"] = naive_partition(cols, t)
            record["naive_s"] = time.perf_counter() - start
            ours = np.empty(n, np.int64)
            ours[batch.order] = rows
            record["same_partition"] = same_partition(labels, ours.tolist())
            line += (f"; the authors' loop {record['naive_s']:.1f} s ({record['naive_calls']} ratio() "
                     f"calls), same partition: {record['same_partition']}")
            assert record["same_partition"]
        print(line, flush=True)
        out[t] = record
    assert np.array_equal(authors_order(batch), np.arange(n))  # rows given in the authors' order
    return out


if __name__ == "__main__":
    main()
