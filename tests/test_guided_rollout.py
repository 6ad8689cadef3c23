"""Expert-guided rollouts (issue 50, part 3; a unit since issue 62): the prefix replayed by a
wrapper of the env pool and handed to the rollout loop (env steps, the agent's memory, rows of
the policy's turns only, episode lengths and outcomes), the prefix as history for hgpo's levels,
and the `g2` unit in a run."""

import functools

import numpy as np
import pytest

from hgpo_jax.build import resolve_model_path
from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.envs.toy import WIN_REWARD, ToyMemoryEnv
from hgpo_jax.models import load_pretrained, load_tokenizer
from hgpo_jax.rl import compute_step_advantages
from hgpo_jax.rl.grouping import index_step_groups, prepare_batch
from hgpo_jax.rl.guides.replay import ReplayingPool
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
        batch = collect_rollouts(policy, ReplayingPool(pool, prefixes, 10), [1], group_size=4,
                                 max_steps=10)
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
        batch = collect_rollouts(policy, ReplayingPool(pool, [plan[:2]], 3), [2], group_size=1,
                                 max_steps=3)
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
    full = index_step_groups(prepare_batch(task, traj, step, anchor), K)
    full_rows = prepare_batch(task, traj, step, anchor).order  # canonical -> input
    keep = np.asarray(policy_row)
    sub = [np.asarray(x)[keep] for x in (task, traj, step, anchor)]
    sub[2] = sub[2] - np.asarray([len(prefix[t]) for t in sub[1]])
    b = prepare_batch(*sub, prefix_anchors=prefix)
    guided = index_step_groups(b, K)
    # both in input order of the policy rows
    full_in = np.empty_like(full.ids)
    full_in[full_rows] = full.ids
    full_policy = full_in[keep]
    guided_in = np.empty_like(guided.ids)
    guided_in[b.order] = guided.ids
    for k in range(K + 1):
        assert partition(guided_in[:, k]) == partition(full_policy[:, k]), k
    without = index_step_groups(prepare_batch(*sub), K)
    assert (without.ids >= 0).sum() < (guided.ids >= 0).sum() or not any(prefix.values())
    adv = compute_step_advantages("hgpo", *sub, np.ones(len(sub[0])), K=K, prefix_anchors=prefix)
    assert adv.shape == (len(sub[0]),) and np.isfinite(adv).all()


def test_the_oracle_reads_the_shared_prefix_as_history():
    """The full-history oracle (diagnostics) of the policy's rows with each task's shared prefix
    as history equals the oracle of the same rows with the prefix as rows (then dropped)."""
    from hgpo_jax.rl.diagnostics import oracle_advantages

    rs = np.random.RandomState(0)
    task, traj, step, anchor, prefix, policy_row = [], [], [], [], {}, []
    for g in range(3):
        shared = [f"p{x}" for x in rs.randint(0, 2, int(rs.randint(0, 3)))]
        for t in range(4 * g, 4 * g + 4):
            seq = shared + [f"a{x}" for x in rs.randint(0, 2, int(rs.randint(1, 4)))]
            prefix[t] = shared
            for j, a in enumerate(seq):
                task.append(g), traj.append(t), step.append(j), anchor.append(a)
                policy_row.append(j >= len(shared))
    keep = np.asarray(policy_row)
    sub = [np.asarray(x)[keep] for x in (task, traj, step, anchor)]
    sub[2] = sub[2] - np.asarray([len(prefix[t]) for t in sub[1]])
    rewards = rs.rand(len(task))
    full_adv, full_flag = oracle_advantages(task, traj, step, anchor, rewards)
    got_adv, got_flag = oracle_advantages(*sub, rewards[keep], prefix_anchors=prefix)
    np.testing.assert_array_equal(got_flag, full_flag[keep])
    assert got_flag.any()
    np.testing.assert_allclose(got_adv, full_adv[keep], atol=1e-6)


# --------------------------------------------------------------------------- the run's guide
def guide_of(experts, **options):
    from hgpo_jax.guidance_specs import G2Options
    from hgpo_jax.rl.guides.g2 import Guide

    return Guide(experts, lambda text: list(text), G2Options(**options),
                 max_steps=10)


