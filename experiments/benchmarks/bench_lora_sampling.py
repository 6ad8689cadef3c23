"""Rollouts with LoRA adapters: applied on the fly against merged into the weights (CPU).

Issue 60 asks which the sampler should use. On the fly, every adapted linear layer computes
x W + s (x A) B; merged, the sampler would get W + s A B once per iteration (a copy of every
adapted kernel) and run the plain layers. Same model (BENCH_SHAPE, bench_common: a Qwen2 of 4
layers, hidden 256, vocab 4096), adapters of rank `--rank` on every linear layer with random B
(what a trained adapter looks like), the same `generate` call; the merged model is the run's own
merged export (`save_pretrained`, W + s A B in float32) loaded back. The ratio (merged / on the
fly, new tokens per second) is measured in the same run, interleaved; nothing is asserted.

    python -m experiments.benchmarks.bench_lora_sampling [--batch 16] [--prompt 256] [--new 32] [--rank 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from experiments.benchmarks.bench_common import BENCH_SHAPE, bench_hf_model
from experiments.benchmarks.bench_sampler import time_interleaved


def main(argv=None) -> dict:
    from flax import nnx

    from hgpo_jax.models import load_pretrained
    from hgpo_jax.models.hf_io import save_pretrained
    from hgpo_jax.models.lora import LoraSpec
    from hgpo_jax.rl.sampling import Sampler

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as d:
        base, merged_dir = os.path.join(d, "base"), os.path.join(d, "merged")
        bench_hf_model(0, base)
        adapted = load_pretrained(base, lora=LoraSpec(rank=args.rank, alpha=float(args.rank)))
        rng = np.random.RandomState(1)
        for path, var in nnx.to_flat_state(nnx.state(adapted, nnx.LoRAParam)):
            if path[-1] == "lora_b":  # new adapters have B = 0: give them a trained look
                var[...] = jax.numpy.asarray(0.02 * rng.standard_normal(var.shape), var.dtype)
        t0 = time.perf_counter()
        save_pretrained(adapted, merged_dir)
        merged = load_pretrained(merged_dir)
        merge_s = time.perf_counter() - t0
    ids = np.random.RandomState(0).randint(0, BENCH_SHAPE["vocab_size"], (args.batch, args.prompt))
    prompts, new_tokens = ids.tolist(), args.batch * args.new
    seeds = iter(range(10**6))
    runs, first = {}, {}
    for name, model in (("on the fly", adapted), ("merged", merged)):
        sampler = Sampler()

        def run(model=model, sampler=sampler):
            out = sampler.generate(model, prompts, args.new, temperature=1.0, rng=next(seeds))
            assert sum(map(len, out.tokens)) == new_tokens
            return out

        t0 = time.perf_counter()
        out = run()
        first[name] = (out.compile_s, time.perf_counter() - t0)
        runs[name] = run
    greedy = {name: Sampler().generate(m, prompts, args.new, temperature=0.0).tokens
              for name, m in (("on the fly", adapted), ("merged", merged))}
    same = np.mean([a == b for a, b in zip(greedy["on the fly"], greedy["merged"])])
    times = time_interleaved(runs, args.repeats)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"LoRA sampling, Qwen2 {BENCH_SHAPE['num_hidden_layers']} layers, hidden "
          f"{BENCH_SHAPE['hidden_size']}, rank {args.rank} on every linear layer; batch "
          f"{args.batch}, prompt {args.prompt}, {args.new} new tokens, temperature 1; "
          f"{os.cpu_count()} CPUs, jax {jax.__version__}; median of {args.repeats} interleaved "
          f"runs; load average {os.getloadavg()[0]:.2f}")
    print(f"{'adapters':<14}{'median s':>10}{'min s':>10}{'new tokens/s':>14}{'compile s':>11}")
    for name, t in times.items():
        print(f"{name:<14}{med[name]:>10.4f}{min(t):>10.4f}{new_tokens / med[name]:>14.0f}"
              f"{first[name][0]:>11.2f}")
    ratio = med["on the fly"] / med["merged"]
    print(f"ratio merged / on the fly, new tokens/s: {ratio:.2f}x; the merge (the export "
          f"path, host float32, disk and back): {merge_s:.2f}s; greedy rows equal: {same:.0%}")
    result = {"command": " ".join(["python -m experiments.benchmarks.bench_lora_sampling", *(argv or sys.argv[1:])]),
              "batch": args.batch, "prompt": args.prompt, "new": args.new, "rank": args.rank,
              "median_s": med, "min_s": {k: min(v) for k, v in times.items()},
              "ratio_merged_over_on_the_fly": ratio, "merge_s": merge_s,
              "greedy_rows_equal": float(same), "load_average": os.getloadavg()[0]}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
