"""Did the agent get better? Start-vs-end success of a run, with its uncertainty, and its curves.

    s = learning_summary(read_metrics(run_dir))        # {"eval/valid_seen": {...}, "success": {...}}
    path = plot_learning_curves(run_dir)               # RUN_DIR/learning_curves.png

For each success series of a run (the training rollouts' `success/all`, and each evaluation
split's `eval/<split>/all`), the iterations are cut in thirds; the summary gives the success of
the first and the last third (the mean over their episodes), the difference, and standard errors:
binomial, sqrt(p (1 - p) / n) over the n episodes of the third, the difference's from the two
combined. The policy changes within a third, so this is the uncertainty of the third's average
success, not of a fixed policy's.
"""

from __future__ import annotations

import math
import os

SUCCESS = "success/all"


def success_series(records: list[dict]) -> dict[str, list[tuple[int, float, float]]]:
    """{name: [(iteration, success rate, episodes)]} for the training rollouts ('train') and each
    evaluation split ('eval/<split>')."""
    series: dict[str, list] = {}
    for r in records:
        step = int(r["step"])
        if SUCCESS in r and r[SUCCESS] is not None:
            series.setdefault("train", []).append(
                (step, float(r[SUCCESS]), float(r.get("rollout/episodes", 0.0) or 0.0)))
        for key, value in r.items():
            if key.startswith("eval/") and key.endswith("/all") and key.count("/") == 2 \
                    and value is not None:
                name = key[:-len("/all")]
                series.setdefault(name, []).append(
                    (step, float(value), float(r.get(f"{name}/episodes", 0.0) or 0.0)))
    return {k: sorted(v) for k, v in series.items()}


def _third(points: list[tuple[int, float, float]]) -> dict:
    episodes = sum(n for _, _, n in points)
    if episodes > 0:
        p = sum(rate * n for _, rate, n in points) / episodes
        se = math.sqrt(max(p * (1 - p), 0.0) / episodes)
    else:  # no episode counts logged: the plain mean over iterations
        p = sum(rate for _, rate, _ in points) / len(points)
        se = float("nan")
    return {"success": p, "se": se, "episodes": episodes,
            "iterations": [points[0][0], points[-1][0]]}


def learning_summary(records: list[dict]) -> dict[str, dict]:
    """{series: {first, last (each: success, se, episodes, iterations), improvement,
    improvement_se, start, end}} for every success series with at least 3 points."""
    out = {}
    for name, points in success_series(records).items():
        if len(points) < 3:
            continue
        k = len(points) // 3
        first, last = _third(points[:k]), _third(points[-k:])
        out[name] = {"first": first, "last": last,
                     "improvement": last["success"] - first["success"],
                     "improvement_se": math.sqrt(first["se"] ** 2 + last["se"] ** 2),
                     "start": points[0][1], "end": points[-1][1]}
    return out


def summary_metrics(summary: dict[str, dict]) -> dict[str, float]:
    """The summary as flat metrics: summary/<series>/{first_third, last_third, ...}."""
    flat = {}
    for name, s in summary.items():
        prefix = f"summary/{name.replace('/', '_')}"
        flat.update({f"{prefix}/first_third": s["first"]["success"],
                     f"{prefix}/first_third_se": s["first"]["se"],
                     f"{prefix}/last_third": s["last"]["success"],
                     f"{prefix}/last_third_se": s["last"]["se"],
                     f"{prefix}/improvement": s["improvement"],
                     f"{prefix}/improvement_se": s["improvement_se"]})
    return flat


def format_summary(summary: dict[str, dict]) -> str:
    lines = []
    for name, s in summary.items():
        f, la = s["first"], s["last"]
        lines.append(
            f"{name:<18} first third (it {f['iterations'][0]}-{f['iterations'][1]}, "
            f"{f['episodes']:.0f} episodes) {f['success']:.3f} +/- {f['se']:.3f}  ->  last third "
            f"(it {la['iterations'][0]}-{la['iterations'][1]}) {la['success']:.3f} +/- {la['se']:.3f}"
            f"   change {s['improvement']:+.3f} +/- {s['improvement_se']:.3f}")
    return "\n".join(lines)


def plot_learning_curves(run_dir: str, records: list[dict] | None = None, out: str | None = None,
                         title: str | None = None) -> str:
    """Success per iteration of every series (training rollouts, evaluation splits) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hgpo_jax.metrics import read_metrics

    records = read_metrics(run_dir) if records is None else records
    series = success_series(records)
    out = out or os.path.join(run_dir, "learning_curves.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in series.items():
        steps, rates = [p[0] for p in points], [p[1] for p in points]
        ax.plot(steps, rates, marker="o", markersize=3,
                label="training rollouts (T=1.0)" if name == "train" else f"{name} (held out)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or os.path.basename(os.path.normpath(run_dir)))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
