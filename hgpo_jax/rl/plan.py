"""`hgpo-jax plan CONFIG`: compile the train step ahead of time and report memory per device.

Nothing is allocated: the model, optimizer state and a mini-batch are abstract arrays
(`jax.ShapeDtypeStruct` with their shardings on the config's mesh); XLA compiles the real program
and reports its buffer sizes. On a machine without the mesh's accelerators the plan runs on as
many virtual CPU devices, which gives the per-device sizes of weights, optimizer state and
gradients exactly, and the activation peak as XLA's CPU compiler schedules it (an estimate of the
GPU one). Use it to check that a 7B run fits before renting GPUs.

Attention: the plan compiles the path `model.attention` takes on the target platform
(`--target`, default gpu). cuDNN flash attention has no CPU kernel, so on CPU a stand-in with its
memory profile is compiled instead (`qwen2._flash_standin`: output and logsumexp residuals, no
[T, S] buffer); its values are never computed.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from hgpo_jax.models import Qwen2Config, Qwen2ForCausalLM, make_mesh
from hgpo_jax.models.config import resolve_dtype
from hgpo_jax.models.qwen2 import resolve_attention
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


def _bytes_per_device(tree) -> int:
    """Bytes one device holds of an abstract tree (each leaf's shard shape)."""
    return sum(jnp.dtype(x.dtype).itemsize * math.prod(x.sharding.shard_shape(x.shape))
               for x in jax.tree.leaves(tree))


def _step_peak_bytes(mem) -> int:
    """A compiled step's peak: arguments + temporaries + outputs that do not alias (donated)
    arguments."""
    return (getattr(mem, "argument_size_in_bytes", 0) + getattr(mem, "temp_size_in_bytes", 0)
            + max(getattr(mem, "output_size_in_bytes", 0) - getattr(mem, "alias_size_in_bytes", 0), 0))


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        tree, shardings)


def plan_attention(cfg, model_cfg: Qwen2Config, target: str | None) -> tuple[str, str]:
    """(the attention path to compile here, its label) for `model.attention` on `target`."""
    target = target or jax.default_backend()
    impl = resolve_attention(cfg.model.attention, resolve_dtype(cfg.model.compute_dtype),
                             model_cfg.head_size, platform=target)
    if impl == "cudnn" and jax.default_backend() != "gpu":
        return "flash_standin", f"cudnn flash on {target} (a memory stand-in compiled on " \
                                f"{jax.default_backend()})"
    return impl, f"{impl} on {target}"