def test_the_guide_draws_one_plan_per_task_shared_by_its_group():
    """Experts of 2 to 6 steps (clusters from their lengths), an unmatched task; a draw per task
    in task order, the same schedule and seed giving the same plans (every process agrees)."""
    experts = {t: [f"go {t} {i}" for i in range(2 + t % 5)] for t in range(10)}
    guide = guide_of(experts, num_difficulty_groups=3)
    assert guide.thresholds == [2, 4, 6] and guide.cluster(0) == 1 and guide.cluster(99) == 0
    plans = guide.plan([3, 99, 7], group_size=2)
    assert len(plans) == 6 and plans[0] == plans[1] and plans[4] == plans[5]
    assert not plans[2].matched and plans[2].actions == ()
    for p, task in ((plans[0], 3), (plans[4], 7)):
        assert p.matched and 0 < len(p.actions) < len(experts[task])  # the last step is the policy's
        assert list(p.actions) == experts[task][:len(p.actions)] and p.expert_steps == len(experts[task])
    again = guide_of(experts, num_difficulty_groups=3).plan([3, 99, 7], group_size=2)
    assert again == plans
    per_rollout = guide_of(experts, num_difficulty_groups=3, share_prefix_within_group=False)
    assert len(per_rollout.plan([3], group_size=4)) == 4


def test_the_guide_updates_from_the_kept_matched_rollouts_and_round_trips():
    experts = {t: [f"step {i}" for i in range(4)] for t in range(4)}
    guide = guide_of(experts, num_difficulty_groups=1, sigma_mode="dynamic_sigma",
                     batch_acc_low=0.5, batch_acc_high=0.5)
    plans = guide.plan([0, 1, 9], group_size=2)      # task 9: unmatched, left out of the update
    m = guide.update(plans, episode_traj=[0, 1, 2, 4, 5], episode_won=[1, 1, 1, 0, 0])
    assert m["guidance/rollouts"] == 3 and m["guidance/batch_success"] == 1.0  # rollout 3: gone
    assert m["guidance/mu_global"] == pytest.approx(0.7) and m["guidance/matched_rate"] == 4 / 6
    state = guide.state_dict()
    fresh = guide_of(experts, num_difficulty_groups=1, sigma_mode="dynamic_sigma")
    fresh.load_state_dict(state)
    assert fresh.schedule.mu_global == guide.schedule.mu_global
    assert fresh.schedule.accuracy(1) == guide.schedule.accuracy(1) == pytest.approx(0.2)
    other = guide_of(experts, num_difficulty_groups=1, difficulty_group_mode="webshop_3")
    with pytest.raises(ValueError, match="difficulty clusters"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="no training task has an expert"):
        guide_of({})


def test_a_guided_run_on_the_toy_env_trains_saves_and_resumes_its_schedule(tmp_path):
    """Two guided HGPO iterations on the toy env: the rollouts replay expert steps, the
    schedule's metrics are logged, its state is in the checkpoint and a resume loads it."""
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.rl import Trainer

    def config(iterations):
        return load_config("tiny_cpu_toy", [f"train.run_dir={tmp_path}/run", "env.num_workers=1",
                                            "guidance.kind=g2", f"train.iterations={iterations}",
                                            "train.save_every=1",
                                            "guidance.initial_group_accuracy=0.5"])

    with Trainer(config(1), progress=False) as trainer:
        history = trainer.train()
        state = trainer.guidance.state_dict()
        assert trainer.guidance.guide.thresholds  # the toy tasks' experts, clustered
    m = history[0]
    for key in ("guidance/mu_global", "guidance/batch_success", "guidance/prefix_steps",
                "guidance/matched_rate", "guidance/group_1/A", "train/loss"):
        assert key in m and np.isfinite(m[key]), key
    assert m["guidance/matched_rate"] == 1.0 and m["guidance/prefix_steps"] > 0
    assert state["scoreboard"]["1"]["accuracy_ema"] != 0.5  # the schedule learned something
    with Trainer(config(2), resume=True, progress=False) as trainer:
        assert trainer.iteration == 1
        assert trainer.guidance.state_dict() == state  # the schedule continues where it stopped
        history = trainer.train()
    assert len(history) == 1 and "guidance/mu_global" in history[0]

    # evaluated: hint-free, with the policy alone (no guide, no experts, no optimizer)
    from hgpo_jax.trainers.evaluator import Evaluator

    evaluated = load_config("tiny_cpu_toy", [f"model.path={tmp_path}/run", "env.num_workers=1",
                                             "guidance.kind=g2", "eval.protocol=each-once"])
    with Evaluator.load(evaluated, progress=False) as evaluator:
        assert not hasattr(evaluator, "guidance")
        assert evaluator.evaluate("valid_seen", games=2)["eval/valid_seen/episodes"] == 2

    # the same run resumed with other clusters: refused before any weights load
    import hgpo_jax.runs as runs

    def must_not_load(*a, **k):
        raise AssertionError("the weights were loaded")

    other = load_config("tiny_cpu_toy", [f"train.run_dir={tmp_path}/run", "env.num_workers=1",
                                         "guidance.kind=g2", "train.iterations=3",
                                         "guidance.num_difficulty_groups=2"])
    original = runs.load_model
    runs.load_model = must_not_load
    try:
        with pytest.raises(ValueError, match="difficulty clusters"):
            Trainer(other, resume=True, progress=False, allow_change=True)
    finally:
        runs.load_model = original


