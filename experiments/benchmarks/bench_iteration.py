"""One HGPO iteration of a paper config, each phase timed and set against its physical limit on the
device it ran on. A benchmark: nothing is asserted.

    python -m experiments.benchmarks.bench_iteration --shape tiny --min-prompt-tokens 1024      # ALFWorld, CPU
    python -m experiments.benchmarks.bench_iteration --shape tiny --env webshop --min-prompt-tokens 1024
    python -m experiments.benchmarks.bench_iteration --shape 1.5b --min-prompt-tokens 1536 --json out.json  # 1 GPU
    python -m experiments.benchmarks.bench_iteration --shape qwen3-1.7b --min-prompt-tokens 1536 --json out.json
    python -m experiments.benchmarks.bench_iteration --shape tiny rollout.num_groups=2 env.max_steps=3    # key=value

What runs: `Trainer.run_iteration` of the paper config (`--env alfworld`:
hgpo_k2_alfworld_qwen2.5_1.5b, 16 groups x 8 envs, up to 50 steps, memory H = 2, prompts cut at
4096 tokens, responses up to 512; `--env webshop`: the WebShop one, up to 30 steps) on the real env
engine, on one device (mesh 1 x 1 x 1), with a random-weight model of `--shape`:
- tiny: 2 layers, hidden 64, vocab 1024 (hgpo_jax.models.local's "tiny" size), float32 compute;
- 1.5b: Qwen2.5-1.5B's architecture (vocab 151,936), the config's fp32 master weights and bf16
  compute; qwen3-1.7b: Qwen3-1.7B's (the same config, another family: docs/models.md).
All use the small byte-level BPE of `hgpo_jax.models.tiny` (trained offline in a second, word
pre-splitting like Qwen's) with Qwen2.5's chat template: it only sets the lengths. The folder is
built once (`--model-dir`, default `$HGPO_JAX_CACHE/models/bench-<shape>-v1`).
Random weights reply with garbage: every action is invalid, so every episode runs to the step
limit (the worst case) and its prompts stay near the first observation's length, shorter than a
real agent's (whose observations and admissible actions grow). `--min-prompt-tokens N` pads every
prompt to at least N tokens with its own tokens (cyclically, the real prompt last) to emulate
realistic lengths (ALFWorld with H = 2: 1-2k tokens); the natural lengths are reported as well.

Phases (wall seconds; a device phase's compile is its own row):
- env reset, prompts (building + tokenizing), replies (detokenizing + projection), env steps:
  `collect_rollouts`' timers (`time/*`); host work, no bound;
- prefill, decode: `GenerateOutput.prefill_s` / `decode_s` summed over the rollout's generate
  calls (one "generate" row when the sampler does not report them); sampler compile: `compile_s`;
- advantages: the trainer's `time/advantages` (incl. the oracle diagnostics);
- old / ref log-probs: the calls of the trainer's log-prob function (blocking; the compile of
  each new shape measured apart by compiling it ahead of time); packing: the rest of
  `time/logprobs`;
- update: the calls of the trainer's train step, or of a token-budget update's parts
  (`train.max_tokens_per_micro_batch`), timed the same way; update other: the rest.
Lower bounds (`--peak-flops`, `--peak-bw`; on a GPU known peaks by device name, on a CPU measured
in this run: a matmul in the compute dtype and a large reduction):
- prefill, log-probs, update: FLOPs / peak FLOP/s, FLOPs = 2 x matmul weights x tokens + causal
  attention 4 x layers x heads x head_dim x T(T+1)/2 per row + the LM head on the positions it
  projects (prefill: the last token; log-probs: the response tokens); update: 3 x a forward,
  4 x with `train.remat` (MFU, printed too, always counts 3 x);
- decode: per step max(bytes / bandwidth, FLOPs / peak), bytes = all weights once (compute dtype)
  + the KV cache of every running row (its real tokens).
Tokens and padding count real tokens against the slots the programs ran on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from hgpo_jax.config import load_config
from hgpo_jax.models.config import DecoderConfig
from hgpo_jax.rl.batching import TokenRows
from hgpo_jax.rl.policy import Policy
from hgpo_jax.rl.sampling import batch_bucket, new_tokens_bucket, prompt_bucket
from hgpo_jax.trainers.rl import Trainer

CONFIGS = {"alfworld": "hgpo_k2_alfworld_qwen2.5_1.5b", "webshop": "hgpo_k2_webshop_qwen2.5_1.5b"}
MODEL_VERSION = 1  # bump when the shapes or the tokenizer change: older cached folders are not reused
SHAPE_OVERRIDES = {  # applied before the command line's key=value overrides
    "tiny": ["model.dtype=float32", "model.compute_dtype=float32"],
    "1.5b": [],  # the paper config's: fp32 master weights, bf16 compute
    "qwen3-1.7b": [],  # Qwen3-1.7B's architecture (q/k norms, head_dim 128) in the same config
}
PRESET_SHAPES = {"1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "qwen3-1.7b": "Qwen/Qwen3-1.7B"}
ONE_DEVICE = ["mesh.data=1", "mesh.fsdp=1", "mesh.tensor=1"]
# Known dense 16-bit peaks per device: (substring of jax's device_kind, FLOP/s, bytes/s).
KNOWN_PEAKS = (("H200", 989e12, 4.8e12), ("H100 PCIe", 756e12, 2.0e12),
               ("H100", 989e12, 3.35e12))  # H100 SXM (device_kind "NVIDIA H100 80GB HBM3")
ENV_STEP_SHARE_LIMIT = 0.15  # env steps above this share of the rollout: overlap them (issue 27)


# --------------------------------------------------------------------------- the model
def shape_config(shape: str, vocab_size: int, eos_token_id: int) -> DecoderConfig:
    """The architecture of `--shape` (tiny: the local "tiny" size with `vocab_size` tokens)."""
    if shape == "tiny":
        from hgpo_jax.models.local import model_config

        return model_config("tiny", vocab_size, eos_token_id)
    if shape in PRESET_SHAPES:
        from hgpo_jax.trainers.plan import PRESETS

        return dataclasses.replace(PRESETS[PRESET_SHAPES[shape]], eos_token_id=eos_token_id,
                                   extra={})
    raise ValueError(f"unknown shape {shape!r}; use tiny, {', '.join(PRESET_SHAPES)}")


def build_model_folder(folder: str, shape: str, seed: int = 0) -> str:
    """A random-weight HF folder of `shape` with the small BPE and Qwen2.5's chat template, built
    once (reused when its config.json exists; written atomically by `save_pretrained`)."""
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    from flax import nnx

    from hgpo_jax.models.hf_io import save_pretrained
    from hgpo_jax.models.decoder import CausalLM
    from hgpo_jax.models.tiny import train_tiny_tokenizer
    from hgpo_jax.models.tokenizer import QWEN2_5_CHAT_TEMPLATE

    tokenizer = train_tiny_tokenizer()
    tokenizer.hf.chat_template = QWEN2_5_CHAT_TEMPLATE
    config = shape_config(shape, max(1024, tokenizer.vocab_size), tokenizer.end_of_turn_id)
    store = "float32" if shape == "tiny" else "bfloat16"  # random weights: bf16 halves the file
    print(f"building a random {shape} {config.model_type} in {folder} ...", flush=True)
    model = CausalLM(config, param_dtype=store, rngs=nnx.Rngs(seed))
    save_pretrained(model, folder, tokenizer=tokenizer, dtype=store)
    return folder


def default_model_dir(shape: str) -> str:
    from hgpo_jax.envs.data import cache_root

    return os.path.join(cache_root(), "models", f"bench-{shape}-v{MODEL_VERSION}")


# --------------------------------------------------------------------------- cost formulas
def matmul_weights(cfg: DecoderConfig) -> int:
    """Weights each token is multiplied by in the decoder layers (q, k, v, o, gate, up, down)."""
    D, hd, H, K, I = (cfg.hidden_size, cfg.head_size, cfg.num_attention_heads,
                      cfg.num_key_value_heads, cfg.intermediate_size)
    return cfg.num_hidden_layers * (D * H * hd + 2 * D * K * hd + H * hd * D + 3 * D * I)


def attention_flops(cfg: DecoderConfig, pairs: float) -> float:
    """Scores and weighted sum for `pairs` (query, key) pairs: 4 x layers x heads x head_dim each."""
    return 4.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_size * pairs


def causal_pairs(lengths) -> float:
    """(query, key) pairs of causal attention over rows of these lengths: sum T(T+1)/2."""
    t = np.asarray(lengths, np.float64)
    return float((t * (t + 1) / 2).sum())


def forward_flops(cfg: DecoderConfig, lengths, head_positions: float) -> float:
    """One forward over rows of `lengths` tokens (causal), projecting `head_positions` positions
    on the vocabulary: 2 x matmul weights x tokens + attention + 2 x hidden x vocab per position."""
    tokens = float(np.sum(lengths))
    return (2.0 * matmul_weights(cfg) * tokens + attention_flops(cfg, causal_pairs(lengths))
            + 2.0 * cfg.hidden_size * cfg.vocab_size * head_positions)


def kv_bytes_per_token(cfg: DecoderConfig, itemsize: int) -> int:
    """KV cache bytes of one token: keys and values of every layer's kv heads."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_size * itemsize


