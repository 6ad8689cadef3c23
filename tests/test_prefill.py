"""The sampler's prefill paths: chunked (left-padded, einsum) and fused (right-padded), their
parity with transformers and with each other, the chunk rule, the `rollout.prefill_chunk` key, the
per-phase timings, and the peak memory of long prompts in a fresh process."""

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from child_env import child_env
from hf_models import build_hf_model

from hgpo_jax.config import Config, load_config, save_config
from hgpo_jax.config_checks import ConfigError
from hgpo_jax.models import DecoderConfig, CausalLM, load_pretrained
from hgpo_jax.rl import sampling
from hgpo_jax.rl.sampling import Sampler, generate, prefill_chunk_size

# 2 layers, hidden 64, 4 heads, 2 kv heads (GQA 2): the brief's tiny shape
LONG_SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                  max_position_embeddings=4096)
LONG_LENS = (2600, 1100, 37)   # mixed lengths, left padding; batch bucket 4 (a dummy row), P = 4096
NEW = 6


def random_prompts(vocab, lens, seed=0):
    rs = np.random.RandomState(seed)
    return [rs.randint(0, vocab, n).tolist() for n in lens]


@pytest.fixture(scope="module")
def long_models(tmp_path_factory):
    """(transformers model, the same weights in Flax: scanned layers) of LONG_SHAPE."""
    folder = tmp_path_factory.mktemp("prefill-long")
    hf = build_hf_model(LONG_SHAPE, folder)
    return hf, load_pretrained(folder, scan_layers=True), str(folder)


def hf_greedy(hf, prompt, max_new):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new,
                          pad_token_id=0)
    return out[0, len(prompt):].tolist()


# --------------------------------------------------------------------------- chunked prefill
def test_chunked_prefill_greedy_matches_transformers_on_long_left_padded_prompts(long_models):
    """Prompts of 37-2600 tokens (bucket 4096): a chunk that does not divide the bucket (1000: a
    first chunk of 96, then four of 1000), one that does (auto: 1024) and one chunk (0) all give
    transformers' greedy tokens, and the same log-probs."""
    hf, model, _ = long_models
    prompts = random_prompts(LONG_SHAPE["vocab_size"], LONG_LENS)
    expected = [hf_greedy(hf, p, NEW) for p in prompts]
    s = Sampler()
    ref = None
    for chunk in (1000, 0, -1):
        out = generate(model, prompts, NEW, temperature=0, sampler=s, prefill_chunk=chunk)
        assert out.tokens == expected, chunk
        assert out.prefill_s > 0 and out.decode_s > 0
        if ref is None:
            ref = np.concatenate(out.logprobs)
        np.testing.assert_allclose(np.concatenate(out.logprobs), ref, atol=2e-5)
    # auto for 4 rows x 4 heads x 4096 slots: 256 KiB per query token -> chunks of 512
    assert prefill_chunk_size(-1, 4, 4, 4096) == 512
    assert s.num_compiles == 3


def test_chunked_equals_unchunked_when_sampling(long_models):
    """The same rng, top-p sampling: a 100-token chunk (bucket 2048 is no multiple of it) draws the
    unchunked prefill's tokens, with the same log-probs."""
    _, model, _ = long_models
    prompts = random_prompts(LONG_SHAPE["vocab_size"], (1500, 700, 1900), seed=1)
    s = Sampler()
    kw = dict(temperature=1.0, top_p=0.95, rng=7, sampler=s)
    one = generate(model, prompts, NEW, prefill_chunk=0, **kw)
    chunked = generate(model, prompts, NEW, prefill_chunk=100, **kw)
    assert chunked.tokens == one.tokens
    np.testing.assert_allclose(np.concatenate(chunked.logprobs), np.concatenate(one.logprobs),
                               atol=2e-5)
    np.testing.assert_allclose(np.concatenate(chunked.model_logprobs),
                               np.concatenate(one.model_logprobs), atol=2e-5)


