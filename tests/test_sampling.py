"""The batched sampler: greedy parity with transformers, sampling statistics, top-k / top-p sets,
log-probs, eos handling, bucketing / compile counts, sharding, errors, and the benchmark script."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from child_env import child_env
from hf_models import TINY_SHAPES, build_hf_model

from hgpo_jax.models import load_pretrained, make_mesh
from hgpo_jax.rl import sampling
from hgpo_jax.rl.sampling import Sampler, filter_logits, generate, sample_token

MAX_NEW = 14                       # bucket 16
PROMPT_LENS = (5, 11, 3, 8)        # batch bucket 4, prompt bucket 32
PARITY_SHAPES = ("tied_gqa2", "untied_gqa6_odd")  # GQA 2 and GQA 6, tied and untied


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """shape name -> (transformers model, Flax model) with the same random weights."""
    out = {}
    for name in PARITY_SHAPES:
        folder = tmp_path_factory.mktemp(f"sampler-{name}")
        hf = build_hf_model(TINY_SHAPES[name], folder)
        out[name] = (hf, load_pretrained(folder), str(folder))
    return out


@pytest.fixture(scope="module")
def sampler():
    """One compiled-program cache for the module, so tests share buckets."""
    return Sampler()


def make_prompts(vocab: int, lens=PROMPT_LENS, seed: int = 0) -> list[list[int]]:
    rs = np.random.RandomState(seed)
    return [rs.randint(0, vocab, n).tolist() for n in lens]


def hf_greedy(hf, prompt, max_new, eos=None) -> list[int]:
    """transformers greedy continuation of one unpadded prompt (eos kept, nothing after it)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=max_new, min_new_tokens=0,
                          eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def cut_after(tokens, eos_ids):
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i + 1]
    return tokens


_forward = nnx.jit(lambda model, ids: model(ids))
FORWARD_LEN = 64


def full_forward_logits(model, prompt, tokens) -> np.ndarray:
    """Logits [len(tokens), V] that predicted each generated token, from one full forward without
    cache or left padding over prompt + tokens (right-padded to FORWARD_LEN so one compile serves
    every call; causal attention makes the right padding invisible to earlier positions)."""
    seq = prompt + tokens
    ids = np.zeros((1, FORWARD_LEN), np.int32)
    ids[0, :len(seq)] = seq
    logits = np.asarray(_forward(model, jnp.asarray(ids))[0], np.float64)
    return logits[len(prompt) - 1: len(seq) - 1]


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# --------------------------------------------------------------------------- greedy parity
@pytest.mark.parametrize("shape", PARITY_SHAPES)
def test_greedy_matches_transformers_on_left_padded_batch(models, sampler, shape):
    hf, model, _ = models[shape]
    prompts = make_prompts(model.config.vocab_size)
    free = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    # eos: a token that first shows up mid-way in some row, so that row stops early
    candidates = [row[i] for row in free for i in range(2, MAX_NEW - 2) if row[i] not in row[:i]]
    eos = candidates[0] if candidates else free[0][-1]

    expected = [hf_greedy(hf, p, MAX_NEW, eos=eos) for p in prompts]
    out = generate(model, prompts, MAX_NEW, temperature=0, eos_token_id=eos, sampler=sampler)
    assert out.tokens == expected
    assert [cut_after(row, [eos]) for row in free] == expected
    if candidates:
        assert any(len(row) < MAX_NEW and row[-1] == eos for row in out.tokens)
    assert all(len(lp) == len(t) for lp, t in zip(out.logprobs, out.tokens))
    np.testing.assert_array_equal(np.concatenate(out.logprobs), np.concatenate(out.model_logprobs))


# --------------------------------------------------------------------------- filtering
def np_top_k_keep(scaled, k):
    return scaled >= np.sort(scaled)[-k]


def np_top_p_keep(scaled, top_p):
    """transformers' TopPLogitsWarper, literally: ascending sort, remove cumsum <= 1 - top_p,
    keep the last (most likely) token."""
    order = np.argsort(scaled, kind="stable")
    probs = np.exp(log_softmax(scaled[order].astype(np.float64)))
    remove_sorted = np.cumsum(probs) <= 1 - top_p
    remove_sorted[-1] = False
    remove = np.zeros(len(scaled), bool)
    remove[order] = remove_sorted
    return ~remove