def decode_steps(cfg: DecoderConfig, prompt_lens, response_lens, weight_bytes: float,
                 kv_itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs [S], bytes [S]) of the S = max(response) - 1 decode steps of one generate call (its
    first token comes from the prefill). At step s a row with more than s tokens is running: it
    feeds one token that attends to its prompt + s cached tokens. bytes: every weight once plus
    the running rows' KV cache (real tokens only); FLOPs: 2 x (matmul weights + LM head) per row
    plus its attention."""
    p = np.asarray(prompt_lens, np.float64)[None, :]                      # [1, R]
    r = np.asarray(response_lens, np.int64)[None, :]
    steps = np.arange(1, max(int(r.max(initial=0)) - 1, 0) + 1)[:, None]  # [S, 1]
    running = r > steps                                                   # [S, R]
    context = (p + steps) * running                                       # keys read per row
    per_row = 2.0 * (matmul_weights(cfg) + cfg.hidden_size * cfg.vocab_size)
    flops = running.sum(1) * per_row + attention_flops(cfg, 1.0) * context.sum(1)
    nbytes = weight_bytes + kv_bytes_per_token(cfg, kv_itemsize) * context.sum(1)
    return flops, nbytes


def roofline_s(flops, nbytes, peak_flops: float, peak_bw: float) -> float:
    """Lower bound in seconds of work items done one after the other: sum of max(FLOPs / peak,
    bytes / bandwidth) (both may be arrays, one entry per item)."""
    return float(np.sum(np.maximum(np.asarray(flops) / peak_flops, np.asarray(nbytes) / peak_bw)))


# --------------------------------------------------------------------------- device peaks
def measure_peak_flops(dtype: str, n: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of an n x n matmul in `dtype` on the default device."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, a).block_until_ready()
    best = min(_seconds(lambda: mm(a, a).block_until_ready()) for _ in range(repeats))
    return 2.0 * n ** 3 / best


def measure_bandwidth(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best bytes/s of a sum over a float32 array of `nbytes` (each byte read once)."""
    x = jnp.ones((nbytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    best = min(_seconds(lambda: total(x).block_until_ready()) for _ in range(repeats))
    return nbytes / best


def device_peaks(compute_dtype: str, peak_flops: float = 0.0, peak_bw: float = 0.0) -> dict:
    """{flops, bw, source}: the overrides, else a known GPU's 16-bit dense peaks, else measured."""
    kind = jax.devices()[0].device_kind
    source = "given"
    if not (peak_flops and peak_bw) and jax.default_backend() == "gpu" and compute_dtype in (
            "bfloat16", "float16"):
        for name, flops, bw in KNOWN_PEAKS:
            if name in kind:
                peak_flops, peak_bw = peak_flops or flops, peak_bw or bw
                source = f"known peaks of {name}"
                break
    if not peak_flops or not peak_bw:
        source = "measured here (matmul in the compute dtype, a large reduction)"
        peak_flops = peak_flops or measure_peak_flops(compute_dtype)
        peak_bw = peak_bw or measure_bandwidth()
    return {"flops": peak_flops, "bw": peak_bw, "source": source, "device": kind}


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- instrumentation
@dataclasses.dataclass
class BenchPolicy(Policy):
    """The trainer's rollout policy, plus: prompts padded to `min_prompt_tokens` (see the module
    docstring) and a record of every generate call and every prompt's natural length."""

    min_prompt_tokens: int = 0
    calls: list = dataclasses.field(default_factory=list)
    natural_tokens: list = dataclasses.field(default_factory=list)
    prompt_chars: list = dataclasses.field(default_factory=list)

    def encode_prompt(self, text: str) -> list[int]:
        ids = super().encode_prompt(text)
        self.natural_tokens.append(len(ids))
        self.prompt_chars.append(len(text))
        return pad_prompt(ids, self.min_prompt_tokens)

    def generate(self, prompts, rng, row_ids=None):
        t0 = time.perf_counter()
        out = super().generate(prompts, rng, row_ids)
        self.calls.append({"wall": time.perf_counter() - t0, "compile": out.compile_s,
                           "prefill": getattr(out, "prefill_s", None),
                           "decode": getattr(out, "decode_s", None),
                           "prompt_lens": [len(p) for p in prompts],
                           "response_lens": [len(t) for t in out.tokens]})
        return out


def pad_prompt(ids: list[int], min_tokens: int) -> list[int]:
    """ids repeated cyclically to at least `min_tokens` tokens, ending with the real prompt."""
    if len(ids) >= min_tokens or not ids:
        return ids
    return (ids * -(-min_tokens // len(ids)))[-min_tokens:]


class TimedFn:
    """A jitted function whose calls are timed to completion; a call with argument shapes not
    seen before is first compiled ahead of time, and that compile timed apart (`compile_s`, over
    all shapes; the jit cache then serves the call). `record(args, wall)` is called after each
    call with its arguments."""

    def __init__(self, fn, record):
        self.fn, self.record = fn, record
        self.compile_s, self.seen = 0.0, set()

    def __call__(self, *args):
        key = tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x))))
                    for x in jax.tree.leaves(args))
        if key not in self.seen and hasattr(self.fn, "lower"):
            self.compile_s += _seconds(lambda: self.fn.lower(*args).compile())
        self.seen.add(key)
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.fn(*args))
        wall = time.perf_counter() - t0
        self.record(args, wall)
        return out