def test_prefill_chunk_rule():
    # auto: the largest power of two within 128 MiB of float32 scores per layer, >= 64, <= P
    assert prefill_chunk_size(-1, 16, 4, 4096) == 128            # 1 MiB per query token
    assert prefill_chunk_size(-1, 16, 4, 1024) == 512
    assert prefill_chunk_size(-1, 4, 4, 1024) == 1024            # one chunk
    assert prefill_chunk_size(-1, 64, 12, 4096) == 64            # the floor (768 MiB)
    assert prefill_chunk_size(-1, 1, 1, 32) == 32
    for rows, heads, slots in [(16, 4, 4096), (3, 7, 2048), (128, 12, 8192)]:
        c = prefill_chunk_size(-1, rows, heads, slots)
        assert c & (c - 1) == 0 and 64 <= c <= slots or c == slots
        assert rows * heads * c * slots * 4 <= sampling.PREFILL_SCORE_BYTES or c == 64
    assert prefill_chunk_size(0, 16, 4, 4096) == 4096
    assert prefill_chunk_size(100, 16, 4, 4096) == 100
    assert prefill_chunk_size(10_000, 16, 4, 4096) == 4096
    for bad in (-2, 1.5, True, "64"):
        with pytest.raises(ValueError, match="prefill_chunk"):
            prefill_chunk_size(bad, 16, 4, 4096)


def test_generate_rejects_a_bad_prefill_chunk():
    model = CausalLM(DecoderConfig(**{**LONG_SHAPE, "max_position_embeddings": 128}))
    with pytest.raises(ValueError, match="prefill_chunk must be an int >= -1"):
        generate(model, [[1, 2, 3]], 4, prefill_chunk=-2, sampler=Sampler())


# --------------------------------------------------------------------------- fused prefill
@pytest.mark.parametrize("scan,kw", [(False, dict(temperature=0)),
                                     (True, dict(temperature=1.0, top_k=20, rng=4))])
def test_fused_prefill_equals_the_einsum_path(scan, kw):
    """A model whose attention resolves to a fused impl ('xla' here; 'cudnn' on a GPU) prefills
    right-padded prompts in one forward: greedy (unrolled layers) and sampled (scanned layers)
    tokens and log-probs equal the chunked einsum path's (GQA 3, mixed lengths, a dummy row)."""
    cfg = DecoderConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024)
    ein = CausalLM(cfg, rngs=nnx.Rngs(3), scan_layers=scan)
    xla = CausalLM(cfg, rngs=nnx.Rngs(3), scan_layers=scan, attention="xla")
    assert sampling.prefill_path(ein) == "einsum" and sampling.prefill_path(xla) == "xla"
    prompts = random_prompts(97, (300, 5, 170), seed=2)
    a = generate(ein, prompts, 10, prefill_chunk=64, sampler=Sampler(), **kw)
    b = generate(xla, prompts, 10, sampler=Sampler(), **kw)
    assert a.tokens == b.tokens and [len(t) for t in a.tokens] == [10] * 3
    np.testing.assert_allclose(np.concatenate(b.logprobs), np.concatenate(a.logprobs), atol=2e-5)
    np.testing.assert_allclose(np.concatenate(b.model_logprobs),
                               np.concatenate(a.model_logprobs), atol=2e-5)


@pytest.mark.parametrize("attention", ["einsum", "xla"])
def test_right_padded_prefill_into_a_cache_gives_each_rows_last_real_token(attention):
    """hidden_states(right_padded=True, cache=empty, last_only=True): each row's hidden state at
    its last real token equals the unpadded row's forward, the cache holds its keys/values at
    slots 0..len-1, key_mask marks them and pos is the length (einsum and fused paths)."""
    cfg = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = CausalLM(cfg, rngs=nnx.Rngs(5), attention=attention)
    lens, T = (9, 3, 16), 16
    rows = random_prompts(64, lens, seed=5)
    ids = np.zeros((3, T), np.int32)
    mask = np.zeros((3, T), bool)
    for r, p in enumerate(rows):
        ids[r, :len(p)], mask[r, :len(p)] = p, True

    @nnx.jit
    def prefill(m, ids, mask):
        return m.hidden_states(ids, attention_mask=mask, cache=m.new_cache(3, T + 4),
                               last_only=True, right_padded=True)

    hidden, cache = prefill(model, jnp.asarray(ids), jnp.asarray(mask))
    assert hidden.shape == (3, 1, 32)
    np.testing.assert_array_equal(np.asarray(cache.key_mask[:, :T]), mask)
    assert not np.asarray(cache.key_mask[:, T:]).any()
    assert np.asarray(cache.pos).tolist() == list(lens) and int(cache.index) == T
    for r, p in enumerate(rows):
        alone, one = model.hidden_states(jnp.asarray([p]), cache=model.new_cache(1, len(p)),
                                         last_only=True)                  # eager, unpadded
        np.testing.assert_allclose(np.asarray(hidden[r, 0]), np.asarray(alone[0, 0]), atol=2e-5)
        np.testing.assert_allclose(np.asarray(cache.v[0][r, :, :len(p)]),
                                   np.asarray(one.v[0][0]), atol=1e-6)
        np.testing.assert_allclose(np.asarray(cache.k[1][r, :, :, :len(p)]),
                                   np.asarray(one.k[1][0]), atol=1e-6)


