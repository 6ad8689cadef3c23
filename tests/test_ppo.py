"""Token log-probs, batching and the jitted PPO-KL update (single device and sharded)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hf_models import FAMILY_SHAPES, TINY_SHAPES

from hgpo_jax.models import DecoderConfig, CausalLM, make_mesh
from hgpo_jax.rl.batching import PolicyRows, gather_rows, minibatch_indices, pack_rows
from hgpo_jax.rl.ppo import LossConfig, make_train_step
from hgpo_jax.rl.update import (init_opt_state, make_logprob_fn, make_optimizer, param_shardings,
                                shard_params, token_logprobs)

CFG = DecoderConfig(**TINY_SHAPES["untied_gqa1"])  # 4 kv heads: tensor=2 splits every weight
# The other families at shapes whose heads tensor=2 splits: Qwen3 (q/k norms, head_dim 8 of a
# hidden 32) and Llama with every bias.
FAMILY_CFGS = {"qwen2": CFG} | {
    name.split("_")[0]: DecoderConfig.from_hf_dict({"model_type": FAMILY_SHAPES[name][0],
                                                   **FAMILY_SHAPES[name][1]})
    for name in ("qwen3_tied_gqa2", "llama_untied_hd24_gqa1_bias")}


def tiny_model(seed=0, cfg=CFG):
    return CausalLM(cfg, rngs=nnx.Rngs(seed))


def random_batch(rows=8, seed=0, vocab=CFG.vocab_size):
    rng = np.random.RandomState(seed)
    prompts = [list(rng.randint(0, vocab, rng.randint(3, 12))) for _ in range(rows)]
    responses = [list(rng.randint(0, vocab, rng.randint(1, 8))) for _ in range(rows)]
    adv = rng.randn(rows).astype(np.float32)
    return pack_rows(prompts, responses, adv, length_multiple=16)


def test_pack_rows_layout():
    b = pack_rows([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]], [0.5, -1.0], [[-.1, -.2], [-.3, -.4, -.5]],
                  pad_id=0, row_multiple=4, length_multiple=8)
    assert b.shape == (4, 8) and b.num_rows == 2
    np.testing.assert_array_equal(b.input_ids[0], [1, 2, 3, 5, 6, 0, 0, 0])
    np.testing.assert_array_equal(b.attention_mask[1], [1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(b.response_mask[1], [0, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(b.sample_logp[0, 3:5], [-.1, -.2])
    np.testing.assert_array_equal(b.advantages, [0.5, -1.0, 0, 0])
    assert b.response_mask[2:].sum() == 0  # padded rows are inert
    with pytest.raises(ValueError, match="empty prompt"):
        pack_rows([[]], [[1]], [0.0])
    with pytest.raises(ValueError, match="log-probs"):
        pack_rows([[1]], [[1, 2]], [0.0], [[0.0]])
    with pytest.raises(ValueError, match="does not fit the log-prob window of 2"):
        pack_rows([[1], [2]], [[1, 2], [1, 2, 3]], [0.0, 0.0], max_response=2)


def test_minibatches_cover_every_row_once_and_pad_with_inert_rows():
    idx = minibatch_indices(10, 4, np.random.default_rng(0))
    flat = np.concatenate(idx)
    assert [len(i) for i in idx] == [4, 4, 4]
    assert sorted(flat[flat >= 0]) == list(range(10)) and (flat < 0).sum() == 2
    b = random_batch(10)
    a = b.arrays()
    rows = gather_rows(PolicyRows.of({**a, "old_logp": a["sample_logp"], "ref_logp": a["sample_logp"]}), idx[-1])
    pad = idx[-1] < 0
    assert rows.response_mask[pad].sum() == 0 and (rows.advantages[pad] == 0).all()


def test_typed_batches_declare_their_ranks_and_inert_fields():
    """The batch classes are the one place a field's rank and dtype are written: `spec` gives
    them (advantages per token with a critic; the row weights only for token-budget
    micro-batches), and an inert row zeroes masks, advantages and weights but not the ids."""
    from hgpo_jax.rl.batching import CriticRows, TokenRows

    spec = PolicyRows.spec(4, 16)
    assert spec.advantages.shape == (4,) and spec.old_logp.shape == (4, 16)
    assert spec.input_ids.dtype == np.int32 and spec.token_weight is None
    weighted = PolicyRows.spec(4, 16, token_advantages=True, weighted=True)
    assert weighted.advantages.shape == (4, 16) and weighted.agg_weight.shape == (4,)
    assert len(jax.tree.leaves(weighted)) == len(jax.tree.leaves(spec)) + 2
    assert [x.shape for x in jax.tree.leaves(CriticRows.spec(2, 3))] == [(2, 3)] * 5
    assert CriticRows.spec(2, 3, window=5).returns.shape == (2, 5)  # the response window
    with pytest.raises(ValueError, match="no fields"):
        TokenRows.spec(ndims={"advantages": 2})
    a = random_batch(4).arrays()
    rows = PolicyRows.of({**a, "old_logp": a["sample_logp"], "ref_logp": a["sample_logp"],
                          "token_weight": np.ones(4, np.float32), "agg_weight": np.ones(4, np.float32)})
    got = gather_rows(rows, np.array([1, -1]))
    assert isinstance(got, PolicyRows) and got.rows == 2
    for name in ("attention_mask", "response_mask", "advantages", "token_weight", "agg_weight"):
        assert not getattr(got, name)[1].any(), name
    np.testing.assert_array_equal(got.input_ids[1], a["input_ids"][0])  # ids kept: only masks matter


def test_token_logprobs_equal_log_softmax_of_the_full_logits():
    model = tiny_model()
    b = random_batch()
    ids, mask = jnp.asarray(b.input_ids), jnp.asarray(b.attention_mask)
    logits = model(ids, attention_mask=mask).astype(jnp.float32)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), ids[:, 1:, None], -1)[..., 0]
    for chunk in (5, 16, 128):  # chunk sizes that do and do not divide L
        lp = token_logprobs(model, ids, mask, chunk=chunk)
        assert lp.shape == ids.shape and (lp[:, 0] == 0).all()
        np.testing.assert_allclose(np.asarray(lp[:, 1:]), np.asarray(ref), atol=1e-5)


def full_logits_entropy(model, ids, mask):
    """Entropy of every next-token distribution from the whole [S, L, V] fp32 logits at once,
    shifted like the log-probs: [S, L - 1], column t - 1 for token t."""
    hidden, _ = model.hidden_states(ids, attention_mask=mask)
    logits = model.logits(hidden).astype(jnp.float32)[:, :-1]
    return -jnp.sum(jax.nn.softmax(logits) * jax.nn.log_softmax(logits), axis=-1)


def test_token_entropy_equals_the_full_logits_and_keeps_the_logprobs():
    model = tiny_model()
    b = random_batch()
    ids, mask = jnp.asarray(b.input_ids), jnp.asarray(b.attention_mask)
    ref = full_logits_entropy(model, ids, mask)
    assert float(ref.min()) > 0.1  # random weights: far from one-hot, a comparison that means something
    for chunk in (5, 16, 128):
        lp, ent = token_logprobs(model, ids, mask, chunk=chunk, with_entropy=True)
        assert ent.shape == ids.shape and ent.dtype == jnp.float32 and (ent[:, 0] == 0).all()
        np.testing.assert_allclose(np.asarray(ent[:, 1:]), np.asarray(ref), atol=1e-5)
        np.testing.assert_array_equal(np.asarray(lp), np.asarray(token_logprobs(model, ids, mask, chunk=chunk)))


@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_token_logprobs_at_a_temperature_are_those_of_the_tempered_softmax(temperature):
    """At the rollout temperature T the log-probs and entropies are those of softmax(logits / T),
    the distribution the sampler draws from (verl-agent's log-prob passes divide the logits by
    T), windowed or not; T = 1 is the plain softmax."""
    model = tiny_model()
    b = random_batch()
    ids, mask, rm = (jnp.asarray(x) for x in (b.input_ids, b.attention_mask, b.response_mask))
    hidden, _ = model.hidden_states(ids, attention_mask=mask)
    scaled = model.logits(hidden).astype(jnp.float32)[:, :-1] / temperature
    want_lp = jnp.take_along_axis(jax.nn.log_softmax(scaled), ids[:, 1:, None], -1)[..., 0]
    want_ent = -jnp.sum(jax.nn.softmax(scaled) * jax.nn.log_softmax(scaled), axis=-1)
    lp, ent = token_logprobs(model, ids, mask, chunk=5, with_entropy=True, temperature=temperature)
    np.testing.assert_allclose(np.asarray(lp[:, 1:]), np.asarray(want_lp), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent[:, 1:]), np.asarray(want_ent), atol=1e-5)
    plain = np.asarray(token_logprobs(model, ids, mask, chunk=5)[:, 1:])
    assert np.abs(np.asarray(lp[:, 1:]) - plain).max() > 0.1  # the temperature changes them
    graphdef, params = nnx.split(model, nnx.Param)
    windowed = make_logprob_fn(graphdef, window=8, temperature=temperature)(params, ids, mask, rm)
    np.testing.assert_allclose(np.asarray(windowed), np.asarray(lp) * np.asarray(rm), atol=1e-5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(model, ids, mask, temperature=0.0)


def test_train_step_scores_the_policy_at_the_loss_temperature():
    """The update's log-probs are taken at `LossConfig.temperature`: with the old and reference
    log-probs of the same temperature the first step's ratio is 1 (ppo_kl and the KL are 0);
    scored at another temperature they are not."""
    model = tiny_model()
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.sgd(0.0)
    batch = random_batch(8)
    mb = minibatch(make_logprob_fn(graphdef, temperature=0.7), params, batch, perturb=0.0)
    m = {}
    for temperature in (0.7, 1.0):
        step = make_train_step(graphdef, tx, LossConfig(temperature=temperature), 2)
        _, _, m[temperature] = step(jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], mb)
    assert abs(float(m[0.7]["train/ppo_kl"])) < 1e-6 and abs(float(m[0.7]["train/kl_loss"])) < 1e-6
    assert abs(float(m[1.0]["train/ppo_kl"])) > 1e-3 and float(m[1.0]["train/kl_loss"]) > 1e-3


@pytest.mark.parametrize("window,chunk", [(7, 128), (7, 3), (12, 5)])
def test_response_window_equals_every_position_on_the_response(window, chunk):
    """With a window (the vocabulary projection for the response positions only), log-probs,
    entropies and their gradients on the response tokens are those of the full computation, and
    every other position is 0; a row whose response ends near the padded length is fine."""
    b = random_batch(8)  # responses of 1..7 tokens
    ids, mask, rm = (jnp.asarray(x) for x in (b.input_ids, b.attention_mask, b.response_mask))
    model = tiny_model()
    full = token_logprobs(model, ids, mask, chunk=chunk, with_entropy=True)
    win = token_logprobs(model, ids, mask, chunk=chunk, with_entropy=True, response_mask=rm,
                         window=window)
    for f, w in zip(full, win):
        # float32 entropies reach ~5 here and the window's matmuls have other shapes (so another
        # summation order): allow a few ulps relative, as well as 1e-6 absolute near 0
        np.testing.assert_allclose(np.asarray(w), np.asarray(f * rm), rtol=2e-6, atol=1e-6)
        assert float(jnp.abs(w * (1 - rm)).max()) == 0.0
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, window):
        lp, ent = token_logprobs(nnx.merge(graphdef, p), ids, mask, chunk=chunk, with_entropy=True,
                                 response_mask=rm, window=window)
        return ((lp + 0.3 * ent) * rm).sum()

    (v0, g0), (v1, g1) = (jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, w)
                          for w in (None, window))
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-4), g1, g0)
    with pytest.raises(ValueError, match="needs the response_mask"):
        token_logprobs(model, ids, mask, window=window)


def test_windowed_train_step_and_logprob_fn_equal_the_full_ones():
    """The trainers' window (rollout.max_new_tokens) changes nothing but the cost."""
    graphdef, params, opt_state, step, logprob = setup_step()
    batch = random_batch(8)
    mb = minibatch(logprob, params, batch)
    a = batch.arrays()
    args = (params, a["input_ids"], a["attention_mask"], a["response_mask"])
    np.testing.assert_allclose(np.asarray(make_logprob_fn(graphdef, window=8)(*args)),
                               np.asarray(logprob(*args)) * a["response_mask"], atol=1e-6)
    tx = optax.sgd(0.1)  # updates linear in the gradients (Adam would amplify rounding on ~0 ones)
    windowed = make_train_step(graphdef, tx, LossConfig(entropy_coef=0.01), 2, window=8)
    full = make_train_step(graphdef, tx, LossConfig(entropy_coef=0.01), 2)
    p1, _, m1 = windowed(jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], mb)
    p0, _, m0 = full(jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], mb)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-4, atol=1e-6, err_msg=k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), p1, p0)