class BenchTrainer(Trainer):
    """The RL trainer with its rollout policy, log-prob function and update steps instrumented
    (the fixed micro-batch train step, or the parts of a token-budget update)."""

    def __init__(self, cfg, min_prompt_tokens: int = 0):
        super().__init__(cfg, progress=False)
        self.min_prompt_tokens = min_prompt_tokens
        self.bench_policy = None
        self.logprob_calls, self.step_calls = [], []
        self.logprob_fn = TimedFn(self.logprob_fn, self._record_logprobs)
        self.train_step = TimedFn(self.train_step, self._record_step)
        self.update_fns = [self.train_step]
        if getattr(self, "budget_step", None) is not None:  # train.max_tokens_per_micro_batch
            parts = {k: TimedFn(getattr(self.budget_step, k), self._record_step)
                     for k in ("init", "accumulate", "apply")}
            self.budget_step = self.budget_step._replace(**parts)
            self.update_fns += list(parts.values())

    def policy(self, temperature: float) -> Policy:
        base = super().policy(temperature)
        self.bench_policy = BenchPolicy(**{f.name: getattr(base, f.name)
                                           for f in dataclasses.fields(Policy)},
                                        min_prompt_tokens=self.min_prompt_tokens)
        return self.bench_policy

    def _record_logprobs(self, args, wall):
        params, _, attention, response = args
        self.logprob_calls.append({"wall": wall, "ref": params is self.state.ref_params,
                                   **_row_stats(attention, response)})

    def _record_step(self, args, wall):
        mb = args[2] if len(args) > 2 else None  # a (micro-)batch, or a budget update's state
        rows = (_row_stats(mb.attention_mask, mb.response_mask) if isinstance(mb, TokenRows)
                else {"lengths": [], "response": 0.0, "slots": 0})
        self.step_calls.append({"wall": wall, **rows})