def kept(filtered) -> np.ndarray:
    return np.isfinite(np.asarray(filtered))


def test_filter_logits_top_k_keeps_exactly_the_k_highest():
    logits = np.random.RandomState(1).normal(size=(3, 40)).astype(np.float32) * 2
    for k in (1, 5, 39, 40, 100):
        got = kept(filter_logits(jnp.asarray(logits), 0.7, top_k=k))
        assert (got.sum(axis=-1) == min(k, 40)).all()
        for row, keep in zip(logits, got):
            np.testing.assert_array_equal(keep, np_top_k_keep(row, min(k, 40)))
    # kept logits are the temperature-scaled ones, untouched
    out = np.asarray(filter_logits(jnp.asarray(logits), 0.5, top_k=5))
    np.testing.assert_allclose(out[kept(out)], (logits / 0.5)[kept(out)], rtol=1e-6)


def test_filter_logits_top_p_matches_transformers_rule():
    rs = np.random.RandomState(2)
    for trial in range(20):
        row = (rs.normal(size=50) * rs.uniform(0.5, 4)).astype(np.float32)
        for top_p in (0.05, 0.3, 0.6, 0.9, 0.99):
            for temperature in (1.0, 0.6):
                got = kept(filter_logits(jnp.asarray(row), temperature, top_p=top_p))
                np.testing.assert_array_equal(got, np_top_p_keep(row / temperature, top_p))
    assert kept(filter_logits(jnp.asarray(row), 1.0, top_p=1.0)).all()          # off: keeps all
    assert kept(filter_logits(jnp.asarray(row), 1.0, top_p=1e-6)).sum() == 1     # top token only


def test_filter_logits_top_p_edge_where_the_cumulative_sum_hits_top_p_exactly():
    probs = np.array([0.0625, 0.5, 0.125, 0.0625, 0.25])   # dyadic: exact in float32
    logits = jnp.asarray(np.log(probs), jnp.float32)
    ordered = jax.nn.softmax(jnp.sort(logits))
    assert np.cumsum(np.asarray(ordered)).tolist() == [0.0625, 0.125, 0.25, 0.5, 1.0]  # premise
    cases = {0.5: [0, 1, 0, 0, 0],        # 0.5 reached by the top token alone
             0.75: [0, 1, 0, 0, 1],       # 0.5 + 0.25 lands exactly on 0.75: the 0.125 is dropped
             0.875: [0, 1, 1, 0, 1],
             0.7: [0, 1, 0, 0, 1],
             1.0: [1, 1, 1, 1, 1]}
    for top_p, expect in cases.items():
        got = kept(filter_logits(logits, 1.0, top_p=top_p)).astype(int).tolist()
        assert got == expect, top_p
        assert got == np_top_p_keep(np.log(probs), top_p).astype(int).tolist()


def test_filter_logits_applies_top_k_before_top_p():
    row = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    # after top-2 the kept mass renormalizes to (4/7, 3/7): top_p 0.5 keeps only the first
    got = kept(filter_logits(jnp.asarray(row, jnp.float32), 1.0, top_k=2, top_p=0.5))
    assert got.tolist() == [True, False, False, False]
    assert kept(filter_logits(jnp.asarray(row, jnp.float32), 1.0, top_p=0.5)).sum() == 2


# --------------------------------------------------------------------------- sampling statistics
N_DRAWS = 20_000


def draw(logits, temperature, top_k=0, top_p=1.0, seed=0):
    """N_DRAWS independent sample_token calls on the same logits [V] in one jitted vmap."""
    keys = jax.random.split(jax.random.PRNGKey(seed), N_DRAWS)
    top_p_arg = top_p if top_p < 1.0 else 1.0

    @jax.jit
    def run(keys, logits):
        def one(key):
            tok, lp, mlp = sample_token(logits[None], key, temperature, greedy=False,
                                        top_k=top_k, top_p=top_p_arg)
            return tok[0], lp[0], mlp[0]
        return jax.vmap(one)(keys)

    tok, lp, mlp = run(keys, jnp.asarray(logits, jnp.float32))
    return np.asarray(tok), np.asarray(lp), np.asarray(mlp)