def test_token_entropy_gradient_equals_the_full_logits():
    """The chunked, rematerialized entropy has the gradient of the unchunked one."""
    b = random_batch(4)
    ids, mask = jnp.asarray(b.input_ids), jnp.asarray(b.attention_mask)
    w = jnp.asarray(b.response_mask)
    graphdef, params = nnx.split(tiny_model(), nnx.Param)
    chunked = lambda p: (token_logprobs(nnx.merge(graphdef, p), ids, mask, chunk=5,  # noqa: E731
                                        with_entropy=True)[1] * w).sum()
    full = lambda p: (full_logits_entropy(nnx.merge(graphdef, p), ids, mask) * w[:, 1:]).sum()  # noqa: E731
    (v0, g0), (v1, g1) = (jax.jit(jax.value_and_grad(f))(params) for f in (chunked, full))
    np.testing.assert_allclose(float(v0), float(v1), rtol=1e-5)
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, atol=1e-5, rtol=1e-4), g0, g1)


def setup_step(mesh=None, lr=1e-3, num_micro=2, cfg=CFG):
    model = tiny_model(cfg=cfg)
    model.batch_mesh = mesh  # as load_pretrained(mesh=...) sets it: activations split by batch
    graphdef, params = nnx.split(model, nnx.Param)
    params = shard_params(params, mesh)
    tx = make_optimizer(lr)
    shard = param_shardings(mesh, params) if mesh is not None else None
    opt_state, opt_shard = init_opt_state(tx, params, mesh)
    step = make_train_step(graphdef, tx, LossConfig(), num_micro, mesh, shard, opt_shard)
    logprob = make_logprob_fn(graphdef, mesh, shard)
    return graphdef, params, opt_state, step, logprob


