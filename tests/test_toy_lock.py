"""The toy lock (`toy-lock`, hgpo_jax/envs/toy/lock.py): random play almost never opens it, the
expert always does, held-out paths are never training paths, the dynamics step by step, its
registry entry and prompts, and that training starts on it."""

from __future__ import annotations

import json
import math
import os

import pytest

from hgpo_jax.config import EnvConfig
from hgpo_jax.envs.base import check_info
from hgpo_jax.envs.registry import get_env
from hgpo_jax.envs.toy import SPLITS, ToyLockEnv, lock_episodes
from hgpo_jax.envs.toy.lock import (COLORS, HELD_OUT_TASKS, TASK, WIN_REWARD, action_of,
                                    is_held_out_path, make_lock, num_stages, random_success)

CFG = EnvConfig(name="toy-lock")
RANDOM_REPEATS, RANDOM_SEED = 400, 0  # random episodes per valid_unseen task, their generator


def tasks(split: str) -> list[int]:
    return get_env("toy-lock").list_tasks(CFG, split)


def path_indices(task: int) -> tuple[int, ...]:
    return tuple(COLORS.index(c) for c in make_lock(task).path)


# ------------------------------------------------------------------------ (1) random play
def test_random_play_almost_never_opens_a_held_out_lock():
    """24,000 random episodes (each valid_unseen task 400 times, seed 0): success below 1% and
    within 4 standard deviations of the analytic mean of (1/4)^L; the share of episodes that pass
    their first s stages is (1/4)^s (the mechanism behind it)."""
    held_out = tasks("valid_unseen")
    episodes = lock_episodes(held_out * RANDOM_REPEATS, "random", seed=RANDOM_SEED)
    n, won = len(episodes), sum(ep.won for ep in episodes)
    analytic = random_success(held_out)
    assert n == 24_000 and analytic == pytest.approx((4**-5 + 4**-6 + 4**-7) / 3)  # 20 tasks per L
    assert won / n < 0.01
    assert abs(won - n * analytic) <= 4 * math.sqrt(n * analytic)
    for stages in (1, 2, 3):
        passed = sum(len(ep.steps) > stages for ep in episodes)  # a wrong action ends an episode
        p = 4.0**-stages
        assert abs(passed - n * p) <= 4 * math.sqrt(n * p * (1 - p)), (stages, passed)
    assert all(step.action in step.admissible for ep in episodes for step in ep.steps)


# ------------------------------------------------------------------------ (2) the expert
@pytest.mark.parametrize("split", SPLITS)
def test_the_expert_wins_every_task_of_every_split(split):
    spec = get_env("toy-lock")
    experts = spec.expert_trajectories(CFG, split)
    assert list(experts) == tasks(split)  # every task has one
    env = ToyLockEnv()
    for task, actions in experts.items():
        assert actions == tuple(map(action_of, make_lock(task).path))
        assert len(actions) == num_stages(task)
        env.reset(task)
        for action in actions:
            obs, reward, done, info = env.step(action)
        assert done and info["won"] and reward == WIN_REWARD
    episodes = spec.record_episodes(CFG, split, 5, "expert")
    assert [ep.won for ep in episodes] == [True] * 5
    assert [ep.source for ep in episodes] == [f"toy-lock:{t}" for t in tasks(split)[:5]]


def test_expert_subsets_and_errors():
    spec = get_env("toy-lock")
    assert set(spec.expert_trajectories(CFG, "train", tasks=[5, 7])) == {5, 7}
    with pytest.raises(ValueError, match="not in split 'train'"):
        spec.expert_trajectories(CFG, "train", tasks=[200_000])
    with pytest.raises(ValueError, match="unknown toy split 'test'"):
        spec.expert_trajectories(CFG, "test")
    with pytest.raises(ValueError, match="unknown toy episode kind"):
        spec.record_episodes(CFG, "train", 2, "walkthrough")


