"""Token-budget micro-batches (`train.max_tokens_per_micro_batch`) against fixed micro-batches, on
real ALFWorld rollout shapes. A benchmark: nothing asserted.

    # 1. real row lengths: rollouts of the kept laptop warm start on real ALFWorld (no update)
    python experiments/bench_token_budget.py --collect 4
    # 2. padding and update + log-prob time, fixed (key 0) vs token budgets, laptop model
    python experiments/bench_token_budget.py --budgets 0,2176,4352,8704

--collect N runs N rollout iterations of experiments/configs/alfworld_laptop_rl.yaml (16 episodes
of at most 50 steps each, temperature 0.4) from docs/results/alfworld_laptop/warm_start on the
train split and writes every row's prompt and response length to LENGTHS (JSON).

The timing pass replays each recorded iteration's rows as the trainer does: pack to [S, L], the
old and the reference log-prob passes, then one epoch of shuffled mini-batches, each one AdamW
update; once with fixed micro-batches (micro_batch_size rows padded to the batch's longest row)
and once per token budget. Token ids are random (the lengths are real: the cost does not depend
on the ids). Each budget's first pass compiles its shapes; the timed passes come after a warm-up
pass over the same iterations, so compile time is reported apart. Every variant starts from the
same parameters and optimizer state. Padding fraction: padded positions / all positions of the
update's micro-batches (what the model runs over), for one epoch over every recorded iteration.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
LENGTHS = os.path.join(ROOT, "docs", "results", "token_budget", "alfworld_laptop_lengths.json")
WARM_START = os.path.join(ROOT, "docs", "results", "alfworld_laptop", "warm_start")
CONFIG = "alfworld_laptop_rl"


def collect(iterations: int, out: str, seed: int) -> None:
    """Prompt and response lengths of every row of `iterations` rollout iterations."""
    import jax

    from hgpo_jax.config import load_config
    from hgpo_jax.rl.rollout import collect_rollouts
    from hgpo_jax.rl.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(CONFIG, [f"model.path={WARM_START}", f"train.run_dir={tmp}/run",
                                   f"mesh.data={jax.device_count()}", f"train.seed={seed}"])
        r = cfg.rollout
        records = []
        with Trainer(cfg, progress=False) as trainer:
            key = jax.random.PRNGKey(seed)
            for it in range(iterations):
                key, sub = jax.random.split(key)
                t0 = time.perf_counter()
                batch = collect_rollouts(trainer.policy(r.temperature), trainer.pool,
                                         trainer.sampler.next(r.num_groups), r.group_size,
                                         cfg.env.max_steps, cfg.env.memory_len, rng=sub,
                                         spec=trainer.env_spec, projection=cfg.env.projection)
                records.append({"prompt": [len(p) for p in batch.prompt_ids],
                                "response": [len(x) for x in batch.response_ids]})
                print(f"iteration {it + 1}/{iterations}: {len(batch)} rows, "
                      f"{time.perf_counter() - t0:.1f}s", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"source": f"experiments/bench_token_budget.py --collect {iterations} --seed {seed}",
                   "config": CONFIG, "model": "docs/results/alfworld_laptop/warm_start",
                   "max_prompt_tokens": r.max_prompt_tokens, "max_new_tokens": r.max_new_tokens,
                   "pad_multiple": cfg.train.pad_multiple, "iterations": records}, f)
    print(f"wrote {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collect", type=int, default=0, help="rollout iterations to record (then exit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", default=LENGTHS)
    args = p.parse_args(argv)
    if args.collect:
        collect(args.collect, args.lengths, args.seed)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
