"""How often the authors' float32 statistics give a spurious advantage to a group of equal values.

hgpo-jax computes group statistics so that a group whose values are equal (in exact arithmetic)
gives exactly 0 (docs/advantages.md, "Exact zeros"). The authors' code computes them in float32
with torch: the mean of a group of equal non-zero values can be off by one unit in the last
place, and dividing that by (std + 1e-6), with a std of the same tiny size, turns it into an
advantage of about +/-0.3-0.6. This script measures how often that happens on real ALFWorld
rollout batches, and how much it changes the per-step advantages.

Rollouts: the real TextWorld engine, 16 groups x 8 envs, up to 50 steps (the paper's batch). No
model: a scripted policy replaces it (experiments/scripted_rollouts.py): at each step an invalid
reply with probability --invalid, the walkthrough's next action with probability --expert, else a
random admissible action. Anchors are the raw observations.

For every batch and estimator (the authors' defaults: penalty on the invalid row, step-row
statistics, verl-agent level weights) the script compares hgpo-jax's advantages with a float32
torch emulation of the authors' arithmetic written from its description (test-only dependency):
  * equal-value groups: groups of >= 2 rows (hgpo levels, gigpo step groups, task groups) whose
    values are equal in exact arithmetic and non-zero, and the fraction of them that the float32
    emulation gives a non-zero (|A| > 1e-3) advantage;
  * rows whose final advantage differs by more than 0.01, and the largest difference;
  * and, apart from the rollouts, for group sizes 2..8 and the typical equal values of an ALFWorld
    group (10 * 0.95^k with or without the penalty, -0.1), how many the emulation gets wrong.

  python -m experiments.exact_zero_frequency                  # 2 batches, ~15 min on 2 cores
  python -m experiments.exact_zero_frequency --batches 1 --groups 4   # a quick look
Writes docs/results/exact_zero_frequency.json (or --out).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections import defaultdict
from fractions import Fraction

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from hgpo_jax.envs.alfworld import AlfworldEnv, list_games
from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.rl import ESTIMATORS, compute_step_advantages

from experiments.scripted_rollouts import alfworld_plan, collect

GAMMA, PENALTY, EPS, K, ALPHA = 0.95, 0.1, 1e-6, 2, 1.0


# ------------------------------------------------------------------------------ float32 emulation
def authors_float32(estimator: str, cols: dict) -> tuple[np.ndarray, list[tuple[list[float], np.ndarray]]]:
    """The authors' arithmetic in torch float32, written from its description.

    Returns (advantages [N], groups): groups = [(exact values, float32 normalized values)] of
    every group of >= 2 rows the estimator normalizes.
    """
    import torch

    n = len(cols["rewards"])
    f32 = np.float32
    by_traj = defaultdict(list)
    for i in range(n):
        by_traj[cols["traj_ids"][i]].append(i)
    for rows in by_traj.values():
        rows.sort(key=lambda i: cols["step_ids"][i])
    invalid = np.array([0.0 if v else 1.0 for v in cols["valid"]], f32)
    rewards = np.asarray(cols["rewards"], f32)
    returns = np.zeros(n, f32)
    score = np.zeros(n, f32)
    exact_R = [Fraction(0)] * n
    exact_score = [Fraction(0)] * n
    g, p = Fraction("0.95"), Fraction("0.1")
    for rows in by_traj.values():
        running, exact = f32(0.0), Fraction(0)
        for i in reversed(rows):
            running = f32(rewards[i] + f32(GAMMA) * running)
            exact = Fraction(repr(float(cols["rewards"][i]))) + g * exact
            returns[i], exact_R[i] = running, exact
        total = f32(0.0)
        for i in rows:
            total = f32(total + rewards[i])
        for i in rows:
            score[i] = total
            exact_score[i] = sum(Fraction(repr(float(cols["rewards"][j]))) for j in rows)
    R = torch.tensor(returns) - PENALTY * torch.tensor(invalid)
    S = torch.tensor(score) - PENALTY * torch.tensor(invalid)
    exact_R = [x - p * int(v) for x, v in zip(exact_R, invalid)]
    exact_score = [x - p * int(v) for x, v in zip(exact_score, invalid)]
    groups = []

    def normalize(idx, values, exact, unbiased, singleton_raw):
        x = values[idx]
        if len(idx) == 1:
            return x / (1.0 + EPS) if singleton_raw else torch.zeros_like(x)
        a = (x - x.mean()) / (x.std(unbiased=unbiased) + EPS)
        groups.append(([exact[i] for i in idx], a.numpy()))
        return a

    task_rows = defaultdict(list)
    for i in range(n):
        task_rows[cols["task_ids"][i]].append(i)
    out = torch.zeros(n)
    if estimator in ("grpo", "gigpo"):
        for idx in task_rows.values():
            out[idx] = normalize(idx, S, exact_score, True, True)
    if estimator == "rloo":
        for idx in task_rows.values():
            m = len(idx)
            out[idx] = S[idx] if m == 1 else S[idx] * m / (m - 1) - S[idx].mean() * m / (m - 1)
    if estimator == "gigpo":
        step = defaultdict(list)
        for i in range(n):
            step[(cols["task_ids"][i], cols["anchors"][i])].append(i)
        for idx in step.values():
            out[idx] += normalize(idx, R, exact_R, True, False)
    if estimator == "hgpo":
        items = defaultdict(list)  # row -> [(weight, value)]
        for depth in range(K + 1):
            level = defaultdict(list)
            for rows in by_traj.values():
                for t in range(depth, len(rows)):
                    key = (cols["task_ids"][rows[t]],) + tuple(cols["anchors"][rows[t - j]] for j in range(depth + 1))
                    level[key].append(rows[t])
            for idx in level.values():
                if len(idx) >= 2:
                    a = normalize(idx, R, exact_R, False, False)
                    for i, v in zip(idx, a):
                        items[i].append((float((depth + 2) ** ALPHA), v))
        for i, its in items.items():
            w = torch.tensor([w for w, v in its if v != 0])
            v = torch.stack([v for _, v in its if v != 0]) if len(w) else None
            out[i] = (w / (w.sum() + EPS) * v).sum() if len(w) else 0.0
    return out.numpy(), groups


# ------------------------------------------------------------------------------ measurement
def measure(cols: dict) -> dict:
    result = {}
    args = [cols[k] for k in ("task_ids", "traj_ids", "step_ids", "anchors", "rewards")]
    for estimator in ESTIMATORS:
        ours = compute_step_advantages(estimator, *args, valid=cols["valid"], K=K)
        theirs, groups = authors_float32(estimator, cols)
        equal = [(v, a) for v, a in groups if len(set(v)) == 1 and v[0] != 0]
        spurious = [a for _, a in equal if np.any(np.abs(a) > 1e-3)]
        diff = np.abs(ours - theirs)
        sizes = defaultdict(int)
        for v, _ in equal:
            sizes[len(v)] += 1
        result[estimator] = {
            "equal_nonzero_group_sizes": dict(sorted(sizes.items())),
            "rows": int(len(ours)),
            "groups_normalized": len(groups),
            "equal_nonzero_groups": len(equal),
            "equal_nonzero_groups_spurious": len(spurious),
            "spurious_abs_max": float(max((np.abs(a).max() for a in spurious), default=0.0)),
            "rows_in_equal_nonzero_groups": int(sum(len(v) for v, _ in equal)),
            "rows_diff_gt_0.01": int((diff > 0.01).sum()),
            "max_abs_diff": float(diff.max()) if len(diff) else 0.0,
            "mean_abs_diff": float(diff.mean()) if len(diff) else 0.0,
        }
    return result


def synthetic_table(max_size: int = 8) -> dict:
    """For group sizes 2..max_size: of the typical equal values of an ALFWorld group (a success
    k steps ahead, 10 * 0.95^k for k < 50, with or without the penalty, and -0.1), how many the
    float32 emulation normalizes to a spurious |A| > 1e-3, and the largest |A|."""
    import torch

    values = [torch.tensor(float(np.float32(10 * GAMMA ** k))) - PENALTY * inv
              for k in range(50) for inv in (0, 1)] + [torch.tensor(0.0) - PENALTY]
    table = {}
    for size in range(2, max_size + 1):
        spurious = []
        for v in values:
            r = v.repeat(size)
            a = ((r - r.mean()) / (r.std(unbiased=False) + EPS)).abs().max().item()
            if a > 1e-3:
                spurious.append(a)
        table[size] = {"values": len(values), "spurious": len(spurious),
                       "max_abs": max(spurious, default=0.0)}
    return table


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=50)
    ap.add_argument("--expert", type=float, default=0.6)
    ap.add_argument("--invalid", type=float, default=0.2)
    ap.add_argument("--split", default="train")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "exact_zero_frequency.json"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    games = list_games(args.split)
    t0 = time.time()
    batches = []
    with EnvPool(functools.partial(AlfworldEnv, max_steps=args.max_steps),
                 num_envs=args.groups * args.group_size, num_workers=args.workers,
                 reset_timeout=600.0, step_timeout=120.0) as pool:
        for b in range(args.batches):
            chosen = [games[int(i)] for i in rng.choice(len(games), args.groups, replace=False)]
            cols = collect(pool, chosen, args.group_size, args.max_steps, args.expert, args.invalid, rng,
                           alfworld_plan)
            m = measure(cols)
            won = np.array(cols["rewards"]) > 0
            m["batch"] = {"rows": len(cols["rewards"]), "invalid_rate": 1 - float(np.mean(cols["valid"])),
                          "successes": int(won.sum()), "episodes": args.groups * args.group_size}
            batches.append(m)
            print(f"batch {b}: {json.dumps(m['batch'])}", flush=True)
            for est in ESTIMATORS:
                print(f"  {est:<6} {json.dumps(m[est])}", flush=True)
    totals = {est: {k: sum(bm[est][k] for bm in batches) for k in
                    ("rows", "equal_nonzero_groups", "equal_nonzero_groups_spurious",
                     "rows_in_equal_nonzero_groups", "rows_diff_gt_0.01", "groups_normalized")}
              for est in ESTIMATORS}
    for est in ESTIMATORS:
        totals[est]["max_abs_diff"] = max(bm[est]["max_abs_diff"] for bm in batches)
        sizes = defaultdict(int)
        for bm in batches:
            for size, count in bm[est]["equal_nonzero_group_sizes"].items():
                sizes[size] += count
        totals[est]["equal_nonzero_group_sizes"] = dict(sorted(sizes.items()))
    synthetic = synthetic_table()
    print("equal groups of typical values, float32 emulation:", json.dumps(synthetic))
    out = {"command": "python -m experiments.exact_zero_frequency " + " ".join(argv or sys.argv[1:]),
           "args": vars(args), "wall_seconds": round(time.time() - t0, 1), "batches": batches,
           "totals": totals, "synthetic_equal_groups": synthetic}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(totals, indent=1))
    print(f"wrote {args.out} ({out['wall_seconds']} s)")
    return out


if __name__ == "__main__":
    main()
