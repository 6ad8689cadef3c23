"""Memory plans of the Qwen3 configs on one GPU and on the paper's two: `hgpo-jax plan CONFIG
mesh.fsdp=F --json` for each config and mesh, as separate processes (each needs its own count of
virtual CPU devices), collected into a table ('fits 80 GB': the plan's own `fits_80gb`, both the
update's and the sampler's peak within what an 80 GB card gives a run, `trainers.memory`).

    python -m experiments.plan_families                       # the 12 Qwen3 configs x fsdp 1, 2
    python -m experiments.plan_families --configs hgpo_k2_alfworld_qwen3_4b --fsdp 1 2 4 --sampler
    python -m experiments.plan_families --configs hiper_alfworld_qwen2.5_1.5b --fsdp 1 \
        --set train.max_tokens_per_micro_batch=49152            # any config, with overrides

Writes docs/results/plan_families/{results.json,table.md} (or --out). The numbers are XLA:CPU's
schedule of the GPU program (cuDNN flash attention compiled as a stand-in with its memory
profile), an upper bound of what XLA:GPU compiles (README, "Memory plan").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3 = [f"{algo}_{env}_{size}" for size in ("qwen3_1.7b", "qwen3_4b")
         for algo in ("hgpo_k2", "gigpo", "hiper") for env in ("alfworld", "webshop")]


def plan_one(config: str, fsdp: int, sampler: bool, overrides=()) -> dict:
    """One `hgpo-jax plan` in its own process -> its JSON plus the command and wall time."""
    cmd = [sys.executable, "-m", "hgpo_jax.cli", "plan", config, f"mesh.fsdp={fsdp}", *overrides,
           "--json"]
    cmd += ["--sampler"] if sampler else []
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"config": config, "fsdp": fsdp, "error": proc.stderr.strip().splitlines()[-1:],
                "wall_s": wall}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"config": config, "fsdp": fsdp, "command": " ".join(["hgpo-jax"] + cmd[3:]),
            "wall_s": round(wall, 1), "plan": result}


def row(r: dict) -> str:
    if "error" in r:
        return f"| `{r['config']}` | {r['fsdp']} | error: {r['error']} | | | | |"
    p, step = r["plan"], r["plan"]["train_step"]
    critic = f" (critic step {step['critic_step_gib']:.1f})" if "critic_step_gib" in step else ""
    sampler = f"{p['sampler']['peak_gib']:.1f}" if "sampler" in p else ""
    budget = step.get("token_budget") or "off"
    return (f"| `{r['config']}` | {r['fsdp']} | {p['params'] / 1e9:.2f} B | {budget} | "
            f"{step['temp_gib']:.1f}{critic} | **{step['peak_gib']:.1f}** | {sampler} | "
            f"{'yes' if p['fits_80gb'] else 'no'} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=QWEN3)
    ap.add_argument("--fsdp", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--sampler", action="store_true", help="also plan the sampler (--sampler)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides for every plan (e.g. train.max_tokens_per_micro_batch=32768)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "plan_families"))
    args = ap.parse_args(argv)
    results = []
    for config in args.configs:
        for fsdp in args.fsdp:
            results.append(plan_one(config, fsdp, args.sampler, args.set))
            print(row(results[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = ["| config | fsdp (GPUs) | parameters | token budget | temporaries GiB | estimated peak "
             "/ device GiB | sampler peak GiB | fits 80 GB |", "|---|---|---|---|---|---|---|---|"]
    lines += [row(r) for r in results]
    lines += ["", f"Command: `python -m experiments.plan_families {' '.join(argv or sys.argv[1:])}`"
              f" ({sum(r['wall_s'] for r in results):.0f} s on this machine's CPU)."]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
