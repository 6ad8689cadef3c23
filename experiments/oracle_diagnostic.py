"""The paper's bias-vs-oracle diagnostic (Fig. 2, Prop. 4.1) on toy and ALFWorld rollout batches.

  python -m experiments.oracle_diagnostic                      # ~15 min on 2 cores
  python -m experiments.oracle_diagnostic --envs toy-history --batches 2   # a quick look

For each env and each level of policy skill (the probability that the scripted policy takes the
expert's next action; experiments/scripted_rollouts.py), rollout batches of `groups` tasks x 8
envs are collected on the real envs, and each estimator's advantages (the authors' defaults: grpo,
gigpo, hgpo with K = 2 and K = 4) are compared with the oracle: the return normalized within the
group of steps that share the whole history of anchors (hgpo_jax.rl.diagnostics). Reported over
the oracle steps: mean |A - A_oracle| (abs_dev), root mean square (rmse), mean (bias), and the
fraction of steps that are oracle steps (coverage).

Writes OUT/oracle_diagnostic.json and OUT/oracle_diagnostic.png (one panel per env, abs_dev per
estimator and skill level).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from experiments.scripted_rollouts import alfworld_plan, collect, toy_plan

from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.rl.diagnostics import oracle_deviation

ESTIMATORS = (("grpo", "grpo", 2), ("gigpo", "gigpo", 2), ("hgpo K=2", "hgpo", 2), ("hgpo K=4", "hgpo", 4))
STATS = ("abs_dev", "rmse", "bias", "coverage")


def env_setup(env: str, max_steps: int):
    """(env factory, task list, plan function)."""
    if env == "alfworld":
        from hgpo_jax.envs.alfworld import AlfworldEnv, list_games

        return functools.partial(AlfworldEnv, max_steps=max_steps), list_games("train"), alfworld_plan
    from hgpo_jax.envs.toy import ToyMemoryEnv, env_kwargs

    return (functools.partial(ToyMemoryEnv, max_steps=max_steps, **env_kwargs(env)),
            list(range(1000)), toy_plan(env))


def measure(cols: dict) -> dict:
    columns = [cols[k] for k in ("task_ids", "traj_ids", "step_ids", "anchors", "rewards")]
    out = {}
    for label, estimator, K in ESTIMATORS:
        out[label] = oracle_deviation(*columns, valid=cols["valid"], K=K, estimators=(estimator,))[estimator]
    return out


def plot(result: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(result["envs"])
    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.2), squeeze=False)
    labels = [label for label, _, _ in ESTIMATORS]
    for ax, env in zip(axes[0], envs):
        levels = result["envs"][env]
        width = 0.8 / len(levels)
        for j, (skill, stats) in enumerate(levels.items()):
            means = [stats["mean"][label]["abs_dev"] for label in labels]
            x = np.arange(len(labels)) + (j - (len(levels) - 1) / 2) * width
            cov = stats["mean"][labels[0]]["coverage"]
            ax.bar(x, means, width, label=f"expert p={skill} (coverage {cov:.2f})")
        ax.set_xticks(np.arange(len(labels)), labels)
        ax.set_ylabel("mean |A - A_oracle| over oracle steps")
        ax.set_title(env)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=["toy-history", "alfworld"])
    ap.add_argument("--skills", type=float, nargs="+", default=[0.3, 0.6, 0.9])
    ap.add_argument("--batches", type=int, default=3, help="batches per env and skill (ALFWorld: 1)")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--invalid", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    result = {"command": "python -m experiments.oracle_diagnostic " + " ".join(argv or sys.argv[1:]),
              "args": vars(args), "envs": {}}
    for env in args.envs:
        max_steps = 50 if env == "alfworld" else 12
        factory, tasks, plan_of = env_setup(env, max_steps)
        batches = 1 if env == "alfworld" else args.batches
        result["envs"][env] = {}
        with EnvPool(factory, num_envs=args.groups * args.group_size, num_workers=args.workers,
                     reset_timeout=600.0, step_timeout=120.0) as pool:
            for skill in args.skills:
                per_batch = []
                for _ in range(batches):
                    chosen = [tasks[int(i)] for i in rng.choice(len(tasks), args.groups, replace=False)]
                    cols = collect(pool, chosen, args.group_size, max_steps, skill, args.invalid, rng, plan_of)
                    per_batch.append(measure(cols))
                mean = {label: {s: float(np.nanmean([b[label][s] for b in per_batch])) for s in STATS}
                        for label, _, _ in ESTIMATORS}
                result["envs"][env][str(skill)] = {"batches": per_batch, "mean": mean}
                row = "  ".join(f"{label} {mean[label]['abs_dev']:.3f}" for label, _, _ in ESTIMATORS)
                print(f"{env:<12} expert p={skill}: coverage {mean['grpo']['coverage']:.2f}  abs_dev: {row}",
                      flush=True)
    result["wall_seconds"] = round(time.time() - t0, 1)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "oracle_diagnostic.json"), "w") as f:
        json.dump(result, f, indent=1)
    png = plot(result, os.path.join(args.out, "oracle_diagnostic.png"))
    print(f"wrote {os.path.join(args.out, 'oracle_diagnostic.json')} and {png} ({result['wall_seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
