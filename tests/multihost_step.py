"""One PPO train step of the tiny model on a fixed global mini-batch, for tests/test_multihost.py.

    python tests/multihost_step.py OUT.npz                                    # one process
    python tests/multihost_step.py OUT.npz --coordinator localhost:PORT --num-processes 2 --process-id I

For each mesh layout in LAYOUTS (batch over `data`; batch and weights over `fsdp`; batch over
`data` in token-budget micro-batches planned over every process's rows, as the trainer plans them)
it computes the token log-probs of the mini-batch and takes one optimizer update; process 0 writes the
log-probs, the step's metrics and the updated parameters (gathered whole) to OUT.npz. Every
process builds the same global mini-batch from a fixed seed and feeds its own rows
(`hgpo_jax.distributed.global_rows`), as the trainer does.
"""

import sys

import numpy as np

import multihost_common  # tests/, the script's folder

LAYOUTS = {"data": (-1, 1, 1), "fsdp": (1, -1, 1),  # name -> mesh (data, fsdp, tensor)
           "budget": (-1, 1, 1)}  # batch over `data`, token-budget micro-batches (log-probs and update)
ROWS, LENGTH, MICRO = 8, 32, 4
BUDGET = 48  # tokens per device: micro-batches of 1 to 6 rows per device of 8 to 32 tokens


def minibatch(vocab: int) -> dict[str, np.ndarray]:
    """The global mini-batch [ROWS, LENGTH] (old/ref log-probs are filled in by the caller)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, (ROWS, LENGTH), dtype=np.int32)
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, ROWS)
    prompt = rng.integers(4, LENGTH // 2, ROWS)
    pos = np.arange(LENGTH)[None, :]
    attention = (pos < lengths[:, None]).astype(np.int32)
    response = ((pos >= prompt[:, None]) & (pos < lengths[:, None])).astype(np.float32)
    return {"input_ids": ids, "attention_mask": attention, "response_mask": response,
            "advantages": rng.normal(size=ROWS).astype(np.float32)}


def main(argv=None) -> int:
    args = multihost_common.init(argv)
    from hgpo_jax import distributed as dist
    import jax
    from flax import nnx

    from hgpo_jax.models import make_mesh
    from hgpo_jax.rl.batching import PolicyRows, length_ladder
    from hgpo_jax.rl.ppo import LossConfig, make_budget_train_step, make_train_step
    from hgpo_jax.rl.update import (batch_sharding, budget_update, init_opt_state, make_logprob_fn,
                                    make_optimizer, on_mesh, param_shardings)
    from hgpo_jax.trainers.budget import budget_minibatch, budget_rows_pass
    from hgpo_jax.runs import load_model

    procs, index = jax.process_count(), jax.process_index()
    out = {}
    for name, (data, fsdp, tensor) in LAYOUTS.items():
        mesh = make_mesh(data, fsdp, tensor)
        model, _, _ = load_model("tiny", "float32", "float32", mesh)
        graphdef, params = nnx.split(model, nnx.Param)
        shardings = param_shardings(mesh, params)
        tx = make_optimizer(1e-3)
        opt_state, opt_shardings = init_opt_state(tx, params, mesh)
        mb = minibatch(model.config.vocab_size)
        own = slice(index * ROWS // procs, (index + 1) * ROWS // procs)  # this process's rows
        rows_sh = batch_sharding(mesh, 2)
        budget = BUDGET if name == "budget" else 0
        logp_fn = make_logprob_fn(graphdef, mesh, shardings, token_budget=budget)
        ladder = length_ladder(LENGTH, 8)
        if budget:
            logp = budget_rows_pass(logp_fn, params, {k: v[own] for k, v in mb.items()}, budget,
                                    ladder, 2 // procs, mesh)
        else:
            logp = dist.local_rows(logp_fn(params, *(dist.global_rows(mb[k][own], rows_sh)
                                                     for k in ("input_ids", "attention_mask", "response_mask"))),
                                   mesh)
        local = PolicyRows(**{k: v[own] for k, v in mb.items()}, ref_logp=logp,
                           old_logp=logp - 0.1 * np.random.default_rng(1).normal(
                               size=(ROWS, LENGTH)).astype(np.float32)[own])
        if budget:
            step = make_budget_train_step(graphdef, tx, LossConfig(), budget, mesh, shardings,
                                          opt_shardings)
            micros = budget_minibatch(local, ROWS // MICRO, "token-mean", budget, ladder, 2 // procs, mesh)
            params, opt_state, metrics = budget_update(step, params, opt_state, micros)
        else:
            step = make_train_step(graphdef, tx, LossConfig(), ROWS // MICRO, mesh, shardings, opt_shardings)
            params, opt_state, metrics = step(params, opt_state, on_mesh(local, mesh))
        out[f"{name}/logp"] = dist.to_host(logp_fn(params, *(
            dist.global_rows(mb[k][own], rows_sh)
            for k in ("input_ids", "attention_mask", "response_mask"))))
        out[f"{name}/loss"] = np.asarray(jax.device_get(metrics["train/loss"]))
        out[f"{name}/grad_norm"] = np.asarray(jax.device_get(metrics["train/grad_norm"]))
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            out[f"{name}/param{jax.tree_util.keystr(path)}"] = dist.to_host(leaf)
    if index == 0:
        np.savez(args.out, **out)
    print(f"process {index} of {procs}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
