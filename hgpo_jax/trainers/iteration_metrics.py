"""What an RL iteration reports: the progress line, the per-row statistics combined over the
processes, the prefix SFT metrics."""

from __future__ import annotations

import math
from collections import defaultdict


def progress_line(iteration: int, total: int, metrics: dict[str, float]) -> str:
    """One line per iteration: success (training rollouts and held-out splits), invalid replies,
    losses, time."""
    parts = [f"it {iteration:>4}/{total}"]
    for key, label in (("success/all", "success"), ("rollout/invalid_action_rate", "invalid"),
                       ("train/loss", "loss"), ("train/kl_loss", "kl")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.3f}")
    for key in sorted(metrics):
        if key.startswith("eval/") and key.endswith("/all") and key.count("/") == 2:
            parts.append(f"{key[5:-4]} {metrics[key]:.3f}")
    if "time/iteration" in metrics:
        parts.append(f"{metrics['time/iteration']:.1f}s")
    return "  ".join(parts)


def merge_row_statistics(parts: list[dict]) -> tuple[dict[str, float], float]:
    """(metrics, tokens): the per-row statistics of an iteration over all processes. parts: one dict per process,
    {"rows": n, "adv": [sum, sum of squares], "tokens": t, "logp_gap": [sum, count],
    "row_means": {metric: mean over its rows}}; row means are weighted by rows."""
    rows = sum(p["rows"] for p in parts)
    adv_sum, adv_sq = (sum(p["adv"][i] for p in parts) for i in (0, 1))
    mean = adv_sum / max(rows, 1)
    gap, count = (sum(p["logp_gap"][i] for p in parts) for i in (0, 1))
    out = {"train/mean_advantage": mean,
           "train/std_advantage": math.sqrt(max(adv_sq / max(rows, 1) - mean * mean, 0.0)),
           "train/rollout_vs_policy_logp_gap": gap / max(count, 1)}
    for key in sorted({k for p in parts for k in p["row_means"]}):
        held = [(p["rows"], p["row_means"][key]) for p in parts if key in p["row_means"]]
        out[key] = sum(n * v for n, v in held) / max(sum(n for n, _ in held), 1)
    return out, float(sum(p["tokens"] for p in parts))


def mean_metrics(records: list[dict]) -> dict[str, float]:
    sums, counts = defaultdict(float), defaultdict(int)
    for r in records:
        for k, v in r.items():
            sums[k] += float(v)
            counts[k] += 1
    return {k: sums[k] / counts[k] for k in sums}


def prefix_sft_metrics(records: list[dict], rows: int) -> dict[str, float]:
    """The prefix SFT metrics of an iteration: `train/prefix_sft_rows` (every process's rows),
    `train/prefix_sft_updates`, and over its updates (`records`, when there were any) the mean
    of `train/prefix_sft_loss` (the weighted cross-entropy), `train/prefix_sft_grad_norm` and
    `train/prefix_sft_skipped_nonfinite`."""
    out = {"train/prefix_sft_rows": float(rows), "train/prefix_sft_updates": float(len(records))}
    if records:
        mean = mean_metrics(records)
        out.update({"train/prefix_sft_loss": mean["train/prefix_sft_loss"],
                    "train/prefix_sft_grad_norm": mean["train/grad_norm"],
                    "train/prefix_sft_skipped_nonfinite": mean["train/skipped_nonfinite"]})
    return out
