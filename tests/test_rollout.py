"""Multi-turn rollouts on the toy env and on real ALFWorld games, and the evaluation mode."""

import dataclasses
import functools

import numpy as np
import pytest

from hgpo_jax.agents import get_agent
from hgpo_jax.envs.alfworld import AlfworldEnv, list_games, task_type_of
from hgpo_jax.envs.pool import EnvPool, EnvReply
from hgpo_jax.envs.toy import TASK, WIN_REWARD, ToyMemoryEnv
from hgpo_jax.models import load_pretrained, load_tokenizer
from hgpo_jax.rl import compute_step_advantages
from hgpo_jax.rl.episodes import evaluate, mean_and_sem, play_each_once, summarize_episodes
from hgpo_jax.rl.policy import Policy
from hgpo_jax.rl.rollout import collect_rollouts, default_spec
from hgpo_jax.build import resolve_model_path
from toy_policies import RecordingPool, ReplayPolicy, ScriptedToyPolicy


@pytest.fixture(scope="module")
def tiny():
    folder = resolve_model_path("tiny")
    return load_pretrained(folder), load_tokenizer(folder)


def scripted_policy(model, tok, **kwargs):
    """Solves the toy game from the prompt text alone; records every generate batch size."""
    return ScriptedToyPolicy(model, tok, think="easy", logprob=-0.5, **kwargs)


def toy_pool(n, max_steps=50):
    return EnvPool(functools.partial(ToyMemoryEnv, max_steps=max_steps), num_envs=n, num_workers=1)


