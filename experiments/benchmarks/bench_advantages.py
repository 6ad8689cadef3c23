"""Benchmark of `compute_step_advantages` (host grouping + jitted device part). Not a test.

  python -m experiments.benchmarks.bench_advantages            # full run (about a minute on 2 CPU cores)
  python -m experiments.benchmarks.bench_advantages --quick    # smoke run, a few seconds

(1) 16 tasks x 8 trajectories x 50 steps (N = 6,400), K = 4, hgpo, text anchors that repeat
    across each task's group: median wall time after warm-up against the dict-based reference of
    tests/reference_advantages.py in the same run. Target: >= 20x faster.
(2) Scaling at N = 10k, 100k, 1M steps (same shape of batch, more tasks): median wall time,
    split into host (validation, returns, grouping) and device (padding + jitted segment ops), and
    time / (N log N) normalised to the smallest N. Target: 1M steps under 10 s, growth close to N log N.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



def _reference():
    """tests/reference_advantages.py (the test suite's reference, read by path: tests/ is no
    package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "reference_advantages", os.path.join(ROOT, "tests", "reference_advantages.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reference_step_advantages


reference_step_advantages = _reference()

from hgpo_jax.rl import compute_step_advantages
from hgpo_jax.rl.advantages import step_advantages_from_index
from hgpo_jax.rl.grouping import (
    index_step_groups,
    build_trajectory_groups,
    discounted_returns,
    prepare_batch,
)

ROOMS = ("kitchen", "hallway", "bedroom", "bathroom", "living room", "garage", "garden", "pantry")
ITEMS = ("nothing", "a mug", "a key", "an apple")
TARGET_SPEEDUP = 20.0
TARGET_1M_SECONDS = 10.0


def make_batch(num_tasks: int, group_size: int, length: int, seed: int = 0) -> dict:
    """A synthetic rollout batch in step-major order (all trajectories' step 0, then step 1, ...).

    Each trajectory random-walks over 8 rooms x 4 held items of its task, so observations repeat
    across the task's group; the anchor is a fresh str per step (as an env would return it).
    Reward: 10 at the last step if the trajectory succeeds (probability depends on the task), else 0.
    Returns a dict of the five per-step inputs (lists / arrays of length num_tasks*group_size*length).
    """
    rng = np.random.default_rng(seed)
    num_traj = num_tasks * group_size
    room = np.cumsum(rng.integers(-1, 2, size=(num_traj, length)), axis=1) % len(ROOMS)
    item = (np.cumsum(rng.random((num_traj, length)) < 0.15, axis=1)) % len(ITEMS)
    task = np.arange(num_traj) // group_size  # [num_traj]
    success = rng.random(num_traj) < rng.random(num_tasks)[task]
    rewards = np.zeros((num_traj, length))
    rewards[:, -1] = 10.0 * success
    # step-major flattening: row = t * num_traj + traj
    traj_ids = np.tile(np.arange(num_traj), length)
    step_ids = np.repeat(np.arange(length), num_traj)
    task_col = task[traj_ids]
    room_col, item_col = room.T.reshape(-1), item.T.reshape(-1)
    anchors = [f"task {p}: you are in the {ROOMS[r]}, holding {ITEMS[i]}. What do you do next?"
               for p, r, i in zip(task_col.tolist(), room_col.tolist(), item_col.tolist())]
    return {
        "task_ids": [f"task-{p}" for p in task_col.tolist()],
        "traj_ids": traj_ids,
        "step_ids": step_ids,
        "anchors": anchors,
        "rewards": rewards.T.reshape(-1),
    }


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall time of `repeats` calls of fn(), and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench_vs_reference(num_tasks: int, group_size: int, length: int, K: int, repeats: int,
                       ref_repeats: int) -> dict:
    batch = make_batch(num_tasks, group_size, length, seed=1)
    kwargs = dict(K=K, gamma=0.95, alpha=1.0, mode="mean_std_norm")
    fast = lambda: compute_step_advantages("hgpo", **batch, **kwargs)  # noqa: E731
    ref_args = (batch["task_ids"], batch["traj_ids"].tolist(), batch["step_ids"].tolist(), batch["anchors"],
                batch["rewards"].tolist())
    slow = lambda: reference_step_advantages("hgpo", *ref_args, **kwargs)  # noqa: E731
    slow_float = lambda: reference_step_advantages("hgpo", *ref_args, **kwargs, exact_zero=False)  # noqa: E731
    fast(), fast()  # warm-up: compile and fill caches
    t_fast, got = timed(fast, repeats)
    t_ref, want = timed(slow, ref_repeats)
    t_ref_float, want_float = timed(slow_float, ref_repeats)
    return {"n": len(batch["anchors"]), "t_fast": t_fast, "t_ref": t_ref, "t_ref_float": t_ref_float,
            "speedup": t_ref / t_fast, "speedup_float": t_ref_float / t_fast,
            "max_abs_diff": float(np.max(np.abs(got - np.asarray(want)))),
            "max_abs_diff_float": float(np.max(np.abs(got - np.asarray(want_float))))}


def bench_scaling(sizes: list[int], group_size: int, length: int, K: int, repeats: int) -> list[dict]:
    rows = []
    for n in sizes:
        num_tasks = max(1, n // (group_size * length))
        batch = make_batch(num_tasks, group_size, length, seed=2)
        n_actual = len(batch["anchors"])

        def host():
            b = prepare_batch(batch["task_ids"], batch["traj_ids"], batch["step_ids"], batch["anchors"],
                              batch["rewards"])
            return b, discounted_returns(b, 0.95), index_step_groups(b, K)

        run = lambda: compute_step_advantages("hgpo", **batch, K=K)  # noqa: E731
        run()  # warm-up (compiles this bucket)
        t_total, _ = timed(run, repeats)
        t_host, (b, returns, index) = timed(host, repeats)
        traj_index = build_trajectory_groups(b)
        t_device, _ = timed(lambda: step_advantages_from_index("hgpo", returns, index, returns[:0], traj_index,
                                                               b.traj), repeats)
        rows.append({"n": n_actual, "t_total": t_total, "t_host": t_host, "t_device": t_device})
    base = rows[0]["t_total"] / (rows[0]["n"] * math.log2(rows[0]["n"]))
    for row in rows:
        row["nlogn_ratio"] = row["t_total"] / (row["n"] * math.log2(row["n"])) / base
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few seconds")
    args = parser.parse_args(argv)
    if args.quick:
        vs = bench_vs_reference(num_tasks=4, group_size=4, length=10, K=4, repeats=3, ref_repeats=1)
        scaling = bench_scaling([1_000, 4_000], group_size=8, length=50, K=4, repeats=1)
    else:
        vs = bench_vs_reference(num_tasks=16, group_size=8, length=50, K=4, repeats=9, ref_repeats=3)
        scaling = bench_scaling([10_000, 100_000, 1_000_000], group_size=8, length=50, K=4, repeats=3)

    import jax

    print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind}), cpu cores: {os.cpu_count()}")
    print()
    print(f"(1) hgpo, K=4, {vs['n']:,} steps: compute_step_advantages vs dict reference "
          f"(median, after warm-up)")
    print(f"    {'compute_step_advantages':<26}{vs['t_fast'] * 1e3:10.2f} ms")
    print(f"    {'dict reference':<26}{vs['t_ref'] * 1e3:10.2f} ms   speedup {vs['speedup']:6.1f}x, "
          f"max |diff| {vs['max_abs_diff']:.2e}  (exact-rational zero test, as in the tests)")
    print(f"    {'dict reference, float':<26}{vs['t_ref_float'] * 1e3:10.2f} ms   speedup {vs['speedup_float']:6.1f}x, "
          f"max |diff| {vs['max_abs_diff_float']:.2e}  (float zero test: faster baseline)")
    worst = min(vs["speedup"], vs["speedup_float"])
    verdict = "PASS" if worst >= TARGET_SPEEDUP else "MISS"
    print(f"    speedup vs the faster reference {worst:.1f}x  (target >= {TARGET_SPEEDUP:.0f}x: {verdict})")
    print()
    print("(2) scaling, hgpo, K=4, 8 trajectories x 50 steps per task (median wall time)")
    header = f"    {'N steps':>10} | {'total s':>8} | {'host s':>8} | {'device s':>9} | {'t/(N log N), rel':>16}"
    print(header)
    print("    " + "-" * (len(header) - 4))
    for row in scaling:
        print(f"    {row['n']:>10,} | {row['t_total']:8.3f} | {row['t_host']:8.3f} | "
              f"{row['t_device']:9.3f} | {row['nlogn_ratio']:16.2f}")
    largest = scaling[-1]
    if largest["n"] >= 1_000_000:
        verdict = "PASS" if largest["t_total"] < TARGET_1M_SECONDS else "MISS"
        print(f"    {largest['n']:,} steps in {largest['t_total']:.2f} s "
              f"(target < {TARGET_1M_SECONDS:.0f} s: {verdict})")
    return {"vs_reference": vs, "scaling": scaling}


if __name__ == "__main__":
    main()