def plan(cfg, target: str | None = None, sampler: bool = False) -> dict:
    """Compile the config's train step on abstract inputs; returns sizes in bytes per device.

    target: the platform the run is for ('gpu', 'tpu', 'cpu'; None: this one), which decides the
    attention path. sampler: also compile the rollout's generation programs (prefill + decode of
    num_groups x group_size prompts of max_prompt_tokens, max_new_tokens new) and time it.
    """
    model_cfg = plan_model_config(cfg.model.path)
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    t, r = cfg.train, cfg.rollout
    attention, attention_label = plan_attention(cfg, model_cfg, target)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen2ForCausalLM(
        model_cfg, dtype=cfg.model.compute_dtype, param_dtype=cfg.model.dtype,
        rngs=nnx.Rngs(0), remat=t.remat, batch_mesh=mesh, scan_layers=cfg.model.scan_layers,
        attention=attention)), nnx.Param)
    shardings = param_shardings(mesh, params)
    abs_params = _abstract(params, shardings)
    tx = build_optimizer(cfg)
    opt_shardings = opt_state_shardings(tx, params, mesh)
    abs_opt = _abstract(jax.eval_shape(tx.init, params), opt_shardings)
    L = r.max_prompt_tokens + r.max_new_tokens
    M, W = t.mini_batch_size, r.max_new_tokens
    ppo = cfg.algo.estimator == "ppo"
    shapes = {"input_ids": (jnp.int32, (M, L)), "attention_mask": (jnp.int32, (M, L)),
              "response_mask": (jnp.float32, (M, L)), "advantages": (jnp.float32, (M, L) if ppo else (M,)),
              "old_logp": (jnp.float32, (M, L)), "ref_logp": (jnp.float32, (M, L)),
              "values": (jnp.float32, (M, W)), "returns": (jnp.float32, (M, W))}
    def minibatch(keys):
        return {k: jax.ShapeDtypeStruct(shapes[k][1], shapes[k][0],
                                        sharding=batch_sharding(mesh, len(shapes[k][1]))) for k in keys}

    step = make_train_step(graphdef, tx, build_loss_config(cfg), M // t.micro_batch_size, mesh,
                           shardings, opt_shardings, window=W, token_advantages=ppo)
    t0 = time.perf_counter()
    compiled = step.lower(abs_params, abs_opt, minibatch(list(shapes)[:6])).compile(
        compiler_options=plan_compiler_options(mesh))
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    n_dev = mesh.devices.size

    out = {
        "model": cfg.model.path, "mesh": dict(mesh.shape), "devices": n_dev,
        "platform": jax.devices()[0].platform, "params": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
        "seq_len": L, "mini_batch": M, "micro_batch": t.micro_batch_size, "remat": t.remat,
        "scan_layers": cfg.model.scan_layers, "attention": attention_label,
        "params_bytes": _bytes_per_device(abs_params), "opt_bytes": _bytes_per_device(abs_opt),
        "ref_params_bytes": _bytes_per_device(abs_params),
        "argument_bytes": getattr(mem, "argument_size_in_bytes", 0),
        "output_bytes": getattr(mem, "output_size_in_bytes", 0),
        "temp_bytes": getattr(mem, "temp_size_in_bytes", 0),
        "alias_bytes": getattr(mem, "alias_size_in_bytes", 0),
        "compile_s": compile_s,
    }
    # Peak of the train step (arguments + temporaries; outputs alias the donated arguments),
    # plus the frozen reference weights that live beside it.
    out["peak_bytes"] = _step_peak_bytes(mem) + out["ref_params_bytes"]
    if ppo:  # the critic lives beside the policy all run; its step runs before the actor's
        out.update(plan_critic(cfg, model_cfg, mesh, attention, minibatch(
            ["input_ids", "attention_mask", "response_mask", "values", "returns"])))
        resident_policy = out["params_bytes"] + out["opt_bytes"] + out["ref_params_bytes"]
        out["peak_bytes"] = max(out["peak_bytes"] + out["critic_params_bytes"] + out["critic_opt_bytes"],
                                out["critic_step_bytes"] + resident_policy)
    if sampler:
        rows = r.num_groups * r.group_size
        out["sampler_compile_s"] = sampler_compile_seconds(
            graphdef, abs_params, rows, r.max_prompt_tokens, r.max_new_tokens, mesh,
            cfg.model.compute_dtype)
        out["sampler_shape"] = (rows, r.max_prompt_tokens, r.max_new_tokens)
    return out