def check_consistent(batch, num_envs, group_size, max_steps):
    S = len(batch)
    assert S > 0
    for col in (batch.anchor, batch.prompt_ids, batch.response_ids, batch.sample_logp,
                batch.task_type):
        assert len(col) == S
    for arr in (batch.task_id, batch.traj_id, batch.step_id, batch.reward, batch.valid,
                batch.done, batch.won):
        assert arr.shape == (S,)
    assert set(batch.traj_id) <= set(range(num_envs))
    np.testing.assert_array_equal(batch.task_id, batch.traj_id // group_size)
    for traj in np.unique(batch.traj_id):
        rows = np.flatnonzero(batch.traj_id == traj)
        np.testing.assert_array_equal(batch.step_id[rows], np.arange(len(rows)))
        assert len(rows) <= max_steps
        assert not batch.done[rows[:-1]].any()  # only the last step can be done
        assert len(set(batch.won[rows])) == 1    # the outcome is per trajectory
    for r, lp in zip(batch.response_ids, batch.sample_logp):
        assert len(r) == len(lp) >= 1
    assert all(isinstance(a, str) and a for a in batch.anchor)


def test_finished_envs_are_not_generated_for(tiny):
    model, tok = tiny
    policy = scripted_policy(model, tok)
    with toy_pool(4) as pool:
        # task 0: corridor of 1 (done after 3 steps); task 1: corridor of 2 (4 steps)
        batch = collect_rollouts(policy, pool, [0, 1], group_size=2, max_steps=10)
    assert policy.batch_sizes == [4, 4, 4, 2]
    check_consistent(batch, 4, 2, 10)
    assert batch.won.all() and batch.valid.all() and len(batch) == 3 * 2 + 4 * 2
    last = np.flatnonzero(batch.done)
    assert (batch.reward[last] == WIN_REWARD).all() and batch.reward.sum() == 4 * WIN_REWARD
    m = batch.metrics()
    assert m["success/all"] == 1.0 and m["success/memory"] == 1.0
    assert m["rollout/invalid_action_rate"] == 0.0
    # the rows feed the advantage estimators directly
    adv = compute_step_advantages("hgpo", batch.task_id, batch.traj_id, batch.step_id,
                                  batch.anchor, batch.reward, K=2)
    assert adv.shape == (len(batch),) and np.isfinite(adv).all()


def test_memory_of_the_last_steps_is_in_the_prompt(tiny):
    model, tok = tiny
    policy = scripted_policy(model, tok)
    with toy_pool(2) as pool:
        batch = collect_rollouts(policy, pool, [1], group_size=2, max_steps=10, memory_len=2)
    row = int(np.flatnonzero((batch.traj_id == 0) & (batch.step_id == 3))[0])
    prompt = tok.decode(batch.prompt_ids[row])
    assert "already taken 3 step(s)" in prompt
    assert "Action 2: 'go forward'" in prompt and "Action 3: 'go forward'" in prompt
    assert "Action 1:" not in prompt  # H = 2
    assert "Your task is to: open the door of the colour of the button you pressed" in prompt


def test_rollout_steps_projected_actions_and_keeps_the_env_reward():
    # task 0: buttons red/blue/green, a corridor of 1 step. Steps 1 and 2 are invalid replies:
    # step 1 has no tags (its last 30 characters are executed: nothing happens); step 2 has
    # upper-case think tags (invalid, yet its action is executed and moves the agent on).
    replies = ["<think>a</think><action>Press RED button</action>",
               "<think>b</think> I will go forward",
               "<THINK>c</THINK><action>go forward</action>",
               "<think>d</think><action> open red door </action>"]
    projected = ["press red button", "nk>b</think> i will go forward", "go forward",
                 "open red door"]
    policy, pool = ReplayPolicy(replies), RecordingPool(2)
    batch = collect_rollouts(policy, pool, [0], group_size=2, max_steps=10, memory_len=2,
                             agent=get_agent("verl-agent", "toy"))
    assert pool.received == [projected, projected]
    np.testing.assert_array_equal(batch.step_id, np.repeat(np.arange(4), 2))  # rows by step
    np.testing.assert_array_equal(batch.valid, np.repeat([True, False, False, True], 2))
    np.testing.assert_array_equal(batch.reward, np.repeat([0.0, 0.0, 0.0, WIN_REWARD], 2))
    assert batch.won.all() and batch.metrics()["rollout/invalid_action_rate"] == 0.5
    assert batch.metrics()["rollout/mean_step_reward"] == WIN_REWARD / 4

    # the prompts: no history at step 0, then the memory of the projected actions
    texts = policy.prompts[::2]
    assert policy.prompts[1::2] == texts  # both envs of the group saw the same prompts
    assert texts[0].startswith("\nYou are an agent in a small text world.\nYour current "
                               "observation is: Task 0: open the door of the colour you choose. "
                               "You are in a room with a red button, blue button and green "
                               "button.\n")
    obs2 = "Nothing happens. You are in a corridor, 1 step(s) from its end."
    assert texts[3].startswith(
        f"\nYou are an agent in a small text world. Your task is to: {TASK}\n"
        "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 "
        "observations and the corresponding actions you took: "
        "[Observation 2: 'You hear a click somewhere ahead. You are in a corridor, 1 step(s) from "
        "its end.', Action 2: 'nk>b</think> i will go forward']\n"
        f"[Observation 3: '{obs2}', Action 3: 'go forward']\n"
        "You are now at step 4 and your current observation is: You are at a junction with a red "
        "door, blue door and green door.\n"
        "Your admissible actions of the current situation are: ['open red door'\n "
        "'open blue door'\n 'open green door'].\n")
    with pytest.raises(ValueError, match="verl-agent"):
        collect_rollouts(policy, RecordingPool(2), [0], group_size=2, max_steps=2,
                         agent=get_agent("verl-agent", "toy", projection="lenient"))


def test_strict_projection_in_rollouts_executes_the_empty_action():
    replies = ["<action>press red button</action>", "I will go forward",
               "<action>go forward</action>", "<action>open red door</action>"]
    pool = RecordingPool(1)
    batch = collect_rollouts(ReplayPolicy(replies), pool, [0], group_size=1, max_steps=4,
                             agent=get_agent("verl-agent", "alfworld", projection="strict"))
    assert pool.received == [["press red button", "", "go forward", "open red door"]]
    np.testing.assert_array_equal(batch.valid, [True, False, True, True])
    np.testing.assert_array_equal(batch.reward, [0.0, 0.0, 0.0, WIN_REWARD])


def test_random_tiny_model_on_the_toy_env(tiny):
    model, tok = tiny
    policy = Policy(model, tok, temperature=1.0, max_new_tokens=8, max_prompt_tokens=512)
    with toy_pool(4, max_steps=3) as pool:
        batch = collect_rollouts(policy, pool, [0, 1], group_size=2, max_steps=3, rng=0)
    check_consistent(batch, 4, 2, 3)
    assert len(batch) == 4 * 3  # nobody wins by chance in 3 steps with noise replies
    invalid = ~batch.valid
    assert invalid.any()
    np.testing.assert_array_equal(batch.reward, 0.0)  # the env's reward: no invalid penalty
    assert all(len(r) <= 8 for r in batch.response_ids)
    assert all(len(p) <= 512 for p in batch.prompt_ids)
    # rollout.max_num_seqs below the 4 envs: 2 generation batches a step, the same rollout
    few = Policy(model, tok, temperature=1.0, max_new_tokens=8, max_prompt_tokens=512,
                 max_num_seqs=3)
    with toy_pool(4, max_steps=3) as pool:
        again = collect_rollouts(few, pool, [0, 1], group_size=2, max_steps=3, rng=0)
    assert again.response_ids == batch.response_ids and again.prompt_ids == batch.prompt_ids


def test_rollouts_on_real_alfworld_games(tiny):
    model, tok = tiny
    games = list_games("valid_seen")[:2]
    policy = Policy(model, tok, temperature=1.0, max_new_tokens=8, max_prompt_tokens=1024)
    with EnvPool(functools.partial(AlfworldEnv, max_steps=3), num_envs=4, num_workers=2) as pool:
        batch = collect_rollouts(policy, pool, games, group_size=2, max_steps=3, rng=1)
        assert pool.stats.as_dict()["failed_episodes"] == 0
    check_consistent(batch, 4, 2, 3)
    assert len(batch) == 4 * 3 and batch.num_failed == 0
    assert set(batch.task_type) == {task_type_of(games[0]), task_type_of(games[1])}
    first = [batch.anchor[i] for i in np.flatnonzero(batch.step_id == 0)]
    assert first[0] == first[1] and first[2] == first[3]  # a group shares its initial state
    assert first[0].startswith("-= Welcome to TextWorld, ALFRED! =-\n\n")  # raw, banner kept
    assert "Your task is to:" in first[0]
    assert "ALFRED" in tok.decode(batch.prompt_ids[0])


def test_evaluate_reports_success_per_task_type(tiny):
    model, tok = tiny
    policy = scripted_policy(model, tok, temperature=0.4)
    with toy_pool(4) as pool:
        result = evaluate(policy, pool, list(range(6)), max_steps=10)  # 6 tasks in 2 chunks of 4
        cut = evaluate(policy, pool, list(range(6)), max_steps=1)  # no game ends in one step
    # the scripted solver wins every toy game in 4 steps, each ended by the env
    assert result == {"memory": 1.0, "all": 1.0, "mean_length": 4.0, "ended": 1.0,
                      "episodes": 6.0, "failed": 0.0}
    assert cut == {"memory": 0.0, "all": 0.0, "mean_length": 1.0, "ended": 0.0,
                   "episodes": 6.0, "failed": 0.0}


def test_evaluate_reports_the_score_and_its_standard_error(tiny):
    model, tok = tiny
    policy = scripted_policy(model, tok, temperature=0.4)
    scored = dataclasses.replace(default_spec(), score_key="won")  # the toy's win flag as a 0/1 score
    with toy_pool(4) as pool:
        result = evaluate(policy, pool, list(range(6)), max_steps=10, spec=scored)
    assert result["score"] == 1.0 and result["score_sem"] == 0.0  # every episode won: no spread


def test_play_each_once_keeps_every_episode_in_task_order(tiny):
    model, tok = tiny
    policy = scripted_policy(model, tok, temperature=0.4)
    tasks = [5, 1, 4, 0, 2, 3]
    with toy_pool(4) as pool:  # two chunks, the second of two envs (the others idle)
        episodes, failed = play_each_once(policy, pool, tasks, max_steps=10)
        assert pool.stats.resets == 6 and pool.running == []
    assert failed == 0
    assert [e.index for e in episodes] == list(range(6)) and [e.task for e in episodes] == tasks
    assert all(e.won and e.ended and e.score == 0.0 for e in episodes)
    assert [e.length for e in episodes] == [3 + t % 3 for t in tasks]  # the toy's task t takes 3 + t % 3 steps
    assert summarize_episodes(episodes, failed) == {"memory": 1.0, "all": 1.0, "mean_length": 4.0,
                                                    "ended": 1.0, "episodes": 6.0, "failed": 0.0}


def test_mean_and_sem():
    assert mean_and_sem([]) == (0.0, 0.0)
    assert mean_and_sem([0.7]) == (0.7, 0.0)
    mean, sem = mean_and_sem([0.0, 1.0, 1.0, 0.0])  # sample std sqrt(1/3), over sqrt(4)
    assert mean == 0.5 and sem == pytest.approx(np.sqrt(1 / 3) / 2, rel=1e-12)
    mean, sem = mean_and_sem([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5) and sem == pytest.approx(np.std([0.2, 0.4, 0.9], ddof=1) / np.sqrt(3))


def test_mismatched_pool_size_is_an_error(tiny):
    model, tok = tiny
    with toy_pool(3) as pool:
        with pytest.raises(ValueError, match="need 4"):
            collect_rollouts(Policy(model, tok), pool, [0, 1], group_size=2, max_steps=2)