# ------------------------------------------------------------------------ (3) held-out paths
def test_held_out_paths_are_never_training_paths():
    train_paths = {make_lock(t).path for t in tasks("train")}
    unseen = tasks("valid_unseen")
    assert all(t in HELD_OUT_TASKS for t in unseen)
    assert not {make_lock(t).path for t in unseen} & train_paths
    # by construction: the classes split on the colour indices' sum mod 4
    assert all(is_held_out_path(path_indices(t)) for t in unseen)
    for split in ("train", "valid_seen", "valid_train"):
        assert not any(is_held_out_path(path_indices(t)) for t in tasks(split)), split
    # the splits' task ints are disjoint, and paths differ between tasks
    assert len({t for split in SPLITS for t in tasks(split)}) == sum(map(len, map(tasks, SPLITS)))
    assert len(train_paths) > 850  # mostly distinct (334 five-pin locks draw from 768 paths)


def test_locks_are_deterministic_and_differ_between_tasks():
    assert make_lock.__wrapped__(12) == make_lock(12)  # the cache changes nothing
    assert [num_stages(t) for t in range(6)] == [5, 6, 7, 5, 6, 7]
    lock = make_lock(200_003)
    assert len(lock.path) == len(lock.orders) == 7  # 200003 % 3 == 2
    assert all(sorted(order) == sorted(COLORS) for order in lock.orders)
    # the right action's place in the admissible list is shuffled: no position habit wins
    places = [make_lock(t).orders[s].index(make_lock(t).path[s])
              for t in range(300) for s in range(5)]
    assert {places.count(i) for i in range(4)} <= set(range(300, 450))  # ~375 each of 1500
    with pytest.raises(ValueError, match=">= 0"):
        make_lock(-1)


# ------------------------------------------------------------------------ (4) dynamics
def test_a_right_path_opens_the_lock_only_at_the_last_stage():
    env = ToyLockEnv()
    obs, info = env.reset(4)
    check_info(info)
    lock = make_lock(4)
    assert obs == f"You face a lock of 6 pins. Stage 1 of 6. The next pin is marked {lock.path[0]}."
    assert info["anchor"] == f"Stage 1 of 6. The next pin is marked {lock.path[0]}."
    assert info["task_type"] == "lock" and info["task"] == TASK and not info["won"]
    assert info["admissible_actions"] == [action_of(c) for c in lock.orders[0]]
    assert ToyLockEnv().reset(4) == (obs, info)  # every reset of a task starts the same
    for stage, color in enumerate(lock.path):
        obs, reward, done, info = env.step(action_of(color))
        if stage < len(lock.path) - 1:
            assert (reward, done, info["won"]) == (0.0, False, False)
            assert obs == (f"The pin clicks into place. Stage {stage + 2} of 6. The next pin is "
                           f"marked {lock.path[stage + 1]}.")
    assert (reward, done, info["won"]) == (WIN_REWARD, True, True)
    assert obs.startswith("The last pin clicks and the lock opens. You win!")
    assert info["admissible_actions"] == []
    assert env.step(action_of(lock.path[0])) == (
        "The episode is over. The episode is over.", 0.0, True, info)


def test_a_wrong_action_ends_the_episode_at_zero():
    env = ToyLockEnv()
    env.reset(9)
    lock = make_lock(9)
    env.step(action_of(lock.path[0]))  # stage 2
    wrong = next(c for c in COLORS if c != lock.path[1])
    obs, reward, done, info = env.step(action_of(wrong))
    assert (reward, done, info["won"], info["admissible_actions"]) == (0.0, True, False, [])
    assert obs == "The dial jams and the lock seizes. You lose. The episode is over."
    assert env.step(action_of(lock.path[1]))[1:3] == (0.0, True)  # nothing reopens it


