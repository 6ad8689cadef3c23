"""The study runner: what every comparison of arms x paired seeds on a toy env runs and reports
with (experiments/compare_estimators.py, compare_hiper.py, guidance_study.py,
guidance_sparse.py; the laptop studies' staged pipeline, experiments/laptop.py, takes its
statistics from here).

    sft_dir = run_sft(out, seed, env, memory_len, steps)         # each seed's warm start
    records = run_rl(out, arm, seed, sft_dir, env, memory_len, iterations, extra, arms)
    series = curves(records)                                     # held-out success per iteration
    mean, half = mean_ci(values)                                 # 95% Student t interval
    result = write_results(script, argv, args, t0, timing, summary, runs=...)

A run lives in OUT/runs/<arm>-s<seed>: reused when it finished (a `done` file), resumed from its
checkpoints when cut, and never taken as done when the trainer stopped early (SIGTERM: the
study ends with the command that resumes it). The arms of a seed share its warm start, so their
differences are paired by seed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np

from hgpo_jax.config import load_config
from hgpo_jax.metrics import read_metrics

SPLIT = "valid_seen"  # the toy envs' held-out split the RL configs evaluate after every iteration
DIAG = ("grpo", "gigpo", "hgpo")  # the estimators the trainer's bias-vs-oracle diagnostic covers


def t95(n: int) -> float:
    """The two-sided 95% Student t quantile for n - 1 degrees of freedom (n >= 2)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
    return table.get(n - 1, 1.96)

