"""PPO train-step time and sampler throughput with scanned or unrolled layers and each attention
path, measured in one run so that the ratios compare like with like. A benchmark: nothing asserted.

    python -m experiments.benchmarks.bench_train_step                        # bench shape, CPU: scan vs unrolled
    python -m experiments.benchmarks.bench_train_step --shape 1.5b --rows 256 --micro 16 --seq 4608 \\
        --compute-dtype bfloat16 --attention einsum,cudnn --sampler 128,2048,512   # one GPU

Random weights (same seed for every variant, so the layouts hold the same weights). The train step
is the trainer's (`make_train_step`: micro-batch accumulation, remat, AdamW) on full-length rows
with a 512-token response mask. MFU counts 6 x parameters x tokens plus causal attention
(6 x layers x seq x hidden per token) against --peak-tflops (H100 SXM bf16 dense: 989).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import jax
import numpy as np
from flax import nnx

from hgpo_jax.models import DecoderConfig, make_mesh
from hgpo_jax.models.attention import resolve_attention
from hgpo_jax.models.decoder import CausalLM
from hgpo_jax.trainers.plan import PRESETS
from hgpo_jax.rl.batching import PolicyRows
from hgpo_jax.rl.ppo import LossConfig, make_train_step
from hgpo_jax.rl.update import init_opt_state, make_optimizer, param_shardings
from hgpo_jax.rl.sampling import Sampler

SHAPES = {"1.5b": PRESETS["Qwen/Qwen2.5-1.5B-Instruct"], "7b": PRESETS["Qwen/Qwen2.5-7B-Instruct"]}


def shape_config(name: str) -> DecoderConfig:
    if name == "bench":
        from experiments.benchmarks.bench_common import BENCH_SHAPE
        return DecoderConfig(**BENCH_SHAPE)
    if name.startswith("local-"):  # the models built here (`build:alfworld-<size>`: 4,096 tokens)
        from hgpo_jax.models.local import model_config
        return model_config(name[len("local-"):], 4096, 2)
    return SHAPES[name]


def random_minibatch(rows: int, seq: int, vocab: int, response: int, seed: int = 0) -> PolicyRows:
    """A PPO mini-batch of full-length rows: the last `response` tokens carry the loss."""
    rng = np.random.default_rng(seed)
    resp = np.zeros((rows, seq), np.float32)
    resp[:, max(seq - response, 1):] = 1.0
    return PolicyRows(input_ids=rng.integers(0, vocab, (rows, seq)).astype(np.int32),
                      attention_mask=np.ones((rows, seq), np.int32), response_mask=resp,
                      advantages=rng.standard_normal(rows).astype(np.float32),
                      old_logp=np.full((rows, seq), -2.0, np.float32),
                      ref_logp=np.full((rows, seq), -2.0, np.float32))


def model_flops_per_token(cfg: DecoderConfig, n_params: int, seq: int) -> float:
    """Training FLOPs per token: 6 N plus causal attention's 6 x layers x seq x hidden."""
    return 6.0 * n_params + 6.0 * cfg.num_hidden_layers * seq * cfg.hidden_size


