"""Expert-guided rollouts (issue 50, part 3): the replayed prefix in the rollout loop (env steps,
the agent's memory, rows of the policy's turns only, episode lengths and outcomes) and the
prefix as history for hgpo's levels."""

import functools

import numpy as np
import pytest

from hgpo_jax.build import resolve_model_path
from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.envs.toy import WIN_REWARD, ToyMemoryEnv
from hgpo_jax.models import load_pretrained, load_tokenizer
from hgpo_jax.rl import compute_step_advantages
from hgpo_jax.rl.grouping import build_step_groups, prepare_batch
from hgpo_jax.rl.rollout import collect_rollouts
from toy_policies import ScriptedToyPolicy


@pytest.fixture(scope="module")
def tiny():
    folder = resolve_model_path("tiny")
    return load_pretrained(folder), load_tokenizer(folder)


def toy_pool(n, max_steps=50):
    return EnvPool(functools.partial(ToyMemoryEnv, max_steps=max_steps), num_envs=n, num_workers=1)


def solution(task: int) -> list[str]:
    env = ToyMemoryEnv()
    env.reset(task)
    return env.solution()


class PromptLog(ScriptedToyPolicy):
    """The scripted toy policy, keeping every prompt's text."""

    def generate(self, prompts, rng, row_ids=None):
        self.texts = getattr(self, "texts", []) + [self.tokenizer.decode(p) for p in prompts]
        return super().generate(prompts, rng, row_ids)


def test_the_prefix_is_played_remembered_and_never_a_row(tiny):
    """Task 1 (a corridor of 2: press, forward, forward, open). Env 0 replays 2 expert steps, env
    1 none, env 2 three, env 3 all four (it wins in the prefix: no rows, not kept)."""
    model, tok = tiny
    plan = solution(1)
    prefixes = [plan[:2], [], plan[:3], plan]
    policy = PromptLog(model, tok, think="easy")
    with toy_pool(4) as pool:
        batch = collect_rollouts(policy, pool, [1], group_size=4, max_steps=10, prefixes=prefixes)
    assert policy.batch_sizes == [3, 2, 1, 1]  # env 1 plays 4 turns, env 0 two, env 2 one
    assert sorted(set(batch.traj_id.tolist())) == [0, 1, 2]
    for traj, first in ((0, 2), (1, 0), (2, 3)):
        steps = batch.step_id[batch.traj_id == traj]
        np.testing.assert_array_equal(steps, np.arange(len(steps)))  # policy turns from 0
        assert len(steps) == 4 - first
    np.testing.assert_array_equal(batch.episode_traj, [0, 1, 2])
    np.testing.assert_array_equal(batch.episode_prefix, [2, 0, 3])
    np.testing.assert_array_equal(batch.episode_length, [4, 4, 4])  # the prefix counts
    assert batch.won.all() and batch.reward.sum() == 3 * WIN_REWARD
    # the replayed turns are the agent's own history in the first prompt of env 0 (2 steps)
    first_prompt_env0 = policy.texts[0]
    assert "2 step(s)" in first_prompt_env0 and plan[1] in first_prompt_env0
    anchors = batch.prefix_anchors()  # the scenes the replayed steps were played from
    assert set(anchors) == {0, 2} and len(anchors[0]) == 2 and len(anchors[2]) == 3
    assert anchors[2][:2] == anchors[0] and "room" in anchors[0][0] and "corridor" in anchors[0][1]


def test_the_prefix_bounds_the_policys_steps(tiny):
    """max_steps counts the replayed steps: a prefix of 2 leaves the policy 1 of 3 steps."""
    model, tok = tiny
    plan = solution(2)  # press, forward x3, open: 5 steps
    policy = ScriptedToyPolicy(model, tok, think="easy")
    with toy_pool(1, max_steps=50) as pool:
        batch = collect_rollouts(policy, pool, [2], group_size=1, max_steps=3,
                                 prefixes=[plan[:2]])
    assert len(batch) == 1 and not batch.won.any()
    np.testing.assert_array_equal(batch.episode_length, [3])


def partition(ids: np.ndarray) -> set:
    """The groups of ids as a set of frozensets of row positions (-1: no group)."""
    groups = {}
    for i, g in enumerate(ids):
        if g >= 0:
            groups.setdefault(int(g), set()).add(i)
    return {frozenset(x) for x in groups.values()}


@pytest.mark.parametrize("K", [1, 2, 4])
def test_hgpo_levels_read_the_replayed_anchors_as_history(K):
    """The level-k groups of the policy's rows with the prefix given as history equal those of
    the same rows when the replayed steps are rows of their own (then dropped)."""
    rs = np.random.RandomState(K)
    task, traj, step, anchor, prefix, policy_row = [], [], [], [], {}, []
    for t in range(8):
        m = int(rs.randint(0, 4))
        seq = [f"a{x}" for x in rs.randint(0, 3, m + int(rs.randint(1, 5)))]
        prefix[t] = seq[:m]
        for j, a in enumerate(seq):
            task.append(t // 4), traj.append(t), step.append(j), anchor.append(a)
            policy_row.append(j >= m)
    full = build_step_groups(prepare_batch(task, traj, step, anchor), K)
    full_rows = prepare_batch(task, traj, step, anchor).order  # canonical -> input
    keep = np.asarray(policy_row)
    sub = [np.asarray(x)[keep] for x in (task, traj, step, anchor)]
    sub[2] = sub[2] - np.asarray([len(prefix[t]) for t in sub[1]])
    b = prepare_batch(*sub, prefix_anchors=prefix)
    guided = build_step_groups(b, K)
    # both in input order of the policy rows
    full_in = np.empty_like(full.ids)
    full_in[full_rows] = full.ids
    full_policy = full_in[keep]
    guided_in = np.empty_like(guided.ids)
    guided_in[b.order] = guided.ids
    for k in range(K + 1):
        assert partition(guided_in[:, k]) == partition(full_policy[:, k]), k
    without = build_step_groups(prepare_batch(*sub), K)
    assert (without.ids >= 0).sum() < (guided.ids >= 0).sum() or not any(prefix.values())
    adv = compute_step_advantages("hgpo", *sub, np.ones(len(sub[0])), K=K, prefix_anchors=prefix)
    assert adv.shape == (len(sub[0]),) and np.isfinite(adv).all()
