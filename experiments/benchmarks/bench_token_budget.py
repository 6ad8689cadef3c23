"""Token-budget micro-batches (`train.max_tokens_per_micro_batch`) against fixed micro-batches, on
real ALFWorld rollout shapes. A benchmark: nothing asserted.

    # 1. real row lengths: rollouts of the kept laptop warm start on real ALFWorld (no update)
    python -m experiments.benchmarks.bench_token_budget --collect 4
    # 2. padding and update + log-prob time, fixed (key 0) vs token budgets, laptop model
    python -m experiments.benchmarks.bench_token_budget --budgets 0,2176,4352,8704

--collect N runs N rollout iterations of hgpo_jax/configs/alfworld_laptop_rl.yaml (16 episodes
of at most 50 steps each, temperature 0.4) from docs/results/alfworld_laptop/warm_start (rebuilt
by `python -m experiments.alfworld_laptop --stage sft`: weights are not kept in git) on the
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

import argparse
import json
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTHS = os.path.join(ROOT, "docs", "results", "token_budget", "alfworld_laptop_lengths.json")
WARM_START = os.path.join(ROOT, "docs", "results", "alfworld_laptop", "warm_start")
CONFIG = "alfworld_laptop_rl"


def collect(iterations: int, out: str, seed: int) -> None:
    """Prompt and response lengths of every row of `iterations` rollout iterations."""
    import jax

    from hgpo_jax.config import load_config
    from hgpo_jax.rl.rollout import collect_rollouts
    from hgpo_jax.trainers.rl import Trainer

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
                                         trainer.loop.tasks.next(r.num_groups), r.group_size,
                                         cfg.env.max_steps, cfg.env.memory_len, rng=sub,
                                         spec=trainer.env_spec, agent=trainer.agent)
                records.append({"prompt": [len(p) for p in batch.prompt_ids],
                                "response": [len(x) for x in batch.response_ids]})
                print(f"iteration {it + 1}/{iterations}: {len(batch)} rows, "
                      f"{time.perf_counter() - t0:.1f}s", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"source": f"experiments/benchmarks/bench_token_budget.py --collect {iterations} --seed {seed}",
                   "config": CONFIG, "model": "docs/results/alfworld_laptop/warm_start",
                   "max_prompt_tokens": r.max_prompt_tokens, "max_new_tokens": r.max_new_tokens,
                   "pad_multiple": cfg.train.pad_multiple, "iterations": records}, f)
    print(f"wrote {out}")


def iteration_rows(record: dict, vocab: int, seed: int):
    """(prompts, responses, advantages) of one recorded iteration: random ids, the real lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, vocab, n).tolist() for n in record["prompt"]]
    responses = [rng.integers(1, vocab, n).tolist() for n in record["response"]]
    return prompts, responses, rng.standard_normal(len(prompts)).astype(np.float32)


def pack(trainer, record: dict, seed: int):
    """The iteration's rows packed as `Trainer.run_iteration` packs them (one process)."""
    from hgpo_jax.rl.batching import pack_rows

    t, r = trainer.cfg.train, trainer.cfg.rollout
    prompts, responses, adv = iteration_rows(record, trainer.model().config.vocab_size, seed)
    return pack_rows(prompts, responses, adv, pad_id=0, row_multiple=t.micro_batch_size,
                     length_multiple=t.pad_multiple, max_response=r.max_new_tokens)


def run_iteration_update(trainer, packed, seed: int) -> tuple[float, float]:
    """(log-prob seconds, update seconds): the old and reference log-prob passes, then one epoch
    of shuffled mini-batches, as `Trainer.run_iteration` runs them."""
    import jax
    import numpy as np

    from hgpo_jax.rl.batching import PolicyRows, gather_rows, minibatch_indices

    t0 = time.perf_counter()
    arrays = packed.arrays()
    arrays["old_logp"] = trainer._logprobs(trainer.state.params, arrays)
    arrays["ref_logp"] = trainer._logprobs(trainer.state.ref_params, arrays)
    t1 = time.perf_counter()
    rows = PolicyRows.of(arrays)
    rng = np.random.default_rng(seed)
    for idx in minibatch_indices(packed.num_rows, trainer.cfg.train.mini_batch_size, rng):
        if trainer.budget:
            params, opt_state, m = trainer._budget_update(rows, idx)
        else:
            params, opt_state, m = trainer.train_step(
                trainer.state.params, trainer.state.opt_state,
                gather_rows(rows, idx))
        trainer.state = trainer.state.replace(params=params, opt_state=opt_state)
        jax.device_get(m)
    return t1 - t0, time.perf_counter() - t1


