"""Expert-guided rollouts (Agent-G², docs/guidance.md) against the same estimator without them,
on the history-dependent toy task, several paired seeds: does guidance raise hint-free success?

  python experiments/guidance_study.py                          # 5 seeds x 4 arms
  taskset -c 0 python experiments/guidance_study.py --seeds 0 2 4 &   # one process per core,
  taskset -c 1 python experiments/guidance_study.py --seeds 1 3       # then collect (finished
  python experiments/guidance_study.py                                # runs are reused)
  python experiments/guidance_study.py --seeds 0 --iterations 2 --arms grpo grpo_g2  # a quick look

The task is "toy-history" (experiments/compare_estimators.py's setting: press a coloured button,
walk a corridor, open the door of the pressed colour; memory H = 4). Per seed one format-only
warm start (hgpo-jax sft on random episodes) is shared by the four arms: GRPO and HGPO K=2, each
without and with guidance (`guidance.enable=true`, the authors' scripts' schedule values:
dynamic_sigma, batch_acc_low = batch_acc_high = 0.5; 3 clusters of the experts' lengths, 3-5
steps; the experts are the env's optimal solutions). Everything else is equal: 16 tasks x 8
rollouts per iteration, the optimizer, the loss, the iterations. After every iteration, success
on 48 held-out tasks at temperature 0.4, played WITHOUT a prefix (hint-free), is logged.

Writes OUT/results.json (per arm: held-out success per iteration with 95% intervals over seeds,
the last third per seed and its interval; per estimator the paired difference guided - unguided
of the last third, per seed, with its 95% t interval; the guidance metrics; wall times; the
command) and OUT/success.png. Runs live in OUT/runs/ (resumable).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "experiments")):
    if path not in sys.path:
        sys.path.insert(0, path)

from compare_estimators import (curves, mean_ci, plot_success, run_rl,  # noqa: E402
                                run_seconds, run_sft, write_results)

from hgpo_jax.metrics import read_metrics  # noqa: E402

GUIDED = ["guidance.enable=true", "guidance.sigma_mode=dynamic_sigma",
          "guidance.batch_acc_low=0.5", "guidance.batch_acc_high=0.5",
          "guidance.num_difficulty_groups=3"]
ARMS = {  # name -> overrides
    "grpo": ["algo.estimator=grpo"],
    "grpo_g2": ["algo.estimator=grpo", *GUIDED],
    "hgpo_k2": ["algo.estimator=hgpo", "algo.K=2"],
    "hgpo_k2_g2": ["algo.estimator=hgpo", "algo.K=2", *GUIDED],
}
PAIRS = (("grpo_g2", "grpo"), ("hgpo_k2_g2", "hgpo_k2"))


def guidance_curves(records: list[dict]) -> dict[str, list]:
    """Per iteration: the schedule's global centre, the batch success it saw, the mean replayed
    steps."""
    keys = {"mu_global": "guidance/mu_global", "batch_success": "guidance/batch_success",
            "prefix_steps": "guidance/prefix_steps"}
    by_step: dict[int, dict] = {}
    for r in records:
        by_step.setdefault(int(r["step"]), {}).update(r)
    return {k: [by_step[s].get(m) for s in sorted(by_step)] for k, m in keys.items()}


def summarize(runs: dict[str, dict[int, dict]], iterations: int) -> dict:
    third = max(1, iterations // 3)
    out = {"arms": {}, "paired": {}}
    for name, by_seed in runs.items():
        per_iter = [mean_ci([c["eval"][i] for c in by_seed.values() if i < len(c["eval"])])
                    for i in range(iterations)]
        last = {s: float(np.mean(c["eval"][-third:])) for s, c in by_seed.items()}
        out["arms"][name] = {"eval_mean": [m for m, _ in per_iter],
                             "eval_ci95": [h for _, h in per_iter],
                             "first_iteration": mean_ci([c["eval"][0] for c in by_seed.values()]),
                             "last_third": mean_ci(last.values()),
                             "last_third_per_seed": {str(s): v for s, v in last.items()}}
    for guided, plain in PAIRS:
        if guided in runs and plain in runs:
            seeds = sorted(set(runs[guided]) & set(runs[plain]))
            diff = {s: out["arms"][guided]["last_third_per_seed"][str(s)]
                    - out["arms"][plain]["last_third_per_seed"][str(s)] for s in seeds}
            out["paired"][f"{guided} - {plain}"] = {
                "per_seed": {str(s): d for s, d in diff.items()},
                "mean_ci95": mean_ci(diff.values()),
                "guided_better": sum(d > 0 for d in diff.values()), "seeds": len(diff)}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--env", default="toy-history")
    ap.add_argument("--memory-len", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "guidance_study"))
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every RL run")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    runs: dict[str, dict[int, dict]] = {name: {} for name in args.arms}
    guidance: dict[str, dict[int, dict]] = {name: {} for name in args.arms if "g2" in name}
    timing = {}
    for seed in args.seeds:
        sft_dir = run_sft(args.out, seed, args.env, args.memory_len, args.sft_steps)
        timing[f"sft-s{seed}"] = run_seconds(read_metrics(sft_dir))
        for name in args.arms:
            records = run_rl(args.out, name, seed, sft_dir, args.env, args.memory_len,
                             args.iterations, ["train.save_every=1", *args.overrides], ARMS)
            timing[f"{name}-s{seed}"] = run_seconds(records)
            runs[name][seed] = curves(records)
            if name in guidance:
                guidance[name][seed] = guidance_curves(records)
            c = runs[name][seed]["eval"]
            print(f"seed {seed} {name:<11} held-out success first {c[0]:.3f} last {c[-1]:.3f} "
                  f"({timing[f'{name}-s{seed}']:.0f} s)", flush=True)
    summary = summarize(runs, args.iterations)
    result = write_results("guidance_study.py", argv, args, t0, timing, summary, runs=runs,
                           guidance=guidance)
    png = plot_success({n: (s["eval_mean"], s["eval_ci95"], len(runs[n]))
                        for n, s in summary["arms"].items()}, os.path.join(args.out, "success.png"),
                       "toy-history, hint-free held-out success: mean and 95% interval")
    for name, s in summary["arms"].items():
        m, h = s["last_third"]
        print(f"{name:<11} held-out success, last third {m:.3f} +/- {h:.3f}")
    for pair, p in summary["paired"].items():
        m, h = p["mean_ci95"]
        print(f"{pair}: {m:+.3f} +/- {h:.3f} (guided better on {p['guided_better']} of "
              f"{p['seeds']} seeds)")
    print(f"wrote {os.path.join(args.out, 'results.json')} and {png} "
          f"({result['wall_seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