def chi_square_pvalue(counts, probs) -> float:
    """Pearson chi-square goodness of fit over the categories with probs > 0."""
    support = probs > 0
    expected = counts.sum() * probs[support]
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    return float(jax.scipy.special.gammaincc(dof / 2, stat / 2))


LOGITS = np.random.RandomState(3).normal(size=12) * 1.5


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_frequencies_match_softmax(temperature):
    tok, lp, mlp = draw(LOGITS, temperature)
    probs = np.exp(log_softmax(LOGITS / temperature))
    counts = np.bincount(tok, minlength=len(LOGITS))
    assert chi_square_pvalue(counts, probs) > 1e-3
    np.testing.assert_allclose(lp, np.log(probs)[tok], atol=1e-5)             # policy log-prob
    np.testing.assert_allclose(mlp, log_softmax(LOGITS)[tok], atol=1e-5)       # model log-prob


def assert_samples_only_kept_tokens(tok, lp, keep, temperature):
    """Draws `tok` hit every kept token and nothing else, with frequencies (chi-square) and
    log-probs `lp` of softmax(LOGITS / temperature) renormalized over the kept set."""
    counts = np.bincount(tok, minlength=len(LOGITS))
    assert counts[~keep].sum() == 0 and (counts[keep] > 0).all()
    probs = np.where(keep, np.exp(LOGITS / temperature), 0.0)
    probs /= probs.sum()
    assert chi_square_pvalue(counts, probs) > 1e-3
    np.testing.assert_allclose(lp, np.log(probs[tok]), atol=1e-5)


def test_top_k_samples_only_the_k_highest_with_renormalized_frequencies():
    temperature, k = 0.8, 4
    tok, lp, _ = draw(LOGITS, temperature, top_k=k)
    assert_samples_only_kept_tokens(tok, lp, np_top_k_keep(LOGITS, k), temperature)


def test_top_p_samples_only_the_nucleus_with_renormalized_frequencies():
    temperature, top_p = 1.0, 0.8
    tok, lp, _ = draw(LOGITS, temperature, top_p=top_p)
    keep = np_top_p_keep(LOGITS / temperature, top_p)
    assert 1 < keep.sum() < len(LOGITS)
    assert_samples_only_kept_tokens(tok, lp, keep, temperature)


def test_two_level_categorical_matches_softmax_on_a_ragged_vocabulary_with_holes():
    """categorical's block CDF (block 8 for V = 50: the last block is short and padded) draws
    each token with its softmax probability, never a -inf token: not the first or last token,
    not a whole empty block, not the holes inside a block."""
    vocab = 50
    assert sampling.cdf_block_size(vocab) == 8
    logits = np.random.RandomState(5).normal(size=vocab) * 1.2
    holes = np.zeros(vocab, bool)
    holes[[0, 3, 9, 49]] = True            # edges of the vocabulary and of blocks
    holes[16:24] = True                    # a whole block
    logits = np.where(holes, -np.inf, logits)
    keys = jax.random.split(jax.random.PRNGKey(11), N_DRAWS)
    tok = np.asarray(jax.jit(jax.vmap(
        lambda k: sampling.categorical(k, jnp.asarray(logits, jnp.float32)[None])[0]))(keys))
    counts = np.bincount(tok, minlength=vocab)
    assert counts[holes].sum() == 0
    probs = np.exp(log_softmax(np.where(holes, -1e30, logits)))
    probs[holes] = 0.0
    assert chi_square_pvalue(counts, probs) > 1e-3
    # a one-hot row (all mass on one token, every other weight 0) always returns that token
    onehot = jnp.full((3, vocab), -jnp.inf).at[jnp.arange(3), jnp.asarray([0, 31, 49])].set(0.0)
    for seed in range(5):
        assert sampling.categorical(jax.random.PRNGKey(seed), onehot).tolist() == [0, 31, 49]


def test_greedy_step_is_argmax_with_model_logprob():
    logits = jnp.asarray(np.stack([LOGITS, -LOGITS]), jnp.float32)
    tok, lp, mlp = sample_token(logits, jax.random.PRNGKey(0), 1.0, greedy=True)
    assert tok.tolist() == [int(np.argmax(LOGITS)), int(np.argmin(LOGITS))]
    np.testing.assert_allclose(lp, mlp)
    np.testing.assert_allclose(lp[0], log_softmax(LOGITS)[np.argmax(LOGITS)], atol=1e-6)


