"""PPO with a critic: the value model (HF Qwen2ForTokenClassification as the reference), GAE, the
advantage whitening and the clipped value loss against plain NumPy references."""

import json
import os
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_models import TINY_SHAPES, build_hf_model
from transformers import AutoModelForTokenClassification

from hgpo_jax.models import CriticModel, load_pretrained, save_pretrained


def test_critic_from_a_causal_lm_folder_exports_as_token_classification(tmp_path):
    """The critic starts from the policy's folder (backbone loaded, LM head never read, a new
    N(0, 0.02) head with zero bias), exports as transformers' Qwen2ForTokenClassification (one
    label) whose outputs are our values, and loads back with its head."""
    for name in ("untied_gqa1", "tied_gqa2"):
        src = tmp_path / f"lm-{name}"
        build_hf_model(TINY_SHAPES[name], src)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an unused lm_head.weight is expected, not warned about
            critic = load_pretrained(src, critic=True, seed=3)
        policy = load_pretrained(src)
        assert isinstance(critic, CriticModel) and critic.lm_head is None
        np.testing.assert_array_equal(np.asarray(critic.model.embed_tokens.embedding[...]),
                                      np.asarray(policy.model.embed_tokens.embedding[...]))
        kernel, bias = np.asarray(critic.score.kernel[...]), np.asarray(critic.score.bias[...])
        assert kernel.shape == (TINY_SHAPES[name]["hidden_size"], 1) and (bias == 0).all()
        assert 0.01 < kernel.std() < 0.03
        with pytest.raises(TypeError, match="no LM head"):
            critic.logits(jnp.zeros((1, 1, kernel.shape[0])))

        ids = np.random.RandomState(0).randint(0, TINY_SHAPES[name]["vocab_size"], (2, 9))
        mask = np.ones_like(ids)
        mask[1, 6:] = 0
        ours = np.asarray(critic(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
        assert ours.shape == (2, 9) and ours.dtype == np.float32

        out = tmp_path / f"critic-{name}"
        save_pretrained(critic, out)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen2ForTokenClassification"] and len(cfg["id2label"]) == 1
        hf = AutoModelForTokenClassification.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits[..., 0].numpy()
        np.testing.assert_allclose(ours * mask, ref * mask, atol=2e-5)
        again = load_pretrained(out, critic=True, seed=99)  # the exported head, not a new one
        np.testing.assert_array_equal(np.asarray(again.score.kernel[...]), kernel)
        assert not os.path.exists(out / "lm_head.safetensors")


# ------------------------------------------------------------------ NumPy references (verl's loops)
def np_gae(rewards, values, gamma, lam):
    S, W = rewards.shape
    adv, last = np.zeros((S, W)), np.zeros(S)
    for t in reversed(range(W)):
        nxt = values[:, t + 1] if t < W - 1 else 0.0
        last = rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


def np_whiten(x, mask):
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / n * n / (n - 1)
    return (x - mean) / np.sqrt(var + 1e-8)


def random_rows(seed, window=6, rows=7):
    """Right-padded rows (prompt, response) with responses of 1..window tokens (one truncated at
    the window, one inert padding row); episode rewards with penalties; values on the value mask."""
    from hgpo_jax.rl.batching import pack_rows

    rng = np.random.RandomState(seed)
    lengths = [window, 1] + list(rng.randint(1, window + 1, rows - 3))
    prompts = [list(rng.randint(1, 50, rng.randint(2, 9))) for _ in lengths]
    responses = [list(rng.randint(1, 50, n)) for n in lengths]
    b = pack_rows(prompts, responses, np.zeros(len(lengths)), row_multiple=rows, length_multiple=8)
    rewards = np.array([rng.choice([0.0, 10.0]) - 0.1 * rng.randint(0, 2) for _ in lengths] + [0.0])
    L = np.array(lengths + [0])
    t = np.arange(window)[None]
    token_mask, value_mask = (t < L[:, None]).astype(float), ((t <= L[:, None]) & (L[:, None] > 0)).astype(float)
    values = rng.randn(rows, window) * 3 * value_mask
    return b, rewards.astype(np.float32), values.astype(np.float32), L, token_mask, value_mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.95, 0.9), (0.99, 0.0)])
def test_gae_and_whitening_equal_verls_loops(gamma, lam):
    from hgpo_jax.rl.critic import gae_advantages, make_gae_fn, window_masks

    for seed in range(3):
        b, rewards, values, L, token_mask, value_mask = random_rows(seed)
        W = values.shape[1]
        tm, vm = (np.asarray(m) for m in window_masks(jnp.asarray(b.response_mask), W))
        np.testing.assert_array_equal(tm, token_mask)
        np.testing.assert_array_equal(vm, value_mask)
        r = np.zeros_like(values)
        for i, n in enumerate(L):
            if n:
                r[i, n - 1] = rewards[i]
        want_adv, want_ret = np_gae(r, values, gamma, lam)
        want_adv = np_whiten(want_adv, token_mask)
        adv_rows, ret, metrics = make_gae_fn(W, gamma, lam)(rewards, values, b.response_mask)
        np.testing.assert_allclose(np.asarray(ret), want_ret, atol=1e-5)
        adv_rows = np.asarray(adv_rows)
        for i, n in enumerate(L):  # the window's advantages sit on the row's response tokens
            pos = np.flatnonzero(b.response_mask[i])
            np.testing.assert_allclose(adv_rows[i, pos], want_adv[i, :n], atol=1e-5)
            assert (adv_rows[i, b.response_mask[i] == 0] == 0).all()
        if gamma == lam == 1.0:  # the closed form: A = r - V, return = r on every response token
            raw = (want_ret - values) * token_mask
            np.testing.assert_allclose(raw, (r.sum(1, keepdims=True) - values) * token_mask, atol=1e-5)
        np.testing.assert_allclose(float(metrics["critic/returns_mean"]),
                                   (want_ret * token_mask).sum() / token_mask.sum(), rtol=1e-5)
        unjitted = gae_advantages(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(b.response_mask),
                                  W, gamma, lam)
        np.testing.assert_allclose(np.asarray(unjitted[0]), adv_rows, atol=1e-6)