def _row_stats(attention, response) -> dict:
    """Real tokens per row, response tokens per row and the slots ([rows, L]) of a batch."""
    attention, response = np.asarray(attention), np.asarray(response)
    return {"lengths": attention.sum(1).tolist(), "response": float(response.sum()),
            "slots": int(attention.size)}


# --------------------------------------------------------------------------- the table
@dataclasses.dataclass
class Phase:
    """One row of the table. tokens: real tokens processed; work: FLOPs or bytes (`unit`);
    bound: lower bound in seconds on this device; padding: padded / all slots the programs ran."""

    name: str
    wall: float
    tokens: float | None = None
    work: float | None = None
    unit: str = ""
    bound: float | None = None
    padding: float | None = None

    @property
    def fraction(self) -> float | None:
        return self.bound / self.wall if self.bound is not None and self.wall > 0 else None


def sampler_phases(cfg: DecoderConfig, calls: list[dict], generate_s: float, peaks: dict,
                   weight_bytes: float, kv_itemsize: int) -> list[Phase]:
    """compile, prefill and decode rows (or one generate row) of the rollout's generate calls;
    generate_s: the rollout's wall seconds in generate (the rows add up to it)."""
    split = all(c["prefill"] is not None for c in calls) and sum(
        c["prefill"] + c["decode"] for c in calls) > 0
    compile_s = sum(c["compile"] for c in calls)
    pf_flops = pf_tokens = pf_slots = 0.0
    dec_flops, dec_bytes = [], []
    dec_tokens = dec_slots = 0.0
    for c in calls:
        p, r = c["prompt_lens"], c["response_lens"]
        B = batch_bucket(len(p))
        pf_flops += forward_flops(cfg, p, head_positions=len(p))
        pf_tokens += sum(p)
        pf_slots += B * prompt_bucket(max(p))
        f, b = decode_steps(cfg, p, r, weight_bytes, kv_itemsize)
        dec_flops.append(f)
        dec_bytes.append(b)
        dec_tokens += sum(max(n - 1, 0) for n in r)
        dec_slots += B * len(f)
    dec_flops, dec_bytes = np.concatenate(dec_flops), np.concatenate(dec_bytes)
    pf_bound = pf_flops / peaks["flops"]
    dec_bound = roofline_s(dec_flops, dec_bytes, peaks["flops"], peaks["bw"])
    rows = [Phase("sampler compile", compile_s)]
    if split:
        rows += [Phase("prefill", sum(c["prefill"] for c in calls), pf_tokens, pf_flops, "FLOP",
                       pf_bound, 1 - pf_tokens / pf_slots),
                 Phase("decode", sum(c["decode"] for c in calls), dec_tokens, dec_bytes.sum(), "B",
                       dec_bound, 1 - dec_tokens / max(dec_slots, 1)),
                 Phase("generate other (host)", generate_s - compile_s
                       - sum(c["prefill"] + c["decode"] for c in calls))]
    else:  # the sampler does not report its executables apart: one phase, the bounds added
        rows.append(Phase("generate (prefill+decode)", generate_s - compile_s,
                          pf_tokens + dec_tokens, None, "", pf_bound + dec_bound))
    return rows


