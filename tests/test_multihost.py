"""Multi-process runs on one machine: 2 JAX processes on localhost with one CPU device each (CPU
collectives via gloo) against 1 process with 2 devices (docs/multihost.md).

Every process is a subprocess with its own device count (this test process has 8 virtual devices);
each wait has a time-out and every process is killed in a `finally`.
"""

import math
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from hgpo_jax.metrics import read_metrics
from hgpo_jax.build import resolve_model_path
from hgpo_jax.trainers.rl import Trainer
from hgpo_jax.config import load_config

from child_env import child_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_SCRIPT = os.path.join(REPO, "tests", "multihost_step.py")
TOY = ["tiny_cpu_toy", "env.num_workers=1", "mesh.data=-1", "dist.heartbeat_timeout_s=10",
       "dist.init_timeout_s=60"]


@pytest.fixture(scope="module", autouse=True)
def tiny_model():
    """Build the cached tiny model once here, before processes that would all build it at once."""
    resolve_model_path("tiny")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def env_for(devices: int) -> dict:
    env = child_env(devices)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def start(cmd: list[str], log, devices: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT,
                            env=env_for(devices), cwd=REPO, start_new_session=True)


def start_job(cmd: list[str], tmp_path, name: str, processes: int = 2):
    """`processes` processes of `cmd` joined through a coordinator on a free localhost port, one
    CPU device each; -> (processes, their log paths)."""
    port = free_port()
    procs, logs = [], []
    for i in range(processes):
        path = tmp_path / f"{name}-{i}.log"
        with open(path, "w") as log:
            procs.append(start([*cmd, "--coordinator", f"localhost:{port}",
                                "--num-processes", str(processes), "--process-id", str(i)],
                               log, devices=1))
        logs.append(path)
    return procs, logs


