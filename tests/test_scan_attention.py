"""Scanned decoder layers and the fused attention path, against the unrolled model, the einsum
attention and transformers."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hf_models import TINY_SHAPES, build_hf_model, hf_logits, load_hf
from jax.sharding import PartitionSpec as P

from hgpo_jax.models import DecoderConfig, load_pretrained, make_mesh, save_pretrained
from hgpo_jax.models.attention import resolve_attention
from hgpo_jax.models.decoder import CausalLM, relayout_layers
from hgpo_jax.models.layers import stack_layers, unstack_layers
from hgpo_jax.models.sharding import param_partition_spec
from hgpo_jax.rl.update import token_logprobs
from hgpo_jax.rl.sampling import Sampler


def random_ids(vocab, shape, seed=1):
    return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


def left_pad(rows):
    T = max(len(r) for r in rows)
    ids = np.zeros((len(rows), T), np.int32)
    mask = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return ids, mask


def right_padded_batch(vocab, lengths, T, seed=0):
    """ids, mask int32 [B, T]: row i has lengths[i] real tokens first (0: a row of padding)."""
    ids = random_ids(vocab, (len(lengths), T), seed)
    mask = (np.arange(T)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    return jnp.asarray(ids * mask), jnp.asarray(mask)


def flat_params(model) -> dict:
    return {".".join(map(str, p)): np.asarray(v[...])
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def as_unrolled(tree: dict, num_layers: int) -> dict:
    """{dotted path: array}: stacked layer entries split into per-layer entries."""
    out = {}
    for path, value in tree.items():
        if path.startswith("model.layers.") and not path.split(".")[2].isdigit():
            rest = path[len("model.layers."):]
            out.update({f"model.layers.{i}.{rest}": value[i] for i in range(num_layers)})
        else:
            out[path] = value
    return out


# ------------------------------------------------------------------------------ scanned layers
def test_scanned_model_matches_transformers_and_the_unrolled_cache_path(hf_model_dir):
    """Loaded with scan_layers: fp32 logits equal transformers'; a left-padded prefill into a
    stacked cache (with last_only) and token-by-token decode equal the unrolled model's."""
    name, folder = hf_model_dir
    vocab = TINY_SHAPES[name]["vocab_size"]
    scanned = load_pretrained(folder, scan_layers=True)
    unrolled = load_pretrained(folder)
    ids = random_ids(vocab, (3, 21))
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x))(scanned, jnp.asarray(ids))),
                               hf_logits(load_hf(folder), ids), atol=1e-4, rtol=0)

    ids, mask = left_pad([random_ids(vocab, (n,), seed=n) for n in (7, 2, 5)])
    extra = random_ids(vocab, (3, 4), seed=9)

    @functools.partial(nnx.jit, static_argnums=3)
    def prefill(m, ids, mask, last_only):
        cache = m.new_cache(ids.shape[0], ids.shape[1] + 4)
        return m.hidden_states(ids, attention_mask=mask, cache=cache, last_only=last_only)

    step = nnx.jit(lambda m, x, c: m(x, cache=c))
    results = {}
    for label, model in (("scanned", scanned), ("unrolled", unrolled)):
        hidden, cache = prefill(model, jnp.asarray(ids), jnp.asarray(mask), True)
        logits = [np.asarray(model.logits(hidden))[:, -1]]
        for t in range(extra.shape[1]):
            out, cache = step(model, jnp.asarray(extra[:, t:t + 1]), cache)
            logits.append(np.asarray(out)[:, 0])
        results[label] = (np.stack(logits), cache)
    assert results["scanned"][1].stacked and not results["unrolled"][1].stacked
    np.testing.assert_allclose(results["scanned"][0], results["unrolled"][0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(results["scanned"][1].k),
                               np.stack(results["unrolled"][1].k), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(results["scanned"][1].v),
                               np.stack(results["unrolled"][1].v), atol=1e-6, rtol=0)


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_gradients_equal_the_unrolled_ones(remat):
    """Same seed, same weights; the token log-prob loss and every gradient agree (remat too)."""
    cfg = DecoderConfig(**TINY_SHAPES["tied_gqa2_odd3l"])
    scanned = CausalLM(cfg, rngs=nnx.Rngs(4), scan_layers=True, remat=remat)
    unrolled = CausalLM(cfg, rngs=nnx.Rngs(4), remat=remat)
    assert as_unrolled(flat_params(scanned), 3).keys() == flat_params(unrolled).keys()
    ids, mask = right_padded_batch(cfg.vocab_size, [9, 4, 0], 9)

    def loss(m):
        return (token_logprobs(m, ids, mask) * mask).sum()

    grad = nnx.jit(nnx.value_and_grad(loss))  # jitted: eager op-by-op dispatch is slow
    ls, gs = grad(scanned)
    lu, gu = grad(unrolled)
    assert abs(float(ls) - float(lu)) < 1e-4
    flat_s = as_unrolled({".".join(map(str, p)): np.asarray(v[...])
                          for p, v in nnx.to_flat_state(gs)}, 3)
    flat_u = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(gu)}
    assert flat_s.keys() == flat_u.keys()
    for k in flat_u:
        np.testing.assert_allclose(flat_s[k], flat_u[k], atol=1e-6, rtol=1e-5, err_msg=k)