def minibatch(logprob, params, batch, perturb=0.05):
    a = batch.arrays()
    old = np.asarray(logprob(params, a["input_ids"], a["attention_mask"], a["response_mask"]))
    rng = np.random.RandomState(1)
    return PolicyRows(input_ids=a["input_ids"], attention_mask=a["attention_mask"],
                      response_mask=a["response_mask"], advantages=a["advantages"],
                      old_logp=old + perturb * rng.randn(*old.shape).astype(np.float32),
                      ref_logp=old - perturb * rng.rand(*old.shape).astype(np.float32))


def test_train_step_updates_params_and_lowers_the_loss():
    graphdef, params, opt_state, step, logprob = setup_step(lr=3e-3)
    mb = minibatch(logprob, params, random_batch(8), perturb=0.0)
    before = jax.tree.map(np.asarray, params)
    losses = []
    for _ in range(4):
        params, opt_state, m = step(params, opt_state, mb)
        losses.append(float(m["train/loss"]))
        assert m["train/skipped_nonfinite"] == 0
    assert losses[-1] < losses[0]
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, params)
    assert all(jax.tree.leaves(changed))
    for key in ("train/pg_loss", "train/kl_loss", "train/pg_clipfrac", "train/ppo_kl",
                "train/grad_norm", "train/entropy"):
        assert np.isfinite(float(m[key])), key
    assert float(m["train/entropy"]) > 0


