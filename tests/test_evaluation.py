"""Evaluation protocols: the authors' sampled batches per seed, and every game once."""

import functools

import numpy as np
import pytest

from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.envs.toy import PALETTE, ToyMemoryEnv
from hgpo_jax.models import load_tokenizer
from hgpo_jax.rl.evaluation import EVAL_PROTOCOLS, evaluate_split, shuffled_cycle_schedule
from hgpo_jax.build import resolve_model_path
from toy_policies import ScriptedToyPolicy

LUCKY = set(PALETTE[0::2])  # the first colour of toy task n is PALETTE[n % 6]: lucky iff n is even


@pytest.fixture(scope="module")
def policy():
    # opens the first door if its colour is LUCKY, else the second: wins exactly the even tasks
    return ScriptedToyPolicy(model=None, tokenizer=load_tokenizer(resolve_model_path("tiny")),
                             max_new_tokens=16, pick_door=lambda d: d[0] if d[0] in LUCKY else d[1])


@pytest.fixture(scope="module")
def pool():
    with EnvPool(functools.partial(ToyMemoryEnv, max_steps=10), num_envs=4, num_workers=1) as p:
        yield p


def test_schedule_walks_one_shuffled_cycle_per_env():
    tasks = list(range(5))
    sched = shuffled_cycle_schedule(tasks, seed=7, batches=12, batch_size=3)
    assert len(sched) == 12 and all(len(b) == 3 for b in sched)
    for i in range(3):
        column = [sched[b][i] for b in range(12)]
        rng = np.random.RandomState(7 + 1000 + i)  # env i of the authors' validation envs
        first = list(tasks)
        rng.shuffle(first)
        assert column[:5] == first
        assert sorted(column[5:10]) == tasks  # each pass visits every task once
    assert [sched[0][i] for i in range(3)] != [sched[1][i] for i in range(3)]
    assert shuffled_cycle_schedule(tasks, 7, 12, 3) == sched  # deterministic
    assert shuffled_cycle_schedule(tasks, 8, 12, 3) != sched
    with pytest.raises(ValueError, match="no tasks"):
        shuffled_cycle_schedule([], 0, 1, 1)


def test_verl_agent_protocol_is_the_mean_of_batch_rates_then_of_seeds(policy, pool):
    tasks = list(range(10))
    seeds, batches, batch_size = (3, 4), 2, 6
    got = evaluate_split(policy, pool, tasks, protocol="verl-agent", seeds=seeds, batches=batches,
                         batch_size=batch_size, max_steps=10, memory_len=2)
    per_seed = []
    for seed in seeds:
        sched = shuffled_cycle_schedule(tasks, seed, batches, batch_size)
        per_seed.append(np.mean([np.mean([t % 2 == 0 for t in batch]) for batch in sched]))
        assert got[f"seed{seed}/all"] == pytest.approx(per_seed[-1])
    assert got["all"] == pytest.approx(np.mean(per_seed))
    assert got["all_std"] == pytest.approx(np.std(per_seed))
    assert got["memory"] == pytest.approx(got["all"])  # the toy env's one task type
    assert (got["episodes"], got["failed"]) == (len(seeds) * batches * batch_size, 0)


def test_each_once_protocol_plays_every_game_once(policy, pool):
    tasks = list(range(7))
    got = evaluate_split(policy, pool, tasks, protocol="each-once", max_steps=10)
    assert got["all"] == pytest.approx(4 / 7) and got["episodes"] == 7
    first = evaluate_split(policy, pool, tasks, protocol="each-once", games=3, max_steps=10)
    assert first["all"] == pytest.approx(2 / 3) and first["episodes"] == 3


def test_unknown_protocol(policy, pool):
    assert EVAL_PROTOCOLS == ("verl-agent", "each-once")
    with pytest.raises(ValueError, match="unknown evaluation protocol"):
        evaluate_split(policy, pool, [0], protocol="paper")
