"""Token-budget micro-batches (`train.max_tokens_per_micro_batch`): the plan, the loss weights, the
update and the log-prob pass against the fixed, padded micro-batches, and a trainer iteration."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hf_models import TINY_SHAPES

from hgpo_jax.config import load_config
from hgpo_jax.config_checks import ConfigError
from hgpo_jax.models import DecoderConfig, CausalLM, make_mesh
from hgpo_jax.rl.batching import (PolicyRows, TokenRows, fit_length, fixed_micro_weights, gather_rows,
                                  length_ladder, pack_rows, take_micro, token_budget_micro_batches)
from hgpo_jax.rl.ppo import LossConfig, make_budget_train_step, make_train_step, ppo_micro_loss
from hgpo_jax.rl.update import (budget_update, init_opt_state, make_logprob_fn, param_shardings,
                                shard_params)
from hgpo_jax.trainers.rl import Trainer

CFG = DecoderConfig(**TINY_SHAPES["untied_gqa1"])
WINDOW = 12  # the response window (rollout.max_new_tokens) of the update tests


def ragged_batch(rows=16, seed=0, multiple=8):
    """Rows of very different lengths (prompts 3..40 tokens, responses 1..12), some rows without a
    response token: [S, L] host arrays with old/ref log-probs near the policy's."""
    rng = np.random.RandomState(seed)
    prompts = [list(rng.randint(0, CFG.vocab_size, rng.choice([3, 6, 20, 40]) + rng.randint(0, 3)))
               for _ in range(rows)]
    responses = [list(rng.randint(0, CFG.vocab_size, rng.randint(1, WINDOW + 1))) for _ in range(rows)]
    b = pack_rows(prompts, responses, rng.randn(rows).astype(np.float32), length_multiple=multiple)
    a = b.arrays()
    a["response_mask"][1] = 0  # a row with nothing to learn from
    noise = rng.randn(*a["input_ids"].shape).astype(np.float32)
    a["old_logp"] = -2.0 + 0.05 * noise
    a["ref_logp"] = -2.0 - 0.05 * np.abs(noise)
    return a


# --------------------------------------------------------------------------- the plan
def test_length_ladder_steps_and_fit():
    ladder = length_ladder(1072, 32)
    assert ladder[:8] == tuple(32 * u for u in range(1, 9)) and ladder[-1] == 1088
    assert all(b % 32 == 0 for b in ladder) and list(ladder) == sorted(set(ladder))
    assert max(b / a for a, b in zip(ladder[8:], ladder[9:])) <= 1.25
    assert length_ladder(4608, 64)[-1] == 4608
    assert fit_length(257, ladder) == 320 and fit_length(1088, ladder) == 1088
    with pytest.raises(ValueError, match="longer than the longest micro-batch length 1088"):
        fit_length(1089, ladder)


