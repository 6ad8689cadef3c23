"""HGPO (K=2, K=4) vs GiGPO vs GRPO vs RLOO vs PPO (critic) on a history-dependent toy task, several seeds.

  python -m experiments.compare_estimators                      # 3 seeds x 6 estimators, ~3.5 h on 2 cores
  taskset -c 0 python -m experiments.compare_estimators --seeds 0 2 &   # faster (~1.4x): one
  taskset -c 1 python -m experiments.compare_estimators --seeds 1       # process per core, then
  python -m experiments.compare_estimators                      # collect (finished runs are reused)
  python -m experiments.compare_estimators --seeds 0 --iterations 6 --estimators hgpo_k2 grpo  # a quick look

The task is the "toy-history" env (hgpo_jax/envs/toy/memory.py): press one of three coloured buttons,
walk a corridor of 1-3 steps, open the door of the pressed colour at a junction whose doors are
listed in a task-dependent order. The first corridor observation names the pressed colour, the
junction observation does not: steps at the junction share one anchor but need different actions
(context-inconsistent for anchor-only groups), and the colour is only in the memory (H = 4 steps
for every estimator, so all see the same prompts).

Equal compute: per seed, one format-only warm start (hgpo-jax sft on random episodes) shared by
every estimator, then the same number of iterations of the same batch (16 tasks x 8 rollouts), the
same optimizer and loss; only `algo.estimator` / `algo.K` differ. After every iteration, success
on 48 held-out tasks at temperature 0.4 and each estimator's bias against the oracle on the
iteration's own rollout batch (diag/, hgpo_jax.rl.diagnostics) are logged.

Writes OUT/results.json (curves per run, per-estimator mean and 95% interval over seeds of the
held-out success per iteration and of the last third, the diagnostic's means, wall time, the
command) and OUT/success.png, OUT/bias.png. Runs live in OUT/runs/.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from experiments.study import (DIAG, curves, mean_ci, plot_success, run_rl, run_seconds, run_sft,
                               write_results)
from hgpo_jax.metrics import read_metrics

ESTIMATORS = {  # name -> overrides
    "hgpo_k2": ["algo.estimator=hgpo", "algo.K=2"],
    "hgpo_k4": ["algo.estimator=hgpo", "algo.K=4"],
    "gigpo": ["algo.estimator=gigpo"],
    "grpo": ["algo.estimator=grpo"],
    "rloo": ["algo.estimator=rloo"],
    # PPO with a critic (the paper's value baseline): the same 128 episodes per iteration as 128
    # independent tasks (no groups), GAE gamma = lambda = 1 as the authors' PPO runs, the critic
    # at 10x the actor's lr (the paper's 1e-5 vs 1e-6)
    "ppo": ["algo.estimator=ppo", "algo.gamma=1.0", "algo.lam=1.0", "rollout.group_size=1",
            "rollout.num_groups=128", "critic.lr=5e-3"],
}


def summarize(runs: dict[str, dict[int, dict]], iterations: int) -> dict:
    summary = {}
    third = max(1, iterations // 3)
    for name, by_seed in runs.items():
        per_iter = [mean_ci([c["eval"][i] for c in by_seed.values() if i < len(c["eval"])])
                    for i in range(iterations)]
        last = [float(np.mean(c["eval"][-third:])) for c in by_seed.values()]
        first = [float(np.mean(c["eval"][:third])) for c in by_seed.values()]
        summary[name] = {
            "eval_mean": [m for m, _ in per_iter], "eval_ci95": [h for _, h in per_iter],
            "first_third": mean_ci(first), "last_third": mean_ci(last),
            "last_third_per_seed": dict(zip(map(str, by_seed), last)),
            "train_last_third": mean_ci([float(np.mean(c["train"][-third:])) for c in by_seed.values()]),
            "diag_abs_dev": {e: mean_ci([float(np.nanmean(np.asarray(c[f"abs_dev/{e}"], float)))
                                         for c in by_seed.values()]) for e in DIAG},
            "coverage": mean_ci([float(np.nanmean(np.asarray(c["coverage"], float))) for c in by_seed.values()]),
        }
    return summary


def plot(summary: dict, runs: dict, out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [plot_success({name: (s["eval_mean"], s["eval_ci95"], len(runs[name]))
                           for name, s in summary.items()}, os.path.join(out, "success.png"),
                          "toy-history: mean and 95% interval over seeds")]

    # the diagnostic on the batches of the HGPO K=2 runs (every estimator is measured on them)
    source = "hgpo_k2" if "hgpo_k2" in runs else next(iter(runs))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for e in DIAG:
        series = [np.asarray(c[f"abs_dev/{e}"], float) for c in runs[source].values()]
        n = min(len(s) for s in series)
        mean = np.nanmean(np.stack([s[:n] for s in series]), axis=0)
        ax.plot(np.arange(1, n + 1), mean, label=e)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean |A - A_oracle| over oracle steps")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"deviation from the full-history oracle (batches of the {source} runs)")
    fig.tight_layout()
    paths.append(os.path.join(out, "bias.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--env", default="toy-history")
    ap.add_argument("--memory-len", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "compare_estimators"))
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every RL run")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    runs: dict[str, dict[int, dict]] = {name: {} for name in args.estimators}
    timing = {}
    for seed in args.seeds:
        sft_dir = run_sft(args.out, seed, args.env, args.memory_len, args.sft_steps)
        timing[f"sft-s{seed}"] = run_seconds(read_metrics(sft_dir))
        for name in args.estimators:
            records = run_rl(args.out, name, seed, sft_dir, args.env, args.memory_len, args.iterations,
                             args.overrides, ESTIMATORS)
            timing[f"{name}-s{seed}"] = run_seconds(records)
            runs[name][seed] = curves(records)
            c = runs[name][seed]["eval"]
            print(f"seed {seed} {name:<8} held-out success first {c[0]:.3f} last {c[-1]:.3f} "
                  f"({timing[f'{name}-s{seed}']:.0f} s)", flush=True)
    summary = summarize(runs, args.iterations)
    result = write_results("compare_estimators.py", argv, args, t0, timing, summary, runs=runs)
    paths = plot(summary, runs, args.out)
    for name, s in summary.items():
        (m1, h1), (m3, h3) = s["first_third"], s["last_third"]
        print(f"{name:<8} held-out success first third {m1:.3f} +/- {h1:.3f}  last third {m3:.3f} +/- {h3:.3f}")
    print(f"wrote {os.path.join(args.out, 'results.json')} and {', '.join(paths)} "
          f"({result['wall_seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
