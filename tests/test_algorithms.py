"""Algorithms as units: their declarations (`hgpo_jax.algo_specs`), the units that run them
(`hgpo_jax.rl.algorithms`), the typed rows an iteration passes between stages, and that a new
algorithm runs in the trainer without a change in trainers/."""

import dataclasses

import numpy as np
import pytest

from hgpo_jax import algo_specs
from hgpo_jax.algo_specs import ALGO_OPTIONS, AlgorithmSpec, GroupOptions, algorithm_spec
from hgpo_jax.config import AlgoConfig, load_config
from hgpo_jax.config_checks import ConfigError
from hgpo_jax.rl import algorithms
from hgpo_jax.rl.advantages import AdvantageOptions, compute_step_advantages
from hgpo_jax.rl.algorithms import (Advantages, Algorithm, CriticAlgorithm, GroupAlgorithm,
                                    LinkedTurns, StepRows, build_algorithm)
from hgpo_jax.rl.batching import pack_rows
from hgpo_jax.rl.rollout import RolloutBatch


# ------------------------------------------------------------------------------------- declarations
def test_the_declarations_say_what_each_algorithm_needs():
    assert algo_specs.algorithm_names() == ("grpo", "rloo", "gigpo", "hgpo", "ppo", "hiper")
    assert algo_specs.GROUP_ESTIMATORS == ("grpo", "rloo", "gigpo", "hgpo")
    for name in algo_specs.GROUP_ESTIMATORS:
        spec = algorithm_spec(name)
        assert (spec.family, spec.has_critic, spec.token_advantages, spec.singleton_groups,
                spec.sections) == ("group", False, False, False, ())
    ppo = algorithm_spec("ppo")
    assert (ppo.family, ppo.critic_heads, ppo.token_advantages, ppo.singleton_groups,
            ppo.sections) == ("critic", 1, True, True, ("critic",))
    hiper = algorithm_spec("hiper")
    assert (hiper.family, hiper.critic_heads, hiper.token_advantages, hiper.agent) == (
        "hiper", 3, True, "plan-execute")
    with pytest.raises(ValueError, match="unknown algorithm 'hgp'.*Did you mean 'hgpo'"):
        algorithm_spec("hgp")
    # every declared family has its unit
    assert {s.family for s in algo_specs.ALGORITHMS.values()} <= set(algorithms.FAMILIES)


def test_each_option_is_declared_once_and_checked_beside_it():
    names = [f.name for f in dataclasses.fields(AlgoConfig)]
    assert len(names) == len(set(names))
    declared = {f.name for cls in ALGO_OPTIONS for f in dataclasses.fields(cls)}
    assert set(names) == declared | {"estimator"}
    assert AdvantageOptions is GroupOptions  # the estimators' options are the config's fields
    assert GroupOptions.of(load_config(None, ["algo.K=4"]).algo).K == 4
    # built in code: a ValueError naming the option; in a config: the key and how to fix it
    with pytest.raises(ValueError, match="unknown mode 'zscore'"):
        GroupOptions(mode="zscore")
    with pytest.raises(ConfigError, match=r"algo.mode='zscore' is not allowed; use one of mean_std_norm"):
        load_config(None, ["algo.mode=zscore"])
    assert AlgoConfig().problems("algo.") == []


def test_the_config_reads_the_declaration():
    # groups of one only for an algorithm that declares them
    assert load_config("tiny_cpu_ppo").rollout.group_size == 1
    with pytest.raises(ConfigError, match="rollout.group_size=1: must be >= 2"):
        load_config("tiny_cpu_ppo", ["algo.estimator=grpo"])
    # an algorithm's own sections are shown for it only
    from hgpo_jax.commands.common import format_config
    assert "\n  critic" in format_config(load_config("tiny_cpu_ppo"))
    assert "\n  critic" not in format_config(load_config("tiny_cpu"))


def test_an_algorithm_that_needs_an_agent_says_which(monkeypatch):
    monkeypatch.setitem(algo_specs.ALGORITHMS, "planner",
                        AlgorithmSpec("planner", "group", "a test algorithm", agent="plan-execute"))
    with pytest.raises(ConfigError, match="algo.estimator='planner' needs the agent 'plan-execute'"
                                          ".*set agent.name=plan-execute"):
        load_config("tiny_cpu_toy", ["algo.estimator=planner"])