@pytest.mark.parametrize("procs,shards", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_micro_batches_respect_the_budget_and_take_every_row_once(procs, shards):
    rng = np.random.default_rng(procs * 10 + shards)
    lengths = rng.integers(200, 1073, (procs, 64))
    lengths[:, :5] = 0  # inert rows are left out
    ladder, budget = length_ladder(1072, 32), 4352
    plan = token_budget_micro_batches(lengths, budget, ladder, shards=shards)
    for p in range(procs):
        taken = np.concatenate([m.rows[p] for m in plan])
        taken = taken[taken >= 0]
        assert sorted(taken) == list(range(5, 64))  # every row with a length, once
    for m in plan:
        rows, length = m.shape
        assert rows % (procs * shards) == 0 and rows // (procs * shards) * length <= budget
        assert length in ladder
        for p in range(procs):
            own = m.rows[p][m.rows[p] >= 0]
            assert (lengths[p, own] <= length).all()
    assert [m.length for m in plan] == sorted((m.length for m in plan), reverse=True)
    with pytest.raises(ValueError, match="at least 1088"):
        token_budget_micro_batches(lengths, 1000, ladder)


def test_padding_is_small_and_compiled_shapes_few():
    """On 40 mini-batches of 64 rows of 300-1,072 tokens, the planned micro-batches pad far less
    than padding every row to the longest, with only a few distinct shapes."""
    rng = np.random.default_rng(0)
    ladder, budget = length_ladder(1072, 32), 8704
    shapes, padded, real, fixed = set(), 0, 0, 0
    for _ in range(40):
        lengths = rng.integers(300, 1073, (1, 64))
        plan = token_budget_micro_batches(lengths, budget, ladder, shards=2)
        shapes.update(m.shape for m in plan)
        padded += sum(m.rows.size * m.length for m in plan)
        real += lengths.sum()
        fixed += lengths.size * fit_length(lengths.max(), ladder)
    assert 1 - real / padded < 0.2 < 1 - real / fixed
    assert len(shapes) <= 25, sorted(shapes)


def test_fixed_micro_weights_reproduce_the_mean_of_micro_batch_aggregates():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 9, (2, 8))  # 2 processes x 8 rows, global row p * 8 + i
    tokens[0, 3] = 0
    values = [rng.normal(size=n) for n in tokens.reshape(-1)]  # each row's per-token values
    for agg in ("token-mean", "seq-mean"):
        token_w, agg_w = fixed_micro_weights(tokens, 4, agg)
        assert token_w.shape == tokens.shape and agg_w[0, 3] == 0 and token_w[0, 3] == 0
        got = sum(w * v.sum() for w, v in zip(agg_w.reshape(-1), values))
        micro = [[g for g in range(16) if g % 4 == j] for j in range(4)]
        if agg == "token-mean":
            want = np.mean([sum(values[g].sum() for g in m) / sum(tokens.reshape(-1)[m]) for m in micro])
        else:
            want = np.mean([np.mean([values[g].mean() for g in m if len(values[g])]) for m in micro])
        np.testing.assert_allclose(got, want, rtol=1e-6)
        got_tok = sum(w * v.sum() for w, v in zip(token_w.reshape(-1), values))
        want_tok = np.mean([sum(values[g].sum() for g in m) / sum(tokens.reshape(-1)[m]) for m in micro])
        np.testing.assert_allclose(got_tok, want_tok, rtol=1e-6)
    with pytest.raises(ValueError, match="cannot form 3 equal micro-batches"):
        fixed_micro_weights(tokens, 3)


def test_every_gpu_paper_config_has_a_token_budget():
    """Every hgpo_jax/configs/*_qwen* config (the Qwen2.5 and Qwen3 presets of every
    algorithm, run on GPUs) forms its update's and log-prob passes' micro-batches by a token
    budget (the values and why: docs/training.md, "Token-budget micro-batches"); the CPU configs
    keep the authors' fixed micro-batches."""
    from hgpo_jax.config import available_configs

    names = [name for name in available_configs() if "_qwen" in name]
    assert len(names) >= 40
    for name in names:
        budget = load_config(name).train.max_tokens_per_micro_batch
        assert budget > 0, (name, budget)
    assert load_config("tiny_cpu").train.max_tokens_per_micro_batch == 0


def test_config_key_is_validated():
    cfg = load_config("tiny_cpu_toy", ["train.max_tokens_per_micro_batch=4096"])
    assert cfg.train.max_tokens_per_micro_batch == 4096
    assert load_config("tiny_cpu_toy").train.max_tokens_per_micro_batch == 0  # off by default
    with pytest.raises(ConfigError, match="at least the longest possible row"):
        load_config("tiny_cpu_toy", ["train.max_tokens_per_micro_batch=100"])
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch"):
        load_config("tiny_cpu_toy", ["train.max_tokens_per_micro_batch=-1"])


