"""Sampling throughput of `hgpo_jax.rl.sampling.generate` against transformers `generate` (CPU).

The issue's setting: tiny Qwen2 (4 layers, hidden 256, 4 heads, 2 kv heads, intermediate 704,
vocab 4096), batch 16, prompt 256, 32 new tokens, sampling at temperature 1 (no top-k / top-p,
no eos, so both produce exactly 32 tokens per row). Same weights: the model is built with
transformers, saved, and loaded with `load_pretrained`. New tokens/s are medians over `--repeats`
runs after compilation (compile time printed separately). A benchmark: nothing is asserted.

hgpo_jax is timed in two placements of the same `generate` call, both against the same
transformers runs (torch uses all CPU threads):
- "1 device": JAX's default CPU setup, one device whose ops use the cores through XLA's
  intra-op thread pool;
- "N devices": the CPU split into one JAX device per core (`request_cpu_devices()`, when run as
  a script) and the params loaded onto a data-parallel mesh (`make_mesh(data=N)`), so
  `generate` splits the batch over the cores (docs/sampling.md, "CPU hosts").

    python -m experiments.benchmarks.bench_sampler [--batch 16] [--prompt 256] [--new 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np
import torch
from hgpo_jax.models import make_mesh, request_cpu_devices
from hgpo_jax.rl.sampling import Sampler

from experiments.benchmarks.bench_common import BENCH_SHAPE, paired_models


def time_interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Wall seconds of `repeats` calls of each fn (each must block until done), alternating
    between them so a change in machine load hits all alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)

    # one device per core where JAX has that many CPU devices (see __main__), else fewer
    n_dev = max(1, min(os.cpu_count() or 1, len(jax.devices("cpu"))))
    mesh = make_mesh(data=n_dev, devices=jax.devices("cpu")[:n_dev])
    hf, model, model_dp = paired_models(meshes=[mesh])
    ids = np.random.RandomState(0).randint(0, BENCH_SHAPE["vocab_size"], (args.batch, args.prompt))
    prompts = ids.tolist()
    new_tokens = args.batch * args.new

    # hgpo_jax: eos_token_id=None, so every row runs to args.new tokens
    seeds = iter(range(10**6))
    jax_runs, first = {}, {}
    for name, m in (("1 device", model), (f"{n_dev} devices", model_dp)):
        sampler = Sampler()

        def run_jax(m=m, sampler=sampler):
            out = sampler.generate(m, prompts, args.new, temperature=1.0, rng=next(seeds))
            assert sum(map(len, out.tokens)) == new_tokens
            return out

        t0 = time.perf_counter()
        out = run_jax()
        first[name] = (out.compile_s, time.perf_counter() - t0, sampler)
        jax_runs[name] = run_jax

    # transformers: no eos (min_new_tokens = max_new_tokens), same sampling settings
    xt = torch.tensor(ids)
    mask = torch.ones_like(xt)

    def run_torch():
        with torch.inference_mode():
            out = hf.generate(xt, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                              top_p=1.0, max_new_tokens=args.new, min_new_tokens=args.new,
                              pad_token_id=0)
        assert out.shape == (args.batch, args.prompt + args.new)

    run_torch()  # warm-up
    times = time_interleaved({**jax_runs, "transformers": run_torch}, args.repeats)
    med = {name: statistics.median(t) for name, t in times.items()}
    torch_s = med["transformers"]

    print(f"sampling, Qwen2 {BENCH_SHAPE['num_hidden_layers']} layers, hidden "
          f"{BENCH_SHAPE['hidden_size']}, vocab {BENCH_SHAPE['vocab_size']}; batch {args.batch}, "
          f"prompt {args.prompt}, {args.new} new tokens, temperature 1; {os.cpu_count()} CPUs, "
          f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); median of {args.repeats} interleaved runs; load average "
          f"{os.getloadavg()[0]:.2f} (timings are only meaningful on an otherwise idle machine)")
    print(f"{'implementation':<34}{'median s':>10}{'min s':>10}{'new tokens/s':>14}{'ratio':>8}")
    for name, t in times.items():
        label = "transformers generate" if name == "transformers" else f"hgpo_jax generate, {name}"
        print(f"{label:<34}{med[name]:>10.4f}{min(t):>10.4f}{new_tokens / med[name]:>14.0f}"
              f"{torch_s / med[name]:>7.2f}x")
    for name in jax_runs:
        compile_s, first_s, sampler = first[name]
        print(f"ratio hgpo_jax ({name})/transformers new tokens/s: {torch_s / med[name]:.2f}x   "
              f"(compile {compile_s:.2f}s, first call {first_s:.2f}s, not included; "
              f"{sampler.num_compiles} program)")
    single, split = jax_runs
    return {"jax_tok_s": new_tokens / med[single], "jax_dp_tok_s": new_tokens / med[split],
            "torch_tok_s": new_tokens / torch_s, "ratio": torch_s / med[single],
            "ratio_dp": torch_s / med[split], "devices": n_dev,
            "compile_s": first[single][0], "first_call_s": first[single][1],
            "num_compiles": first[single][2].num_compiles}


if __name__ == "__main__":
    request_cpu_devices()  # one JAX CPU device per core; must precede any JAX work
    main(sys.argv[1:])
