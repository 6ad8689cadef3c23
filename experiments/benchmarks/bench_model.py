"""Forward-pass throughput of the Flax Qwen2 against transformers (torch) on this CPU.

Same tiny config, same weights (the Flax model is loaded from the transformers checkpoint), same
batch; prints tokens/s of each and their ratio. A benchmark, not a test: nothing is asserted.

    python -m experiments.benchmarks.bench_model [--batch 8] [--seq 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from experiments.benchmarks.bench_common import BENCH_SHAPE, paired_models


def time_it(fn, repeats: int) -> float:
    """Median wall seconds of fn() over `repeats` runs (fn must block until done)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    hf, model = paired_models()
    ids = np.random.RandomState(0).randint(0, BENCH_SHAPE["vocab_size"], (args.batch, args.seq))
    tokens = args.batch * args.seq

    forward = nnx.jit(lambda m, x: m(x))
    x = jnp.asarray(ids, jnp.int32)
    t0 = time.perf_counter()
    jax.block_until_ready(forward(model, x))
    compile_s = time.perf_counter() - t0
    flax_s = time_it(lambda: jax.block_until_ready(forward(model, x)), args.repeats)

    xt = torch.tensor(ids)
    with torch.inference_mode():
        hf(xt)  # warm-up
        torch_s = time_it(lambda: hf(xt).logits, args.repeats)

    res = {"flax_tok_s": tokens / flax_s, "torch_tok_s": tokens / torch_s,
           "ratio": torch_s / flax_s, "compile_s": compile_s}
    print(f"Qwen2 forward, {BENCH_SHAPE['num_hidden_layers']} layers, hidden "
          f"{BENCH_SHAPE['hidden_size']}, vocab {BENCH_SHAPE['vocab_size']}; batch {args.batch} x "
          f"{args.seq} tokens; {os.cpu_count()} CPUs, jax {jax.__version__} "
          f"({jax.default_backend()}), torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"{'implementation':<22}{'seconds':>10}{'tokens/s':>12}")
    print(f"{'flax (jit)':<22}{flax_s:>10.4f}{res['flax_tok_s']:>12.0f}")
    print(f"{'transformers (torch)':<22}{torch_s:>10.4f}{res['torch_tok_s']:>12.0f}")
    print(f"ratio flax/transformers tokens/s: {res['ratio']:.2f}x   (flax compile {compile_s:.2f}s, "
          "not included)")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