# --------------------------------------------------------------------------- the update
def budget_micros(a, num_micro, budget, agg, shards=1, length_multiple=8):
    """The token-budget micro-batches of mini-batch `a` (`PolicyRows`, all rows, one process),
    with weights."""
    tokens = a.response_mask.sum(1).astype(np.int64)
    token_w, agg_w = fixed_micro_weights(tokens, num_micro, agg)
    rows = a.replace(token_weight=token_w, agg_weight=agg_w)
    lengths = np.where(tokens > 0, a.attention_mask.sum(1), 0)
    ladder = length_ladder(a.input_ids.shape[1], length_multiple)
    plan = token_budget_micro_batches(lengths, budget, ladder, shards=shards)
    return [take_micro(rows, m.rows[0], m.length) for m in plan], plan


def fixed_grads(graphdef, params, mb, loss_cfg, num_micro, window):
    """The fixed form's mini-batch gradient: the mean over the interleaved micro-batches."""
    loss = ppo_micro_loss(loss_cfg, window)
    mb = jax.tree.map(jnp.asarray, mb)

    def f(p):
        model = nnx.merge(graphdef, p)
        parts = [loss(model, jax.tree.map(lambda v: v[j::num_micro], mb))[0] for j in range(num_micro)]
        return sum(parts) / num_micro

    return jax.jit(jax.grad(f))(params)


@pytest.mark.parametrize("agg,token_adv,entropy", [("token-mean", False, 0.001),
                                                   ("seq-mean", True, 0.01)])
def test_budget_update_equals_the_padded_fixed_update(agg, token_adv, entropy):
    """Ragged rows (16 to 56 tokens), 16 per mini-batch in 4 fixed micro-batches: the token-budget
    update (budget 96 tokens: micro-batches of 1 to 6 rows of 16 to 56 tokens) has the same
    gradient, the same metrics and the same new parameters."""
    a = ragged_batch(16)
    if token_adv:  # PPO with a critic: token-level advantages
        a["advantages"] = (np.random.RandomState(3).randn(*a["input_ids"].shape).astype(np.float32)
                           * a["response_mask"])
    mb = PolicyRows.of(a)
    loss_cfg = LossConfig(agg=agg, entropy_coef=entropy)
    graphdef, params = nnx.split(CausalLM(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    micros, plan = budget_micros(mb, 4, 96, agg)
    assert len({m.shape for m in plan}) >= 3 and min(m.length for m in plan) < a["input_ids"].shape[1] / 3

    tx = optax.sgd(0.1)  # updates linear in the gradients
    step = make_budget_train_step(graphdef, tx, loss_cfg, 96, window=WINDOW, token_advantages=token_adv)
    acc = step.init(params)
    for micro in micros:
        acc = step.accumulate(params, acc, micro)
    want = fixed_grads(graphdef, params, mb, loss_cfg, 4, WINDOW)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-7), acc[0], want)

    fixed = make_train_step(graphdef, tx, loss_cfg, 4, window=WINDOW, token_advantages=token_adv)
    p0, _, m0 = fixed(jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], mb)
    p1, _, m1 = budget_update(step, jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], micros)
    assert sorted(m0) == sorted(m1)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-4, atol=1e-7, err_msg=k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), p1, p0)
    assert float(m0["train/grad_norm"]) > 0


def test_budget_update_with_adamw_on_a_sharded_mesh_equals_the_fixed_update():
    """data=2 x fsdp=2 (4 of the 8 virtual devices): AdamW, two updates, the same parameters and
    losses as the fixed step; an update with no micro-batch at all (every row inert) moves the
    parameters as the fixed step's all-inert update does."""
    mesh = make_mesh(data=2, fsdp=2, tensor=1)
    a = ragged_batch(16, seed=1)
    mb = PolicyRows.of(a)
    model = CausalLM(CFG, rngs=nnx.Rngs(0))
    model.batch_mesh = mesh
    graphdef, params = nnx.split(model, nnx.Param)
    params = shard_params(params, mesh)
    sh = param_shardings(mesh, params)
    tx = optax.adamw(1e-3)
    micros, plan = budget_micros(mb, 2, 128, "token-mean", shards=4)
    inert = gather_rows(mb, np.full(16, -1))
    out = []
    for budget in (0, 128):
        opt, opt_sh = init_opt_state(tx, params, mesh)
        p, losses = jax.tree.map(jnp.copy, params), []
        if budget:
            step = make_budget_train_step(graphdef, tx, LossConfig(), budget, mesh, sh, opt_sh, window=WINDOW)
            for batch in (micros, micros, []):
                p, opt, m = budget_update(step, p, opt, batch)
                losses.append(float(m["train/loss"]))
        else:
            step = make_train_step(graphdef, tx, LossConfig(), 2, mesh, sh, opt_sh, window=WINDOW)
            for batch in (mb, mb, inert):
                p, opt, m = step(p, opt, batch)
                losses.append(float(m["train/loss"]))
        out.append((losses, jax.tree.map(np.asarray, p)))
    (l0, p0), (l1, p1) = out
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-7)
    assert l0[2] == 0.0
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-6), p1, p0)
    assert all(m.shape[0] % 4 == 0 for m in plan)


