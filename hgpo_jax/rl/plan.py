"""`hgpo-jax plan CONFIG`: compile the train step ahead of time and report memory per device.

Nothing is allocated: the model, optimizer state and a mini-batch are abstract arrays
(`jax.ShapeDtypeStruct` with their shardings on the config's mesh); XLA compiles the real program
and reports its buffer sizes. On a machine without the mesh's accelerators the plan runs on as
many virtual CPU devices, which gives the per-device sizes of weights, optimizer state and
gradients exactly, and the activation peak as XLA's CPU compiler schedules it (an estimate of the
GPU one). Use it to check that a 7B run fits before renting GPUs.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from hgpo_jax.models import Qwen2Config, Qwen2ForCausalLM, make_mesh
from hgpo_jax.models.xla_options import plan_compiler_options
from hgpo_jax.rl.ppo import batch_sharding, make_train_step, opt_state_shardings, param_shardings
from hgpo_jax.rl.trainer import build_loss_config
from hgpo_jax.runs import build_optimizer

# Shapes of the released checkpoints (their config.json), for planning without the weights.
PRESETS = {
    "Qwen/Qwen2.5-1.5B-Instruct": Qwen2Config(),
    "Qwen/Qwen2.5-7B-Instruct": Qwen2Config(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}
GIB = 2**30


def plan_model_config(path: str) -> Qwen2Config:
    """The architecture to plan: a local folder's config.json, a known preset, 'tiny', a model
    built here or a run folder's model."""
    if path == "tiny":
        from hgpo_jax.models.tiny import TINY_CONFIG
        return TINY_CONFIG
    if os.path.isfile(os.path.join(path, "config.json")):
        return Qwen2Config.from_json_file(os.path.join(path, "config.json"))
    if path in PRESETS:
        return PRESETS[path]
    if path.startswith("build:") or os.path.isdir(path):  # a model built here, a run folder
        from hgpo_jax.runs import model_folder

        return Qwen2Config.from_json_file(os.path.join(model_folder(path), "config.json"))
    raise FileNotFoundError(f"cannot plan model.path {path!r}: not a local folder with a "
                            f"config.json, a run folder, a build:<env>-<size>, nor one of the "
                            f"presets {sorted(PRESETS)}")


def devices_needed(cfg) -> int:
    """Devices the config's mesh asks for (an axis of -1, "all the rest", counts as 1)."""
    return math.prod(max(s, 1) for s in (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor))


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def plan(cfg) -> dict:
    """Compile the config's train step on abstract inputs; returns sizes in bytes per device."""
    model_cfg = plan_model_config(cfg.model.path)
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    t, r = cfg.train, cfg.rollout
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen2ForCausalLM(
        model_cfg, dtype=cfg.model.compute_dtype, param_dtype=cfg.model.dtype,
        rngs=nnx.Rngs(0), remat=t.remat, batch_mesh=mesh)), nnx.Param)
    shardings = param_shardings(mesh, params)
    abs_params = _abstract(params, shardings)
    tx = build_optimizer(cfg)
    opt_shardings = opt_state_shardings(tx, params, mesh)
    abs_opt = _abstract(jax.eval_shape(tx.init, params), opt_shardings)
    L = r.max_prompt_tokens + r.max_new_tokens
    M = t.mini_batch_size
    mb = {}
    for k, dtype, shape in (("input_ids", jnp.int32, (M, L)), ("attention_mask", jnp.int32, (M, L)),
                            ("response_mask", jnp.float32, (M, L)), ("advantages", jnp.float32, (M,)),
                            ("old_logp", jnp.float32, (M, L)), ("ref_logp", jnp.float32, (M, L))):
        mb[k] = jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))
    step = make_train_step(graphdef, tx, build_loss_config(cfg), M // t.micro_batch_size, mesh,
                           shardings, opt_shardings)
    t0 = time.perf_counter()
    compiled = step.lower(abs_params, abs_opt, mb).compile(
        compiler_options=plan_compiler_options(mesh))
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    n_dev = mesh.devices.size

    def per_device(tree):
        return sum(jnp.dtype(x.dtype).itemsize * math.prod(x.sharding.shard_shape(x.shape))
                   for x in jax.tree.leaves(tree))

    out = {
        "model": cfg.model.path, "mesh": dict(mesh.shape), "devices": n_dev,
        "platform": jax.devices()[0].platform, "params": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
        "seq_len": L, "mini_batch": M, "micro_batch": t.micro_batch_size, "remat": t.remat,
        "params_bytes": per_device(abs_params), "opt_bytes": per_device(abs_opt),
        "ref_params_bytes": per_device(abs_params),
        "argument_bytes": getattr(mem, "argument_size_in_bytes", 0),
        "output_bytes": getattr(mem, "output_size_in_bytes", 0),
        "temp_bytes": getattr(mem, "temp_size_in_bytes", 0),
        "alias_bytes": getattr(mem, "alias_size_in_bytes", 0),
        "compile_s": compile_s,
    }
    # Peak of the train step (arguments + temporaries; outputs alias the donated arguments),
    # plus the frozen reference weights that live beside it.
    out["peak_bytes"] = (out["argument_bytes"] + out["temp_bytes"]
                         + max(out["output_bytes"] - out["alias_bytes"], 0) + out["ref_params_bytes"])
    return out


def format_plan(p: dict) -> str:
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
    return "\n".join([
        f"plan: {p['model']} ({p['params'] / 1e9:.2f} B parameters) on {p['devices']} "
        f"{p['platform']} device(s), mesh {mesh}",
        f"  train step: mini-batch {p['mini_batch']} rows x {p['seq_len']} tokens, micro-batch "
        f"{p['micro_batch']} rows, remat {p['remat']} (compiled in {p['compile_s']:.1f}s)",
        "  per device:",
        f"    parameters (master)   {g(p['params_bytes'])}",
        f"    optimizer state       {g(p['opt_bytes'])}",
        f"    reference parameters  {g(p['ref_params_bytes'])}",
        f"    step arguments        {g(p['argument_bytes'])}  (params + opt state + mini-batch)",
        f"    step temporaries      {g(p['temp_bytes'])}  (gradients, activations, logits chunks)",
        f"    estimated peak        {g(p['peak_bytes'])}",
    ])