def padding_stats(trainer, packed, seed: int) -> dict:
    """Positions the update's and the log-prob passes' micro-batches run over, real tokens among
    them, and the distinct (rows, length) shapes: from the same plans the trainer makes."""
    import numpy as np

    from hgpo_jax.rl.batching import TokenRows, gather_rows, minibatch_indices, token_budget_micro_batches

    t = trainer.cfg.train
    arrays = packed.arrays()
    lengths = arrays["attention_mask"].sum(1)
    ladder, shards = trainer._ladder(arrays["input_ids"].shape[1]), trainer.dp // trainer.procs
    out = {"update_positions": 0, "update_tokens": 0, "logprob_positions": 0,
           "logprob_tokens": int(lengths.sum()), "update_shapes": set(), "logprob_shapes": set()}
    S, L = arrays["input_ids"].shape
    if trainer.budget:
        plan = token_budget_micro_batches(lengths, trainer.budget, ladder, shards=shards)
        out["logprob_positions"] = sum(m.rows.size * m.length for m in plan)
        out["logprob_shapes"].update(m.shape for m in plan)
    else:
        out["logprob_positions"] = S * L
        out["logprob_shapes"].add((t.micro_batch_size, L))
    rng = np.random.default_rng(seed)
    for idx in minibatch_indices(packed.num_rows, t.mini_batch_size, rng):
        mb = gather_rows(TokenRows.of(arrays), idx)
        own = mb.attention_mask.sum(1)
        out["update_tokens"] += int(own.sum())
        if trainer.budget:
            plan = token_budget_micro_batches(np.where(mb.response_mask.sum(1) > 0, own, 0),
                                              trainer.budget, ladder, shards=shards)
            out["update_positions"] += sum(m.rows.size * m.length for m in plan)
            out["update_shapes"].update(m.shape for m in plan)
        else:
            out["update_positions"] += len(idx) * L
            out["update_shapes"].add((t.micro_batch_size, L))
    return out


