"""The trainer end to end on CPU: toy env and real ALFWorld, resume, export, SIGTERM, plan."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from hf_models import hf_logits, load_hf

from hgpo_jax.cli import main as cli_main
from hgpo_jax.config import load_config
from hgpo_jax.metrics import read_metrics
from hgpo_jax.models import load_pretrained
from hgpo_jax.trainers.rl import Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def toy_config(run_dir, *extra):
    return load_config("tiny_cpu_toy", [f"train.run_dir={run_dir}", "env.num_workers=1", *extra])


def assert_finite_metrics(history, iterations):
    assert len(history) == iterations
    for m in history:
        for key in ("train/loss", "train/pg_loss", "train/kl_loss", "train/pg_clipfrac",
                    "train/mean_advantage", "rollout/mean_step_reward", "success/all",
                    "rollout/invalid_action_rate", "time/iteration", "hierarchy/level0_grouped_fraction"):
            assert key in m and math.isfinite(m[key]), (key, m.get(key))
        assert m["train/updates"] >= 1 and m["train/skipped_nonfinite"] == 0


def test_three_iterations_on_the_toy_env(tmp_path):
    cfg = toy_config(tmp_path / "run")
    with Trainer(cfg, progress=False) as trainer:
        history = trainer.train()
    assert_finite_metrics(history, 3)
    logged = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in logged] == [1, 2, 3]
    assert os.path.isfile(tmp_path / "run" / "config.yaml")
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints"))[-1] == "3"
    # the model folder model.path resolved to is recorded (a later build recipe cannot swap it)
    with open(tmp_path / "run" / "model_source.json") as f:
        assert json.load(f)["folder"] == os.path.abspath(trainer.model_dir)
    # the bias-vs-oracle diagnostic is logged every iteration
    for m in history:
        assert 0.0 <= m["diag/coverage"] <= 1.0
        for est in ("grpo", "gigpo", "hgpo"):
            assert f"diag/{est}/abs_dev" in m and f"diag/{est}/bias" in m


def test_three_iterations_on_alfworld_via_the_cli(tmp_path, capsys):
    run = tmp_path / "alf"
    assert cli_main(["train", "tiny_cpu", f"train.run_dir={run}", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "iterations 1..3" in out and "success" in out
    history = read_metrics(str(run))
    assert_finite_metrics(history, 3)
    assert any(k.startswith("success/pick") or k.startswith("success/look")
               or k.startswith("success/") for k in history[0])


def test_webshop_train_and_eval_via_the_cli(tmp_path, capsys):
    """hgpo-jax train tiny_cpu_webshop (2 iterations) then hgpo-jax eval on the test goals."""
    run = tmp_path / "ws"
    assert cli_main(["train", "tiny_cpu_webshop", f"train.run_dir={run}", "train.iterations=2",
                     "env.num_workers=1", "--no-progress"]) == 0
    history = read_metrics(str(run))
    assert_finite_metrics(history, 2)
    assert "score/all" in history[0] and "success/all" in history[0]
    assert cli_main(["eval", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "eval/test/all" in out and "eval/test/score" in out
    # --json: the last line of stdout is one object, one entry per split, with what it printed
    assert cli_main(["eval", str(run), "--split", "test", "--games", "3", "eval.protocol=each-once",
                     "--json", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert list(result) == ["test"]
    test = result["test"]
    assert test["episodes"] == 3 and 0.0 <= test["score"] <= 1.0 and 0.0 <= test["success"] <= 1.0
    assert 1.0 <= test["mean_length"] <= 4 and 0.0 <= test["ended"] <= 1.0  # tiny_cpu_webshop: 4 steps
    assert 0.0 <= test["score_sem"] <= 0.5 / np.sqrt(2)  # scores on 0..1, 3 episodes: sem <= 0.5 / sqrt(n - 1)
    printed = {ln.split()[0]: float(ln.split()[1]) for ln in lines[:-1] if ln.strip().startswith("eval/test/")}
    assert printed["eval/test/score"] == pytest.approx(test["score"], abs=1e-4)
    assert printed["eval/test/all"] == pytest.approx(test["success"], abs=1e-4)
    # --episodes: one line per game played, in task order, whose scores make the printed mean
    path = tmp_path / "episodes.jsonl"
    assert cli_main(["eval", str(run), "--split", "test", "--games", "3", "eval.protocol=each-once",
                     "--episodes", str(path), "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["test"]
    episodes = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["index"] for e in episodes] == [0, 1, 2] and {e["split"] for e in episodes} == {"test"}
    assert set(episodes[0]) == {"split", "index", "task", "task_type", "won", "score", "length", "ended"}
    assert np.mean([e["score"] for e in episodes]) == pytest.approx(result["score"], abs=1e-9)
    assert np.mean([e["length"] for e in episodes]) == pytest.approx(result["mean_length"], abs=1e-9)
    assert result["score_sem"] == pytest.approx(np.std([e["score"] for e in episodes], ddof=1) / np.sqrt(3))
    # an env without a task score (the toy) reports score None
    from hgpo_jax.commands.eval import eval_json

    assert eval_json({"eval/valid_seen/all": 0.5, "eval/valid_seen/episodes": 4.0}, ["valid_seen"]) == {
        "valid_seen": {"score": None, "success": 0.5, "episodes": 4}}


def test_eval_flags_are_checked_before_anything_runs():
    from hgpo_jax.commands.eval import check_eval_args

    cfg = load_config("tiny_cpu_webshop", ["eval.protocol=verl-agent"])
    with pytest.raises(ValueError, match="--episodes writes one line per game of eval.protocol=each-once"):
        check_eval_args(cfg, "test", 0, "episodes.jsonl")
    with pytest.raises(ValueError, match="--games 3 counts the games of eval.protocol=each-once"):
        check_eval_args(cfg, "test", 3)
    with pytest.raises(ValueError, match="--split 'nope'"):
        check_eval_args(cfg, "nope", 0)
    check_eval_args(load_config("tiny_cpu_webshop", ["eval.protocol=each-once"]), "test", 3, "episodes.jsonl")


def test_resume_continues_exactly(tmp_path):
    """Iteration 2 after a stop-and-resume equals iteration 2 of an uninterrupted run."""
    with Trainer(toy_config(tmp_path / "straight", "train.iterations=2"), progress=False) as t:
        straight = t.train()
        final = jax.tree.map(np.asarray, t.params)
    with Trainer(toy_config(tmp_path / "resumed", "train.iterations=1"), progress=False) as t:
        t.train()
    cfg = toy_config(tmp_path / "resumed", "train.iterations=2")
    with Trainer(cfg, resume=True, progress=False) as t:
        assert t.iteration == 1
        resumed = t.train()
        params = jax.tree.map(np.asarray, t.params)
    assert len(resumed) == 1
    for key in ("train/loss", "train/pg_loss", "train/kl_loss", "rollout/mean_step_reward"):
        assert resumed[0][key] == pytest.approx(straight[1][key], rel=1e-6, abs=1e-7), key
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), final, params)
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(toy_config(tmp_path / "straight"), progress=False)


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path):
    run = tmp_path / "run"
    with Trainer(toy_config(run, "train.iterations=2"), progress=False) as t:
        t.train()
    newest = run / "checkpoints" / "2" / "state"
    for root, _, files in os.walk(newest):
        for f in files:
            if "ocdbt" in root or f.endswith(".ocdbt"):
                with open(os.path.join(root, f), "r+b") as fh:
                    fh.truncate(3)
    with pytest.warns(UserWarning, match="corrupt or partial"):
        t = Trainer(toy_config(run, "train.iterations=2"), resume=True, progress=False)
    with t:
        assert t.iteration == 1  # the previous checkpoint


def test_export_round_trip_matches_transformers(tmp_path):
    run = tmp_path / "run"
    with Trainer(toy_config(run, "train.iterations=1"), progress=False) as t:
        t.train()
        flax_model = nnx.merge(t.graphdef, t.params)
    out = tmp_path / "hf"
    assert cli_main(["export", str(run), str(out)]) == 0
    ids = np.random.RandomState(0).randint(0, 600, (2, 12))
    np.testing.assert_allclose(hf_logits(load_hf(str(out)), ids),
                               np.asarray(flax_model(ids)), atol=1e-4)
    np.testing.assert_allclose(np.asarray(load_pretrained(out)(ids)), np.asarray(flax_model(ids)),
                               atol=1e-6)
    assert os.path.isfile(out / "tokenizer.json")


def test_sigterm_saves_a_checkpoint_before_exit(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hgpo_jax.cli", "train", "tiny_cpu_toy", f"train.run_dir={run}",
           "train.iterations=500", "train.save_every=0", "env.num_workers=1", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out.decode()[-3000:]
    steps = sorted(int(s) for s in os.listdir(run / "checkpoints") if s.isdigit())
    assert steps and steps[-1] < 500
    assert steps[-1] == len(read_metrics(str(run)))


def test_loss_config_takes_the_algo_settings():
    from hgpo_jax.trainers.rl import build_loss_config

    lc = build_loss_config(load_config("tiny_cpu", ["algo.entropy_coef=0.02", "algo.kl_coef=0.03",
                                                    "algo.loss_agg=seq-mean"]))
    assert (lc.entropy_coef, lc.kl_coef, lc.agg) == (0.02, 0.03, "seq-mean")
    assert build_loss_config(load_config("tiny_cpu")).entropy_coef == 0.001


def test_loss_config_scores_at_the_rollout_temperature():
    from hgpo_jax.trainers.rl import build_loss_config

    assert build_loss_config(load_config("tiny_cpu", ["rollout.temperature=0.7"])).temperature == 0.7
    assert build_loss_config(load_config("tiny_cpu", ["rollout.temperature=0"])).temperature == 1.0


def test_old_logprobs_are_those_the_rollout_sampled_at_its_temperature(tmp_path):
    """At rollout.temperature 0.6 the trainer's old log-probs of the response tokens are the
    sampler's own (the gap is rounding), so the policy updated is the one that acted; scored at
    temperature 1 they would differ by ~0.1-0.3 nats a token."""
    cfg = toy_config(tmp_path / "run", "rollout.temperature=0.6", "train.iterations=1")
    with Trainer(cfg, progress=False) as trainer:
        (m,) = trainer.train()
    assert m["train/rollout_vs_policy_logp_gap"] < 1e-3
    assert abs(m["train/ppo_kl"]) < 1e-3


def test_plan_prints_memory_per_device(capsys):
    assert cli_main(["plan", "tiny_cpu"]) == 0
    out = capsys.readouterr().out
    assert "estimated peak" in out and "optimizer state" in out and "GiB" in out


def test_plan_with_a_critic(capsys):
    """A PPO run's plan adds the critic: its weights (the policy's less the LM head, plus a
    D + 1 head), its AdamW moments, and a peak that holds both models."""
    from hgpo_jax.models.tiny import TINY_CONFIG
    from hgpo_jax.trainers.plan import plan

    base = plan(load_config("tiny_cpu_toy"))
    p = plan(load_config("tiny_cpu_ppo", ["rollout.num_groups=2", "rollout.group_size=2"]))
    lm_head = 0 if TINY_CONFIG.tie_word_embeddings else 4 * TINY_CONFIG.vocab_size * TINY_CONFIG.hidden_size
    assert p["critic_params_bytes"] == p["params_bytes"] - lm_head + 4 * (TINY_CONFIG.hidden_size + 1)
    assert p["critic_opt_bytes"] >= 2 * p["critic_params_bytes"]
    assert p["peak_bytes"] >= base["peak_bytes"] + p["critic_params_bytes"] + p["critic_opt_bytes"]
    assert cli_main(["plan", "tiny_cpu_ppo"]) == 0
    out = capsys.readouterr().out
    assert "critic parameters" in out and "critic step peak" in out


def _plan_temporaries(tmp_path, layers: int, remat: bool) -> int:
    """Step temporaries per device of a 1024-token, FSDP=2 plan of a small Qwen2 with `layers`."""
    import json

    from hgpo_jax.trainers.plan import plan

    folder = tmp_path / f"qwen2_{layers}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=4096, hidden_size=256,
        intermediate_size=704, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=4096)))
    cfg = load_config("tiny_cpu", [f"model.path={folder}", f"train.remat={remat}",
                                   "rollout.max_prompt_tokens=1008", "train.micro_batch_size=4",
                                   "train.mini_batch_size=8", "mesh.data=1", "mesh.fsdp=2"])
    return plan(cfg)["temp_bytes"]


def test_plan_under_fsdp_keeps_one_layer_of_activations_with_remat(tmp_path):
    """Remat must hold under FSDP: each extra layer adds its input (2 rows x 1024 x 256 float32
    = 2 MiB per device) and a few parameter-sized buffers (gradient accumulator, micro-batch
    gradient, optimizer update: ~1.5 MiB each), not its attention scores (2 rows x 4 heads x
    1024^2 x 4 B = 32 MiB, several times over without remat). Measured: ~11 MiB with remat,
    ~80 MiB without."""
    MiB = 2**20
    per_layer = {remat: (_plan_temporaries(tmp_path, 4, remat)
                         - _plan_temporaries(tmp_path, 2, remat)) / 2
                 for remat in (True, False)}
    assert per_layer[False] > 32 * MiB, per_layer  # the check can fail: without remat it grows
    assert per_layer[True] < 16 * MiB, per_layer


def test_bad_config_fails_before_anything_starts(tmp_path, capsys):
    assert cli_main(["train", "tiny_cpu", "algo.k=4", f"train.run_dir={tmp_path}/x"]) == 2
    assert "algo.K" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")


def test_summary_rows_are_numbered_by_the_real_iteration():
    from hgpo_jax.commands.train import _summary

    text = _summary([{"success/all": 0.5}, {"success/all": 0.75}], start=4)  # a run resumed at 4
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["5", "6"]


def test_a_failed_start_closes_the_checkpointer(tmp_path, monkeypatch):
    """An error after the checkpoint manager exists (here: the env lookup) closes it, instead of
    leaving Orbax's event loop to be collected later ("Event loop is closed")."""
    from hgpo_jax import checkpoint
    from hgpo_jax.trainers import evaluator as evaluator_module  # where the trainer looks up its env

    closed, close = [], checkpoint.Checkpointer.close
    monkeypatch.setattr(checkpoint.Checkpointer, "close", lambda self: (closed.append(self), close(self)))

    def broken(name):
        raise RuntimeError("no such env today")

    monkeypatch.setattr(evaluator_module, "get_env", broken)
    with pytest.raises(RuntimeError, match="no such env today"):
        Trainer(toy_config(tmp_path / "x"), progress=False)
    assert len(closed) == 1


