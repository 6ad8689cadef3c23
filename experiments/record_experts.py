"""Record an env's expert trajectories into its cache, for expert-guided rollouts (Agent-G²).

  python -m experiments.record_experts --env alfworld --split train --workers 2
  python -m experiments.record_experts --env webshop --split train
  python -m experiments.record_experts --env alfworld --split train --limit 10   # a timing sample

Calls the env registry's `expert_trajectories` (hgpo_jax.envs.experts), which plays the expert on
every task of the split its cache lacks (with a progress bar; an interrupted run continues where
it stopped) and reads the rest back. Then prints how many tasks have an expert, the wall time,
and the histogram of the experts' lengths (ALFWorld, the authors' file: 3-15 steps, mean 7.08,
3:59 4:611 5:218 6:635 7:557 8:688 9:346 10:138 11:90 12:70 13:78 14:45 15:18).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from hgpo_jax.config import EnvConfig
from hgpo_jax.envs.episodes import spread
from hgpo_jax.envs.registry import env_names, get_env


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="alfworld", choices=env_names())
    p.add_argument("--split", default="train")
    p.add_argument("--workers", type=int, default=1, help="worker processes that play the expert")
    p.add_argument("--data-dir", default=None, help="the env's data folder (default: its usual lookup)")
    p.add_argument("--seed", type=int, default=0, help="env seed (webshop: the goal order)")
    p.add_argument("--limit", type=int, default=0,
                   help="only this many tasks spread over the split (0: all of them)")
    return p.parse_args(argv)


def length_histogram(experts: dict) -> str:
    """'length:count' pairs in length order, then min, max and mean."""
    lengths = [len(actions) for actions in experts.values()]
    if not lengths:
        return "no experts"
    counts = " ".join(f"{n}:{c}" for n, c in sorted(Counter(lengths).items()))
    return (f"lengths {min(lengths)}-{max(lengths)}, mean {sum(lengths) / len(lengths):.2f}\n"
            f"histogram {counts}")


def main(argv=None) -> None:
    args = parse_args(argv)
    spec = get_env(args.env)
    if spec.expert_trajectories is None:
        sys.exit(f"env {args.env!r} has no expert trajectories (EnvSpec.expert_trajectories)")
    if args.split not in spec.splits:
        sys.exit(f"env {args.env!r} has no split {args.split!r}; use one of {spec.splits}")
    env_cfg = EnvConfig(name=args.env, split=args.split, data_dir=args.data_dir, seed=args.seed)
    tasks = spread(spec.list_tasks(env_cfg, args.split), args.limit) if args.limit > 0 else None
    start = time.perf_counter()
    experts = spec.expert_trajectories(env_cfg, args.split, progress=True, workers=args.workers,
                                       tasks=tasks)
    seconds = time.perf_counter() - start
    asked = len(tasks) if tasks is not None else len(spec.list_tasks(env_cfg, args.split))
    print(f"{args.env} {args.split}: {len(experts)} of {asked} tasks have an expert "
          f"({seconds:.1f} s, {seconds / max(asked, 1):.2f} s a task, cached ones included)")
    print(length_histogram(experts))


if __name__ == "__main__":
    main()
