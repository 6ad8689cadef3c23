"""The ragged decode (issue 49, part 4): the Pallas GPU decode-attention kernel over each row's
tokens only, run here through Pallas's interpreter, against the einsum attention over the whole
cache; the ragged KV cache's per-row writes; the sampler's ragged decode against its einsum decode
(greedy and sampled, rows ending early, on one device and on a mesh); the choice of the path."""

import jax.numpy as jnp
import numpy as np
import pytest
from hf_models import TINY_SHAPES, build_hf_model

from hgpo_jax.models import load_pretrained, make_mesh
from hgpo_jax.models.attention import MASKED_SCORE, attention
from hgpo_jax.models.kv_cache import KVCache
from hgpo_jax.models.gpu_attention import (BLOCK_K, decode_blocks, ragged_decode_attention,
                                           ragged_slots)
from hgpo_jax.rl.sampling import Sampler, decode_path, generate

SHAPES = ("tied_gqa2", "untied_gqa6_odd")  # GQA 2 and GQA 6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """shape -> (its folder, the model with right-padded fused prefill: attention 'xla')."""
    out = {}
    for name in SHAPES:
        folder = tmp_path_factory.mktemp(f"ragged-{name}")
        build_hf_model(TINY_SHAPES[name], folder)
        out[name] = (str(folder), load_pretrained(folder, attention="xla"))
    return out


def prompts_of(vocab: int, lens, seed: int = 0) -> list[list[int]]:
    rs = np.random.RandomState(seed)
    return [rs.randint(1, vocab, n).tolist() for n in lens]


# --------------------------------------------------------------------------- the kernel
@pytest.mark.parametrize("heads,kv_heads,head_size", [(4, 2, 16), (6, 1, 32), (8, 8, 64)])
def test_the_kernel_reads_each_rows_first_slots_as_the_masked_einsum_does(heads, kv_heads,
                                                                          head_size):
    """Rows of 1 slot, of every slot, and between; the slots past a row's length hold large
    values, which must not leak into its output."""
    B, S = 5, 2 * BLOCK_K
    rs = np.random.RandomState(heads)
    q = jnp.asarray(rs.normal(size=(B, heads, head_size)), jnp.float32)
    k = rs.normal(size=(B, kv_heads, S, head_size))
    v = rs.normal(size=(B, kv_heads, S, head_size))
    lengths = np.array([1, S, 130, 128, 77])
    past = np.arange(S)[None, :] >= lengths[:, None]                    # [B, S]
    k[past[:, None, :, None].repeat(kv_heads, 1).repeat(head_size, 3)] = 1e4
    v[past[:, None, :, None].repeat(kv_heads, 1).repeat(head_size, 3)] = 1e4
    k, v = jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32)
    out = ragged_decode_attention(q, k, v, jnp.asarray(lengths))
    mask = jnp.asarray(~past)[:, None, None, :]                          # [B, 1, 1, S]
    ref = attention(q[:, :, None], k.transpose(0, 1, 3, 2), v, mask)[:, :, 0]
    assert out.shape == (B, heads, head_size) and out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=2e-5)
    assert MASKED_SCORE < -1e29  # the reference masks by an additive score, the kernel by length


def test_the_kernels_blocks_and_parts():
    assert ragged_slots(1) == BLOCK_K and ragged_slots(2048 + 512) == 2560
    assert ragged_slots(32 + 8) == 128 and ragged_slots(256) == 256
    assert decode_blocks(2560, 128 * 2) == (128, 5)   # the paper's 128 rows, 2 kv heads: 5 parts
    assert decode_blocks(2560, 1) == (128, 20)        # one row: a part per block
    assert decode_blocks(128, 8) == (128, 1)
    with pytest.raises(ValueError, match="multiple of 128 slots, not 200"):
        decode_blocks(200, 1)
    with pytest.raises(ValueError, match="expected q"):
        ragged_decode_attention(jnp.zeros((2, 4, 16)), jnp.zeros((2, 2, 128, 8)),
                                jnp.zeros((2, 2, 128, 8)), jnp.ones((2,), jnp.int32))


