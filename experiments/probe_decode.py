"""Decode time per token step of the sampler against its bandwidth bound, for a grid of rows x
prompt lengths, with random weights of a model shape. A benchmark for a GPU: nothing asserted.

    python experiments/probe_decode.py --json out.json                           # 1.5B, bf16 weights
    python experiments/probe_decode.py --param-dtype float32 --new 512 --grid 128x2048
    python experiments/probe_decode.py --param-dtype float32 --new 512 --grid 128x2048 --no-cast
    python experiments/probe_decode.py --shape bench --new 16 --grid 2x64         # CPU smoke run

Each grid point builds a fresh `Sampler` (its own compile), generates once to compile and twice to
time, and keeps the faster `decode_s` over the new tokens after the first. The bound reads every
weight once in bf16 plus every cache slot (prompt bucket + new tokens; the decode attends over all
of them) at --peak-bw (H200: 4.8 TB/s). `--no-cast` runs the sampler without its once-per-call
conversion of the weights to the compute dtype (`hgpo_jax.models.decoder.cast_to_compute`), as it
ran before that was added: the A/B of docs/training.md ("Decode on the H200").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_step import shape_config  # noqa: E402

import hgpo_jax.rl.sampling as sampling  # noqa: E402
from hgpo_jax.models.decoder import CausalLM  # noqa: E402


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1.5b", help="1.5b, 7b or bench")
    p.add_argument("--param-dtype", default="bfloat16", help="stored weights (compute: bfloat16)")
    p.add_argument("--new", type=int, default=256, help="new tokens per row")
    p.add_argument("--grid", default="128x2048,128x256,32x2048,8x2048,8x256,1x256",
                   help="rows x prompt tokens, comma-separated")
    p.add_argument("--no-cast", action="store_true", help="skip the once-per-call weight cast")
    p.add_argument("--peak-bw", type=float, default=4.8e12, help="bytes/s of the device")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.no_cast:
        sampling.cast_to_compute = lambda model: model
    cfg = shape_config(args.shape)
    model = CausalLM(cfg, dtype="bfloat16", param_dtype=args.param_dtype,
                             rngs=nnx.Rngs(0), scan_layers=True)
    weight_bytes = 2 * sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    out = []
    for point in args.grid.split(","):
        rows, plen = (int(x) for x in point.split("x"))
        prompts = np.random.default_rng(1).integers(0, cfg.vocab_size, (rows, plen)).tolist()
        sampler = sampling.Sampler()
        sampler.generate(model, prompts, args.new, temperature=1.0, rng=0)
        runs = [sampler.generate(model, prompts, args.new, temperature=1.0, rng=i) for i in (1, 2)]
        slots = sampling.prompt_bucket(plen) + args.new
        kv = rows * slots * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_size * 2
        rec = {"param_dtype": args.param_dtype, "no_cast": args.no_cast, "rows": rows,
               "prompt": plen, "new": args.new,
               "decode_ms_per_step": 1e3 * min(r.decode_s for r in runs) / (args.new - 1),
               "prefill_s": min(r.prefill_s for r in runs), "kv_cache_GB": kv / 1e9,
               "bound_ms_all_slots": 1e3 * (weight_bytes + kv) / args.peak_bw}
        rec["bound_over_wall"] = rec["bound_ms_all_slots"] / rec["decode_ms_per_step"]
        print(json.dumps(rec), flush=True)
        out.append(rec)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
