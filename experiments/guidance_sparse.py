"""Guidance where it should help (issue 63): Agent-G²'s expert prefixes on a sparse-reward task
that unguided RL cannot start on, several paired seeds.

  python -m experiments.guidance_sparse                          # 6 arms x 9 seeds
  taskset -c 0 python -m experiments.guidance_sparse --seeds 0 2 4 6 8 &  # one process per
  taskset -c 1 python -m experiments.guidance_sparse --seeds 1 3 5 7      # core, then collect
  python -m experiments.guidance_sparse                                   # (finished runs are
                                                                          # reused)

The task is "toy-lock" (hgpo_jax/envs/toy/lock.py): a lock of 5-7 stages, each with 4
admissible dial settings of which only the one the stage's observation names is right; a wrong
one ends the episode at 0, the last right one opens the lock (reward 10). Random play wins
(1/4)^L: `random_play_success` below measures it on the held-out tasks, whose colour sequences
are never a training task's. Everything else is experiments/guidance_study.py's design, through
the same study runner (experiments/study.py): per seed one format-only warm start (`hgpo-jax
sft` on random episodes) shared by the arms, GRPO and HGPO (K=2) each without guidance, with
`guidance.kind=g2` (the authors' scripts' schedule: dynamic_sigma, batch success band 0.5/0.5;
3 clusters of the experts' lengths) and with it and prefix SFT (`guidance.sft_coef=0.5`); 16
tasks x 8 rollouts per iteration, 60 iterations, no memory in the prompt (the observation says
all a step needs), 2 policy updates per iteration at lr 3e-3 (`RL_SETTINGS`: why below); after
every iteration the policy plays 48 held-out tasks (`valid_unseen`: paths no training task has)
at temperature 0.4 WITHOUT a prefix (hint-free).

Writes OUT/results.json: the command, `random_play_success` (and its analytic value), per arm
(`grpo`, `grpo_g2`, `grpo_g2_sft`, `hgpo_k2`, `hgpo_k2_g2`, `hgpo_k2_g2_sft`) the list `seeds`
and the list `last_third` (hint-free held-out success over the last third of the iterations,
one value per seed, the same seed order for every arm), the summary with 95% t intervals and
the paired differences guided - unguided, and per guided arm what the schedule did
(`dynamics`: mu_global, the batch success it saw and the replayed steps, per iteration, mean
over seeds); OUT/results.md, OUT/success.png, OUT/schedule.png. Runs live in OUT/runs/.
"""

from __future__ import annotations

import os
import time

import numpy as np

from experiments.guidance_study import finish, parser, report, run_arms, summarize
from experiments.study import write_results

ENV = "toy-lock"
HELD_OUT = "valid_unseen"  # toy-lock's split whose paths no training task has
# what every RL run changes of toy_hgpo: 2 policy updates per iteration instead of 1 and lr 3e-3
# instead of 5e-4 (the warm start's SFT lr). Reading the clue is a copy of the observation's
# colour into the reply, which this 2-layer model forms only after some hundreds of supervised
# updates (expert SFT, memory 0: held-out NLL on a 0.35 plateau until ~450 steps of 64 rows at
# 3e-3, then 0.09); with toy_hgpo's own settings no arm got past it in 60 iterations (pilots,
# docs/results.md section 11)
RL_SETTINGS = ["train.mini_batch_size=64", "optim.lr=3e-3"]


def random_play_success(env: str = ENV, split: str = HELD_OUT, passes: int = 2000) -> dict:
    """Random play on the held-out tasks of `split`: every task played `passes` times by the
    env's random episodes (`EnvSpec.record_episodes`, kind "random": a uniformly random
    admissible action at every step), seeds 0..passes-1 -> {success, episodes, analytic (the
    mean over the tasks of the product over the expert's steps of 1 / the admissible actions
    there: the chance that random play takes the expert's path), split}."""
    from hgpo_jax.config import load_config
    from hgpo_jax.envs.registry import get_env

    cfg = load_config("toy_hgpo", [f"env.name={env}"])
    spec = get_env(env)
    tasks = spec.list_tasks(cfg.env, split)
    won = [ep.won for s in range(passes)
           for ep in spec.record_episodes(cfg.env, split, len(tasks), "random", seed=s)]
    experts = spec.record_episodes(cfg.env, split, len(tasks), "expert")
    analytic = float(np.mean([np.prod([1.0 / len(step.admissible) for step in ep.steps])
                              for ep in experts]))
    return {"success": float(np.mean(won)), "episodes": len(won), "analytic": analytic,
            "split": split}


