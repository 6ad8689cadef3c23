"""HiPER as an algorithm unit (`hgpo_jax.rl.algorithms.hiper`): its declaration and config
checks, the token assignment of HAE's three advantages, the three heads' targets, its metrics,
the plan of its three-head critic, and bad input refused before anything loads. A run of
`tiny_cpu_hiper` in the unchanged trainer, with eval, export, resume and plot on it:
tests/test_hiper_run.py."""

import dataclasses
import types

import numpy as np
import pytest

from hgpo_jax.config import load_config
from hgpo_jax.config_checks import ConfigError
from hgpo_jax.rl.algorithms import HiperAlgorithm, LinkedTurns, StepRows, build_algorithm
from hgpo_jax.rl.algorithms.hiper import block_masks, subgoal_changed
from hgpo_jax.rl.batching import pack_rows
from hgpo_jax.rl.hae import hae_advantages
from hgpo_jax.rl.rollout import RolloutBatch


def test_the_config_takes_hiper_with_its_agent_and_checks_its_options():
    cfg = load_config("tiny_cpu_hiper")
    assert (cfg.algo.estimator, cfg.agent.name, cfg.algo.spec.critic_heads) == ("hiper", "plan-execute", 3)
    assert isinstance(build_algorithm(cfg), HiperAlgorithm)
    with pytest.raises(ConfigError, match="needs the agent 'plan-execute'.*agent.name=plan-execute"):
        load_config("tiny_cpu_hiper", ["agent.name=verl-agent"])
    with pytest.raises(ConfigError, match="algo.keep_penalty_mode='mean' is not allowed"):
        load_config("tiny_cpu_hiper", ["algo.keep_penalty_mode=mean"])
    with pytest.raises(ConfigError, match=r"algo.lam_seg=1.5: must be in \[0, 1\]"):
        load_config("tiny_cpu_hiper", ["algo.lam_seg=1.5"])