def plan_critic(cfg, model_cfg: Qwen2Config, mesh, attention: str, mb: dict) -> dict:
    """Per-device bytes of a PPO run's critic (`rl.critic`): its weights, its AdamW state and the
    peak of its update step (arguments + temporaries)."""
    from hgpo_jax.models.qwen2 import Qwen2Critic
    from hgpo_jax.rl.critic import critic_optimizer, make_critic_step

    t, c = cfg.train, cfg.critic
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Qwen2Critic(
        model_cfg, dtype=cfg.model.compute_dtype, param_dtype=cfg.model.dtype, rngs=nnx.Rngs(0),
        remat=t.remat, batch_mesh=mesh, scan_layers=cfg.model.scan_layers, attention=attention)),
        nnx.Param)
    shardings = param_shardings(mesh, params)
    tx = critic_optimizer(cfg)
    opt_shardings = opt_state_shardings(tx, params, mesh)
    abs_params = _abstract(params, shardings)
    abs_opt = _abstract(jax.eval_shape(tx.init, params), opt_shardings)
    step = make_critic_step(graphdef, tx, c.cliprange_value, cfg.rollout.max_new_tokens,
                            t.mini_batch_size // t.micro_batch_size, mesh, shardings, opt_shardings)
    mem = step.lower(abs_params, abs_opt, mb).compile(
        compiler_options=plan_compiler_options(mesh)).memory_analysis()
    return {"critic_params": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
            "critic_params_bytes": _bytes_per_device(abs_params),
            "critic_opt_bytes": _bytes_per_device(abs_opt), "critic_step_bytes": _step_peak_bytes(mem)}


def sampler_compile_seconds(graphdef, abs_params, rows: int, prompt_len: int, max_new: int, mesh,
                            cache_dtype, unroll: bool = True) -> float:
    """Seconds to compile the sampler's prefill and decode programs for `rows` prompts of
    `prompt_len` tokens and `max_new` new tokens, on abstract weights (nothing runs). unroll: the
    sampler's `unroll_layers` (a scanned model decodes unrolled by default)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from hgpo_jax.models.sharding import rows_sharding
    from hgpo_jax.rl.sampling import Sampler, _Static, batch_bucket, new_tokens_bucket

    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    B = batch_bucket(rows, dp)
    rep = NamedSharding(mesh, P())
    batched = [jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sharding(mesh, shape))
               for shape, dtype in (((B, prompt_len), jnp.int32), ((B, prompt_len), jnp.bool_),
                                    ((B,), jnp.bool_))]
    scalars = [jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
               for shape, dtype in (((1,), jnp.int32), ((2,), jnp.uint32), ((), jnp.float32),
                                    ((), jnp.float32), ((), jnp.int32))]
    static = _Static(max_new=new_tokens_bucket(max_new), greedy=False, top_k=0, use_top_p=False,
                     cache_dtype=resolve_dtype(cache_dtype), mesh=mesh, unroll_layers=unroll)
    t0 = time.perf_counter()
    Sampler._compile(graphdef, static, (abs_params, *batched, *scalars), mesh, abs_params)
    return time.perf_counter() - t0


def format_plan(p: dict) -> str:
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
    return "\n".join([
        f"plan: {p['model']} ({p['params'] / 1e9:.2f} B parameters) on {p['devices']} "
        f"{p['platform']} device(s), mesh {mesh}",
        f"  train step: mini-batch {p['mini_batch']} rows x {p['seq_len']} tokens, micro-batch "
        f"{p['micro_batch']} rows, remat {p['remat']}, scanned layers {p['scan_layers']} "
        f"(compiled in {p['compile_s']:.1f}s)",
        f"  attention: {p['attention']}",
        "  per device:",
        f"    parameters (master)   {g(p['params_bytes'])}",
        f"    optimizer state       {g(p['opt_bytes'])}",
        f"    reference parameters  {g(p['ref_params_bytes'])}",
        f"    step arguments        {g(p['argument_bytes'])}  (params + opt state + mini-batch)",
        f"    step temporaries      {g(p['temp_bytes'])}  (gradients, activations, logits chunks)",
    ] + ([f"    critic parameters     {g(p['critic_params_bytes'])}  ({p['critic_params'] / 1e9:.2f} B, "
          "value head, no LM head)",
          f"    critic optimizer      {g(p['critic_opt_bytes'])}",
          f"    critic step peak      {g(p['critic_step_bytes'])}  (its arguments + temporaries)"]
         if "critic_params_bytes" in p else []) + [
        f"    estimated peak        {g(p['peak_bytes'])}",
    ] + ([f"  sampler: {p['sampler_shape'][0]} prompts x {p['sampler_shape'][1]} tokens, "
          f"{p['sampler_shape'][2]} new: compiled in {p['sampler_compile_s']:.1f}s"]
         if "sampler_compile_s" in p else []))