def forward_phase(name: str, cfg: DecoderConfig, calls: list[dict], peaks: dict,
                  factor: float = 1.0) -> Phase:
    """A phase of batched forwards (x `factor`: 3 for a train step, 4 with remat)."""
    lengths = [n for c in calls for n in c["lengths"]]
    flops = factor * sum(forward_flops(cfg, c["lengths"], c["response"]) for c in calls)
    tokens = float(sum(lengths))
    slots = sum(c["slots"] for c in calls)
    return Phase(name, sum(c["wall"] for c in calls), tokens, flops, "FLOP",
                 flops / peaks["flops"], 1 - tokens / max(slots, 1))


def iteration_table(trainer: BenchTrainer, metrics: dict, peaks: dict) -> list[Phase]:
    """Every phase of the iteration; their walls add up to `time/iteration`."""
    cfg = trainer.model().config
    m = metrics
    policy = trainer.bench_policy
    compute = jnp.dtype(trainer.cfg.model.compute_dtype).itemsize
    n_params = sum(x.size for x in jax.tree.leaves(trainer.params))
    sampler = sampler_phases(cfg, policy.calls, m["time/generate"], peaks, n_params * compute,
                             compute)
    host = ("env_reset", "prompts", "generate", "replies", "env_step")
    rollout_other = m["time/rollout"] - sum(m.get(f"time/{k}", 0.0) for k in host)
    old = [c for c in trainer.logprob_calls if not c["ref"]]
    ref = [c for c in trainer.logprob_calls if c["ref"]]
    lp = trainer.logprob_fn
    factor = 4.0 if trainer.cfg.train.remat else 3.0
    update = forward_phase("update (train steps)", cfg, trainer.step_calls, peaks, factor)
    update_compile = sum(f.compile_s for f in trainer.update_fns)
    return [Phase("env reset", m["time/env_reset"]),
            Phase("prompts (build + tokenize)", m.get("time/prompts", 0.0)),
            *sampler,
            Phase("replies (detokenize + project)", m.get("time/replies", 0.0)),
            Phase("env steps", m["time/env_step"]),
            Phase("rollout other", rollout_other),
            Phase("advantages (+ diagnostics)", m["time/advantages"]),
            forward_phase("old log-probs", cfg, old, peaks),
            forward_phase("ref log-probs", cfg, ref, peaks),
            Phase("log-prob compile", lp.compile_s),
            Phase("packing + log-prob other", m["time/logprobs"] - lp.compile_s
                  - sum(c["wall"] for c in trainer.logprob_calls)),
            update,
            Phase("update compile", update_compile),
            Phase("update other (batches)", m["time/update"] - update_compile
                  - sum(c["wall"] for c in trainer.step_calls))]