def test_expert_tasks_drawn_records_only_the_tasks_the_run_will_draw(tmp_path):
    """guidance.expert_tasks=drawn: the experts of exactly the tasks the run's sampler draws over
    its iterations (the same as those of the whole split, for those tasks); a value other than
    split | drawn is a config error naming the key."""
    from hgpo_jax.config import load_config
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.rl.guides.g2 import AgentG2
    from hgpo_jax.trainers.state import TaskSampler, drawn_tasks

    def drawn_tasks_of(cfg):
        return drawn_tasks(get_env(cfg.env.name).list_tasks(cfg.env, cfg.env.split), cfg)

    def config(*extra):
        return load_config("tiny_cpu_toy", [f"train.run_dir={tmp_path}/run", "env.num_workers=1",
                                            "guidance.kind=g2", "train.iterations=3",
                                            "train.seed=5", *extra])

    cfg = config("guidance.expert_tasks=drawn")
    split = get_env(cfg.env.name).list_tasks(cfg.env, cfg.env.split)
    sampler = TaskSampler(split, cfg.train.seed)  # what the trainer draws, iteration by iteration
    drawn = {t for _ in range(cfg.train.iterations) for t in sampler.next(cfg.rollout.num_groups)}
    def experts_of(cfg):
        drawn_tasks = lambda: drawn_tasks_of(cfg)  # noqa: E731
        return AgentG2.prepare(cfg, drawn_tasks=drawn_tasks, progress=False, saved=None)

    experts = experts_of(cfg)
    assert set(experts) == drawn and 0 < len(drawn) < len(split)
    everything = experts_of(config())
    assert len(everything) == len(split)
    assert experts == {t: everything[t] for t in drawn}
    with pytest.raises(ValueError, match="expert_tasks"):
        config("guidance.expert_tasks=some")


# --------------------------------------------------------------------------- the worked example
def test_the_worked_example_adds_a_guidance_kind_with_its_own_option_and_state(tmp_path):
    """tests/example_guidance.py (docs/architecture.md, "How to add a guidance"): a kind
    declared with an option of its own and a state, run end to end by the CLI in a fresh
    process, touching no file of trainers/, rl/rollout.py or commands/: its option is read and
    checked, refused for another kind; its prefixes are replayed (the rollouts' episodes are
    longer than the policy's turns); its state is saved with the checkpoint and restored on
    resume (the resumed iteration counts on from the saved wins and episodes)."""
    import json
    import os
    import subprocess
    import sys

    from hgpo_jax.checkpoint import Checkpointer

    run = tmp_path / "run"
    base = ["tiny_cpu_toy", f"train.run_dir={run}", "env.num_workers=1", "--no-progress"]
    commands = [
        ["train", *base, "guidance.hint_steps=2"],                           # kind none: refused
        ["train", *base, "guidance.kind=hint", "guidance.hint_steps=-1"],    # its own check
        ["train", *base, "guidance.kind=hint", "guidance.hint_steps=2", "train.iterations=1",
         "train.save_every=1"],
        ["train", str(run), "--resume", "train.iterations=2", "--no-progress"],
    ]
    script = os.path.join(os.path.dirname(__file__), "example_guidance.py")
    done = subprocess.run([sys.executable, script, json.dumps(commands)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == [2, 2, 0, 0], done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("hgpo-jax train: error:")]
    assert len(errors) == 2, done.stderr[-3000:]
    assert ("guidance.hint_steps=2: guidance.kind=none never reads it (an option of "
            "guidance.kind=hint)") in errors[0]
    assert "guidance.hint_steps=-1: must be >= 0" in errors[1]

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if "hint/steps" in r}
    assert sorted(steps) == [1, 2]
    first, second = steps[1], steps[2]
    assert first["hint/steps"] == 2.0  # no success yet: the hint is replayed
    # the replayed steps count in the episodes' lengths, not in the policy's rows
    assert first["rollout/mean_episode_length"] == pytest.approx(
        2.0 + first["rollout/steps"] / first["rollout/episodes"])
    ckpt = Checkpointer(run / "checkpoints", read_only=True)
    try:
        state = ckpt.latest_meta()["guidance"]
    finally:
        ckpt.close()
    # resumed from the first checkpoint's counts: both iterations' episodes counted
    assert state["episodes"] == first["rollout/episodes"] + second["rollout/episodes"]
    assert state["wins"] / state["episodes"] == pytest.approx(second["hint/success_so_far"])