def wait_all(procs, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    return [p.wait(timeout=max(deadline - time.monotonic(), 1)) for p in procs]


def kill_all(procs) -> None:
    """SIGKILL each process's whole group (its env workers too) and reap it."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)


def read(path) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def one_and_two_processes(script: str, tmp_path, name: str, suffix: str):
    """Run `script OUT` once in 1 process with 2 devices and once as 2 processes with 1 device
    each (at the same time); -> (the 1-process output path, the 2-process one)."""
    one, two = tmp_path / f"one{suffix}", tmp_path / f"two{suffix}"
    with open(tmp_path / f"{name}-single.log", "w") as log:
        single = start([script, str(one)], log, devices=2)
    procs, logs = start_job([script, str(two)], tmp_path, name)
    try:
        assert wait_all([single, *procs], timeout=240) == [0, 0, 0], \
            "\n".join(read(p) for p in [tmp_path / f"{name}-single.log", *logs])
    finally:
        kill_all([single, *procs])
    return one, two


def test_one_train_step_on_two_processes_equals_one_process_with_two_devices(tmp_path):
    """Log-probs, loss, grad norm and updated parameters of one PPO step on the same global
    mini-batch, with the batch over `data` and with batch and weights over `fsdp`."""
    one, two = one_and_two_processes(STEP_SCRIPT, tmp_path, "step", ".npz")
    a, b = np.load(one), np.load(two)
    assert sorted(a.files) == sorted(b.files)
    assert sum("/param" in k for k in a.files) >= 20
    for layout in ("data", "fsdp"):
        assert math.isfinite(float(a[f"{layout}/loss"])) and float(a[f"{layout}/grad_norm"]) > 0
    for key in a.files:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-5, err_msg=key)
    # token-budget micro-batches (log-probs and update, planned over both processes' rows): the
    # fixed micro-batches' loss, gradient norm, log-probs and parameters (AdamW at lr 1e-3 divides
    # each gradient by its own magnitude: a rounding-level difference in a near-zero gradient
    # moves that weight by a fraction of lr, hence the looser bound on the parameters)
    for key in (k for k in a.files if k.startswith("data/")):
        for run in (a, b):
            np.testing.assert_allclose(run["budget/" + key[5:]], run[key], rtol=1e-5,
                                       atol=1e-4 if "/param" in key else 1e-6, err_msg=key)


def test_two_process_toy_run_completes_and_resumes_in_one_process(tmp_path):
    run = tmp_path / "run"
    cmd = ["-m", "hgpo_jax.cli", "train", *TOY, f"train.run_dir={run}", "train.iterations=2",
           "--no-progress"]
    procs, logs = start_job(cmd, tmp_path, "train")
    try:
        assert wait_all(procs, timeout=240) == [0, 0], "\n".join(read(p) for p in logs)
    finally:
        kill_all(procs)
    out0, out1 = read(logs[0]), read(logs[1])
    assert "2 processes, 2 devices" in out0 and "iterations 1..2" in out0
    assert "iterations 1..2" not in out1  # only process 0 prints (and writes the metrics)
    records = read_metrics(str(run))
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["train/loss"]) and r["train/updates"] >= 1
        assert r["rollout/episodes"] == 4  # 2 groups x 2 rollouts, one group per process
    assert sorted(os.listdir(run / "checkpoints")) == ["1", "2"]

    # the checkpoint the two processes wrote together, restored by one process on another mesh
    cfg = load_config(TOY[0], [*TOY[1:], f"train.run_dir={run}", "train.iterations=3",
                               "mesh.data=2"])
    with Trainer(cfg, resume=True, progress=False) as trainer:
        assert trainer.iteration == 2
        history = trainer.train()
    assert len(history) == 1 and math.isfinite(history[0]["train/loss"])
    assert [r["step"] for r in read_metrics(str(run))] == [1, 2, 3]


def wait_for(condition, procs, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        assert all(p.poll() is None for p in procs), f"a process ended before {what}"
        time.sleep(0.25)


def test_sigterm_to_one_process_saves_and_stops_both_and_a_killed_peer_ends_the_other(tmp_path):
    run = tmp_path / "run"
    cmd = ["-m", "hgpo_jax.cli", "train", *TOY, f"train.run_dir={run}", "train.iterations=30",
           "train.save_every=0", "--no-progress"]
    # SIGTERM to process 1 alone, once the loop runs: both finish the iteration, save, exit 0
    procs, logs = start_job(cmd, tmp_path, "term")
    try:
        wait_for(lambda: len(read_metrics(str(run))) >= 1 if (run / "metrics.jsonl").exists()
                 else False, procs, 180, "first iteration")
        os.kill(procs[1].pid, signal.SIGTERM)
        assert wait_all(procs, timeout=120) == [0, 0], "\n".join(read(p) for p in logs)
    finally:
        kill_all(procs)
    steps = [r["step"] for r in read_metrics(str(run))]
    assert 2 <= steps[-1] < 30
    assert os.listdir(run / "checkpoints") == [str(steps[-1])]  # the joint save on stop

    # resumed by two processes, one of them killed (with its env workers: a lost host): the other
    # fails its next collective at once and ends with an error, not a hang
    procs, logs = start_job([*cmd, "--resume"], tmp_path, "kill")
    try:
        wait_for(lambda: f"at iteration {steps[-1]}" in read(logs[0]), procs, 120, "resume")
        os.killpg(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        rc = procs[0].wait(timeout=120)
        took = time.monotonic() - killed
    finally:
        kill_all(procs)
    out = read(logs[0])
    assert rc == 1, out
    assert took < 60, (took, out)
    assert "a collective with the other processes failed" in out, out


# --------------------------------------------------------------------------- in-process pieces
def test_groups_split_whole_over_processes_or_a_clear_error(monkeypatch):
    from hgpo_jax import distributed as dist

    monkeypatch.setattr(dist.jax, "process_count", lambda: 2)
    monkeypatch.setattr(dist.jax, "process_index", lambda: 1)
    assert dist.process_share(16, "rollout.num_groups") == (8, 16)
    monkeypatch.setattr(dist.jax, "process_count", lambda: 3)
    with pytest.raises(ValueError, match=r"rollout.num_groups=16 .* 3 processes.*multiple of 3"):
        dist.process_share(16, "rollout.num_groups")


def test_partial_distributed_flags_are_refused_before_jax_starts():
    from hgpo_jax.cli import main

    with pytest.raises(SystemExit):  # argparse: --num-processes needs an int
        main(["train", "tiny_cpu_toy", "--num-processes", "two"])
    assert main(["train", "tiny_cpu_toy", "--coordinator", "localhost:1234"]) == 2
    assert main(["train", "tiny_cpu_toy", "--coordinator", "localhost:1234", "--num-processes",
                 "2", "--process-id", "2"]) == 2


def test_shared_shuffle_keeps_the_generator_in_step_and_each_process_its_rows():
    from hgpo_jax.rl.batching import minibatch_indices

    rngs = [np.random.default_rng(5) for _ in range(3)]
    same = minibatch_indices(7, 4, np.random.default_rng(5))
    assert all(np.array_equal(a, b) for a, b in zip(same, minibatch_indices(7, 4, rngs[0], draw=7)))
    few = minibatch_indices(3, 4, rngs[1], draw=7)   # a process with fewer rows
    none = minibatch_indices(0, 4, rngs[2], draw=7)  # one with none
    assert none == [] and len(few) == 1 and sorted(few[0][few[0] >= 0]) == [0, 1, 2]
    states = [r.bit_generator.state for r in rngs]
    assert states[0] == states[1] == states[2]


def test_rollout_metrics_of_gathered_summaries_equal_those_of_one_batch():
    from hgpo_jax.rl.rollout import summary_metrics

    def summary(won, types, lengths, valid, reward, tokens, failed, seconds):
        return {"episode_won": won, "episode_task_type": types, "episode_length": lengths,
                "valid": valid, "reward": reward, "response_tokens": tokens,
                "num_failed": failed, "timing": {"generate": seconds}}

    a = summary([True, False], ["pick", "look"], [2, 1], [True, True, False], [0.0, 1.0, 0.0],
                [3, 4, 5], 0, 1.0)
    b = summary([True], ["look"], [2], [True, False], [0.0, 1.0], [6, 7], 1, 2.0)
    both = summary(*(a[k] + b[k] for k in ("episode_won", "episode_task_type", "episode_length",
                                            "valid", "reward", "response_tokens")), 1, 2.0)
    assert summary_metrics([a, b]) == summary_metrics([both])
    m = summary_metrics([a, b])
    assert m["success/all"] == pytest.approx(2 / 3) and m["success/look"] == 0.5
    assert m["rollout/steps"] == 5 and m["rollout/failed_episodes"] == 1
    assert m["rollout/invalid_action_rate"] == pytest.approx(2 / 5) and m["time/generate"] == 2.0


def test_a_multi_process_launcher_is_detected_from_its_environment():
    from hgpo_jax.distributed import detect_launcher

    assert detect_launcher({}) is None
    assert detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one task: alone
    assert "SLURM" in detect_launcher({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
                                       "SLURM_NTASKS": "8"})
    assert detect_launcher({"SLURM_NTASKS": "4"}) is None  # sbatch shell, not an srun task
    assert "Open MPI" in detect_launcher({"OMPI_COMM_WORLD_SIZE": "2"})
    assert detect_launcher({"OMPI_COMM_WORLD_SIZE": "1"}) is None
    assert "TPU" in detect_launcher({"TPU_WORKER_HOSTNAMES": "t1-w-0,t1-w-1"})
    assert detect_launcher({"TPU_WORKER_HOSTNAMES": "localhost"}) is None
    assert detect_launcher({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2"})


def test_cli_joins_a_detected_launch_unless_told_to_run_alone(monkeypatch):
    """No flags under a multi-process launcher: the CLI initializes as --distributed would;
    --single-process or explicit flags skip the detection."""
    import argparse

    from hgpo_jax import distributed
    from hgpo_jax.commands import common
    from hgpo_jax.config import load_config

    seen = []
    monkeypatch.setattr(distributed, "init_distributed",
                        lambda a, **kw: seen.append(a) or False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    cfg = load_config("tiny_cpu_toy")
    base = dict(coordinator=None, num_processes=None, process_id=None, distributed=False)
    common.start_distributed(argparse.Namespace(**base, single_process=False), cfg)
    common.start_distributed(argparse.Namespace(**base, single_process=True), cfg)
    assert seen[0].auto and not seen[1].requested


ROLLOUT_SCRIPT = os.path.join(REPO, "tests", "multihost_rollout.py")


def test_a_rollout_on_two_processes_samples_what_one_process_samples(tmp_path):
    """Per-row sampling keys (the env's global index): 2 toy tasks x 3 rollouts at temperature 1,
    on 1 process with 2 devices and on 2 processes with 1 device each, sample the same tokens
    in every env's every step, with the same log-probs (the second process's envs sit at other
    places of the batch: 4..6 of 8 rows instead of 3..5)."""
    import json

    one, two = one_and_two_processes(ROLLOUT_SCRIPT, tmp_path, "rollout", ".json")

    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert len(a) >= 6 and {r[0] for r in a} == set(range(6))     # every env stepped
    assert [r[:3] for r in b] == [r[:3] for r in a]               # env, step, tokens
    for ra, rb in zip(a, b):
        np.testing.assert_allclose(rb[3], ra[3], atol=1e-5)