def test_train_step_entropy_bonus():
    """loss = pg - entropy_coef * entropy + kl: the same first step with and without the bonus
    differs by exactly that term, and the logged entropy is the response tokens' mean entropy."""
    batch = random_batch(8)
    out = {}
    for coef in (0.0, 0.5):
        model = tiny_model()
        graphdef, params = nnx.split(model, nnx.Param)
        tx = make_optimizer(1e-3)
        opt_state, _ = init_opt_state(tx, params)
        step = make_train_step(graphdef, tx, LossConfig(entropy_coef=coef), 2)
        mb = minibatch(make_logprob_fn(graphdef), params, batch)
        _, ent = token_logprobs(model, jnp.asarray(mb.input_ids), jnp.asarray(mb.attention_mask),
                                with_entropy=True)
        ent, rm = np.asarray(ent), mb.response_mask
        # the step averages the micro-batches' token-means; micro-batch j holds rows j, j + 2, ...
        want_ent = np.mean([(ent[j::2] * rm[j::2]).sum() / rm[j::2].sum() for j in range(2)])
        _, _, m = step(params, opt_state, mb)
        out[coef] = m
        np.testing.assert_allclose(float(m["train/entropy"]), want_ent, rtol=1e-5)
    # same parameters and batch: pg and kl terms are identical, the loss moves by coef * entropy
    m0, m1 = out[0.0], out[0.5]
    for key in ("train/pg_loss", "train/kl_loss", "train/entropy"):
        np.testing.assert_allclose(float(m1[key]), float(m0[key]), rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(float(m1["train/loss"]), float(m0["train/loss"]) - 0.5 * float(m0["train/entropy"]),
                               rtol=1e-5, atol=1e-6)
    assert float(m0["train/entropy"]) > 0.1
    assert float(m1["train/grad_norm"]) != float(m0["train/grad_norm"])  # the bonus is differentiated


def test_nonfinite_loss_skips_the_update():
    graphdef, params, opt_state, step, logprob = setup_step()
    mb = minibatch(logprob, params, random_batch(8))
    mb = mb.replace(advantages=mb.advantages.copy())
    mb.advantages[0] = np.nan
    before = jax.tree.map(np.asarray, params)
    opt_before = jax.tree.map(np.asarray, opt_state)
    params, opt_state, m = step(params, opt_state, mb)
    assert float(m["train/skipped_nonfinite"]) == 1.0
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, params))
    jax.tree.map(np.testing.assert_array_equal, opt_before, jax.tree.map(np.asarray, opt_state))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.tree.map(np.asarray, params)))