def test_clipped_value_loss_equals_the_numpy_reference():
    from hgpo_jax.rl.critic import value_loss

    rng = np.random.RandomState(0)
    for clip in (0.5, 0.1):
        vpred, old, ret = (rng.randn(5, 6).astype(np.float32) * s for s in (2, 2, 4))
        mask = (rng.rand(5, 6) < 0.7).astype(np.float32)
        loss, m = value_loss(jnp.asarray(vpred), jnp.asarray(old), jnp.asarray(ret), jnp.asarray(mask), clip)
        clipped = np.clip(vpred, old - clip, old + clip)
        l1, l2 = (vpred - ret) ** 2, (clipped - ret) ** 2
        np.testing.assert_allclose(float(loss), (np.maximum(l1, l2) * mask).sum() / mask.sum(), rtol=1e-5)
        np.testing.assert_allclose(float(m["vf_clipfrac"]), ((l2 > l1) * mask).sum() / mask.sum(), rtol=1e-5)
        assert 0 < float(m["vf_clipfrac"]) < 1


def test_token_values_read_the_state_before_each_response_token():
    """V_t is the head's output at the token before response token t (the last prompt token for
    t = 0), kept for t <= L; the gradient step lowers the value loss."""
    from flax import nnx

    from hgpo_jax.models import DecoderConfig
    from hgpo_jax.rl.batching import CriticRows
    from hgpo_jax.rl.critic import make_critic_step, make_value_fn, token_values, window_masks
    from hgpo_jax.rl.update import make_optimizer

    critic = CriticModel(DecoderConfig(**TINY_SHAPES["tied_gqa2"]), rngs=nnx.Rngs(1))
    b, rewards, _, L, _, value_mask = random_rows(0, window=6)
    ids, att, rm = (jnp.asarray(x) for x in (b.input_ids, b.attention_mask, b.response_mask))
    full = np.asarray(critic(ids, attention_mask=att))                     # [S, L] per position
    got = np.asarray(token_values(critic, ids, att, rm, 6))
    for i, n in enumerate(L):
        if n:
            start = int(np.flatnonzero(b.response_mask[i])[0])
            np.testing.assert_allclose(got[i, :n + 1 if n < 6 else 6],
                                       full[i, start - 1:start + min(n, 5)], atol=1e-6)
        assert (got[i][value_mask[i] == 0] == 0).all()
    graphdef, params = nnx.split(critic, nnx.Param)
    values = make_value_fn(graphdef, 6)(params, ids, att, rm)
    np.testing.assert_allclose(np.asarray(values), got, atol=1e-6)
    tx = make_optimizer(1e-2)
    step = make_critic_step(graphdef, tx, 0.5, 6, num_micro=1)
    returns = jnp.asarray(np.where(value_mask > 0, 3.0, 0.0), jnp.float32)
    mb = CriticRows(input_ids=ids, attention_mask=att, response_mask=rm, values=values, returns=returns)
    opt = tx.init(params)
    losses = []
    for _ in range(5):
        params, opt, m = step(params, opt, mb)
        mb = mb.replace(values=make_value_fn(graphdef, 6)(params, ids, att, rm))
        losses.append(float(m["train/vf_loss"]))
    assert losses[-1] < losses[0] and 0 <= float(m["train/vf_clipfrac"]) <= 1
    assert window_masks(rm, 6)[1].shape == (7, 6)


def test_critic_from_policy_copies_the_backbone_and_adds_a_head():
    from flax import nnx

    from hgpo_jax.models import DecoderConfig, CausalLM
    from hgpo_jax.models.critic import critic_from_policy

    for scan in (False, True):
        policy = CausalLM(DecoderConfig(**TINY_SHAPES["untied_gqa1"]), rngs=nnx.Rngs(0),
                                  scan_layers=scan, remat=True)
        critic = critic_from_policy(policy, seed=5)
        assert critic.scan_layers == scan and critic.remat and critic.lm_head is None
        p, c = (dict(nnx.to_flat_state(nnx.state(m.model, nnx.Param))) for m in (policy, critic))
        assert p.keys() == c.keys()
        for k in p:
            np.testing.assert_array_equal(np.asarray(p[k][...]), np.asarray(c[k][...]))
        assert float(np.abs(np.asarray(critic.score.bias[...])).max()) == 0.0
        ids = jnp.asarray(np.random.RandomState(0).randint(0, 150, (2, 5)))
        hidden, _ = policy.hidden_states(ids)
        np.testing.assert_allclose(np.asarray(critic(ids)), np.asarray(critic.values(hidden)), atol=1e-6)
        # a copy: training the critic leaves the policy alone
        c_leaf = critic.model.embed_tokens.embedding
        c_leaf[...] = c_leaf[...] + 1.0
        assert not np.array_equal(np.asarray(c_leaf[...]), np.asarray(policy.model.embed_tokens.embedding[...]))