# --------------------------------------------------------------------------- memory
def test_plan_compile_of_a_long_prefill_bounds_its_scores():
    """Compiled only (nothing runs): 16 prompts x 4096 slots through the tiny model. The auto
    chunk (128) keeps the prefill's temporaries far under one layer's [16, 4, 4096, 4096] float32
    scores (4 GiB), which the single-chunk prefill holds."""
    cfg = DecoderConfig(**{**LONG_SHAPE, "max_position_embeddings": 4096 + 64})
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: CausalLM(cfg, scan_layers=True)), nnx.Param)
    temps = {}
    for chunk in (-1, 0):
        p = sampling.compile_for_plan(graphdef, abstract, 16, 4096, 16, None, jnp.float32,
                                      prefill_chunk=chunk)
        assert (p["batch"], p["prompt_slots"], p["new_slots"]) == (16, 4096, 16)
        assert p["prefill_attention"] == "einsum" and p["chunk"] == (128 if chunk else 4096)
        assert p["cache_bytes"] == 2 * 2 * 16 * 2 * 16 * (4096 + 16) * 4  # k and v, L B K hd S f32
        temps[chunk] = p["prefill"].memory_analysis().temp_size_in_bytes
    scores = 16 * 4 * 4096 * 4096 * 4
    assert temps[0] >= scores and temps[-1] < 3 * sampling.PREFILL_SCORE_BYTES, temps


RSS_CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from flax import nnx
    from hgpo_jax.models import DecoderConfig, CausalLM
    from hgpo_jax.rl.sampling import generate, prefill_chunk_size
    chunk = int(sys.argv[1])
    cfg = DecoderConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096 + 64)
    model = CausalLM(cfg, rngs=nnx.Rngs(0), scan_layers=True)
    rs = np.random.RandomState(0)
    lens = rs.randint(3000, 4097, 16)
    prompts = [rs.randint(0, 512, n).tolist() for n in lens]
    out = generate(model, prompts, 16, temperature=1.0, rng=0, prefill_chunk=chunk)
    assert [len(t) for t in out.tokens] == [16] * 16 and out.prefill_s > 0 and out.decode_s > 0
    # this process's peak RSS: VmHWM belongs to its own address space (ru_maxrss can carry the
    # size of the forked parent, e.g. pytest's, across exec)
    try:
        with open("/proc/self/status") as f:
            peak_kib = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    except OSError:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(min(lens), max(lens), prefill_chunk_size(chunk, 16, 4, 4096), peak_kib,
          round(out.compile_s, 2), round(out.prefill_s, 2), round(out.decode_s, 2))
