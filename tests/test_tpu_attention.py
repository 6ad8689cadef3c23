"""The Pallas TPU splash-attention path ('splash', hgpo_jax/models/tpu_attention.py), run on the
CPU through Pallas's interpreter, against the einsum attention: values and gradients over
right-padded rows of mixed lengths, grouped-query heads, causal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import NamedSharding, PartitionSpec as P

from hgpo_jax.models import DecoderConfig, make_mesh
from hgpo_jax.models.attention import attention, resolve_attention
from hgpo_jax.models.decoder import CausalLM
from hgpo_jax.models.tpu_attention import _kernel, splash_attention, splash_blocks
from hgpo_jax.rl.update import token_logprobs


def einsum_reference(q, k, v, lengths):
    """The einsum path (`qwen2.attention`) on the same rows: q [B, T, H, hd], k, v [B, T, K, hd]."""
    T = q.shape[1]
    causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]                       # [T, S]
    mask = causal[None, None] & (jnp.arange(T) < lengths[:, None])[:, None, None, :]  # [B, 1, T, S]
    out = attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask)
    return out.transpose(0, 2, 1, 3)


def random_qkv(B, T, H, K, hd, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=s), jnp.float32)
                 for s in ((B, T, H, hd), (B, T, K, hd), (B, T, K, hd)))


def test_auto_attention_takes_splash_on_tpu():
    assert resolve_attention("auto", jnp.bfloat16, 128, "tpu") == "splash"
    assert resolve_attention("auto", jnp.float32, 256, "tpu") == "splash"
    assert resolve_attention("auto", jnp.float16, 128, "tpu") == "einsum"
    assert resolve_attention("auto", jnp.bfloat16, 64, "tpu") == "einsum"  # under the lane width
    assert resolve_attention("auto", jnp.bfloat16, 128, "gpu") == "cudnn"
    assert resolve_attention("splash", jnp.float32, 64, "cpu") == "splash"  # interpreted
    with pytest.raises(ValueError, match="Pallas TPU kernel and cannot run on gpu"):
        resolve_attention("splash", jnp.bfloat16, 128, "gpu")


def test_splash_blocks_divide_the_project_lengths():
    assert splash_blocks(4096 + 512) == (4608, 512)
    assert splash_blocks(2560) == (2560, 512)
    assert splash_blocks(4096) == (4096, 512)
    assert splash_blocks(768) == (768, 256)
    assert splash_blocks(384) == (384, 128)
    assert splash_blocks(32) == splash_blocks(64) == (128, 128)
    assert splash_blocks(192) == (256, 256)
    with pytest.raises(ValueError, match="at least one slot"):
        splash_blocks(0)


@pytest.mark.parametrize("B,T,H,K,hd,lengths", [
    (4, 192, 4, 2, 64, [192, 101, 1, 64]),    # T padded to 256 inside; one block
    (2, 640, 2, 1, 128, [640, 333]),          # five 128-blocks: the online softmax across blocks
])
def test_splash_values_and_gradients_equal_einsum(B, T, H, K, hd, lengths):
    """Forward and dq, dk, dv of a loss over the real slots equal the einsum path's; the padded
    slots are finite."""
    q, k, v = random_qkv(B, T, H, K, hd)
    lengths = jnp.asarray(lengths, jnp.int32)
    real = np.arange(T)[None] < np.asarray(lengths)[:, None]                        # [B, T]
    weights = jnp.asarray(np.random.default_rng(1).normal(size=q.shape) * real[..., None, None],
                          jnp.float32)

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v, lengths) * weights).sum()

    ours = jax.jit(lambda q, k, v: splash_attention(q, k, v, lengths, interpret=True))(q, k, v)
    ref = einsum_reference(q, k, v, lengths)
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(ref)[real], atol=2e-6, rtol=0)
    assert np.isfinite(np.asarray(ours)).all()
    kernel = lambda q, k, v, n: splash_attention(q, k, v, n, interpret=True)  # noqa: E731
    g_ours = jax.jit(jax.grad(loss(kernel), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.grad(loss(einsum_reference), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_ours, g_ref):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=f"d{name}")


def test_splash_model_values_and_gradients_equal_einsum():
    """A tiny Qwen2 (head size 128, two query heads on one kv head, scanned layers, remat) with
    attention='splash' gives the einsum model's token log-probs, entropies and weight gradients
    on right-padded rows of mixed lengths (one of them all padding)."""
    cfg = DecoderConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=128)
    models = {impl: CausalLM(cfg, rngs=nnx.Rngs(1), attention=impl, scan_layers=True,
                                     remat=True) for impl in ("einsum", "splash")}
    T, lengths = 128, np.array([128, 77, 0, 1])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    ids = jnp.asarray(np.random.RandomState(3).randint(0, cfg.vocab_size, (4, T)) * mask, jnp.int32)
    mask = jnp.asarray(mask)

    def loss(m):
        logp, ent = token_logprobs(m, ids, mask, with_entropy=True)
        return ((logp + 0.1 * ent) * mask).sum(), (logp, ent)

    grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))
    (le, (lpe, ente)), ge = grad(models["einsum"])
    (ls, (lps, ents)), gs = grad(models["splash"])
    m = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(lps)[m], np.asarray(lpe)[m], atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(ents)[m], np.asarray(ente)[m], atol=2e-5, rtol=0)
    assert np.isfinite(np.asarray(lps)).all() and abs(float(ls) - float(le)) < 1e-3
    for (p, a), (_, b) in zip(nnx.to_flat_state(ge), nnx.to_flat_state(gs)):
        np.testing.assert_allclose(np.asarray(b[...]), np.asarray(a[...]), atol=2e-5, rtol=1e-4,
                                   err_msg=".".join(map(str, p)))


def test_splash_kernel_in_tpu_interpret_mode_on_one_row():
    """The TPU interpret mode (TPU memory simulated, scratch memory starting as NaN, out-of-bounds
    reads raising) runs the kernel as built here on one row (it cannot run the vmapped kernel in
    JAX 0.10.2, see tpu_attention): padding as segment 0, grouped heads, values and dq, dk, dv."""
    H, K, hd, T, length = 4, 2, 64, 128, 77
    q, k, v = (a[0] for a in random_qkv(1, T, H, K, hd, seed=2))                   # [T, *, hd]
    seg = (jnp.arange(T) < length).astype(jnp.int32)
    kernel = _kernel(H, T, splash_blocks(T)[1], pltpu.InterpretParams())
    scale = hd ** -0.5

    def ours(q, k, v):
        out = kernel((q * scale).transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2),
                     segment_ids=splash.SegmentIds(q=seg, kv=seg))
        return out.transpose(1, 0, 2)[:length]

    def ref(q, k, v):
        return einsum_reference(q[None], k[None], v[None], jnp.asarray([length]))[0, :length]

    np.testing.assert_allclose(np.asarray(jax.jit(ours)(q, k, v)), np.asarray(ref(q, k, v)),
                               atol=2e-6, rtol=0)
    w = jnp.asarray(np.random.default_rng(4).normal(size=(length, H, hd)), jnp.float32)
    g_ours = jax.jit(jax.grad(lambda *a: (ours(*a) * w).sum(), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.grad(lambda *a: (ref(*a) * w).sum(), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g_ours, g_ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=f"d{name}")


def test_splash_under_a_mesh_splits_rows_and_heads():
    """With a mesh the kernel runs under shard_map (rows over data x fsdp, heads over tensor):
    same values and gradients as on one device."""
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    B, T, H, K, hd = 4, 128, 4, 2, 64
    q, k, v = random_qkv(B, T, H, K, hd, seed=5)
    lengths = jnp.asarray([128, 9, 64, 1], jnp.int32)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P(("data", "fsdp"), None, "tensor")))  # noqa: E731
    loss = lambda mesh: lambda q, k, v: (splash_attention(  # noqa: E731
        q, k, v, lengths, interpret=True, mesh=mesh) ** 2).sum()
    one = jax.jit(jax.value_and_grad(loss(None), argnums=(0, 1, 2)))(q, k, v)
    split = jax.jit(jax.value_and_grad(loss(mesh), argnums=(0, 1, 2)))(put(q), put(k), put(v))
    np.testing.assert_allclose(float(split[0]), float(one[0]), rtol=1e-6)
    for a, b in zip(split[1], one[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)


def test_plan_for_tpu_compiles_the_flash_standin_for_splash():
    """Off a TPU the plan cannot compile the kernel (only interpret it), so `plan --target tpu`
    compiles flash attention's memory stand-in and says so."""
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.plan import plan_attention

    model_cfg = DecoderConfig()  # Qwen2.5-1.5B: head size 128
    cfg = load_config("tiny_cpu", ["model.compute_dtype=bfloat16"])
    impl, label = plan_attention(cfg, model_cfg, "tpu")
    assert impl == "flash_standin" and label.startswith("splash (Pallas TPU flash) on tpu"), label
    assert "stand-in compiled on cpu" in label
    assert plan_attention(cfg, model_cfg, "gpu")[0] == "flash_standin"  # cuDNN's, as before
    f32 = load_config("tiny_cpu", ["model.compute_dtype=float32"])
    assert plan_attention(f32, model_cfg, "tpu")[0] == "flash_standin"  # splash takes float32 too
    assert plan_attention(f32, model_cfg, "gpu") == ("einsum", "einsum on gpu")