def test_scanned_export_round_trip_and_relayout(hf_model_dir, tmp_path):
    """A scanned model exports the HF tensors bit for bit; relayout_layers goes both ways."""
    name, folder = hf_model_dir
    scanned = load_pretrained(folder, scan_layers=True)
    out = save_pretrained(scanned, tmp_path / "export")
    a, b = load_hf(folder).state_dict(), load_hf(out).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    unrolled = load_pretrained(folder)
    back = relayout_layers(load_pretrained(folder, scan_layers=True), False)
    assert not back.scan_layers and flat_params(back).keys() == flat_params(unrolled).keys()
    for k, v in flat_params(unrolled).items():
        np.testing.assert_array_equal(flat_params(back)[k], v)
    again = relayout_layers(back, True)
    for k, v in as_unrolled(flat_params(again), len(unrolled.model.layers)).items():
        np.testing.assert_array_equal(v, flat_params(unrolled)[k])
    layers = unstack_layers(stack_layers(list(unrolled.model.layers)))
    assert len(layers) == TINY_SHAPES[name]["num_hidden_layers"]


def test_scanned_weights_shard_with_an_unsplit_layer_axis(tmp_path):
    assert param_partition_spec("model.layers.self_attn.q_proj.kernel") == P(None, "fsdp", "tensor")
    assert param_partition_spec("model.layers.3.self_attn.q_proj.kernel") == P("fsdp", "tensor")
    assert param_partition_spec("model.layers.input_layernorm.scale") == P(None)
    build_hf_model(TINY_SHAPES["untied_gqa1"], tmp_path)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = load_pretrained(tmp_path, mesh=mesh, scan_layers=True)
    q = sharded.model.layers.self_attn.q_proj.kernel[...]
    assert q.sharding.spec == P(None, "fsdp", "tensor") and q.shape[0] == 2
    ids = jnp.asarray(random_ids(150, (4, 8)))
    plain = load_pretrained(tmp_path)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x))(sharded, ids)),
                               np.asarray(nnx.jit(lambda m, x: m(x))(plain, ids)), atol=1e-5)
    # the sampler's stacked cache on the mesh: same greedy tokens as the unrolled model
    prompts = [[3, 4, 5], [7], [8, 9, 10, 11], [12, 13]]
    a = Sampler().generate(sharded, prompts, 5, temperature=0.0)
    b = Sampler().generate(plain, prompts, 5, temperature=0.0)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(np.concatenate(a.logprobs), np.concatenate(b.logprobs), atol=1e-5)


def test_legacy_run_config_without_scan_layers_loads_unrolled(tmp_path):
    """A run folder's config.yaml written before scanned layers existed keeps the unrolled
    layout its checkpoints have; a config of ours defaults to scanned layers."""
    from hgpo_jax.config import RUN_CONFIG_HEADER, config_to_dict, load_config
    import yaml

    data = config_to_dict(load_config("tiny_cpu"))
    assert data["model"].pop("scan_layers") is True
    path = tmp_path / "config.yaml"
    path.write_text(RUN_CONFIG_HEADER + "\n" + yaml.safe_dump(data))
    assert load_config(str(path)).model.scan_layers is False
    assert load_config(str(path), ["model.scan_layers=true"]).model.scan_layers is True