# --------------------------------------------------------------------------- log-probs
def test_logprobs_equal_the_models_log_softmax_of_the_chosen_tokens(models, sampler):
    _, model, _ = models["tied_gqa2"]
    prompts = make_prompts(model.config.vocab_size, seed=1)
    out = generate(model, prompts, MAX_NEW, temperature=1.0, rng=7, sampler=sampler)
    assert [len(t) for t in out.tokens] == [MAX_NEW] * len(prompts)   # no eos: full length
    # T = 1, no filter: the sampling policy is the model
    np.testing.assert_array_equal(np.concatenate(out.logprobs), np.concatenate(out.model_logprobs))
    for prompt, toks, lps in zip(prompts, out.tokens, out.model_logprobs):
        ref = log_softmax(full_forward_logits(model, prompt, toks))
        np.testing.assert_allclose(lps, ref[np.arange(len(toks)), toks], atol=2e-5)


def test_filtered_logprobs_are_under_the_filtered_tempered_distribution(models, sampler):
    _, model, _ = models["tied_gqa2"]
    prompts = make_prompts(model.config.vocab_size, seed=2)
    temperature, top_k, top_p = 0.7, 20, 0.9
    out = generate(model, prompts, MAX_NEW, temperature=temperature, top_k=top_k, top_p=top_p,
                   rng=jax.random.PRNGKey(3), sampler=sampler)
    for prompt, toks, lps, mlps in zip(prompts, out.tokens, out.logprobs, out.model_logprobs):
        logits = full_forward_logits(model, prompt, toks)
        idx = np.arange(len(toks))
        filtered = np.asarray(filter_logits(jnp.asarray(logits, jnp.float32), temperature,
                                            top_k, top_p), np.float64)
        assert np.isfinite(filtered[idx, toks]).all()      # every token is inside its kept set
        np.testing.assert_allclose(lps, log_softmax(filtered)[idx, toks], atol=2e-5)
        np.testing.assert_allclose(mlps, log_softmax(logits)[idx, toks], atol=2e-5)


def test_rng_seeds(models, sampler):
    _, model, _ = models["tied_gqa2"]
    prompts = make_prompts(model.config.vocab_size)
    a = generate(model, prompts, MAX_NEW, rng=5, sampler=sampler).tokens
    assert generate(model, prompts, MAX_NEW, rng=jax.random.PRNGKey(5), sampler=sampler).tokens == a
    assert generate(model, prompts, MAX_NEW, rng=jax.random.key(5), sampler=sampler).tokens == a
    assert generate(model, prompts, MAX_NEW, rng=6, sampler=sampler).tokens != a
    default = generate(model, prompts, MAX_NEW, sampler=sampler).tokens     # rng=None: seed 0
    assert default == generate(model, prompts, MAX_NEW, rng=0, sampler=sampler).tokens


# --------------------------------------------------------------------------- eos
def test_rows_stop_after_their_first_eos(models, sampler):
    _, model, _ = models["untied_gqa6_odd"]
    prompts = make_prompts(model.config.vocab_size, seed=4)
    free = generate(model, prompts, MAX_NEW, temperature=0, sampler=sampler).tokens
    first = free[1][0]                                # row 1 stops at its first step
    later = next((row[i] for row in free for i in range(3, MAX_NEW)
                  if row[i] not in row[:i] and row[i] != first), None)
    eos_ids = [first] if later is None else [first, later]
    out = generate(model, prompts, MAX_NEW, temperature=0, eos_token_id=eos_ids, sampler=sampler)
    assert out.tokens[1] == [first]
    assert out.tokens == [cut_after(row, eos_ids) for row in free]
    assert any(len(row) == MAX_NEW for row in out.tokens) or later is not None
    # a single int works too
    single = generate(model, prompts, MAX_NEW, temperature=0, eos_token_id=first, sampler=sampler)
    assert single.tokens == [cut_after(row, [first]) for row in free]