def test_an_inadmissible_action_changes_nothing():
    env = ToyLockEnv(max_steps=20)
    env.reset(1)
    _, _, _, first = env.step(action_of(make_lock(1).path[0]))
    for action in ["", "turn the dial to purple", "open the lock", "x" * 10_000, "中文", None, 3]:
        obs, reward, done, info = env.step(action)
        assert obs == f"Nothing happens. {first['anchor']}"
        assert (reward, done, info) == (0.0, False, first)
    same = env.step(f"  TURN the Dial\tto {make_lock(1).path[1].upper()} ")  # case and blanks
    assert same[0].startswith("The pin clicks into place. Stage 3 of 6.")
    with pytest.raises(RuntimeError, match="reset"):
        ToyLockEnv().step("look")


def test_max_steps_cuts_the_episode():
    env = ToyLockEnv(max_steps=3)
    env.reset(0)
    assert [env.step("wait")[2] for _ in range(3)] == [False, False, True]
    env.reset(0)
    plan = env.solution()
    assert [env.step(a)[2] for a in plan[:3]] == [False, False, True]
    assert not env.won


# ------------------------------------------------------------------------ registry and agents
def test_registry_entry_and_prompts():
    from hgpo_jax.agents import get_agent
    from hgpo_jax.agents.verl_agent.alfworld import LOCK_INTRO
    from hgpo_jax.sft.data import samples_from_episodes

    spec = get_env("toy-lock")
    assert spec.splits == SPLITS and spec.eval_splits == ("valid_seen", "valid_unseen")
    assert spec.episode_kinds == ("expert", "random") and spec.built_model.vocab == 1024
    env = spec.make_env(EnvConfig(name="toy-lock", max_steps=8))()
    assert isinstance(env, ToyLockEnv) and env.max_steps == 8
    random = spec.record_episodes(CFG, "train", 50, "random", seed=3)
    assert random == spec.record_episodes(CFG, "train", 50, "random", seed=3)
    assert not all(ep.won for ep in random)
    episode = spec.record_episodes(CFG, "train", 1, "expert")
    for name in ("verl-agent", "plan-execute"):
        agent = get_agent(name, "toy-lock")
        prompts = samples_from_episodes(episode, 2, agent)
        assert len(prompts) == num_stages(0)
        step = episode[0].steps[2]
        prompt, reply = prompts[2]
        assert step.observation in prompt and all(a in prompt for a in step.admissible)
        assert agent.parse(reply).action == step.action  # the SFT reply reads back
    assert get_agent("verl-agent", "toy-lock").prompt(
        TASK, "o", ["turn the dial to red"], (), 2).startswith(f"\n{LOCK_INTRO}\n")


@pytest.mark.slow
def test_build_spec_model(tmp_path, monkeypatch):
    """build:toy-lock-tiny: a tokenizer of 1,024 pieces trained on the lock's own text."""
    from hgpo_jax.build import parse_build_spec, resolve_model_path
    from hgpo_jax.models.tokenizer import load_tokenizer

    monkeypatch.setenv("HGPO_JAX_CACHE", str(tmp_path))
    assert parse_build_spec("build:toy-lock-tiny") == ("toy-lock", "tiny")
    folder = resolve_model_path("build:toy-lock-tiny")
    tok = load_tokenizer(folder)
    observation = "The pin clicks into place. Stage 4 of 7. The next pin is marked yellow."
    assert len(tok.encode(observation)) < len(observation) / 4
    assert 0 < tok.vocab_size <= 1024


# ------------------------------------------------------------------------ (5) training starts
@pytest.mark.slow
def test_training_starts_on_the_lock(tmp_path):
    """`hgpo-jax train tiny_cpu_toy_lock`: one iteration end to end, rollouts on the lock."""
    from hgpo_jax.cli import main as cli_main
    from hgpo_jax.config import load_config

    cfg = load_config("tiny_cpu_toy_lock")
    assert (cfg.env.name, cfg.env.max_steps) == ("toy-lock", 8)
    run = tmp_path / "run"
    assert cli_main(["train", "tiny_cpu_toy_lock", f"train.run_dir={run}", "train.iterations=1",
                     "env.num_workers=1", "--no-progress"]) == 0
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
        record = json.loads(f.readline())
    assert record["step"] == 1 and record["rollout/episodes"] == 4 and "success/lock" in record
