"""ppo_kl_loss against a plain NumPy implementation (value, metrics and gradient), its entropy bonus
against PyTorch autograd (value and gradient with respect to the logits), and jit caching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hgpo_jax.rl import AGGS, KL_TYPES, ppo_kl_loss, ppo_kl_loss_jit, softmax_entropy

S, L, V = 6, 9, 13
CLIP_LOW, CLIP_HIGH, DUAL, KL_COEF, ENT_COEF = 0.2, 0.28, 3.0, 0.05, 0.05


# ----------------------------------------------------------------------------------------------
# NumPy reference (float64): value and analytic gradient with respect to logp


def np_aggregate_weights(mask, agg):
    """w [S, L] with agg(x) = sum(w * x)."""
    if agg == "token-mean":
        return mask / mask.sum() if mask.sum() > 0 else np.zeros_like(mask)
    tokens = mask.sum(axis=1, keepdims=True)
    nonempty = (tokens > 0).sum()
    if nonempty == 0:
        return np.zeros_like(mask)
    return np.where(tokens > 0, mask / np.where(tokens > 0, tokens, 1.0), 0.0) / nonempty


def np_kl(logp, ref, kl_type):
    """(value [S, L], d value / d logp [S, L])."""
    if kl_type == "low_var_kl":
        x = ref - logp
        raw = np.exp(x) - x - 1.0
        value = np.clip(raw, -10.0, 10.0)
        grad = np.where((raw > -10.0) & (raw < 10.0), 1.0 - np.exp(x), 0.0)
        return value, grad
    if kl_type == "kl":
        return logp - ref, np.ones_like(logp)
    if kl_type == "mse":
        return 0.5 * (logp - ref) ** 2, logp - ref
    raise AssertionError(kl_type)


def np_ppo_kl_loss(logp, old, ref, adv, mask, *, kl_type, agg, dual_clip=DUAL, kl_coef=KL_COEF):
    """(loss, metrics, d loss / d logp) in float64."""
    A = adv[:, None] * np.ones_like(logp) if adv.ndim == 1 else adv
    log_ratio = np.clip(logp - old, -20.0, 20.0)
    ratio = np.exp(log_ratio)
    d_ratio = np.where(np.abs(logp - old) < 20.0, ratio, 0.0)
    clipped = np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    pg1, pg2 = -A * ratio, -A * clipped
    d_pg1 = -A * d_ratio
    d_pg2 = np.where((ratio > 1 - CLIP_LOW) & (ratio < 1 + CLIP_HIGH), d_pg1, 0.0)
    pg = np.maximum(pg1, pg2)
    d_pg = np.where(pg1 >= pg2, d_pg1, d_pg2)
    if dual_clip is not None:
        dual_active = (A < 0) & (-A * dual_clip < pg)
        pg = np.where(dual_active, -A * dual_clip, pg)
        d_pg = np.where(dual_active, 0.0, d_pg)
    kl, d_kl = np_kl(logp, ref, kl_type)
    w = np_aggregate_weights(mask, agg)
    pg_loss, kl_loss = np.sum(w * pg), np.sum(w * kl)
    token_w = np_aggregate_weights(mask, "token-mean")
    metrics = {
        "pg_loss": pg_loss,
        "kl_loss": kl_loss,
        "pg_clipfrac": np.sum(token_w * (pg2 > pg1)),
        "ppo_kl": np.sum(token_w * -log_ratio),
    }
    return pg_loss + kl_coef * kl_loss, metrics, w * (d_pg + kl_coef * d_kl)


def make_inputs(seed, adv_shape="seq"):
    """float32 inputs [S, L] with clipped, unclipped and dual-clipped tokens, masked zeros, an empty
    sequence and a few low_var_kl values past the clamp."""
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (S, L))
    logp = old + rng.normal(0.0, 0.35, (S, L))
    logp[0, :4] = old[0, :4] + np.array([1.5, 1.3, 2.0, -0.5])  # ratio > 3 on a negative-A row
    ref = logp + rng.normal(0.0, 0.5, (S, L))
    logp[1, 2:4] = old[1, 2:4] + 0.5  # ratio 1.65 on a positive-A row: upper clip
    ref[1, :2] = logp[1, :2] + 3.5  # exp(x) - x - 1 > 10: clamped
    mask = (rng.random((S, L)) < 0.8).astype(np.float32)
    mask[0, :4] = 1.0
    mask[1, :4] = 1.0
    mask[S - 1] = 0.0  # an empty sequence
    if adv_shape == "seq":
        adv = rng.normal(0.0, 1.0, S)
        adv[0], adv[1] = -1.2, 0.8
    else:
        adv = rng.normal(0.0, 1.0, (S, L))
        adv[0, :4], adv[1, :4] = -1.2, 0.8
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return f32(logp), f32(old), f32(ref), f32(adv), f32(mask)


def as64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


@pytest.mark.parametrize("adv_shape", ["seq", "token"])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_value_metrics_and_grad_match_numpy(kl_type, agg, adv_shape):
    for seed in range(3):
        logp, old, ref, adv, mask = make_inputs(seed, adv_shape)
        want_loss, want_metrics, want_grad = np_ppo_kl_loss(*as64(logp, old, ref, adv, mask), kl_type=kl_type, agg=agg)

        # the data exercises every branch
        A = adv[:, None] if adv.ndim == 1 else adv
        ratio = np.exp(logp.astype(np.float64) - old)
        assert np.any((A < 0) & (ratio > DUAL) & (mask > 0)), "dual clip active somewhere"
        assert np.any((ratio > 1 + CLIP_HIGH) & (A > 0) & (mask > 0)), "upper clip active somewhere"
        assert np.any((np.abs(ratio - 1) < 0.1) & (mask > 0)), "unclipped tokens"
        assert np.any(mask == 0)

        def loss_fn(lp):
            return ppo_kl_loss(lp, old, ref, adv, mask, clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL,
                               kl_coef=KL_COEF, kl_type=kl_type, agg=agg)

        (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(logp))
        assert loss.shape == () and loss.dtype == jnp.float32
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=1e-6)
        for name in ("pg_loss", "kl_loss", "pg_clipfrac", "ppo_kl"):
            np.testing.assert_allclose(float(metrics[name]), want_metrics[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)

        # without the KL term, clipped and dual-clipped tokens get exactly zero gradient
        pg_grad = jax.grad(lambda lp: ppo_kl_loss(lp, old, ref, adv, mask, clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                                                  kl_coef=0.0, agg=agg)[0])(jnp.asarray(logp))
        want_pg_grad = np_ppo_kl_loss(*as64(logp, old, ref, adv, mask), kl_type=kl_type, agg=agg, kl_coef=0.0)[2]
        np.testing.assert_allclose(np.asarray(pg_grad), want_pg_grad, rtol=1e-4, atol=1e-7)
        assert np.any((np.asarray(pg_grad) == 0.0) & (mask > 0)), "some counted tokens are clipped"


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_numpy_gradient_formula_matches_finite_differences(kl_type, agg):
    """Checks the reference itself: its analytic gradient against central differences (float64)."""
    logp, old, ref, adv, mask = as64(*make_inputs(0))
    _, _, grad = np_ppo_kl_loss(logp, old, ref, adv, mask, kl_type=kl_type, agg=agg)
    h = 1e-6
    fd = np.zeros_like(logp)
    for i in range(S):
        for j in range(L):
            up, down = logp.copy(), logp.copy()
            up[i, j] += h
            down[i, j] -= h
            fd[i, j] = (np_ppo_kl_loss(up, old, ref, adv, mask, kl_type=kl_type, agg=agg)[0]
                        - np_ppo_kl_loss(down, old, ref, adv, mask, kl_type=kl_type, agg=agg)[0]) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-8)


def test_seq_mean_weights_sequences_equally():
    # two sequences: one token with pg loss 1, and three tokens with pg loss 0 -> seq-mean .5,
    # token-mean .25
    logp = jnp.zeros((2, 3))
    adv = jnp.array([-1.0, 0.0])
    mask = jnp.array([[1.0, 0, 0], [1, 1, 1]])
    kw = dict(kl_coef=0.0)
    assert float(ppo_kl_loss(logp, logp, logp, adv, mask, agg="seq-mean", **kw)[0]) == pytest.approx(0.5)
    assert float(ppo_kl_loss(logp, logp, logp, adv, mask, agg="token-mean", **kw)[0]) == pytest.approx(0.25)


def test_dual_clip_bounds_negative_advantage_loss():
    logp, old, ref, adv, mask = make_inputs(0)
    kw = dict(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, kl_coef=0.0)
    on = ppo_kl_loss(logp, old, ref, adv, mask, **kw)[0]
    off = ppo_kl_loss(logp, old, ref, adv, mask, dual_clip=None, **kw)[0]
    want_off = np_ppo_kl_loss(*as64(logp, old, ref, adv, mask), kl_type="kl", agg="token-mean", dual_clip=None)[1]
    assert float(off) > float(on)
    np.testing.assert_allclose(float(off), want_off["pg_loss"], rtol=1e-5)


def test_empty_mask_gives_zero_not_nan():
    logp, old, ref, adv, mask = make_inputs(1)
    zero = np.zeros_like(mask)
    for agg in AGGS:
        (loss, metrics), grad = jax.value_and_grad(
            lambda lp: ppo_kl_loss(lp, old, ref, adv, zero, agg=agg), has_aux=True)(jnp.asarray(logp))
        assert float(loss) == 0.0 and all(float(v) == 0.0 for v in metrics.values())
        np.testing.assert_array_equal(np.asarray(grad), 0.0)
        ent = np.abs(logp)  # any non-negative values
        (loss, metrics), (grad, ent_grad) = jax.value_and_grad(
            lambda lp, e: ppo_kl_loss(lp, old, ref, adv, zero, agg=agg, entropy=e, entropy_coef=0.1),
            argnums=(0, 1), has_aux=True)(jnp.asarray(logp), jnp.asarray(ent))
        assert float(loss) == 0.0 and float(metrics["entropy"]) == 0.0
        np.testing.assert_array_equal(np.asarray(grad), 0.0)
        np.testing.assert_array_equal(np.asarray(ent_grad), 0.0)


def test_bad_options_and_shapes_raise():
    logp, old, ref, adv, mask = make_inputs(0)
    with pytest.raises(ValueError, match="kl_type"):
        ppo_kl_loss(logp, old, ref, adv, mask, kl_type="k4")
    with pytest.raises(ValueError, match="agg"):
        ppo_kl_loss(logp, old, ref, adv, mask, agg="seq-sum")
    with pytest.raises(ValueError, match="kl_type"):  # at trace time under jit, too
        ppo_kl_loss_jit(logp, old, ref, adv, mask, kl_type="k4")
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_kl_loss(logp, old, ref, adv, mask, dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages"):
        ppo_kl_loss(logp, old, ref, adv[:-1], mask)
    with pytest.raises(ValueError, match="mask"):
        ppo_kl_loss(logp, old, ref, adv, mask[:, :-1])
    with pytest.raises(ValueError, match="entropy must have"):
        ppo_kl_loss(logp, old, ref, adv, mask, entropy=logp[:, :-1], entropy_coef=0.1)
    with pytest.raises(ValueError, match="entropy_coef=0.1 needs an entropy"):
        ppo_kl_loss(logp, old, ref, adv, mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="needs an entropy"):  # a traced coefficient, even 0
        ppo_kl_loss_jit(logp, old, ref, adv, mask, entropy_coef=0.0)


def test_jit_compiles_once_per_shape():
    traces = []

    def counted(logp, old, ref, adv, mask, kl_coef):
        traces.append(logp.shape)  # runs only while tracing
        return ppo_kl_loss(logp, old, ref, adv, mask, kl_coef=kl_coef)

    step = jax.jit(jax.value_and_grad(counted, has_aux=True))
    for seed in range(4):
        (loss, _), grad = step(*make_inputs(seed), 0.01 * seed)
        assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
    assert len(traces) == 1 and step._cache_size() == 1

    logp, old, ref, adv, mask = make_inputs(0)
    step(logp[:3], old[:3], ref[:3], adv[:3], mask[:3], 0.01)  # new shape: compiles again
    assert len(traces) == 2 and step._cache_size() == 2
    step(logp[:3], old[:3], ref[:3], adv[:3], mask[:3], 0.02)
    assert len(traces) == 2

    before = ppo_kl_loss_jit._cache_size()
    for seed in range(3):  # numeric options are traced, not static: no recompiles
        ppo_kl_loss_jit(*make_inputs(seed), clip_low=0.1 + 0.01 * seed, kl_coef=0.01 * seed)
    assert ppo_kl_loss_jit._cache_size() == before + 1


# ----------------------------------------------------------------------------------------------
# The entropy bonus: loss = agg(pg) - entropy_coef * agg(entropy) + kl_coef * agg(kl), with
# entropy the full-softmax entropy of the logits at each position, differentiated


def entropy_inputs(seed):
    """float32 logits [S, L, V] (ordinary, very peaked and large-offset rows), targets [S, L], and
    old/ref log-probs, advantages and mask from make_inputs."""
    rng = np.random.default_rng(100 + seed)
    logits = rng.normal(0.0, 2.0, (S, L, V))
    logits[2] *= 15.0  # nearly one-hot distributions: entropy close to 0
    logits[3] += 60.0  # a large common offset: logsumexp and sum p z are both about 60
    logits[4, :, :3] -= 40.0  # a few negligible classes
    targets = rng.integers(0, V, (S, L))
    # the peaked row samples its likely tokens (an unlikely one would have logp near -100, and
    # low_var_kl's exp(ref - logp) would overflow float32)
    targets[2] = logits[2].argmax(-1)
    _, old, ref, adv, mask = make_inputs(seed)
    return np.asarray(logits, np.float32), targets, old, ref, adv, mask


def jax_logp(logits, targets):
    return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), jnp.asarray(targets)[..., None], -1)[..., 0]


def torch_logp_and_entropy(logits, targets):
    """float64 torch tensors (requires_grad) -> (logits, token log-probs [S, L], entropies [S, L])."""
    z = torch.tensor(np.asarray(logits, np.float64), requires_grad=True)
    dist = torch.distributions.Categorical(logits=z)
    return z, dist.log_prob(torch.as_tensor(targets)), dist.entropy()


def test_entropy_from_logits_matches_torch():
    for seed in range(3):
        logits = entropy_inputs(seed)[0]
        _, _, want = torch_logp_and_entropy(logits, np.zeros((S, L), np.int64))
        got = softmax_entropy(jnp.asarray(logits))
        assert got.shape == (S, L) and got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=2e-6)
        assert np.all(np.asarray(got) >= 0)
    # the two extremes: uniform gives log V, one-hot gives 0
    np.testing.assert_allclose(float(softmax_entropy(jnp.zeros(V))), np.log(V), rtol=1e-6)
    assert float(softmax_entropy(jnp.array([0.0, 200.0, 0.0]))) == 0.0


@pytest.mark.parametrize("agg", AGGS)
def test_entropy_term_value_metric_and_gradient_match_torch(agg):
    for seed in range(3):
        logits, targets, old, ref, adv, mask = entropy_inputs(seed)
        w = torch.tensor(np_aggregate_weights(np.asarray(mask, np.float64), agg))  # agg(x) = sum(w * x)

        # (1) the entropy term alone, logp fixed: loss(z) = const - ENT_COEF * agg(H(z))
        z, _, ent = torch_logp_and_entropy(logits, targets)
        want_ent_agg = (w * ent).sum()
        (-ENT_COEF * want_ent_agg).backward()
        want_ent_agg = want_ent_agg.item()
        logp = np.asarray(jax_logp(jnp.asarray(logits), targets))
        kw = dict(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=DUAL, kl_coef=KL_COEF, agg=agg)

        def ent_only(zz):
            return ppo_kl_loss(logp, old, ref, adv, mask, entropy=softmax_entropy(zz), entropy_coef=ENT_COEF, **kw)

        (loss, metrics), grad = jax.value_and_grad(ent_only, has_aux=True)(jnp.asarray(logits))
        base = float(ppo_kl_loss(logp, old, ref, adv, mask, **kw)[0])
        np.testing.assert_allclose(float(metrics["entropy"]), want_ent_agg, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(loss), base - ENT_COEF * want_ent_agg, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), z.grad.numpy(), rtol=1e-4, atol=1e-8)
        assert np.abs(z.grad.numpy()).max() > 1e-4  # the term has a real gradient to compare
        np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)

        # (2) the whole loss with logp = log_softmax(z)[target] as well: the NumPy reference gives
        # d loss / d logp, torch autograd carries it and the entropy term back to the logits
        z, logp_t, ent = torch_logp_and_entropy(logits, targets)
        logp64 = logp_t.detach().numpy()
        want_loss, want_metrics, d_logp = np_ppo_kl_loss(logp64, *as64(old, ref, adv, mask), kl_type="low_var_kl",
                                                         agg=agg)
        want_ent_agg = (w * ent).sum()
        ((torch.tensor(d_logp) * logp_t).sum() - ENT_COEF * want_ent_agg).backward()
        want_ent_agg = want_ent_agg.item()

        def full(zz):
            return ppo_kl_loss(jax_logp(zz, targets), old, ref, adv, mask, entropy=softmax_entropy(zz),
                               entropy_coef=ENT_COEF, **kw)

        (loss, metrics), grad = jax.value_and_grad(full, has_aux=True)(jnp.asarray(logits))
        np.testing.assert_allclose(float(loss), want_loss - ENT_COEF * want_ent_agg, rtol=1e-5, atol=1e-6)
        for name in ("pg_loss", "kl_loss"):
            np.testing.assert_allclose(float(metrics[name]), want_metrics[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(float(metrics["entropy"]), want_ent_agg, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), z.grad.numpy(), rtol=1e-4, atol=1e-7)


def test_entropy_coef_zero_is_exactly_the_old_loss():
    for agg in AGGS:
        logits, targets, old, ref, adv, mask = entropy_inputs(0)
        logp = jnp.asarray(make_inputs(0)[0])
        ent = softmax_entropy(jnp.asarray(logits))
        kw = dict(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, kl_coef=KL_COEF, agg=agg)
        old_fn = jax.value_and_grad(lambda lp: ppo_kl_loss(lp, old, ref, adv, mask, **kw), has_aux=True)
        (loss0, m0), g0 = old_fn(logp)
        assert "entropy" not in m0  # no entropy given: no metric
        for coef in (0, 0.0):  # a Python zero: no term at all
            (loss, m), (g, g_ent) = jax.value_and_grad(
                lambda lp, e, c=coef: ppo_kl_loss(lp, old, ref, adv, mask, entropy=e, entropy_coef=c, **kw),
                argnums=(0, 1), has_aux=True)(logp, ent)
            assert float(loss) == float(loss0)
            np.testing.assert_array_equal(np.asarray(g), np.asarray(g0))
            np.testing.assert_array_equal(np.asarray(g_ent), 0.0)
            assert {k: float(v) for k, v in m.items() if k != "entropy"} == {k: float(v) for k, v in m0.items()}
            w = np_aggregate_weights(np.asarray(mask, np.float64), agg)
            np.testing.assert_allclose(float(m["entropy"]), np.sum(w * np.asarray(ent, np.float64)), rtol=1e-6)
        # a traced zero (jit) gives the same value too
        loss_traced = ppo_kl_loss_jit(logp, old, ref, adv, mask, entropy=ent, entropy_coef=0.0, **kw)[0]
        np.testing.assert_allclose(float(loss_traced), float(loss0), rtol=1e-7)