class CharTokenizer:
    """One token per character: a reply's pieces are its characters."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


REPLIES = [  # (trajectory, turn, reply, reward, done)
    (0, 0, "<switch>SWITCH</switch><subgoal>go</subgoal><action>go forward</action>", 0.0, False),
    (0, 1, "<switch>KEEP</switch><subgoal>go</subgoal><action>open door</action>", 10.0, True),
    (1, 0, "<switch>KEEP</switch><subgoal>a</subgoal><action>press red</action>", 0.0, False),
    (1, 1, "<switch>KEEP</switch><subgoal>b</subgoal><action>x</action>", 0.0, False),
    (1, 2, "no blocks at all", 0.0, True),
]


def hiper_rows(width: int = 96) -> StepRows:
    n = len(REPLIES)
    response = [[ord(c) for c in r] for _, _, r, _, _ in REPLIES]
    batch = RolloutBatch(
        task_id=np.zeros(n, np.int64), traj_id=np.asarray([r[0] for r in REPLIES]),
        step_id=np.asarray([r[1] for r in REPLIES]), anchor=["o"] * n, prompt_ids=[[1, 2, 3]] * n,
        response_ids=response, sample_logp=[[-1.0] * len(x) for x in response],
        reward=np.asarray([r[3] for r in REPLIES]), valid=np.asarray([True, True, True, True, False]),
        done=np.asarray([r[4] for r in REPLIES]), won=np.zeros(n, bool), task_type=["t"] * n,
        episode_traj=np.asarray([0, 1]), episode_won=np.zeros(2, bool), episode_task_type=["t"] * 2,
        episode_length=np.asarray([2, 3]), num_failed=0, timing={})
    packed = pack_rows(batch.prompt_ids, batch.response_ids, np.zeros(n, np.float32),
                       batch.sample_logp, pad_id=0, row_multiple=8, length_multiple=8,
                       max_response=width)
    zeros = np.zeros(packed.input_ids.shape, np.float32)
    return StepRows(batch, packed, zeros, zeros, LinkedTurns.of(batch, packed.shape[0]))


def test_hae_advantages_land_on_their_blocks_and_targets_on_their_heads():
    width = 96
    cfg = load_config("tiny_cpu_hiper", [f"rollout.max_new_tokens={width}"])
    unit = build_algorithm(cfg, tokenizer=CharTokenizer())
    rows = hiper_rows(width)
    S, L = rows.tokens.input_ids.shape
    rng = np.random.default_rng(0)
    values = rng.normal(size=(S, width, 3)).astype(np.float32)
    unit.critic = types.SimpleNamespace(value_fn=None)  # values come from the stub pass below
    adv = unit.advantages(rows, types.SimpleNamespace(params=None), lambda fn, params, width: values)

    spans = unit.spans(rows)
    action, subgoal, switch = block_masks(spans, width)
    n = len(REPLIES)
    assert [s.new_segment for s in spans] == [True, False, False, False, False]
    # the low value is read after the sub-goal block; high and termination at the first position
    low_at = [s.low_value_index for s in spans]
    assert low_at[0] == len("<switch>SWITCH</switch><subgoal>go</subgoal>") and low_at[4] == 0
    changed, has_subgoal = subgoal_changed(rows.turns.traj_id[:n], rows.turns.turn[:n],
                                           rows.batch.response_ids, subgoal)
    assert changed.tolist() == [False, False, False, True, False]  # b != a; row 4 has no block
    a = cfg.algo
    want = hae_advantages(
        rows.turns.traj_id[:n], rows.turns.turn[:n], rows.turns.reward[:n], rows.turns.done[:n],
        [s.new_segment for s in spans], values[np.arange(n), low_at, 0], values[:n, 0, 1],
        values[:n, 0, 2], valid=rows.turns.valid[:n], subgoal_changed=changed,
        has_subgoal=has_subgoal, has_switch=switch.any(1), gamma=a.gamma, lam=a.lam,
        lam_seg=a.lam_seg, keep_penalty=a.keep_penalty, keep_penalty_mode=a.keep_penalty_mode,
        invalid_penalty=a.invalid_penalty, keep_consistency_penalty=a.keep_consistency_penalty,
        bootstrap_truncated=a.bootstrap_truncated, norm_adv=a.norm_adv)
    start = np.argmax(rows.tokens.response_mask > 0, axis=1)
    for i, (_, _, reply, _, _) in enumerate(REPLIES):
        window = adv.advantages[i, start[i]:start[i] + len(reply)]
        loss = adv.loss_mask[i, start[i]:start[i] + len(reply)]
        high = subgoal[i, :len(reply)] & bool(want.has_high[i])
        expect = (want.low[i] * action[i, :len(reply)] + want.high[i] * high
                  + want.term[i] * switch[i, :len(reply)])
        np.testing.assert_allclose(window, expect, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(loss, action[i, :len(reply)] | high | switch[i, :len(reply)])
        # nothing outside the reply: the prompt and the padding get no advantage and no loss
        assert not adv.advantages[i, :start[i]].any() and not adv.loss_mask[i, start[i] + len(reply):].any()
    # a KEEP turn's sub-goal tokens get no high-level advantage and no loss
    keep_subgoal = start[1] + np.flatnonzero(subgoal[1])
    assert not adv.loss_mask[1, keep_subgoal].any()
    # a reply without blocks: its whole response is the action
    assert adv.loss_mask[4, start[4]:start[4] + len(REPLIES[4][2])].all()
    # one target per turn per head at its read position; inert rows none
    np.testing.assert_array_equal(adv.value_mask[:n, :, 0].sum(1), 1)
    np.testing.assert_array_equal(adv.value_mask[:n, :, 1].sum(1), want.has_high.astype(float))
    np.testing.assert_array_equal(adv.value_mask[:n, :, 2].sum(1), 1)
    assert not adv.value_mask[n:].any()
    np.testing.assert_allclose(adv.returns[np.arange(n), low_at, 0], want.low_return, rtol=1e-6)
    np.testing.assert_allclose(adv.returns[:n, 0, 2], want.term_return, rtol=1e-6)
    assert adv.row_means["hiper/switch_rate"] == pytest.approx(1 / 5)
    assert adv.row_means["hiper/consistency_violation_rate"] == pytest.approx(1 / 3)
    # two episodes of one segment each (2 and 3 turns): 5 turns / 2 segments
    assert adv.alone()["hiper/mean_segment_length"] == pytest.approx(2.5)
    # each head's values against its targets, where the target is (the value before the update)
    for h in range(3):
        at = adv.value_mask[..., h] > 0
        t, v = adv.returns[..., h][at].astype(np.float64), values[..., h][at].astype(np.float64)
        assert adv.alone()[f"critic/explained_var/head{h}"] == pytest.approx(
            1 - np.var(t - v) / np.var(t), rel=1e-6)
    at = adv.value_mask > 0
    t, v = adv.returns[at].astype(np.float64), values[at].astype(np.float64)
    assert adv.alone()["critic/explained_var"] == pytest.approx(1 - np.var(t - v) / np.var(t), rel=1e-6)
    # the policy's rows carry the loss mask
    assert rows.policy_rows(adv).response_mask is adv.loss_mask


def test_plan_names_the_critics_three_heads(capsys):
    """`hgpo-jax plan tiny_cpu_hiper` sizes and names a critic of three value heads (its
    one-iteration run in the trainer, with the rest of the tool: tests/test_hiper_run.py)."""
    from hgpo_jax.cli import main as cli_main

    assert cli_main(["plan", "tiny_cpu_hiper", "rollout.max_prompt_tokens=256"]) == 0
    out = capsys.readouterr().out
    assert "(0.00 B, 3 value heads, no LM head)" in out and "critic step peak" in out


def test_a_build_model_may_train_its_tokenizer_on_another_agents_text():
    from hgpo_jax.build import build_agent, model_path_folder, parse_build_spec

    assert parse_build_spec("build:toy-tiny@plan-execute") == ("toy", "tiny")
    assert build_agent("build:toy-tiny@plan-execute") == "plan-execute"
    assert build_agent("build:toy-tiny") is None
    assert model_path_folder("build:toy-tiny@plan-execute").endswith("toy-tiny-plan-execute-v1")
    assert model_path_folder("build:toy-tiny").endswith("toy-tiny-v1")  # make run's model as it was
    with pytest.raises(ValueError, match="no agent 'planner'.*use one of verl-agent, plan-execute"):
        parse_build_spec("build:toy-tiny@planner")
    # the toy demo's configs hold together
    assert load_config("toy_hiper_format").model.path == "build:toy-tiny@plan-execute"
    assert load_config("toy_hiper").algo.estimator == "hiper"


# ------------------------------------------------------------------------------------- bad input
def test_a_hiper_config_cannot_drop_its_critic(tmp_path):
    """`critic: null` (or false, or an empty `critic:`) reads as turning the critic off, which
    only algo.estimator decides: a ConfigError naming both ways out; a zero lr likewise."""
    needle = ("critic: null does not turn the critic off: algo.estimator decides whether a run "
              "has one .*drop the line .*algo.estimator=hgpo")
    with pytest.raises(ConfigError, match=needle):
        load_config("tiny_cpu_hiper", ["critic=null"])
    with pytest.raises(ConfigError, match="critic: false does not turn the critic off"):
        load_config("tiny_cpu_hiper", ["critic=false"])
    mine = tmp_path / "no_critic.yaml"
    mine.write_text("base: tiny_cpu_hiper\ncritic: null\n")
    with pytest.raises(ConfigError, match=f"{mine}: " + needle):
        load_config(str(mine))
    with pytest.raises(ConfigError, match=r"critic.lr=0.0: must be a finite number > 0"):
        load_config("tiny_cpu_hiper", ["critic.lr=0"])
    assert load_config("tiny_cpu_hiper", ["critic={}"]).critic.lr == 1e-4  # settings, none given


@pytest.mark.parametrize("agent", ["plan-execute", "verl-agent"])
def test_an_agent_without_a_prompt_for_the_env_is_a_config_error(agent, monkeypatch):
    """Both agents have prompts for every registered env today; an agent that lacked the env's
    would be refused when the config loads, naming the envs it has prompts for."""
    import hgpo_jax.config_checks as config_checks
    from hgpo_jax.agents.registry import agent_spec

    narrow = dataclasses.replace(agent_spec(agent), envs=("alfworld", "webshop"))
    monkeypatch.setattr(config_checks, "_agent_spec", lambda name: narrow if name == agent else None)
    base = "tiny_cpu_hiper" if agent == "plan-execute" else "tiny_cpu_toy"
    with pytest.raises(ConfigError, match=f"agent.name='{agent}': must be an agent with a prompt "
                                          r"for env.name='toy' \(this one has prompts for "
                                          r"alfworld, webshop\)"):
        load_config(base, [f"agent.name={agent}"])


def fake_rl_run(folder, cfg, heads: int):
    """A run folder of `cfg` whose checkpoint (iteration 1) holds a critic of `heads` value heads
    (none for 0): all that the resume checks read (no model)."""
    import jax.numpy as jnp

    from hgpo_jax.checkpoint import Checkpointer
    from hgpo_jax.config import save_config
    from hgpo_jax.runs import recorded_config

    folder.mkdir(parents=True)
    save_config(recorded_config(cfg), str(folder / "config.yaml"))
    state = {"params": {"w": jnp.zeros(2)}, "opt_state": {"m": jnp.zeros(2)}}
    if heads:
        state["critic"] = {"params": {"score": {"kernel": jnp.zeros((4, heads))}},
                           "opt_state": {"m": jnp.zeros(2)}}
    ckpt = Checkpointer(folder / "checkpoints")
    try:
        ckpt.save(1, state, {"iteration": 1})
    finally:
        ckpt.close()
    return folder


@pytest.mark.parametrize("config, heads, overrides, needles", [
    ("tiny_cpu_ppo", 1, ["algo.estimator=hiper", "agent.name=plan-execute"],
     ["holds a critic of 1 value head, but algo.estimator=hiper trains a critic of 3 value heads",
      "resume it with algo.estimator=ppo", "start a new hiper run from its policy with model.path="]),
    ("tiny_cpu_hiper", 3, ["algo.estimator=ppo"],
     ["holds a critic of 3 value heads, but algo.estimator=ppo trains a critic of 1 value head",
      "resume it with algo.estimator=hiper"]),
    ("tiny_cpu_toy", 0, ["algo.estimator=ppo", "rollout.group_size=1"],
     ["holds no critic, but algo.estimator=ppo trains a critic of 1 value head",
      "resume it with algo.estimator=hgpo"]),
    ("tiny_cpu_ppo", 1, ["algo.estimator=hgpo", "rollout.group_size=2"],
     ["holds a critic of 1 value head, but algo.estimator=hgpo trains no critic",
      "resume it with algo.estimator=ppo"]),
])
def test_a_resume_whose_checkpoint_holds_another_critic_is_refused_before_anything_loads(
        config, heads, overrides, needles, tmp_path, monkeypatch, capsys):
    """`train RUN --resume --allow-change algo.estimator=...` whose checkpoint's critic has
    another head count than the algorithm's (or none, or one it has no use for): one line naming
    both and what to do, before the model loads (not an Orbax error after it)."""
    import hgpo_jax.runs as runs
    from hgpo_jax.cli import main as cli_main

    def must_not_run(*a, **k):
        raise AssertionError("loaded before the checks")

    run = fake_rl_run(tmp_path / "run", load_config(config, [f"train.run_dir={tmp_path / 'run'}"]),
                      heads)
    monkeypatch.setattr(runs, "load_model", must_not_run)
    code = cli_main(["train", str(run), "--resume", "--allow-change", "train.iterations=2",
                     *overrides, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"hgpo-jax train: error: --resume: the checkpoint of {run} "), line
    for needle in needles:
        assert needle in line, (needle, line)
    assert not (run / "config_changes.jsonl").exists()  # nothing recorded
    # the trainer's own resume checks the same, before it loads
    from hgpo_jax.trainers.rl import Trainer

    cfg = load_config(str(run), ["train.iterations=2", *overrides])
    with pytest.raises(ValueError, match=needles[0]):
        Trainer(cfg, resume=True, allow_change=True, progress=False)