def mean_per_iteration(series: list[list], iterations: int) -> list[float | None]:
    """[I] the mean over `series` (one list per run) of the value each logged at each iteration;
    None where no run logged one."""
    out = []
    for i in range(iterations):
        values = [s[i] for s in series if i < len(s) and s[i] is not None]
        out.append(float(np.mean(values)) if values else None)
    return out


def dynamics(guidance: dict, iterations: int) -> dict:
    """Per guided arm, per iteration, the mean over seeds of mu_global, the batch success the
    schedule saw and the replayed steps (`guidance_study.guidance_curves`)."""
    return {arm: {key: mean_per_iteration([c[key] for c in by_seed.values()], iterations)
                  for key in ("mu_global", "batch_success", "prefix_steps")}
            for arm, by_seed in guidance.items()}


def dynamics_md(dyn: dict) -> str:
    n = max((len(d["mu_global"]) for d in dyn.values()), default=0)
    picks = sorted({min(n - 1, n * k // 6) for k in range(6)} | {n - 1}) if n else []
    lines = ["", "What the schedule did (mean over seeds at iterations "
             f"{', '.join(str(i + 1) for i in picks)}): mu_global, the batch success it saw "
             "(guided, prefix included) and the expert steps replayed per rollout", "",
             "| arm | mu_global | batch success | replayed steps |", "|---|---|---|---|"]
    for arm, d in dyn.items():

        def row(key):
            return ", ".join("-" if i >= len(d[key]) or d[key][i] is None else f"{d[key][i]:.2f}"
                             for i in picks)
        lines.append(f"| {arm} | {row('mu_global')} | {row('batch_success')} | "
                     f"{row('prefix_steps')} |")
    return "\n".join(lines) + "\n"


def plot_schedule(dyn: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for arm, d in dyn.items():
        x = np.arange(1, len(d["mu_global"]) + 1)
        axes[0].plot(x, [np.nan if v is None else v for v in d["mu_global"]], label=arm)
        axes[1].plot(x, [np.nan if v is None else v for v in d["prefix_steps"]], label=arm)
    axes[0].set_ylabel("mu_global")
    axes[1].set_ylabel("expert steps replayed per rollout")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    ap = parser(__doc__, ENV, "guidance_sparse", memory_len=0, split=HELD_OUT,
                sft_extra=("model.path=build:toy-lock-tiny",))
    # seeds 0-4 first (2026-11-28): both prefix-SFT arms' intervals included 0, with the
    # seeds all-or-nothing; seeds 5-8 were added once, fixed in advance as the last addition
    # (docs/results.md section 11 gives both counts)
    ap.set_defaults(iterations=60, seeds=list(range(9)))
    args = ap.parse_args(argv)
    args.overrides = [*RL_SETTINGS, *args.overrides]
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    runs, stats, guidance, timing = run_arms(args)
    summary = summarize(runs, args.iterations)
    random = random_play_success(args.env, args.split)
    dyn = dynamics(guidance, args.iterations)
    per_arm = {arm: {"seeds": sorted(runs[arm]),
                     "last_third": [summary["arms"][arm]["last_third_per_seed"][str(s)]
                                    for s in sorted(runs[arm])]} for arm in args.arms}
    result = write_results("guidance_sparse.py", argv, args, t0, timing, summary,
                           top={"random_play_success": random["success"],
                                "random_play": random, **per_arm, "dynamics": dyn},
                           runs=runs, stats=stats, guidance=guidance)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(f"Random play on the held-out tasks ({random['split']}, {random['episodes']} "
                f"episodes): success {random['success']:.4f} (analytic {random['analytic']:.4f})."
                "\n\n" + report(result) + dynamics_md(dyn))
    plot_schedule(dyn, os.path.join(args.out, "schedule.png"))
    print(f"random play on the held-out tasks: {random['success']:.4f} "
          f"(analytic {random['analytic']:.4f}, {random['episodes']} episodes)")
    finish(args, runs, summary, result)
    return result


if __name__ == "__main__":
    main()