# --------------------------------------------------------------------------- the cache
def test_a_ragged_cache_keeps_each_rows_tokens_in_its_first_slots(models):
    """A right-padded prefill, then decode steps: row b's keys are slots [0, len_b + steps),
    each the key its token would have in the einsum cache (where the new ones follow the prompt
    bucket), and a finished row (mask 0) neither advances nor moves."""
    _, model = models["tied_gqa2"]
    lens, P, N = [3, 7, 1], 8, 4
    ids = np.zeros((3, P), np.int32)
    mask = np.zeros((3, P), bool)
    for b, (n, p) in enumerate(zip(lens, prompts_of(128, lens))):
        ids[b, :n], mask[b, :n] = p, True
    caches = {}
    for ragged in (False, True):
        cache = model.new_cache(3, ragged_slots(P + N) if ragged else P + N, ragged=ragged)
        _, cache = model.hidden_states(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                       cache=cache, right_padded=True, last_only=True)
        for step, active in enumerate(([1, 1, 1], [1, 0, 1], [1, 0, 1])):
            token = jnp.full((3, 1), 5 + step, jnp.int32)
            _, cache = model.hidden_states(token, attention_mask=jnp.asarray(active)[:, None] > 0,
                                           cache=cache)
        caches[ragged] = cache
    plain, ragged = caches[False], caches[True]
    assert ragged.ragged and not plain.ragged
    assert ragged.k[0].shape == (3, 2, 128, 8) and plain.k[0].shape == (3, 2, 8, P + N)
    np.testing.assert_array_equal(np.asarray(ragged.pos), np.asarray(plain.pos))
    assert np.asarray(ragged.pos).tolist() == [6, 8, 4]
    for b, n in enumerate(lens):
        new = int(ragged.pos[b]) - n                       # new tokens the row kept
        for layer in range(2):
            rk, pk = np.asarray(ragged.k[layer][b]), np.asarray(plain.k[layer][b])
            rv, pv = np.asarray(ragged.v[layer][b]), np.asarray(plain.v[layer][b])
            np.testing.assert_allclose(rk[:, :n], pk[:, :, :n].transpose(0, 2, 1), atol=1e-6)
            np.testing.assert_allclose(rv[:, :n], pv[:, :n], atol=1e-6)
            if b != 1:  # rows 0 and 2 ran every step; the plain cache's new tokens follow P
                np.testing.assert_allclose(rk[:, n:n + new], pk[:, :, P:P + new].transpose(0, 2, 1),
                                           atol=1e-5)
                np.testing.assert_allclose(rv[:, n:n + new], pv[:, P:P + new], atol=1e-5)


def test_a_ragged_cache_refuses_what_it_cannot_do(models):
    _, model = models["tied_gqa2"]
    with pytest.raises(ValueError, match="one array per layer"):
        KVCache.init(model.config, 2, 128, stacked=True, ragged=True)
    cache = model.new_cache(2, 128, ragged=True)
    with pytest.raises(ValueError, match="one token per row per call, not 3"):
        model.hidden_states(jnp.ones((2, 3), jnp.int32), cache=cache)


# --------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("shape", SHAPES)
def test_the_ragged_decode_samples_what_the_einsum_decode_samples(models, shape):
    """Greedy and sampled (the same rng: the same row keys), rows of different lengths, rows that
    end early at an eos: the same tokens, log-probs within float error."""
    _, model = models[shape]
    prompts = prompts_of(model.config.vocab_size, (5, 30, 1, 17, 9), seed=3)
    einsum, ragged = Sampler(), Sampler()
    greedy = generate(model, prompts, 12, temperature=0, sampler=einsum, decode="einsum")
    eos = sorted({row[3] for row in greedy.tokens})[:2]   # some rows end early, others run on
    for kw in (dict(temperature=0), dict(temperature=1.0, rng=7), dict(temperature=0, eos_token_id=eos)):
        ref = generate(model, prompts, 12, sampler=einsum, decode="einsum", **kw)
        out = generate(model, prompts, 12, sampler=ragged, decode="ragged", **kw)
        assert out.tokens == ref.tokens, kw
        np.testing.assert_allclose(np.concatenate(out.model_logprobs),
                                   np.concatenate(ref.model_logprobs), atol=2e-5)
    assert min(map(len, out.tokens)) < 12 == max(map(len, out.tokens))  # eos ended some rows