def test_sampled_rows_stop_at_eos_and_logprobs_match(models, sampler):
    _, model, _ = models["tied_gqa2"]
    prompts = make_prompts(model.config.vocab_size, seed=5)
    eos = list(range(0, model.config.vocab_size, 9))      # ~11% of tokens end a row
    out = generate(model, prompts, MAX_NEW, temperature=1.0, eos_token_id=eos, rng=11,
                   sampler=sampler)
    for prompt, toks, lps in zip(prompts, out.tokens, out.logprobs):
        assert toks == cut_after(toks, eos) and 1 <= len(toks) <= MAX_NEW
        assert len(toks) == MAX_NEW or toks[-1] in eos
        ref = log_softmax(full_forward_logits(model, prompt, toks))
        np.testing.assert_allclose(lps, ref[np.arange(len(toks)), toks], atol=2e-5)


# --------------------------------------------------------------------------- buckets
def test_one_compile_per_bucket(models):
    _, model, _ = models["tied_gqa2"]
    vocab = model.config.vocab_size
    s = Sampler()
    for seed, lens in enumerate([(3, 7, 30), (32, 1, 9, 2), (17, 4, 4), (5, 6, 12)]):   # B<=4, P<=32
        out = generate(model, make_prompts(vocab, lens, seed), 9 + seed, temperature=0.5 + seed / 4,
                       top_p=0.9 - seed / 10, rng=seed, sampler=s)        # N bucket 16
        assert [len(t) for t in out.tokens] == [9 + seed] * len(lens)
        assert s.num_compiles == 1 and out.num_compiles == 1
    assert out.compile_s == 0.0 and s.compile_s > 0
    generate(model, make_prompts(vocab, (4,) * 5), 9, sampler=s)               # batch bucket 8
    assert s.num_compiles == 2
    generate(model, make_prompts(vocab, (33,)), 9, sampler=s)                  # prompt bucket 64
    assert s.num_compiles == 3
    generate(model, make_prompts(vocab, (4,) * 5), 9, sampler=s)               # cached
    assert s.num_compiles == 3 and s.held == 3


def test_a_sampler_is_bounded_and_owned(models):
    """A Sampler keeps at most max_programs programs, dropping the least recently used (a bucket
    seen again after its drop compiles again); `clear` drops all; `generate` without a sampler
    compiles for that call alone (no process-wide cache: another caller's programs are never
    reused); a Policy generates with its own sampler, or the one it is given."""
    from types import SimpleNamespace

    from hgpo_jax.rl.policy import Policy

    _, model, _ = models["tied_gqa2"]
    vocab = model.config.vocab_size
    s = Sampler(max_programs=2)
    for lens in ((4,), (4,) * 3, (4,), (4,) * 5):                 # B buckets 1, 4, 1 (kept), 8
        generate(model, make_prompts(vocab, lens), 5, sampler=s)
    assert s.num_compiles == 3 and s.held == 2                    # 4 was dropped, 1 kept
    generate(model, make_prompts(vocab, (4,) * 3), 5, sampler=s)  # 4 again: compiled again
    assert s.num_compiles == 4 and s.held == 2
    s.clear()
    assert s.held == 0 and s.num_compiles == 4
    with pytest.raises(ValueError, match="max_programs=0"):
        Sampler(max_programs=0)
    first = generate(model, make_prompts(vocab, (4,)), 5)
    second = generate(model, make_prompts(vocab, (4,)), 5)
    assert first.num_compiles == second.num_compiles == 1 and second.compile_s > 0
    assert not hasattr(sampling, "DEFAULT_SAMPLER")
    tokenizer = SimpleNamespace(eos_token_ids=[])
    own, other = Policy(model, tokenizer, max_new_tokens=5), Policy(model, tokenizer, max_new_tokens=5)
    assert own.sampler is not other.sampler
    shared = Sampler()
    for _ in range(2):
        Policy(model, tokenizer, max_new_tokens=5, sampler=shared).generate(
            make_prompts(vocab, (4,)), 0)
    assert shared.num_compiles == 1