# ------------------------------------------------------------------------------------- typed rows
def rollout_batch(traj, step, reward, valid, done, task=None) -> RolloutBatch:
    """A RolloutBatch of the given columns (one-token prompts and responses)."""
    n = len(traj)
    task = [t // 2 for t in traj] if task is None else task
    return RolloutBatch(
        task_id=np.asarray(task, np.int64), traj_id=np.asarray(traj, np.int64),
        step_id=np.asarray(step, np.int64), anchor=[f"obs{s}" for s in step],
        prompt_ids=[[1, 2]] * n, response_ids=[[3, 4]] * n, sample_logp=[[-0.5, -0.5]] * n,
        reward=np.asarray(reward, np.float64), valid=np.asarray(valid, bool),
        done=np.asarray(done, bool), won=np.zeros(n, bool), task_type=["t"] * n,
        episode_traj=np.unique(traj), episode_won=np.zeros(len(set(traj)), bool),
        episode_task_type=["t"] * len(set(traj)), episode_length=np.bincount(traj)[np.unique(traj)],
        num_failed=0, timing={})


def step_rows(batch: RolloutBatch, rows: int = 8) -> StepRows:
    packed = pack_rows(batch.prompt_ids, batch.response_ids, np.zeros(len(batch), np.float32),
                       batch.sample_logp, pad_id=0, row_multiple=rows, length_multiple=8)
    zeros = np.zeros(packed.input_ids.shape, np.float32)
    return StepRows(batch, packed, zeros, zeros, LinkedTurns.of(batch, packed.shape[0]))


# trajectories 0, 1 (task 0) and 2, 3 (task 1); rows out of order
BATCH = dict(traj=[0, 1, 0, 2, 3, 1, 3], step=[0, 0, 1, 0, 0, 1, 1],
             reward=[0.0, 0.0, 10.0, 0.0, 0.0, 0.0, 10.0],
             valid=[True, False, True, True, True, True, False],
             done=[False, False, True, True, False, True, True])


def test_linked_turns_carry_each_turn_and_its_episode():
    b = rollout_batch(**BATCH)
    turns = LinkedTurns.of(b, 8)
    np.testing.assert_array_equal(turns.traj_id, [0, 1, 0, 2, 3, 1, 3, -1])
    np.testing.assert_array_equal(turns.turn, [0, 0, 1, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(turns.done, [0, 0, 1, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(turns.reward, [0, 0, 10, 0, 0, 0, 10, 0])
    np.testing.assert_array_equal(turns.valid, [1, 0, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(turns.episode_rewards(), [10, 0, 10, 0, 10, 0, 10, 0])


def test_the_group_unit_gives_the_estimators_advantages():
    b = rollout_batch(**BATCH)
    rows = step_rows(b)
    for name in algo_specs.GROUP_ESTIMATORS:
        cfg = load_config("tiny_cpu_toy", [f"algo.estimator={name}", "train.diagnostics=false"])
        unit = build_algorithm(cfg)
        assert isinstance(unit, GroupAlgorithm) and unit.init_state(None, 0) is None
        adv = unit.advantages(rows, None, None)
        want = compute_step_advantages(name, b.task_id, b.traj_id, b.step_id, b.anchor, b.reward,
                                       valid=b.valid, options=GroupOptions.of(cfg.algo))
        np.testing.assert_array_equal(adv.advantages[:len(b)], want)
        assert adv.advantages.shape == (8,) and not adv.advantages[len(b):].any()
        np.testing.assert_array_equal(adv.row_adv, want)
        assert "hierarchy/level0_grouped_fraction" in adv.row_means
        # the policy's rows carry them, with the log-probs the rows hold
        policy = rows.policy_rows(adv)
        assert policy.advantages is adv.advantages and policy.old_logp is rows.old_logp
        assert policy.response_mask is rows.tokens.response_mask
        # an algorithm may narrow the tokens the policy's loss covers
        some = rows.tokens.response_mask * (np.arange(rows.tokens.response_mask.shape[1]) % 2)
        assert rows.policy_rows(dataclasses.replace(adv, loss_mask=some)).response_mask is some


def test_the_critic_unit_rewards_each_row_with_its_episode_less_its_own_penalty():
    b = rollout_batch(**BATCH)
    unit = build_algorithm(load_config("tiny_cpu_ppo"))
    assert isinstance(unit, CriticAlgorithm)
    # verl-agent's PPO baseline: the episode's reward on every row, minus the invalid step's 0.1
    np.testing.assert_allclose(unit.rewards(step_rows(b)),
                               [10, -0.1, 10, 0, 10, 0, 9.9, 0], rtol=1e-6)
    assert unit.updates_policy(0)


def test_explained_variance_by_hand_and_merged_over_processes():
    from hgpo_jax.rl.algorithms.critic import explained_variance, value_moments

    targets, values = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 2.0, 5.0])
    # residuals 0, 0, 1, -1: Var 0.5; Var(targets) 1.25; EV = 1 - 0.5 / 1.25
    assert explained_variance([value_moments(targets, values)]) == pytest.approx(0.6)
    # two processes' halves merge to the same number; a process without entries adds nothing
    halves = [value_moments(targets[:2], values[:2]), value_moments(targets[2:], values[2:]),
              value_moments([], [])]
    assert explained_variance(halves) == pytest.approx(0.6)
    assert explained_variance([value_moments(targets, targets)]) == 1.0
    # no variance to explain (constant targets, up to rounding) or no entries: 0.0, never NaN
    assert explained_variance([value_moments([0.3] * 5, [0.1, 0.2, 0.3, 0.4, 0.5])]) == 0.0
    assert explained_variance([value_moments([], [])]) == 0.0


def test_the_critic_unit_logs_the_explained_variance_of_its_values():
    import types

    from hgpo_jax.rl.critic import make_gae_fn

    b = rollout_batch(**BATCH)
    rows = step_rows(b)
    unit = build_algorithm(load_config("tiny_cpu_ppo"))
    W = unit.window
    unit.critic = types.SimpleNamespace(value_fn=None, gae_fn=make_gae_fn(W, 1.0, 1.0))
    # gamma = lam = 1: the targets of a two-token reply are r, r and 0 (the state after it)
    rewards = unit.rewards(rows)
    targets = np.zeros((8, W), np.float32)
    targets[:7, :2] = rewards[:7, None]
    values = 0.5 * targets                     # half of every target: EV = 1 - 1/4
    state = types.SimpleNamespace(params=None)
    adv = unit.advantages(rows, state, lambda fn, params, width: values)
    np.testing.assert_allclose(adv.returns[:7, :3], targets[:7, :3], atol=1e-5)
    assert adv.alone()["critic/explained_var"] == pytest.approx(0.75, abs=1e-6)
    assert not [k for k in adv.metrics if k.startswith("critic/explained_var/")]  # one head
    adv = unit.advantages(rows, state, lambda fn, params, width: targets)  # perfect values
    assert adv.alone()["critic/explained_var"] == pytest.approx(1.0, abs=1e-6)


# ------------------------------------------------------------------------------------- a new unit
class ConstantAlgorithm(Algorithm):
    """A test family: every row's advantage is `cfg.algo.omega`, token advantages as declared."""

    def advantages(self, rows: StepRows, state, rows_pass) -> Advantages:
        n, mask = rows.num_rows, rows.tokens.response_mask
        value = np.float32(self.cfg.algo.omega)
        if self.spec.token_advantages:
            adv = value * mask.astype(np.float32)
            adv[n:] = 0.0
        else:
            adv = np.zeros(mask.shape[0], np.float32)
            adv[:n] = value
        return Advantages(adv, np.full(n, value, np.float32), {"const/rows": float(n)})


@pytest.mark.parametrize("token_advantages", [False, True])
def test_a_new_algorithm_runs_in_the_trainer_with_no_change_there(tmp_path, monkeypatch,
                                                                  token_advantages):
    """What adding an algorithm takes: its declaration and its unit; the trainer, the config
    checks and the loss read them."""
    from hgpo_jax.trainers.rl import Trainer

    monkeypatch.setitem(algo_specs.ALGORITHMS, "const", AlgorithmSpec(
        "const", "const", "every row's advantage is algo.omega",
        token_advantages=token_advantages, singleton_groups=True,
        options=(algo_specs.GroupOptions,), ignores=algo_specs.HGPO_ONLY))  # it reads omega
    monkeypatch.setitem(algorithms.FAMILIES, "const", ConstantAlgorithm)
    cfg = load_config("tiny_cpu_toy", [f"train.run_dir={tmp_path / 'run'}", "env.num_workers=1",
                                       "algo.estimator=const", "algo.omega=0.5",
                                       "rollout.group_size=1", "train.iterations=1"])
    with Trainer(cfg, progress=False) as trainer:
        assert isinstance(trainer.algorithm, ConstantAlgorithm) and trainer.state.algo_state is None
        assert trainer.algorithm.tokenizer is trainer.tokenizer  # for units that read the reply
        (metrics,) = trainer.train()
    assert metrics["const/rows"] == metrics["rollout/steps"] > 0
    assert metrics["train/mean_advantage"] == pytest.approx(0.5)
    assert metrics["train/std_advantage"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["train/updates"] >= 1 and np.isfinite(metrics["train/loss"])


# ------------------------------------------------------------------------------------- the worked example
def test_the_worked_example_adds_an_algorithm_with_its_own_option_and_state(tmp_path):
    """tests/example_algorithm.py (docs/architecture.md, "How to add an algorithm"): an algorithm
    declared with an option of its own and a device state, run end to end by the CLI in a fresh
    process: its option is read and checked, refused for another algorithm; its state is made,
    updated, saved as its own checkpoint item, restored on resume (the resumed iteration starts
    from the saved baseline), and a resume by an algorithm without it is refused by name."""
    import json
    import os
    import subprocess
    import sys

    from hgpo_jax.checkpoint import Checkpointer

    run = tmp_path / "run"
    base = ["tiny_cpu_toy", f"train.run_dir={run}", "env.num_workers=1", "--no-progress"]
    commands = [
        ["train", *base, "algo.estimator=grpo", "algo.baseline_decay=0.5"],   # not grpo's key
        ["train", *base, "algo.estimator=ema", "algo.baseline_decay=2"],      # its own check
        ["train", *base, "algo.estimator=ema", "algo.baseline_decay=0.5", "rollout.group_size=1",
         "train.iterations=1"],
        ["train", str(run), "--resume", "train.iterations=2", "--no-progress"],
        ["train", str(run), "--resume", "--allow-change", "train.iterations=3",
         "algo.estimator=grpo", "rollout.group_size=2", "--no-progress"],      # no baseline in grpo
    ]
    script = os.path.join(os.path.dirname(__file__), "example_algorithm.py")
    done = subprocess.run([sys.executable, script, json.dumps(commands)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == [2, 2, 0, 0, 2], done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("hgpo-jax train: error:")]
    assert len(errors) == 3, done.stderr[-3000:]
    assert "algo.baseline_decay" in errors[0] and "ema" in errors[0] and "grpo" in errors[0]
    assert "algo.baseline_decay=2.0: must be in [0, 1]" in errors[1]
    assert ("holds an EMA baseline, but algo.estimator=grpo trains no ema; resume it with "
            "algo.estimator=ema") in errors[2]

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if "ema/baseline" in r}
    assert sorted(steps) == [1, 2]
    first = steps[1]
    assert first["ema/baseline"] == 0.0                            # init_state
    # the resumed run's advantages used the baseline its checkpoint saved: 0.5 x 0 + 0.5 x mean
    assert steps[2]["ema/baseline"] == pytest.approx(0.5 * first["ema/batch_mean"], abs=1e-6)
    import jax.numpy as jnp

    ckpt = Checkpointer(run / "checkpoints", read_only=True)
    try:
        assert ckpt.steps() == [1, 2] and "ema" in ckpt.items()
        state, _, step = ckpt.restore_latest({"ema": {"baseline": jnp.zeros((), jnp.float32)}})
    finally:
        ckpt.close()
    expected = 0.5 * steps[2]["ema/baseline"] + 0.5 * steps[2]["ema/batch_mean"]
    assert step == 2 and float(state["ema"]["baseline"]) == pytest.approx(expected, abs=1e-6)