def format_table(phases: list[Phase], total: float) -> str:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = [f"{'phase':<32}{'wall s':>9}{'share':>7}{'tokens':>13}{'work':>17}{'bound s':>10}"
             f"{'bound/wall':>11}{'padding':>9}"]
    for p in phases:
        work = "-" if p.work is None else f"{p.work:.3g} {p.unit}"
        lines.append(f"{p.name:<32}{p.wall:>9.2f}{p.wall / total:>7.1%}{num(p.tokens, ',.0f'):>13}"
                     f"{work:>17}{num(p.bound, '.3g'):>10}{num(p.fraction, '.1%'):>11}"
                     f"{num(p.padding, '.1%'):>9}")
    lines.append(f"{'iteration':<32}{total:>9.2f}{1:>7.0%}")
    return "\n".join(lines)


def length_stats(trainer: BenchTrainer) -> dict:
    """Prompt lengths (natural and as generated), characters per token, response lengths."""
    policy = trainer.bench_policy
    natural = np.asarray(policy.natural_tokens, np.float64)
    used = np.asarray([n for c in policy.calls for n in c["prompt_lens"]], np.float64)
    resp = np.asarray([n for c in policy.calls for n in c["response_lens"]], np.float64)
    cap = trainer.cfg.rollout.max_new_tokens
    return {"prompt_tokens_natural": _summary(natural), "prompt_tokens": _summary(used),
            "chars_per_token": float(np.sum(policy.prompt_chars) / max(natural.sum(), 1)),
            "min_prompt_tokens": policy.min_prompt_tokens,
            "response_tokens": _summary(resp), "responses_at_cap": float((resp >= cap).mean()),
            "generate_calls": len(policy.calls),
            "prompt_buckets": sorted({prompt_bucket(max(c["prompt_lens"])) for c in policy.calls}),
            "new_token_bucket": new_tokens_bucket(cap)}