def mean_ci(values) -> tuple[float, float]:
    """(mean, half-width of the 95% t interval over the values; NaN for fewer than 2)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    if len(v) == 0:
        return float("nan"), float("nan")
    if len(v) == 1:
        return float(v[0]), float("nan")
    return float(v.mean()), float(t95(len(v)) * v.std(ddof=1) / math.sqrt(len(v)))

def run_sft(out: str, seed: int, env: str, memory_len: int, steps: int,
            config: str = "toy_format", extra: list[str] | tuple = ()) -> str:
    """Seed `seed`'s warm start in OUT/runs/sft-s<seed>: `hgpo-jax sft` of `config` (the toy
    envs': random episodes, the format without the skill) for `steps` steps; reused when
    finished, resumed when cut, never taken as done when stopped early; `extra`: more
    overrides (e.g. the env's own built model)."""
    from hgpo_jax.trainers.sft import SftTrainer

    run_dir = os.path.join(out, "runs", f"sft-s{seed}")
    checkpoints = os.path.join(run_dir, "checkpoints")
    saved = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
    if str(steps) in saved:
        return run_dir  # reuse a finished warm start (the experiment can be resumed)
    cfg = load_config(config, [f"env.name={env}", f"env.memory_len={memory_len}",
                                     f"train.seed={seed}", f"sft.steps={steps}", f"train.run_dir={run_dir}",
                                     *extra])
    with SftTrainer(cfg, resume=bool(saved), progress=False) as trainer:
        trainer.train()
    if str(steps) not in os.listdir(checkpoints):  # SIGTERM: saved and stopped early
        raise SystemExit(f"{run_dir}: stopped before step {steps}; run the same command again "
                         "to resume it")
    return run_dir

def rl_config(run_dir: str, name: str, seed: int, sft_dir: str, env: str, memory_len: int,
              iterations: int, extra: list[str], arms: dict, config: str = "toy_hgpo"):
    """The config of one arm's RL run in `run_dir` (`arms[name]`'s overrides, on `config` from
    the seed's warm start `sft_dir`)."""
    return load_config(config, [
        f"model.path={sft_dir}", f"env.name={env}", f"env.memory_len={memory_len}",
        f"train.seed={seed}", f"train.iterations={iterations}", f"train.run_dir={run_dir}",
        *arms[name], *extra])

def run_rl(out: str, name: str, seed: int, sft_dir: str, env: str, memory_len: int,
           iterations: int, extra: list[str], arms: dict, config: str = "toy_hgpo") -> list[dict]:
    """One arm's RL run in OUT/runs/<name>-s<seed> (`rl_config`) from the seed's warm start:
    reused when finished, resumed from its checkpoints when cut (`train_to_the_end`)."""
    run_dir = os.path.join(out, "runs", f"{name}-s{seed}")
    if os.path.isfile(os.path.join(run_dir, "done")):
        return read_metrics(run_dir)
    train_to_the_end(rl_config(run_dir, name, seed, sft_dir, env, memory_len, iterations, extra,
                               arms, config), run_dir, iterations)
    open(os.path.join(run_dir, "done"), "w").close()
    return read_metrics(run_dir)

def train_to_the_end(cfg, run_dir: str, iterations: int) -> None:
    """Train `cfg` in `run_dir` (resumed from its checkpoints when cut) up to `iterations`; a run
    the trainer stopped early (SIGTERM: it saved and returned) ends the study with the command
    to resume it, so it is never taken as done. A run whose newest checkpoint is its last
    iteration (cut before the study marked it done) is not trained again."""
    from hgpo_jax.runs import latest_checkpoint
    from hgpo_jax.trainers.rl import Trainer

    newest = latest_checkpoint(run_dir)  # (kind, step) or None
    if newest is not None and newest[1] >= iterations:
        return
    with Trainer(cfg, resume=newest is not None, progress=False) as trainer:
        trainer.train()
        reached = trainer.iteration
    if reached < iterations:  # SIGTERM: the trainer saved and stopped early
        raise SystemExit(f"{run_dir}: stopped at iteration {reached} of {iterations}; run the "
                         "same command again to resume it")

def run_seconds(records: list[dict]) -> float:
    """A run's wall time from its metrics: first to last record plus the first step's own time
    (so runs reused from an earlier invocation keep their timing)."""
    times = [r["time"] for r in records if "time" in r]
    first = next((r.get("time/iteration", r.get("time/step", 0.0)) for r in records
                  if "time/iteration" in r or "time/step" in r), 0.0)
    return float(max(times) - min(times) + first) if times else float("nan")

def curves(records: list[dict], split: str = SPLIT) -> dict[str, list]:
    """Per-iteration series of one run: held-out success on `split`, training success, diag/."""
    out = {"eval": [], "train": []}
    out.update({f"abs_dev/{e}": [] for e in DIAG})
    out.update({f"bias/{e}": [] for e in DIAG})
    out["coverage"] = []
    for r in records:  # read_metrics: one record per iteration, in order
        out["eval"].append(r.get(f"eval/{split}/all"))
        out["train"].append(r.get("success/all"))
        for e in DIAG:
            out[f"abs_dev/{e}"].append(r.get(f"diag/{e}/abs_dev"))
            out[f"bias/{e}"].append(r.get(f"diag/{e}/bias"))
        out["coverage"].append(r.get("diag/coverage"))
    return out

def plot_success(series: dict[str, tuple], path: str, title: str, split: str = SPLIT) -> str:
    """Held-out success per iteration, one line per method with its 95% band: series maps a
    name to (means [I], interval half-widths [I], seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, (mean, half, seeds) in series.items():
        m, h = np.asarray(mean, float), np.nan_to_num(np.asarray(half, float))
        x = np.arange(1, len(m) + 1)
        ax.plot(x, m, label=f"{name} (n={seeds})")
        ax.fill_between(x, m - h, m + h, alpha=0.15)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"held-out success ({split}, T=0.4)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

def write_results(script: str, argv, args, t0: float, timing: dict, summary: dict,
                  top: dict | None = None, **per_seed: dict) -> dict:
    """A comparison's args.out/results.json, returned too: the command (`script` and its
    arguments), the args, the wall seconds since t0, each run's seconds (`timing`) and their
    total, the summary, each `per_seed` item ({method: {seed: data}}, seeds as strings) and the
    study's own `top` keys."""
    module = script[:-len(".py")] if script.endswith(".py") else script
    result = {"command": f"python -m experiments.{module} " + " ".join(argv or sys.argv[1:]),
              "args": vars(args), "wall_seconds": round(time.time() - t0, 1),
              "run_seconds_total": round(sum(timing.values()), 1), "timing": timing,
              "summary": summary}
    result.update({key: {m: {str(s): c for s, c in r.items()} for m, r in data.items()}
                   for key, data in per_seed.items()})
    result.update(top or {})
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result
