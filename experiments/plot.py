"""Draw the paper's training dynamics of one or more runs side by side, to PNG.

  python -m experiments.plot runs/hgpo_k2_alfworld_qwen2.5_1.5b            # -> RUN_DIR/plots.png
  python -m experiments.plot runs/hgpo_k2 runs/gigpo --out cmp.png          # one line per run
  python -m experiments.plot runs/a runs/b --metrics train/ppo_kl time/rollout_s

Reads each RUN_DIR/metrics.jsonl (written by `hgpo_jax.metrics.MetricsLogger`; a resumed run's
re-logged steps count once). One subplot per metric, one line per run (labelled with the run
folder's name), x = iteration. Default metrics: the paper's dynamics (KL loss, clip fraction,
policy loss, mean advantage, mean step reward, success rate), then those of an algorithm's own
(FAMILY_METRICS: a critic's explained variance; HiPER's switch rate, mean segment length and each
head's explained variance) when a run logged them; `--metrics` adds others (`--only` plots just
those). A requested metric that no run logged is skipped with a note. Default output:
RUN_DIR/plots.png for one run, ./runs_comparison.png for several.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from hgpo_jax.metrics import metric_series, metrics_path, read_metrics

DEFAULT_METRICS = ("train/kl_loss", "train/pg_clipfrac", "train/pg_loss", "train/mean_advantage",
                   "rollout/mean_step_reward", "success/all")
# drawn after the defaults when some run logged them (a critic's, HiPER's: docs/hiper.md), no note
FAMILY_METRICS = ("critic/explained_var", "hiper/switch_rate", "hiper/mean_segment_length",
                  *(f"critic/explained_var/head{h}" for h in range(3)))


def run_label(run_dir: str, all_dirs: list[str]) -> str:
    """The run folder's name, or parent/name when two runs share a name."""
    name = os.path.basename(os.path.normpath(run_dir))
    if sum(os.path.basename(os.path.normpath(d)) == name for d in all_dirs) > 1:
        parent = os.path.basename(os.path.dirname(os.path.abspath(os.path.normpath(run_dir))))
        return f"{parent}/{name}"
    return name


def default_out(run_dirs: list[str]) -> str:
    """RUN_DIR/plots.png for one run, ./runs_comparison.png for several."""
    return os.path.join(run_dirs[0], "plots.png") if len(run_dirs) == 1 else "runs_comparison.png"


def plot_runs(run_dirs: list[str], out: str, metrics: list[str], log=print,
              optional: tuple[str, ...] = ()) -> list[str]:
    """Draw `metrics` (one subplot each), then those of `optional` that some run logged, for every
    run to `out` (PNG). Returns the metrics drawn.

    Raises FileNotFoundError for a run without metrics.jsonl and ValueError if no requested
    metric was logged by any run.
    """
    runs = {}
    for d in run_dirs:
        if not os.path.isfile(metrics_path(d)):
            raise FileNotFoundError(f"{metrics_path(d)} not found: is {d} a run folder?")
        runs[d] = read_metrics(d)
    def logged(metric: str) -> bool:
        return any(metric_series(recs, metric)[0] for recs in runs.values())

    drawn = [m for m in metrics if logged(m)]
    skipped = [m for m in metrics if m not in drawn]
    if skipped:
        log(f"note: skipped (logged by no run): {', '.join(skipped)}")
    if not drawn:
        raise ValueError(f"none of the metrics {list(metrics)} was logged by {run_dirs}")
    drawn += [m for m in optional if m not in drawn and logged(m)]
    ncols = min(3, len(drawn))
    nrows = math.ceil(len(drawn) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.4 * nrows), squeeze=False)
    for ax, metric in zip(axes.flat, drawn):
        for d, recs in runs.items():
            steps, values = metric_series(recs, metric)
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3,
                        label=run_label(d, run_dirs))
            else:
                log(f"note: {run_label(d, run_dirs)} has no {metric}")
        ax.set_title(metric)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return drawn


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folders with metrics.jsonl")
    p.add_argument("--out", help="PNG path (default RUN_DIR/plots.png or ./runs_comparison.png)")
    p.add_argument("--metrics", nargs="+", default=[], metavar="KEY",
                   help="metrics to draw besides the defaults")
    p.add_argument("--only", action="store_true", help="draw only the --metrics, not the defaults")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 1 on a bad run folder or no metrics)."""
    args = parse_args(argv)
    metrics = list(dict.fromkeys(([] if args.only else list(DEFAULT_METRICS)) + args.metrics))
    if not metrics:
        print("error: --only needs --metrics KEY ...", file=sys.stderr)
        return 1
    out = args.out or default_out(args.run_dirs)
    try:
        drawn = plot_runs(args.run_dirs, out, metrics, optional=() if args.only else FAMILY_METRICS)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({len(drawn)} metrics, {len(args.run_dirs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
