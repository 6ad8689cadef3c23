"""The start-vs-end learning summary, its curves, and the per-iteration progress line."""

import math
import os

import pytest

from hgpo_jax.trainers.iteration_metrics import progress_line
from hgpo_jax.summary import (format_summary, learning_summary, plot_learning_curves, success_series,
                              summary_metrics)


def records(train, held, episodes=64, held_episodes=48):
    out = []
    for i, (a, b) in enumerate(zip(train, held), 1):
        out.append({"step": i, "success/all": a, "rollout/episodes": episodes})
        out.append({"step": i, "eval/valid_seen/all": b, "eval/valid_seen/episodes": held_episodes,
                    "eval/valid_seen/seed123/all": 0.0})  # not a split's overall rate
    return out


def test_thirds_means_and_binomial_errors():
    recs = records([0.2, 0.3, 0.25, 0.4, 0.5, 0.45, 0.8, 0.9, 0.85], [0.3] * 3 + [0.5] * 3 + [0.9] * 3)
    assert set(success_series(recs)) == {"train", "eval/valid_seen"}
    s = learning_summary(recs)
    t = s["train"]
    assert t["first"]["success"] == pytest.approx(0.25) and t["last"]["success"] == pytest.approx(0.85)
    assert t["first"]["episodes"] == 192 and t["first"]["iterations"] == [1, 3]
    assert t["first"]["se"] == pytest.approx(math.sqrt(0.25 * 0.75 / 192))
    assert t["improvement"] == pytest.approx(0.6)
    assert t["improvement_se"] == pytest.approx(math.hypot(t["first"]["se"], t["last"]["se"]))
    e = s["eval/valid_seen"]
    assert (e["first"]["success"], e["last"]["success"], e["start"], e["end"]) == pytest.approx((0.3, 0.9, 0.3, 0.9))
    flat = summary_metrics(s)
    assert flat["summary/eval_valid_seen/improvement"] == pytest.approx(0.6)
    assert "summary/train/last_third_se" in flat
    text = format_summary(s)
    assert "eval/valid_seen" in text and "+0.600" in text


def test_short_runs_and_missing_episode_counts():
    assert learning_summary(records([0.1, 0.2], [0.1, 0.2])) == {}
    recs = [{"step": i, "success/all": r} for i, r in enumerate([0.0, 0.5, 1.0], 1)]
    s = learning_summary(recs)["train"]
    assert s["improvement"] == 1.0 and math.isnan(s["first"]["se"])  # no counts: no binomial error


def test_curves_png(tmp_path):
    path = plot_learning_curves(str(tmp_path), records([0.1, 0.2, 0.3], [0.2, 0.3, 0.4]))
    assert path == os.path.join(str(tmp_path), "learning_curves.png") and os.path.getsize(path) > 1000


def test_progress_line():
    line = progress_line(3, 10, {"success/all": 0.25, "rollout/invalid_action_rate": 0.0, "train/loss": 0.1,
                                 "eval/valid_seen/all": 0.5, "eval/valid_seen/seed1/all": 0.2,
                                 "time/iteration": 12.34})
    assert line == "it    3/10  success 0.250  invalid 0.000  loss 0.100  valid_seen 0.500  12.3s"
