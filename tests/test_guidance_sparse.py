"""experiments/guidance_sparse.py (issue 63) end to end with tiny settings, through the study
runner (experiments/study.py): the results it must write, and that it resumes: a finished run is
reused, a run cut after its checkpoint is resumed (not trained again), and a run the trainer
stopped early is never taken as done."""

import json
import os

import pytest

from experiments import guidance_sparse, study

pytestmark = pytest.mark.slow

ARMS = ["grpo", "grpo_g2"]


def invoke(out, seeds=(0,)):
    return guidance_sparse.main(["--seeds", *map(str, seeds), "--arms", *ARMS, "--iterations", "1",
                                 "--sft-steps", "2", "--out", str(out), "rollout.num_groups=2",
                                 "eval.games=4", "train.diagnostics=false"])


def test_the_sparse_study_writes_its_results_and_resumes(tmp_path):
    out = tmp_path / "out"
    first = invoke(out)
    saved = json.loads((out / "results.json").read_text())
    assert saved["command"].startswith("python -m experiments.guidance_sparse --seeds 0")
    assert 0 < saved["random_play_success"] < 0.01  # the reason the task exists
    assert saved["random_play"]["split"] == "valid_unseen"
    for arm in ARMS:
        assert saved[arm]["seeds"] == [0] and len(saved[arm]["last_third"]) == 1
    assert set(saved["dynamics"]) == {"grpo_g2"}  # what the schedule did, guided arms only
    assert saved["dynamics"]["grpo_g2"]["mu_global"][0] == pytest.approx(0.8)
    for name in ("results.md", "success.png", "schedule.png"):
        assert (out / name).is_file(), name

    runs = out / "runs"
    logs = {arm: (runs / f"{arm}-s0" / "metrics.jsonl").read_bytes() for arm in ARMS}
    os.remove(runs / "grpo_g2-s0" / "done")  # cut after its last checkpoint, before `done`
    again = invoke(out)
    for arm in ARMS:  # reused and resumed: no iteration trained again
        assert (runs / f"{arm}-s0" / "metrics.jsonl").read_bytes() == logs[arm], arm
    assert (runs / "grpo_g2-s0" / "done").is_file()
    assert json.dumps(again["summary"]["arms"]) == json.dumps(first["summary"]["arms"])  # NaN too


def test_a_run_the_trainer_stopped_early_is_not_taken_as_done(tmp_path, monkeypatch):
    """SIGTERM makes the trainer save and return before its last iteration: the study ends with
    the command to resume, and writes no `done` marker."""
    from hgpo_jax.trainers.rl import Trainer

    monkeypatch.setattr(Trainer, "train", lambda self: [])  # stopped before any iteration
    sft_dir = study.run_sft(str(tmp_path), 0, "toy-lock", 2, 2,
                            extra=["model.path=build:toy-lock-tiny"])
    with pytest.raises(SystemExit, match="run the same command again"):
        study.run_rl(str(tmp_path), "grpo", 0, sft_dir, "toy-lock", 2, 1,
                     ["rollout.num_groups=2"], {"grpo": ["algo.estimator=grpo"]})
    assert not (tmp_path / "runs" / "grpo-s0" / "done").exists()
