"""Benchmark of `EnvPool`: env resets and steps per second with 1, 2 and 4 worker processes.

  python -m experiments.benchmarks.bench_envs                       # toy env, 16 envs, workers 1 2 4
  python -m experiments.benchmarks.bench_envs --quick               # smoke run, a few seconds
  python -m experiments.benchmarks.bench_envs --env alfworld --split valid_seen [--data-dir DIR]
  python -m experiments.benchmarks.bench_envs --env webshop --split test [--data-dir DIR]
  python -m experiments.benchmarks.bench_envs --busy-ms 2           # toy env that burns 2 ms CPU per step

M envs are reset on M tasks (toy: 0..M-1; other envs: the first M tasks of the split, from the
env registry: ALFWorld games, WebShop goals), then stepped
as a batch: each running env takes an action drawn by a seeded RNG (one per env) from its
info["admissible_actions"], so every worker count does exactly the same work. An env that is
done waits; when all are done (or after --max-episode-steps batches) all are reset again, until S
batched steps are done. Resets and steps are timed separately (pool.reset / pool.step wall time;
worker start-up excluded: a warm-up reset runs first). "in-process" (workers = 0) is the same loop
on plain env objects, without a pool: the IPC overhead is the gap between it and 1 worker.
Each worker count runs --repeats times on the same pool; the best resets/s and steps/s are
reported (other load on a shared machine only ever slows a run down). Speed-up is steps/s
relative to 1 worker.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.envs.toy import ToyMemoryEnv


class BusyToyEnv(ToyMemoryEnv):
    """ToyMemoryEnv that burns `busy_ms` of CPU per step (a stand-in for a heavier game engine)."""

    def __init__(self, busy_ms: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.busy_s = busy_ms / 1000.0

    def step(self, action):
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        return super().step(action)


def env_and_tasks(args) -> tuple:
    """(picklable env_fn, list of args.num_envs tasks) for --env."""
    if args.env == "toy":
        if args.busy_ms > 0:
            env_fn = functools.partial(BusyToyEnv, busy_ms=args.busy_ms, max_steps=50)
        else:
            env_fn = functools.partial(ToyMemoryEnv, max_steps=50)
        return env_fn, list(range(args.num_envs))
    from hgpo_jax.config import EnvConfig
    from hgpo_jax.envs.registry import get_env

    spec = get_env(args.env)
    env_cfg = EnvConfig(name=args.env, split=args.split or spec.eval_splits[0],
                        data_dir=args.data_dir, max_steps=args.max_episode_steps)
    found = spec.list_tasks(env_cfg, env_cfg.split)
    if not found:
        raise SystemExit(f"no {args.env} tasks found for split {env_cfg.split!r}")
    tasks = [found[i % len(found)] for i in range(args.num_envs)]
    return spec.make_env(env_cfg), tasks


class InProcess:
    """The EnvPool interface on plain env objects in this process (the no-pool baseline)."""

    def __init__(self, env_fn, num_envs):
        self.envs = [env_fn() for _ in range(num_envs)]
        self.done = [True] * num_envs

    def reset(self, tasks):
        out = []
        for i, (env, task) in enumerate(zip(self.envs, tasks)):
            obs, info = env.reset(task)
            self.done[i] = False
            out.append((obs, info))
        return [_Reply(info, False) for _, info in out]

    def step(self, actions):
        out = {}
        for i, a in actions.items():
            _, _, done, info = self.envs[i].step(a)
            self.done[i] = done
            out[i] = _Reply(info, done)
        return out

    @property
    def running(self):
        return [i for i, d in enumerate(self.done) if not d]

    def close(self):
        for env in self.envs:
            env.close()


class _Reply:
    def __init__(self, info, done, failed=False):
        self.info, self.done, self.failed = info, done, failed


def run(pool, tasks, num_steps: int, max_episode_steps: int, seed: int) -> dict:
    """Drive `pool` for `num_steps` batched steps; returns counts and wall times."""
    rngs = [np.random.default_rng([seed, i]) for i in range(len(tasks))]
    pool.reset(tasks)  # warm-up (worker start-up, imports, first game load)
    resets = steps = batches = failed = 0
    reset_s = step_s = 0.0
    while batches < num_steps:
        t = time.perf_counter()
        replies = dict(enumerate(pool.reset(tasks)))
        reset_s += time.perf_counter() - t
        resets += len(tasks)
        for _ in range(max_episode_steps):
            running = pool.running
            if not running or batches >= num_steps:
                break
            actions = {}
            for i in running:
                admissible = replies[i].info.get("admissible_actions") or ["look"]
                actions[i] = admissible[int(rngs[i].integers(len(admissible)))]
            t = time.perf_counter()
            out = pool.step(actions)
            step_s += time.perf_counter() - t
            replies.update(out)
            steps += len(actions)
            failed += sum(r.failed for r in out.values())
            batches += 1
    return dict(resets=resets, reset_s=reset_s, steps=steps, step_s=step_s, batches=batches,
                failed=failed, resets_per_s=resets / reset_s, steps_per_s=steps / step_s)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", choices=["toy", "alfworld", "webshop"], default="toy")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--num-envs", type=int, default=None, help="M (default 16, quick 4)")
    parser.add_argument("--steps", type=int, default=None,
                        help="batched steps S per worker count (default toy 400 / others 40)")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="worker counts (default 1 2 4; quick 1 2); 0 = in-process baseline "
                             "(always run)")
    parser.add_argument("--max-episode-steps", type=int, default=50)
    parser.add_argument("--busy-ms", type=float, default=0.0, help="toy: CPU ms burnt per step")
    parser.add_argument("--split", default=None, help="split of a registered env (default: its "
                        "first evaluation split: alfworld valid_seen, webshop test)")
    parser.add_argument("--data-dir", default=None, help="env data folder")
    parser.add_argument("--repeats", type=int, default=None, help="runs per worker count, best "
                        "reported (default 3, quick 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the rows (and the settings) here")
    args = parser.parse_args(argv)
    if args.num_envs is None:
        args.num_envs = 4 if args.quick else 16
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.steps is None:
        args.steps = 10 if args.quick else (400 if args.env == "toy" else 40)
    workers = args.workers or ([1, 2] if args.quick else [1, 2, 4])
    workers = [0] + [w for w in workers if w != 0]

    env_fn, tasks = env_and_tasks(args)
    print(f"env={args.env} M={args.num_envs} envs, S={args.steps} batched steps, best of "
          f"{args.repeats}, busy_ms={args.busy_ms}, cpu cores={os.cpu_count()}, load average "
          f"before={os.getloadavg()[0]:.2f}")
    rows = []
    for p in workers:
        pool = InProcess(env_fn, args.num_envs) if p == 0 else EnvPool(
            env_fn, num_envs=args.num_envs, num_workers=p)
        try:
            runs = [run(pool, tasks, args.steps, args.max_episode_steps, args.seed)
                    for _ in range(args.repeats)]
        finally:
            pool.close()
        res = dict(runs[0], resets_per_s=max(r["resets_per_s"] for r in runs),
                   steps_per_s=max(r["steps_per_s"] for r in runs),
                   failed=sum(r["failed"] for r in runs))
        res["workers"] = p
        rows.append(res)
    base = next((r["steps_per_s"] for r in rows if r["workers"] == 1), None)
    print(f"{'workers':>11} | {'resets/s':>9} | {'steps/s':>9} | {'speed-up':>8} | "
          f"{'env steps':>9} | failed")
    print("-" * 66)
    for r in rows:
        r["speedup"] = r["steps_per_s"] / base if base else float("nan")
        name = "in-process" if r["workers"] == 0 else str(r["workers"])
        print(f"{name:>11} | {r['resets_per_s']:9.1f} | {r['steps_per_s']:9.1f} | "
              f"{r['speedup']:7.2f}x | {r['steps']:9d} | {r['failed']}")
    if args.json:
        import json

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"settings": vars(args), "cpu_cores": os.cpu_count(), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