def time_calls(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_variant(cfg, scan: bool, attention: str, args, mesh, window: int | None = None) -> dict:
    model = CausalLM(cfg, dtype=args.compute_dtype, param_dtype=args.dtype,
                             rngs=nnx.Rngs(0), remat=bool(args.remat), scan_layers=scan, attention=attention,
                             batch_mesh=mesh)
    graphdef, params = nnx.split(model, nnx.Param)
    shardings = param_shardings(mesh, params)
    params = jax.device_put(params, shardings)
    state = {"params": params}
    out = {"scan_layers": scan, "attention": resolve_attention(attention, model.dtype,
                                                              cfg.head_size), "window": window}
    if args.rows:
        tx = make_optimizer(1e-6)
        state["opt"], opt_shardings = init_opt_state(tx, params, mesh)
        loss_cfg = LossConfig()  # the paper's: clip 0.2, dual clip 3, low-var KL 0.01, entropy 0.001
        step = make_train_step(graphdef, tx, loss_cfg, max(args.rows // args.micro, 1), mesh,
                               shardings, opt_shardings, window=window)
        out.update(bench_step(cfg, step, state, args, mesh))
        state.pop("opt")
    if args.sampler:
        out.update(bench_sampler(cfg, nnx.merge(graphdef, state["params"]), args))
    del state, params, model
    gc.collect()
    return out


def bench_step(cfg, step, state, args, mesh) -> dict:
    """Compile and time the train step; `state` ({params, opt}) is updated in place."""
    mb = random_minibatch(args.rows, args.seq, cfg.vocab_size, args.response)
    t0 = time.perf_counter()
    compiled = step.lower(state["params"], state["opt"], mb).compile()
    compile_s = time.perf_counter() - t0

    def one():
        state["params"], state["opt"], metrics = compiled(state["params"], state["opt"], mb)
        jax.block_until_ready(metrics)

    one()  # warm-up
    times = time_calls(one, args.repeats)
    n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    step_s = statistics.median(times)
    tokens = args.rows * args.seq
    out = {"compile_s": compile_s, "step_s": step_s, "step_s_all": times,
           "tokens_per_s": tokens / step_s}
    if args.peak_tflops:
        out["mfu"] = model_flops_per_token(cfg, n_params, args.seq) * tokens / step_s / (
            args.peak_tflops * 1e12 * mesh.devices.size)
    return out


def bench_sampler(cfg, model, args) -> dict:
    """Sampler new tokens/s for args.sampler = (prompts, prompt tokens, new tokens)."""
    out = {}
    if True:
        n, plen, new = args.sampler
        prompts = np.random.default_rng(1).integers(0, cfg.vocab_size, (n, plen)).tolist()
        sampler = Sampler(unroll_layers=not args.sampler_scan)
        try:
            first = time.perf_counter()
            sampler.generate(model, prompts, new, temperature=1.0, rng=0)
            out["sampler_first_call_s"] = time.perf_counter() - first
            out["sampler_compile_s"] = sampler.compile_s
            times = time_calls(lambda: sampler.generate(model, prompts, new, temperature=1.0,
                                                        rng=1), max(1, args.repeats // 2))
            out["sampler_s"] = statistics.median(times)
            out["sampler_new_tokens_per_s"] = n * new / out["sampler_s"]
        except Exception as err:  # e.g. out of memory: recorded, the other variants still run
            out["sampler_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="bench",
                   choices=["bench", *SHAPES, "local-tiny", "local-small", "local-base"])
    p.add_argument("--rows", type=int, default=16, help="mini-batch rows per update (0: no step)")
    p.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    p.add_argument("--seq", type=int, default=256, help="tokens per row")
    p.add_argument("--response", type=int, default=512, help="response tokens per row")
    p.add_argument("--dtype", default="float32", help="master weights")
    p.add_argument("--compute-dtype", default="float32")
    p.add_argument("--scan", default="0,1", help="layouts to compare: 0 unrolled, 1 scanned")
    p.add_argument("--attention", default="einsum", help="attention paths, comma-separated")
    p.add_argument("--window", default="0",
                   help="log-prob windows to compare, comma-separated (0: every position; N: the "
                        "vocabulary projection for N positions from the response start, as the "
                        "trainers do with rollout.max_new_tokens)")
    p.add_argument("--remat", type=int, default=1, help="rematerialize each layer (1) or not (0)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sampler", default="", help="prompts,prompt_len,new_tokens (off if empty)")
    p.add_argument("--sampler-scan", action="store_true",
                   help="decode a scanned model with its layers scanned (default: unrolled)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="per device, for MFU")
    p.add_argument("--json", default="", help="write the results here")
    args = p.parse_args(argv)
    args.sampler = tuple(int(x) for x in args.sampler.split(",")) if args.sampler else ()
    cfg = shape_config(args.shape)
    mesh = make_mesh(data=-1)
    results = {"shape": args.shape, "device": str(jax.devices()[0].device_kind),
               "devices": len(jax.devices()), "args": {k: v for k, v in vars(args).items()},
               "variants": []}
    for attention in args.attention.split(","):
        for scan in (bool(int(s)) for s in args.scan.split(",")):
            for window in (int(w) or None for w in args.window.split(",")):
                res = bench_variant(cfg, scan, attention, args, mesh, window)
                results["variants"].append(res)
                print(json.dumps({k: v for k, v in res.items() if k != "step_s_all"}), flush=True)
    base = results["variants"][0]
    for res in results["variants"]:
        if "step_s" in res:
            res["step_time_ratio_vs_first"] = res["step_s"] / base["step_s"]
        print(f"scan {int(res['scan_layers'])} attention {res['attention']:>7} "
              f"window {res['window'] or 'all'}: "
              + (f"step {res['step_s']:.3f}s (x{res['step_time_ratio_vs_first']:.3f} of the "
                 f"first), compile {res['compile_s']:.1f}s" if "step_s" in res else "")
              + (f", MFU {res['mfu']:.1%}" if "mfu" in res else "")
              + (f", sampler {res['sampler_new_tokens_per_s']:.0f} new tok/s"
                 if "sampler_s" in res else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