@pytest.mark.parametrize("family", sorted(FAMILY_CFGS))
def test_sharded_step_equals_single_device(family):
    """Two devices (fsdp=2) and mesh data=2, fsdp=2, tensor=2 over 8 host devices: the same loss
    and parameters as 1 device, for every model family."""
    assert len(jax.devices()) == 8
    cfg = FAMILY_CFGS[family]
    batch = random_batch(8, vocab=cfg.vocab_size)
    results = []
    for mesh in (None, make_mesh(fsdp=2), make_mesh(data=2, fsdp=2, tensor=2)):
        graphdef, params, opt_state, step, logprob = setup_step(mesh, cfg=cfg)
        mb = minibatch(logprob, params, batch)
        for _ in range(2):
            params, opt_state, m = step(params, opt_state, mb)
        if mesh is not None:
            q = params["model"]["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
            assert len(q.sharding.device_set) == mesh.size and not q.sharding.is_fully_replicated
        results.append((float(m["train/loss"]), jax.tree.map(np.asarray, params)))
    loss1, p1 = results[0]
    for loss_n, p_n in results[1:]:
        assert abs(loss1 - loss_n) <= 1e-5 * max(1.0, abs(loss1))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), p1, p_n)


def test_optimizer_schedules():
    for schedule in ("constant", "cosine"):
        tx = make_optimizer(1e-3, warmup_steps=2, schedule=schedule, total_steps=10)
        params = {"w": jnp.ones(3)}
        state = tx.init(params)
        updates, _ = tx.update({"w": jnp.ones(3)}, state, params)
        assert np.isfinite(np.asarray(updates["w"])).all()
    with pytest.raises(ValueError, match="schedule"):
        make_optimizer(1e-3, schedule="linear")
    assert isinstance(make_optimizer(1e-3), optax.GradientTransformation)


def test_remat_changes_no_value_or_gradient():
    b = random_batch(4)
    ids, mask = jnp.asarray(b.input_ids), jnp.asarray(b.attention_mask)
    results = []
    for remat in (False, True):
        graphdef, params = nnx.split(CausalLM(CFG, rngs=nnx.Rngs(0), remat=remat), nnx.Param)
        f = lambda p: (token_logprobs(nnx.merge(graphdef, p), ids, mask) * b.response_mask).sum()  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(f))(params))
    (v0, g0), (v1, g1) = results
    np.testing.assert_allclose(float(v0), float(v1), rtol=1e-6)
    jax.tree.map(lambda a, c: np.testing.assert_allclose(a, c, atol=1e-6), g0, g1)
