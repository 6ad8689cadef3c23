"""Decode time per token step of the sampler against its bandwidth bounds, for a grid of rows x
prompt lengths and each decode attention, with random weights of a model shape. A benchmark for a
GPU: nothing asserted.

    python -m experiments.benchmarks.probe_decode --json out.json                           # 1.5B, bf16 weights
    python -m experiments.benchmarks.probe_decode --param-dtype float32 --new 512 --grid 128x2048,128x1024-2048
    python -m experiments.benchmarks.probe_decode --param-dtype float32 --new 512 --grid 128x2048 --no-cast
    python -m experiments.benchmarks.probe_decode --shape bench --new 16 --grid 2x64         # CPU smoke run

Grid points: `RxP` (R rows of P prompt tokens) or `RxA-B` (R rows whose prompts run evenly from
A to B tokens: rows of different lengths, as a rollout's). Each point and each `--decode` ('einsum':
every cache slot; 'ragged': each row's tokens only, `hgpo_jax.models.gpu_attention`; off a GPU
the ragged kernel runs in Pallas's interpreter, so its times there mean nothing) builds a fresh
`Sampler` (its own compile), generates once to compile and twice to time, and keeps the faster
`decode_s` over the new tokens after the first. The model's attention is the GPU's fused one
('auto': cuDNN) or, off a GPU, 'xla': both decodes start from the same right-padded prefill.

Two bounds, each every weight read once in bf16 plus KV cache bytes, at --peak-bw (H200: 4.8
TB/s): `bound_ms_all_slots` reads every slot of the cache (prompt bucket + new-token slots: what
the einsum decode reads), `bound_ms_real_tokens` only the rows' real tokens (at new token s, a
row's prompt + s: the issue-49 aim is >= 60% of it). `--no-cast` runs the sampler without its
once-per-call conversion of the weights to the compute dtype
(`hgpo_jax.models.decoder.cast_to_compute`), as it ran before that was added: the A/B of
docs/training.md ("Decode on the H200").
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np
from flax import nnx

from experiments.benchmarks.bench_train_step import shape_config

import hgpo_jax.rl.sampling as sampling
from hgpo_jax.models.decoder import CausalLM


def grid_point(point: str) -> tuple[int, list[int]]:
    """'RxP' -> (R, [P] * R); 'RxA-B' -> (R, R lengths evenly from A to B)."""
    rows, lengths = point.split("x")
    rows = int(rows)
    if "-" in lengths:
        lo, hi = (int(x) for x in lengths.split("-"))
        return rows, np.linspace(lo, hi, rows).round().astype(int).tolist()
    return rows, [int(lengths)] * rows


def decode_bounds(cfg, lengths: list[int], new: int, weight_bytes: float, peak_bw: float
                  ) -> dict:
    """Bandwidth bounds (ms per decode step, averaged over the new tokens after the first) of
    rows of prompt `lengths` decoding `new` tokens: every slot of the cache (prompt bucket + new
    slots), or the real tokens only (at new token s a row reads its prompt + s)."""
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_size * 2  # bf16
    slots = len(lengths) * (sampling.prompt_bucket(max(lengths)) + new)
    steps = np.arange(1, new)
    real = float(np.mean([sum(lengths) + len(lengths) * s for s in steps])) if new > 1 else 0.0
    return {"kv_cache_GB": slots * per_token / 1e9,
            "bound_ms_all_slots": 1e3 * (weight_bytes + slots * per_token) / peak_bw,
            "bound_ms_real_tokens": 1e3 * (weight_bytes + real * per_token) / peak_bw}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1.5b", help="1.5b, 7b or bench")
    p.add_argument("--param-dtype", default="bfloat16", help="stored weights (compute: bfloat16)")
    p.add_argument("--new", type=int, default=256, help="new tokens per row")
    p.add_argument("--grid", default="128x2048,128x1024-2048,128x256,32x2048,8x2048,1x256",
                   help="rows x prompt tokens (RxP or RxA-B), comma-separated")
    p.add_argument("--decode", default="einsum,ragged",
                   help="the decode attentions to time, comma-separated (einsum, ragged, auto)")
    p.add_argument("--no-cast", action="store_true", help="skip the once-per-call weight cast")
    p.add_argument("--peak-bw", type=float, default=4.8e12, help="bytes/s of the device")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.no_cast:
        sampling.cast_to_compute = lambda model: model
    cfg = shape_config(args.shape)
    attention = "auto" if jax.default_backend() == "gpu" else "xla"
    model = CausalLM(cfg, dtype="bfloat16", param_dtype=args.param_dtype, rngs=nnx.Rngs(0),
                     scan_layers=True, attention=attention)
    weight_bytes = 2 * sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    out = []
    for point in args.grid.split(","):
        rows, lengths = grid_point(point)
        rs = np.random.default_rng(1)
        prompts = [rs.integers(0, cfg.vocab_size, n).tolist() for n in lengths]
        bounds = decode_bounds(cfg, lengths, args.new, weight_bytes, args.peak_bw)
        for decode in args.decode.split(","):
            sampler = sampling.Sampler()
            sampler.generate(model, prompts, args.new, temperature=1.0, rng=0, decode=decode)
            runs = [sampler.generate(model, prompts, args.new, temperature=1.0, rng=i,
                                     decode=decode) for i in (1, 2)]
            step_ms = 1e3 * min(r.decode_s for r in runs) / max(args.new - 1, 1)
            rec = {"param_dtype": args.param_dtype, "no_cast": args.no_cast, "decode": decode,
                   "rows": rows, "prompt": point.split("x", 1)[1], "new": args.new,
                   "decode_ms_per_step": step_ms, "prefill_s": min(r.prefill_s for r in runs),
                   **bounds,
                   "all_slots_bound_over_wall": bounds["bound_ms_all_slots"] / step_ms,
                   "real_bound_over_wall": bounds["bound_ms_real_tokens"] / step_ms}
            print(json.dumps(rec), flush=True)
            out.append(rec)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