def test_the_ragged_decode_after_a_prefill_in_row_groups(models, monkeypatch):
    """The fused prefill in several forwards of a few rows each (`prefill_row_groups`) fills the
    ragged cache as one forward does."""
    from hgpo_jax.rl import sampling

    _, model = models["tied_gqa2"]
    prompts = prompts_of(model.config.vocab_size, (5, 30, 1, 17, 9), seed=4)
    ref = generate(model, prompts, 8, temperature=0, sampler=Sampler(), decode="einsum")
    monkeypatch.setattr(sampling, "PREFILL_ROW_TOKENS", 64)  # 8 rows x 32 slots: 4 forwards
    assert sampling.prefill_row_groups(-1, 8, 32) == 4
    out = generate(model, prompts, 8, temperature=0, sampler=Sampler(), decode="ragged")
    assert out.tokens == ref.tokens
    np.testing.assert_allclose(np.concatenate(out.logprobs), np.concatenate(ref.logprobs),
                               atol=2e-5)


def test_the_ragged_decode_on_a_mesh_gives_the_unsharded_greedy_output(models):
    folder, model = models["tied_gqa2"]
    sharded = load_pretrained(folder, attention="xla", mesh=make_mesh(data=2, fsdp=2, tensor=2))
    prompts = prompts_of(model.config.vocab_size, (5, 11, 3), seed=6)
    ref = generate(model, prompts, 10, temperature=0, sampler=Sampler(), decode="einsum")
    out = generate(sharded, prompts, 10, temperature=0, sampler=Sampler(), decode="ragged")
    assert out.tokens == ref.tokens
    np.testing.assert_allclose(np.concatenate(out.logprobs), np.concatenate(ref.logprobs),
                               atol=2e-5)


def test_the_decode_path_ragged_on_a_gpu_where_it_runs():
    assert decode_path("auto", "cudnn", True, 128, platform="gpu") == "ragged"
    assert decode_path("auto", "cudnn", True, 128, platform="cpu") == "einsum"
    assert decode_path("auto", "einsum", True, 128, platform="gpu") == "einsum"  # left-padded
    assert decode_path("auto", "cudnn", False, 128, platform="gpu") == "einsum"  # scanned layers
    assert decode_path("auto", "cudnn", True, 8, platform="gpu") == "einsum"     # Triton's blocks
    assert decode_path("einsum", "cudnn", True, 128, platform="gpu") == "einsum"
    assert decode_path("ragged", "xla", True, 8, platform="cpu") == "ragged"     # interpreted
    with pytest.raises(ValueError, match="needs right-padded prompts"):
        decode_path("ragged", "einsum", True)
    with pytest.raises(ValueError, match="use one of auto, einsum, ragged"):
        generate(None, [[1]], 4, decode="paged")


def test_the_config_key_reaches_the_rollouts_policy():
    from hgpo_jax.config import ConfigError, load_config
    from hgpo_jax.rl.policy import Policy

    assert load_config(None, []).rollout.decode_attention == "auto"
    cfg = load_config(None, ["rollout.decode_attention=einsum"])
    assert Policy.of_rollout(None, None, cfg.rollout, 1.0).decode_attention == "einsum"
    with pytest.raises(ConfigError, match="rollout.decode_attention"):
        load_config(None, ["rollout.decode_attention=paged"])