# ------------------------------------------------------------------------------ fused attention
def test_auto_attention_picks_cudnn_only_where_it_runs():
    assert resolve_attention("auto", jnp.bfloat16, 128, "gpu") == "cudnn"
    assert resolve_attention("auto", jnp.float16, 64, "gpu") == "cudnn"
    assert resolve_attention("auto", jnp.float32, 128, "gpu") == "einsum"  # cuDNN: 16-bit only
    assert resolve_attention("auto", jnp.bfloat16, 12, "gpu") == "einsum"
    assert resolve_attention("auto", jnp.bfloat16, 128, "cpu") == "einsum"
    assert resolve_attention("xla", jnp.float32, 128, "cpu") == "xla"
    with pytest.raises(ValueError, match="model.attention='flash'"):
        resolve_attention("flash", jnp.float32, 128)


@pytest.mark.parametrize("shape", ["tied_gqa2", "untied_gqa6_odd"])
@pytest.mark.parametrize("scan", [False, True])
def test_fused_attention_values_and_gradients_equal_einsum(shape, scan):
    """jax.nn.dot_product_attention over right-padded rows (one of them all padding) gives the
    einsum path's token log-probs, entropies and gradients."""
    cfg = DecoderConfig(**TINY_SHAPES[shape])
    models = {impl: CausalLM(cfg, rngs=nnx.Rngs(1), attention=impl, scan_layers=scan,
                                     remat=True) for impl in ("einsum", "xla")}
    ids, mask = right_padded_batch(cfg.vocab_size, [13, 6, 0, 1], 13, seed=3)

    def loss(m):
        logp, ent = token_logprobs(m, ids, mask, with_entropy=True)
        return ((logp + 0.1 * ent) * mask).sum(), (logp, ent)

    grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))
    out = {impl: grad(m) for impl, m in models.items()}
    (le, (lpe, ente)), ge = out["einsum"]
    (lx, (lpx, entx)), gx = out["xla"]
    m = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(lpx)[m], np.asarray(lpe)[m], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(entx)[m], np.asarray(ente)[m], atol=1e-5, rtol=0)
    assert np.isfinite(np.asarray(lpx)).all()
    for (p, a), (_, b) in zip(nnx.to_flat_state(ge), nnx.to_flat_state(gx)):
        np.testing.assert_allclose(np.asarray(b[...]), np.asarray(a[...]), atol=2e-5, rtol=1e-4,
                                   err_msg=".".join(map(str, p)))


def test_fused_path_only_for_right_padded_rows():
    """A left-padded forward without a cache keeps the einsum path (its mask is not a prefix),
    so a model set to a fused path still gives the right logits there."""
    cfg = DecoderConfig(**TINY_SHAPES["tied_gqa2"])
    xla = CausalLM(cfg, rngs=nnx.Rngs(2), attention="xla")
    ein = CausalLM(cfg, rngs=nnx.Rngs(2), attention="einsum")
    ids, mask = left_pad([random_ids(128, (n,), seed=n) for n in (9, 3)])
    f = nnx.jit(lambda m, x, am: m(x, attention_mask=am))
    np.testing.assert_allclose(np.asarray(f(xla, ids, mask)), np.asarray(f(ein, ids, mask)),
                               atol=1e-6, rtol=0)


def test_plan_with_flash_attention_drops_the_score_buffers():
    """The memory plan for a GPU run compiles flash attention's memory stand-in: at 2k tokens its
    step temporaries are well under the einsum path's [rows, heads, L, L] scores."""
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.plan import plan

    over = ["model.compute_dtype=bfloat16", "rollout.max_prompt_tokens=2048",
            "train.micro_batch_size=8", "train.mini_batch_size=8"]
    flash = plan(load_config("tiny_cpu", over), target="gpu")
    einsum = plan(load_config("tiny_cpu", over + ["model.attention=einsum"]), target="gpu")
    assert "cudnn flash" in flash["attention"] and einsum["attention"] == "einsum on gpu"
    from hgpo_jax.models.tiny import TINY_CONFIG

    L = flash["seq_len"]
    one_layer_scores = 8 * TINY_CONFIG.num_attention_heads * L * L * 4  # float32, one layer
    assert einsum["temp_bytes"] - flash["temp_bytes"] > 0.5 * one_layer_scores, (
        einsum["temp_bytes"], flash["temp_bytes"], one_layer_scores)