def _summary(x: np.ndarray) -> dict:
    if not len(x):
        return {"n": 0}
    return {"n": int(len(x)), "mean": float(x.mean()), "median": float(np.median(x)),
            "min": float(x.min()), "max": float(x.max())}


# --------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="config key=value overrides (docs/config.md)")
    p.add_argument("--env", default="alfworld", choices=sorted(CONFIGS),
                   help="which paper config (unless --config)")
    p.add_argument("--config", default="", help="a config name or path instead of --env's")
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPE_OVERRIDES))
    p.add_argument("--model-dir", default="", help="where the random model is built / reused")
    p.add_argument("--model-seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--min-prompt-tokens", type=int, default=0,
                   help="pad prompts to at least this many tokens (0: natural lengths)")
    p.add_argument("--peak-flops", type=float, default=0.0, help="device peak FLOP/s (default: "
                   "known GPU peaks, else measured)")
    p.add_argument("--peak-bw", type=float, default=0.0, help="device memory bandwidth, bytes/s")
    p.add_argument("--json", default="", help="write the table and its context here")
    args = p.parse_args(argv)
    t_start = time.perf_counter()

    run_dir = tempfile.mkdtemp(prefix="bench_iteration-")
    folder = build_model_folder(args.model_dir or default_model_dir(args.shape), args.shape,
                                args.model_seed)
    cfg = load_config(args.config or CONFIGS[args.env],
                      [*SHAPE_OVERRIDES[args.shape], *ONE_DEVICE, f"model.path={folder}",
                       "train.iterations=1", "eval.every=0", f"train.run_dir={run_dir}",
                       *args.overrides])
    if args.min_prompt_tokens > cfg.rollout.max_prompt_tokens:
        raise ValueError(f"--min-prompt-tokens {args.min_prompt_tokens} is above the config's "
                         f"rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens}; lower it")
    load_before = os.getloadavg()[0]
    peaks = device_peaks(cfg.model.compute_dtype, args.peak_flops, args.peak_bw)
    print(f"device {peaks['device']} ({jax.default_backend()}): peak {peaks['flops'] / 1e12:.3g} "
          f"TFLOP/s ({cfg.model.compute_dtype}), {peaks['bw'] / 1e9:.3g} GB/s; {peaks['source']}",
          flush=True)
    try:
        trainer = BenchTrainer(cfg, args.min_prompt_tokens)
        try:
            pool_s = _seconds(lambda: trainer.pool)  # started before the iteration, as in a run
            metrics = trainer.run_iteration()
            if metrics.get("train/skipped_empty_batch"):
                raise RuntimeError("the iteration collected no steps (every episode failed); "
                                   "see the env's logs")
            phases = iteration_table(trainer, metrics, peaks)
            lengths = length_stats(trainer)
            n_params = int(sum(x.size for x in jax.tree.leaves(trainer.params)))
            mcfg = trainer.model().config
        finally:
            trainer.close()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)

    total = metrics["time/iteration"]
    update = next(ph for ph in phases if ph.name.startswith("update ("))
    factor = 4.0 if cfg.train.remat else 3.0
    mfu = (update.work / factor * 3.0) / peaks["flops"] / update.wall if update.wall else None
    rollout = metrics["time/rollout"]
    env_share = metrics["time/env_step"] / rollout if rollout else 0.0
    r = cfg.rollout
    print(f"{cfg.name} with a random {args.shape} model ({n_params / 1e6:.3g} M parameters, "
          f"{cfg.model.dtype} weights, {cfg.model.compute_dtype} compute) on "
          f"{jax.default_backend()}: {r.num_groups} groups x {r.group_size} envs, "
          f"<= {cfg.env.max_steps} steps, H = {cfg.env.memory_len}, responses <= {r.max_new_tokens}")
    print(format_table(phases, total))
    print(f"steps {metrics['rollout/steps']:.0f} (mean episode length "
          f"{metrics['rollout/mean_episode_length']:.1f}), invalid replies "
          f"{metrics['rollout/invalid_action_rate']:.0%}, success {metrics['success/all']:.2f}")
    nat, used, resp = (lengths[k] for k in ("prompt_tokens_natural", "prompt_tokens",
                                            "response_tokens"))
    print(f"prompt tokens: natural mean {nat['mean']:.0f} (max {nat['max']:.0f}, "
          f"{lengths['chars_per_token']:.2f} chars/token), as generated mean {used['mean']:.0f} "
          f"(max {used['max']:.0f}; --min-prompt-tokens {args.min_prompt_tokens}); buckets "
          f"{lengths['prompt_buckets']}")
    print(f"response tokens: mean {resp['mean']:.0f}, {lengths['responses_at_cap']:.0%} ran to the "
          f"cap of {r.max_new_tokens} (the others ended at an eos)")
    steps = len(trainer.bench_policy.calls)
    per_step = {"rollout": rollout - metrics["time/env_reset"] - sum(
        ph.wall for ph in phases if ph.name == "sampler compile"),
        "log-probs + update": sum(ph.wall for ph in phases if ph.name in (
            "old log-probs", "ref log-probs", "update (train steps)"))}
    print("per env step (compile and env reset left out): " + ", ".join(
        f"{k} {v / max(steps, 1):.2f}s" for k, v in per_step.items()))
    print(f"update: MFU {mfu:.1%} (3 x forward FLOPs; the bound counts {factor:.0f} x)"
          if mfu is not None else "update: no train step ran")
    print(f"env steps: {env_share:.1%} of the rollout"
          + (f" (> {ENV_STEP_SHARE_LIMIT:.0%}: overlapping them with generation would pay)"
             if env_share > ENV_STEP_SHARE_LIMIT else ""))
    print(f"env pool start {pool_s:.1f}s (before the iteration); load average "
          f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after; whole script "
          f"{time.perf_counter() - t_start:.0f}s", flush=True)

    result = {
        "command": "python -m experiments.benchmarks.bench_iteration " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "config": cfg.name, "shape": args.shape, "model_seed": args.model_seed,
        "train_seed": cfg.train.seed, "params": n_params,
        "model": {k: getattr(mcfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads")},
        "dtype": cfg.model.dtype, "compute_dtype": cfg.model.compute_dtype,
        "rollout": dataclasses.asdict(r), "max_steps": cfg.env.max_steps,
        "memory_len": cfg.env.memory_len, "train": dataclasses.asdict(cfg.train),
        "backend": jax.default_backend(), "jax": jax.__version__, "peaks": peaks,
        "load_average": [load_before, os.getloadavg()[0]], "cpus": os.cpu_count(),
        "phases": [{**dataclasses.asdict(ph), "fraction": ph.fraction, "share": ph.wall / total}
                   for ph in phases],
        "iteration_s": total, "env_pool_start_s": pool_s, "update_mfu": mfu,
        "env_step_share_of_rollout": env_share, "env_steps_run": steps,
        "per_env_step_s": {k: v / max(steps, 1) for k, v in per_step.items()},
        "call_walls_s": {"generate": [c["wall"] for c in trainer.bench_policy.calls],
                         "logprobs": [c["wall"] for c in trainer.logprob_calls],
                         "update": [c["wall"] for c in trainer.step_calls]},
        "lengths": lengths,
        "metrics": {k: v for k, v in metrics.items() if k.split("/")[0] in (
            "time", "rollout", "perf", "success")},
        "script_s": time.perf_counter() - t_start,
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