def test_auto_falls_back_to_the_einsum_decode_where_the_kernel_does_not_compile(
        models, monkeypatch, capsys):
    """decode='auto' picks the ragged kernel (here: as on a GPU); its lowering fails on this
    device: the sampler says so in one line and decodes with einsum (the same tokens), and its
    later 'auto' calls go straight to einsum. A rollout through the default sampler runs."""
    from hgpo_jax.models import layers
    from hgpo_jax.rl import sampling
    from hgpo_jax.rl.policy import Policy

    real = sampling.decode_path
    monkeypatch.setattr(sampling, "decode_path", lambda requested, prefill, unrolled, *a, **k:
                        "ragged" if requested == "auto" and prefill != "einsum" and unrolled
                        else real(requested, prefill, unrolled, *a, **k))

    def lowering_fails(*args, **kwargs):
        raise RuntimeError("Mosaic GPU lowering failed: unsupported layout\n(details)")

    monkeypatch.setattr(layers, "ragged_decode_attention", lowering_fails)
    _, model = models["tied_gqa2"]
    prompts = prompts_of(model.config.vocab_size, (5, 30, 1, 17, 9), seed=8)
    ref = generate(model, prompts, 10, temperature=0, sampler=Sampler(), decode="einsum")
    sampler = Sampler()
    out = generate(model, prompts, 10, temperature=0, sampler=sampler)  # decode="auto"
    err = capsys.readouterr().err
    assert out.tokens == ref.tokens
    assert err.count("\n") == 1 and "the ragged decode kernel did not compile on this device" \
        in err and "Mosaic GPU lowering failed: unsupported layout" in err
    assert sampler.ragged_failure.startswith("RuntimeError")
    again = generate(model, prompts[:3], 10, temperature=0, sampler=sampler)
    assert again.tokens == ref.tokens[:3] and capsys.readouterr().err == ""
    with pytest.raises(RuntimeError, match="Mosaic"):  # asked for by name: no fallback
        generate(model, prompts, 10, temperature=0, sampler=Sampler(), decode="ragged")
    # a rollout's generation (its policy's decode_attention 'auto', its own sampler)
    from types import SimpleNamespace

    policy = Policy(model, SimpleNamespace(eos_token_ids=[]), temperature=1.0, max_new_tokens=6)
    assert policy.decode_attention == "auto" and policy.sampler.ragged_failure is None
    replies = policy.generate(prompts, 3, row_ids=list(range(5)))
    assert len(replies.tokens) == 5 and policy.sampler.ragged_failure


def test_auto_attention_takes_a_fused_kernel_only_where_it_compiles(models, monkeypatch, capsys):
    """model.attention=auto on a backend whose fused kernel does not compile (here: the CPU
    playing a GPU, so cuDNN is tried and fails): one line, and einsum for training and the
    sampler's prefill; planning for another platform never probes."""
    from hgpo_jax.models import attention as paths
    from hgpo_jax.rl import sampling

    paths.fused_attention_failure.cache_clear()
    monkeypatch.setattr(paths.jax, "default_backend", lambda: "gpu")
    try:
        assert paths.resolve_attention("auto", "bfloat16", 128) == "einsum"
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cudnn attention does not compile on this gpu device" in err
        assert paths.resolve_attention("auto", "bfloat16", 128) == "einsum"  # probed once
        assert capsys.readouterr().err == ""
        assert paths.resolve_attention("cudnn", "bfloat16", 128) == "cudnn"  # by name: as asked
        folder, _ = models["tied_gqa2"]
        model = load_pretrained(folder, attention="auto", dtype="bfloat16",
                                compute_dtype="bfloat16")
        assert sampling.prefill_path(model) == "einsum"  # its head size: probed for it
        assert "cudnn attention does not compile" in capsys.readouterr().err
    finally:
        paths.fused_attention_failure.cache_clear()
    monkeypatch.undo()
    # the plan of a GPU run on this CPU: cuDNN, no probe
    assert paths.resolve_attention("auto", "bfloat16", 128, platform="gpu") == "cudnn"
    assert paths.fused_attention_failure("xla", "float32", 16) is None  # compiles here
    assert capsys.readouterr().err == ""