def test_buckets():
    assert [sampling.batch_bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    assert [sampling.batch_bucket(n, 4) for n in (1, 3, 5, 8)] == [4, 4, 8, 8]
    assert sampling.batch_bucket(3, 6) == 6
    assert [sampling.prompt_bucket(n) for n in (1, 32, 33, 100, 257)] == [32, 32, 64, 128, 512]
    assert [sampling.new_tokens_bucket(n) for n in (1, 8, 9, 32)] == [8, 8, 16, 32]


# --------------------------------------------------------------------------- sharding
def test_sharded_params_and_cache_give_the_unsharded_greedy_output(models, sampler):
    _, model, folder = models["tied_gqa2"]
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = load_pretrained(folder, mesh=mesh)
    prompts = make_prompts(model.config.vocab_size, lens=(5, 11, 3), seed=6)
    ref = generate(model, prompts, MAX_NEW, temperature=0, sampler=sampler)
    s = Sampler()
    out = generate(sharded, prompts, MAX_NEW, temperature=0, sampler=s)      # mesh detected
    assert out.tokens == ref.tokens
    np.testing.assert_allclose(np.concatenate(out.logprobs), np.concatenate(ref.logprobs),
                               atol=1e-5)
    assert sampling.params_mesh(jax.tree.leaves(sharded)) is mesh
    # sampling runs too (different rng layout, so only shapes are compared)
    sampled = generate(sharded, prompts, MAX_NEW, temperature=1.0, rng=1, sampler=s)
    assert [len(t) for t in sampled.tokens] == [MAX_NEW] * 3


# --------------------------------------------------------------------------- errors
def test_errors(models, sampler):
    _, model, _ = models["tied_gqa2"]
    assert generate(model, [], 4, sampler=sampler).tokens == []
    cases = [
        (dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
        (dict(prompts=[[1] * 30], max_new_tokens=model.config.max_position_embeddings), "max_position"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(prompts=[[1, model.config.vocab_size]]), "vocabulary"),
    ]
    for kwargs, match in cases:
        args = dict(prompts=[[1, 2, 3]], max_new_tokens=4)
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            generate(model, args.pop("prompts"), args.pop("max_new_tokens"), sampler=sampler,
                     **args)


# --------------------------------------------------------------------------- benchmark script
def test_bench_sampler_runs(capsys):
    from experiments.benchmarks import bench_sampler as module

    res = module.main(["--batch", "2", "--prompt", "8", "--new", "4", "--repeats", "1"])
    assert res["jax_tok_s"] > 0 and res["torch_tok_s"] > 0 and res["num_compiles"] == 1
    assert res["jax_dp_tok_s"] > 0 and res["devices"] == min(os.cpu_count(), 8)
    out = capsys.readouterr().out
    assert "ratio hgpo_jax (1 device)/transformers" in out
    assert f"ratio hgpo_jax ({res['devices']} devices)/transformers" in out


def test_request_cpu_devices_splits_the_cpu_and_refuses_once_jax_started():
    """In a fresh interpreter: two CPU devices, a data-parallel generate on them equals the
    one-device greedy output, and asking for another count after JAX ran raises with the fix."""
    code = textwrap.dedent("""
        import jax
        from flax import nnx
        from hgpo_jax.models import DecoderConfig, CausalLM, make_mesh, request_cpu_devices
        from hgpo_jax.rl.update import shard_params
        from hgpo_jax.rl.sampling import generate
        assert request_cpu_devices(2) == 2
        assert len(jax.devices("cpu")) == 2
        cfg = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        model = CausalLM(cfg)
        prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
        one = generate(model, prompts, 6, temperature=0).tokens
        mesh = make_mesh(data=2)
        nnx.update(model, shard_params(nnx.state(model), mesh))
        assert generate(model, prompts, 6, temperature=0, mesh=mesh).tokens == one
        try:
            request_cpu_devices(3)
        except RuntimeError as err:
            assert "before any array is created" in str(err)
        else:
            raise AssertionError("no error after JAX started")
        print("ok")
    """)
    env = child_env()  # one CPU device
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_a_rows_samples_depend_on_its_id_not_on_the_batch():
    """Per-row keys (`row_ids`): each prompt sampled alone, in a batch of 5 (bucket 8) or split in
    two calls, with the same ids and rng, draws the same tokens; another id draws others. This
    is what makes a rollout's samples independent of the process count (docs/multihost.md)."""
    from hgpo_jax.models import DecoderConfig, CausalLM

    model = CausalLM(DecoderConfig(**TINY_SHAPES["tied_gqa2"]), rngs=nnx.Rngs(0))
    rs = np.random.RandomState(3)
    prompts = [rs.randint(1, 128, n).tolist() for n in (5, 9, 3, 12, 7)]
    ids = [40, 3, 17, 0, 8]
    s = Sampler()
    kw = dict(temperature=1.0, rng=jax.random.PRNGKey(7), sampler=s)
    together = generate(model, prompts, 12, row_ids=ids, **kw)
    split = [generate(model, prompts[:2], 12, row_ids=ids[:2], **kw),
             generate(model, prompts[2:], 12, row_ids=ids[2:], **kw)]
    alone = [generate(model, [p], 12, row_ids=[i], **kw) for p, i in zip(prompts, ids)]
    assert together.tokens == split[0].tokens + split[1].tokens
    assert together.tokens == [a.tokens[0] for a in alone]
    np.testing.assert_allclose(np.concatenate(together.logprobs),
                               np.concatenate([a.logprobs[0] for a in alone]), atol=1e-5)
    other = generate(model, prompts, 12, row_ids=[i + 100 for i in ids], **kw)
    assert other.tokens != together.tokens
    # without row_ids the rows are numbered by their place: the same as ids 0..n-1
    assert generate(model, prompts, 12, **kw).tokens == generate(
        model, prompts, 12, row_ids=list(range(5)), **kw).tokens
    with pytest.raises(ValueError, match="row_ids"):
        generate(model, prompts, 4, row_ids=[1, 2], **kw)
    # max_rows (rollout.max_num_seqs): the prompts in batches of at most 2, joined in order: the
    # same draws, with and without row_ids; the programs are those of the smaller batch
    batched = generate(model, prompts, 12, row_ids=ids, max_rows=2, **kw)
    assert batched.tokens == together.tokens
    np.testing.assert_allclose(np.concatenate(batched.logprobs),
                               np.concatenate(together.logprobs), atol=1e-5)
    assert generate(model, prompts, 12, max_rows=3, **kw).tokens == generate(
        model, prompts, 12, row_ids=list(range(5)), **kw).tokens
    assert generate(model, prompts, 12, row_ids=ids, max_rows=5, **kw).tokens == together.tokens
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_rows must be an int >= 0"):
            generate(model, prompts, 4, max_rows=bad, **kw)


# --------------------------------------------------------------------------- weights in the compute dtype
def _master_and_cast(model):
    """(a copy of `model` with fp32 master weights and bf16 compute, the same weights stored bf16)."""
    from hgpo_jax.models.decoder import CausalLM, cast_to_compute
    master = CausalLM(model.config, dtype="bfloat16", param_dtype="float32",
                              rngs=nnx.Rngs(3))
    return master, cast_to_compute(nnx.clone(master))


def test_cast_to_compute_stores_weights_in_the_compute_dtype_with_the_same_logits(models):
    master, cast = _master_and_cast(models["tied_gqa2"][1])
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(cast, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(nnx.state(master, nnx.Param))} == {jnp.dtype(jnp.float32)}
    ids = jnp.asarray(make_prompts(master.config.vocab_size, lens=(FORWARD_LEN,), seed=4))
    np.testing.assert_array_equal(np.asarray(_forward(master, ids), np.float32),
                                  np.asarray(_forward(cast, ids), np.float32))


def test_fp32_master_weights_sample_as_their_bf16_copy(models, sampler):
    """The sampler converts master weights once per call (rl.sampling._sampling_model); the samples
    and log-probs are those of the same weights stored in the compute dtype."""
    master, cast = _master_and_cast(models["tied_gqa2"][1])
    prompts = make_prompts(master.config.vocab_size, seed=5)
    a = generate(master, prompts, MAX_NEW, temperature=1.0, rng=3, sampler=sampler)
    b = generate(cast, prompts, MAX_NEW, temperature=1.0, rng=3, sampler=sampler)
    assert a.tokens == b.tokens
    np.testing.assert_array_equal(np.concatenate(a.logprobs), np.concatenate(b.logprobs))