def test_progress_bars_only_on_a_terminal(monkeypatch):
    import argparse

    from hgpo_jax.commands.common import show_progress
    from hgpo_jax.trainers.sft import progress_line

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not show_progress(argparse.Namespace(no_progress=False))  # CI, `make run > log`
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert show_progress(argparse.Namespace(no_progress=False))
    assert not show_progress(argparse.Namespace(no_progress=True))
    line = progress_line(100, 2000, {"train/nll": 1.5, "heldout/nll": 2.0, "time/step": 0.5})
    assert line == "step   100/2000  nll 1.5000  held-out nll 2.0000  0.50s"


def ppo_config(run_dir, *extra):
    return load_config("tiny_cpu_ppo", [f"train.run_dir={run_dir}", "env.num_workers=1", *extra])


def test_ppo_with_a_critic_trains_and_resumes_exactly(tmp_path):
    """algo.estimator=ppo on the toy env: the critic's update and the actor's each iteration,
    critic metrics logged, and iteration 2 after a stop-and-resume (critic restored) equals an
    uninterrupted run's, policy and critic alike; `hgpo-jax eval` reads the policy alone."""
    with Trainer(ppo_config(tmp_path / "straight", "train.iterations=2"), progress=False) as t:
        straight = t.train()
        final = jax.tree.map(np.asarray, (t.params, t.state.algo_state.params))
        head = np.asarray(t.state.algo_state.params["score"]["kernel"][...])
    for m in straight:
        for key in ("train/loss", "train/pg_loss", "critic/vf_loss", "critic/vf_clipfrac",
                    "critic/values_mean", "critic/returns_mean", "critic/grad_norm",
                    "train/mean_advantage", "success/all"):
            assert key in m and math.isfinite(m[key]), (key, m.get(key))
        assert m["train/updates"] >= 1 and "hierarchy/level0_grouped_fraction" not in m
    assert float(np.abs(head).sum()) > 0
    with Trainer(ppo_config(tmp_path / "resumed", "train.iterations=1"), progress=False) as t:
        t.train()
    with Trainer(ppo_config(tmp_path / "resumed", "train.iterations=2"), resume=True, progress=False) as t:
        resumed = t.train()
        again = jax.tree.map(np.asarray, (t.params, t.state.algo_state.params))
    for key in ("train/loss", "critic/vf_loss", "critic/values_mean", "rollout/mean_step_reward"):
        assert resumed[0][key] == pytest.approx(straight[1][key], rel=1e-6, abs=1e-7), key
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), final, again)
    assert cli_main(["eval", str(tmp_path / "straight"), "eval.batch_size=2", "--no-progress"]) == 0
    # the critic exports as transformers' Qwen2ForTokenClassification with the trained head
    import torch
    from transformers import AutoModelForTokenClassification

    out = tmp_path / "critic_hf"
    assert cli_main(["export", str(tmp_path / "straight"), str(out), "--critic"]) == 0
    hf = AutoModelForTokenClassification.from_pretrained(out, dtype=torch.float32)
    np.testing.assert_allclose(hf.score.weight.detach().numpy().T, final[1]["score"]["kernel"][...], atol=1e-7)
    from hgpo_jax.config import save_config
    from hgpo_jax.runs import load_run_state_model

    save_config(toy_config(tmp_path / "grpo"), str(tmp_path / "grpo" / "config.yaml"))
    with pytest.raises(ValueError, match="only a ppo run has a critic"):
        load_run_state_model(str(tmp_path / "grpo"))


def test_ppo_critic_warm_up_holds_the_actor(tmp_path):
    """critic.warmup_iterations=3: the first two iterations update the critic only."""
    with Trainer(ppo_config(tmp_path / "w", "train.iterations=1", "critic.warmup_iterations=3"),
                 progress=False) as t:
        before = jax.tree.map(np.asarray, t.params)
        critic_before = jax.tree.map(np.asarray, t.state.algo_state.params)
        (m,) = t.train()
        jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, t.params))
        changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), critic_before, t.state.algo_state.params)
        assert any(jax.tree.leaves(changed))
    assert m["train/updates"] == 0 and "critic/vf_loss" in m