def bench(args) -> dict:
    """Every variant (token budget; 0 = fixed) on every recorded iteration, interleaved: a warm-up
    pass (compiles), then `--repeats` timed passes."""
    import jax

    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.rl import Trainer

    with open(args.lengths) as f:
        data = json.load(f)
    records = data["iterations"][:args.iterations or None]
    budgets = [int(b) for b in args.budgets.split(",")]
    tmp = tempfile.TemporaryDirectory()
    trainers = {}
    for b in budgets:
        cfg = load_config(CONFIG, [f"model.path={WARM_START}", f"train.run_dir={tmp.name}/b{b}",
                                   f"mesh.data={jax.device_count()}",
                                   f"train.max_tokens_per_micro_batch={b}", *args.set])
        trainers[b] = Trainer(cfg, progress=False)
    t = trainers[budgets[0]].cfg.train
    print(f"{len(records)} iterations ({sum(len(r['prompt']) for r in records)} rows), "
          f"mini-batch {t.mini_batch_size}, micro-batch {t.micro_batch_size}, pad {t.pad_multiple}, "
          f"{jax.device_count()} devices; budgets {budgets}", flush=True)
    packs = {b: [pack(tr, rec, args.seed + i) for i, rec in enumerate(records)]
             for b, tr in trainers.items()}
    results = {b: {"budget": b, "warmup_logprob_s": 0.0, "warmup_update_s": 0.0,
                   "logprob_s": [], "update_s": []} for b in budgets}
    try:
        for rep in range(args.repeats + 1):
            for i in range(len(records)):
                for b, tr in trainers.items():
                    lp, up = run_iteration_update(tr, packs[b][i], args.seed + i)
                    res = results[b]
                    if rep == 0:
                        res["warmup_logprob_s"] += lp
                        res["warmup_update_s"] += up
                    else:
                        if len(res["logprob_s"]) < rep:
                            res["logprob_s"].append(0.0)
                            res["update_s"].append(0.0)
                        res["logprob_s"][-1] += lp
                        res["update_s"][-1] += up
            print(f"pass {rep} ({'warm-up' if rep == 0 else 'timed'}) done", flush=True)
        for b, tr in trainers.items():
            stats = [padding_stats(tr, p, args.seed + i) for i, p in enumerate(packs[b])]
            res = results[b]
            for k in ("update_positions", "update_tokens", "logprob_positions", "logprob_tokens"):
                res[k] = sum(s[k] for s in stats)
            for k in ("update_shapes", "logprob_shapes"):
                res[k] = sorted(set().union(*(s[k] for s in stats)))
            res["update_padding"] = 1 - res["update_tokens"] / res["update_positions"]
            res["logprob_padding"] = 1 - res["logprob_tokens"] / res["logprob_positions"]
    finally:
        for tr in trainers.values():
            tr.close()
        tmp.cleanup()
    return {"lengths": os.path.relpath(args.lengths, ROOT), "iterations": len(records),
            "rows": sum(len(r["prompt"]) for r in records), "repeats": args.repeats,
            "command": "python -m experiments.benchmarks.bench_token_budget " + " ".join(args.argv),
            "results": [results[b] for b in budgets]}


def report(out: dict) -> None:
    import statistics

    base = out["results"][0]
    med = {r["budget"]: (statistics.median(r["logprob_s"]), statistics.median(r["update_s"]))
           for r in out["results"]}
    b_lp, b_up = med[base["budget"]]
    print(f"\n{out['iterations']} iterations, {out['rows']} rows; times: median of {out['repeats']} "
          f"timed passes (after a warm-up pass that compiles); ratios against budget {base['budget']}")
    print(f"{'budget':>7} {'update pad':>10} {'logp pad':>9} {'shapes u/l':>10} {'logprob s':>9} "
          f"{'update s':>9} {'total s':>8} {'ratio':>6} {'warm-up s':>9}")
    for r in out["results"]:
        lp, up = med[r["budget"]]
        print(f"{r['budget']:>7} {r['update_padding']:>10.3f} {r['logprob_padding']:>9.3f} "
              f"{len(r['update_shapes']):>4}/{len(r['logprob_shapes']):<5} {lp:>9.2f} {up:>9.2f} "
              f"{lp + up:>8.2f} {(lp + up) / (b_lp + b_up):>6.3f} "
              f"{r['warmup_logprob_s'] + r['warmup_update_s']:>9.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--collect", type=int, default=0, help="rollout iterations to record (then exit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", default=LENGTHS)
    p.add_argument("--budgets", default="0,2176,4352,8704",
                   help="train.max_tokens_per_micro_batch values; the first is the baseline (0: fixed)")
    p.add_argument("--iterations", type=int, default=0, help="recorded iterations to replay (0: all)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes after the warm-up pass")
    p.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "token_budget",
                                                  "bench_laptop.json"))
    p.add_argument("--set", nargs="*", default=[], help="more config overrides (key=value)")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    args.argv = argv
    if not os.path.isfile(os.path.join(WARM_START, "config.json")):
        raise SystemExit(f"no warm start in {WARM_START}: its weights are not kept in git; rebuild "
                         "them with `python -m experiments.alfworld_laptop --stage sft`")
    if args.collect:
        collect(args.collect, args.lengths, args.seed)
        return 0
    out = bench(args)
    report(out)
    if args.json:
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=list)
        print(f"wrote {os.path.relpath(args.json, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