""")


def run_rss_child(chunk: int) -> dict:
    """Sample 16 prompts of 3000-4096 tokens in a fresh interpreter; its peak RSS and timings."""
    # one CPU device; XLA's optimized code: the child runs 16 x 4k-token prefills, compiles little
    env = child_env(fast_compile=False)
    done = subprocess.run([sys.executable, "-c", RSS_CHILD, str(chunk)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lo, hi, used_chunk, kib, compile_s, prefill_s, decode_s = done.stdout.split()[-7:]
    return dict(lo=int(lo), hi=int(hi), chunk=int(used_chunk), peak_gib=int(kib) / 2**20,
                compile_s=float(compile_s), prefill_s=float(prefill_s), decode_s=float(decode_s))


def test_long_prompts_sample_under_2_gib_in_a_fresh_process():
    """16 left-padded prompts of 3,000-4,096 tokens, 16 new tokens, tiny model, default (auto)
    chunk: the process's peak RSS stays under 2 GiB (one forward over the whole bucket peaks at
    ~9 GiB: its [16, 4, 4096, 4096] float32 scores alone are 4 GiB)."""
    res = run_rss_child(-1)
    assert res["lo"] >= 3000 and res["hi"] <= 4096 and res["chunk"] == 128
    assert res["peak_gib"] < 2.0, res


# --------------------------------------------------------------------------- config and rollout
def test_prefill_chunk_config_key():
    assert Config().rollout.prefill_chunk == -1
    c = load_config(None, ["rollout.prefill_chunk=512"])
    assert c.rollout.prefill_chunk == 512
    assert load_config(None, ["rollout.prefill_chunk=0"]).rollout.prefill_chunk == 0
    for bad, match in (("-2", "rollout.prefill_chunk=-2: must be -1 \\(auto\\)"),
                       ("1.5", "rollout.prefill_chunk"), ("auto", "rollout.prefill_chunk")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, [f"rollout.prefill_chunk={bad}"])


def test_prefill_chunk_round_trips_through_yaml(tmp_path):
    c = load_config(None, ["rollout.prefill_chunk=128"])
    again = load_config(save_config(c, str(tmp_path / "config.yaml")))
    assert again == c and again.rollout.prefill_chunk == 128
    with open(tmp_path / "part.yaml", "w") as f:
        f.write("rollout:\n  prefill_chunk: 0\n")
    assert load_config(str(tmp_path / "part.yaml")).rollout.prefill_chunk == 0


def test_policy_passes_prefill_chunk_to_the_sampler(monkeypatch):
    from hgpo_jax.rl.policy import Policy

    seen = {}

    def fake_generate(model, prompts, max_new_tokens, **kw):
        seen.update(kw)
        return "out"

    class Tok:
        eos_token_ids = [1]

    monkeypatch.setattr(sampling, "generate", fake_generate)
    assert Policy(None, Tok(), prefill_chunk=128).generate([[1, 2]], rng=0) == "out"
    assert seen["prefill_chunk"] == 128
    assert Policy(None, Tok()).prefill_chunk == -1


def test_fused_prefill_in_row_groups_equals_one_forward_and_einsum(monkeypatch):
    """The fused prefill (attention='xla' here; cuDNN/splash on GPU/TPU) split into 1, 4 or 8
    forwards of interleaved rows gives the einsum path's greedy tokens, for both layer layouts."""
    cfg = DecoderConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    rs = np.random.RandomState(0)
    prompts = [rs.randint(1, 128, n).tolist() for n in (50, 120, 7, 90, 128, 33, 64, 100)]
    for scan in (False, True):
        ref = generate(CausalLM(cfg, rngs=nnx.Rngs(0), scan_layers=scan,
                                        attention="einsum"), prompts, 10, temperature=0,
                       sampler=Sampler())
        fused = CausalLM(cfg, rngs=nnx.Rngs(0), scan_layers=scan, attention="xla")
        for budget, groups in ((1 << 15, 1), (256, 4), (128, 8)):
            monkeypatch.setattr(sampling, "PREFILL_ROW_TOKENS", budget)
            assert sampling.prefill_row_groups(-1, 8, 128) == groups
            out = generate(fused, prompts, 10, temperature=0, sampler=Sampler())
            assert out.tokens == ref.tokens, (scan, groups)
            np.testing.assert_allclose(np.concatenate(out.logprobs),
                                       np.concatenate(ref.logprobs), atol=1e-5)
    assert sampling.prefill_row_groups(0, 8, 128) == 1   # prefill_chunk=0: one forward
    monkeypatch.undo()
    assert sampling.prefill_row_groups(-1, 128, 4096) == 16  # the paper's rollout on one device
    assert sampling.prefill_row_groups(-1, 3, 4096 * 16) == 1  # no power of two divides 3