@pytest.mark.parametrize("heads", [1, 3])
def test_critic_budget_update_equals_the_fixed_update(heads):
    """The critic's update over token-budget micro-batches (`rl.critic.make_critic_budget_step`):
    the fixed step's gradient, metrics and new parameters, for PPO's one head and HiPER's three,
    each head trained at its own positions (a value mask per head; one head's mask empty in a
    whole fixed micro-batch). The value windows (W = 32 positions, responses <= 12 tokens) are cut
    to each micro-batch's length."""
    from hgpo_jax.models.critic import critic_from_policy
    from hgpo_jax.rl.batching import CriticRows
    from hgpo_jax.rl.critic import (critic_micro_weights, make_critic_budget_step,
                                    make_critic_step, value_counts)

    a, W = ragged_batch(16, seed=4), 32
    rng = np.random.RandomState(5)
    tail = (heads,) if heads > 1 else ()
    # old values far (|V - V_old| > the clip 0.5) from the critic's: no near-tie of the clipped
    # and unclipped errors, whose order float noise would decide (vf_clipfrac)
    values = (5 * np.sign(rng.randn(16, W, *tail)) + rng.randn(16, W, *tail)).astype(np.float32)
    mask = None
    if heads > 1:
        mask = (rng.rand(16, W, heads) < 0.6).astype(np.float32)
        mask[::4, :, 2] = 0  # head 2 has no target in fixed micro-batch 0 (rows 0, 4, 8, 12)
    returns = values + rng.randn(*values.shape).astype(np.float32)
    rows = CriticRows.of(dict(a, values=values, returns=returns, value_mask=mask))
    critic = critic_from_policy(CausalLM(CFG, rngs=nnx.Rngs(0)), seed=1, num_heads=heads)
    graphdef, params = nnx.split(critic, nnx.Param)
    tx, num_micro, budget = optax.sgd(0.1), 4, 96
    counts = value_counts(rows)
    head_w, value_w = critic_micro_weights(counts[None], num_micro)
    weighted = rows.replace(head_weight=head_w[0], value_weight=value_w[0])
    total = counts if counts.ndim == 1 else counts.sum(-1)
    plan = token_budget_micro_batches(np.where(total > 0, rows.attention_mask.sum(1), 0), budget,
                                      length_ladder(rows.input_ids.shape[1], 8))
    assert len({m.shape for m in plan}) >= 3 and min(m.length for m in plan) < W
    micros = [take_micro(weighted, m.rows[0], m.length) for m in plan]

    fixed = make_critic_step(graphdef, tx, 0.5, W, num_micro, num_heads=heads,
                             value_masks=heads > 1)
    step = make_critic_budget_step(graphdef, tx, 0.5, W, num_heads=heads, value_masks=heads > 1)
    p0, _, m0 = fixed(jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], rows)
    p1, _, m1 = budget_update(step, jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0],
                              micros)
    assert sorted(m0) == sorted(m1) and (heads == 1 or "train/vf_loss/head2" in m0)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-4, atol=1e-6, err_msg=k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), p1, p0)
    assert float(m0["train/grad_norm"]) > 0


def test_budget_logprobs_equal_the_padded_pass_with_few_compiled_shapes():
    a = ragged_batch(16, seed=2)
    graphdef, params = nnx.split(CausalLM(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    args = ("input_ids", "attention_mask", "response_mask")
    padded = np.asarray(make_logprob_fn(graphdef, window=WINDOW)(params, *(a[k] for k in args)))
    fn = make_logprob_fn(graphdef, window=WINDOW, token_budget=64)
    out = np.zeros_like(padded)
    plan = token_budget_micro_batches(a["attention_mask"].sum(1), 64,
                                      length_ladder(a["input_ids"].shape[1], 8))
    for m in plan:
        part = take_micro(TokenRows.of(a), m.rows[0], m.length)
        res = np.asarray(fn(params, part.input_ids, part.attention_mask, part.response_mask))
        keep = m.rows[0] >= 0
        out[m.rows[0][keep], :m.length] = res[keep]
    np.testing.assert_allclose(out, padded, atol=2e-5)
    assert np.abs(padded).sum() > 0
    assert fn._cache_size() == len({m.shape for m in plan}) <= len(plan)


# --------------------------------------------------------------------------- the trainer
GUIDED_SFT = ("guidance.kind=g2", "guidance.sft_coef=0.5", "guidance.initial_group_accuracy=0.5")


@pytest.mark.parametrize("config,on,extra", [("tiny_cpu_toy", 1024, ()), ("tiny_cpu_ppo", 1024, ()),
                                             ("tiny_cpu_hiper", 2048, ()),  # hiper's rows: <= 1,344 tokens
                                             ("tiny_cpu_toy", 1024, GUIDED_SFT)],
                         ids=["toy", "ppo", "hiper", "toy-guided-sft"])
def test_trainer_iteration_with_a_token_budget_equals_fixed_micro_batches(tmp_path, config, on,
                                                                          extra):
    """One toy iteration (the same rollouts) with the key off and on: the same log-probs (and,
    with a critic, values), loss, metrics and updated parameters (the critic's too: its update
    goes by the budget as well, HiPER's three heads each at its own positions; with guidance's
    prefix SFT, its updates too)."""
    out = []
    for budget in (0, on):
        cfg = load_config(config, [f"train.run_dir={tmp_path}/b{budget}", "env.num_workers=1",
                                   "train.iterations=1", f"train.max_tokens_per_micro_batch={budget}",
                                   "train.diagnostics=false", *extra])
        with Trainer(cfg, progress=False) as t:
            (m,) = t.train()
            critic = t.state.algo_state
            out.append((m, jax.tree.map(np.asarray, t.params),
                        None if critic is None else jax.tree.map(np.asarray, critic.params)))
    (m0, p0, c0), (m1, p1, c1) = out
    assert m0["rollout/steps"] == m1["rollout/steps"] > 0 and m1["train/updates"] == m0["train/updates"]
    keys = ["train/loss", "train/pg_loss", "train/kl_loss", "train/entropy", "train/ppo_kl",
            "train/grad_norm", "train/rollout_vs_policy_logp_gap"]
    if extra:
        keys += ["train/prefix_sft_loss", "train/prefix_sft_grad_norm", "train/prefix_sft_rows"]
        assert m0["train/prefix_sft_updates"] == m1["train/prefix_sft_updates"] > 0
    if config != "tiny_cpu_toy":
        # every critic metric but the clip fractions (nor the actor's: in the first update the
        # values are the old values, clipped and unclipped errors tie, and which one rounds
        # larger is float noise)
        keys += ["train/mean_advantage"] + sorted(k for k in m0 if k.startswith("critic/")
                                                  and "clipfrac" not in k)
        assert "critic/vf_loss" in keys and (config != "tiny_cpu_hiper" or "critic/vf_loss/head2" in keys)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), c1, c0)
    # HiPER's pg_loss (~6e-4) sums terms of both signs over masked tokens: 2e-7 of float noise
    atol = 1e-6 if config == "tiny_cpu_hiper" else 1e-7
    for k in keys:
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-4, atol=atol, err_msg=k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), p1, p0)
