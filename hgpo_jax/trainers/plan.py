"""`hgpo-jax plan CONFIG`: compile the train step ahead of time and report memory per device.

Nothing is allocated: the model, optimizer state and a mini-batch are abstract arrays
(`jax.ShapeDtypeStruct` with their shardings on the config's mesh); XLA compiles the real program
and reports its buffer sizes. On a machine without the mesh's accelerators the plan runs on as
many virtual CPU devices, which gives the per-device sizes of weights, optimizer state and
gradients exactly, and the activation peak as XLA's CPU compiler schedules it (an estimate of the
GPU one). Use it to check that a 7B run fits before renting GPUs.

Attention: the plan compiles the path `model.attention` takes on the target platform
(`--target`, default gpu). cuDNN flash attention has no CPU kernel (nor has the TPU splash kernel,
`--target tpu`, but an interpreter), so on CPU a stand-in with their memory profile is compiled
instead (`attention._flash_standin`: output and logsumexp residuals, no
[T, S] buffer); its values are never computed.
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from hgpo_jax.models import CausalLM, DecoderConfig, RopeScaling, make_mesh
from hgpo_jax.models.config import resolve_dtype
from hgpo_jax.models.attention import resolve_attention
from hgpo_jax.models.lora import Adapted, split_params, trainable
from hgpo_jax.models.sharding import tensor_axis_problem
from hgpo_jax.models.xla_options import plan_compiler_options
from hgpo_jax.rl.algorithms import StatePlan, build_algorithm
from hgpo_jax.rl.batching import PolicyRows, budget_ladder, largest_micro_batches
from hgpo_jax.rl.update import (batch_shardings, batch_shards, opt_state_shardings,
                               param_shardings)
from hgpo_jax.runs import build_optimizer, lora_spec
from hgpo_jax.trainers.memory import memory_keys, memory_line, run_peak

# Shapes of the released checkpoints (their config.json), for planning without the weights.
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, rope_theta=1_000_000.0,
              max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645)
_LLAMA3 = dict(model_type="llama", vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500_000.0,
               max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001)
_SMOLLM2 = dict(model_type="llama", vocab_size=49152, rms_norm_eps=1e-5, max_position_embeddings=8192,
                tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
PRESETS = {
    "Qwen/Qwen2.5-1.5B-Instruct": DecoderConfig(),
    "Qwen/Qwen2.5-7B-Instruct": DecoderConfig(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "Qwen/Qwen2.5-3B-Instruct": DecoderConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "Qwen/Qwen3-0.6B": DecoderConfig(**_QWEN3, hidden_size=1024, intermediate_size=3072,
                                     num_hidden_layers=28, num_attention_heads=16,
                                     num_key_value_heads=8, tie_word_embeddings=True),
    "Qwen/Qwen3-1.7B": DecoderConfig(**_QWEN3, hidden_size=2048, intermediate_size=6144,
                                     num_hidden_layers=28, num_attention_heads=16,
                                     num_key_value_heads=8, tie_word_embeddings=True),
    "Qwen/Qwen3-4B": DecoderConfig(**_QWEN3, hidden_size=2560, intermediate_size=9728,
                                   num_hidden_layers=36, num_attention_heads=32,
                                   num_key_value_heads=8, tie_word_embeddings=True),
    "Qwen/Qwen3-8B": DecoderConfig(**_QWEN3, hidden_size=4096, intermediate_size=12288,
                                   num_hidden_layers=36, num_attention_heads=32,
                                   num_key_value_heads=8, tie_word_embeddings=False),
    "meta-llama/Llama-3.2-1B-Instruct": DecoderConfig(
        **_LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
        rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192)),
    "meta-llama/Llama-3.2-3B-Instruct": DecoderConfig(
        **_LLAMA3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192)),
    "meta-llama/Llama-3.1-8B-Instruct": DecoderConfig(
        **_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192)),
    "HuggingFaceTB/SmolLM2-360M-Instruct": DecoderConfig(
        **_SMOLLM2, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
        num_attention_heads=15, num_key_value_heads=5, rope_theta=100_000.0),
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": DecoderConfig(
        **_SMOLLM2, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=32, rope_theta=130_000.0),
}
GIB = 2**30


def plan_model_config(path: str) -> DecoderConfig:
    """The architecture to plan: a local folder's config.json, a known preset, 'tiny', a model
    built here or a run folder's model."""
    if path == "tiny":
        from hgpo_jax.models.tiny import TINY_CONFIG
        return TINY_CONFIG
    if os.path.isfile(os.path.join(path, "config.json")):
        return DecoderConfig.from_json_file(os.path.join(path, "config.json"))
    if path in PRESETS:
        return PRESETS[path]
    if path.startswith("build:") or os.path.isdir(path):  # a model built here, a run folder
        from hgpo_jax.runs import model_folder

        return DecoderConfig.from_json_file(os.path.join(model_folder(path), "config.json"))
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


def plan_attention(cfg, model_cfg: DecoderConfig, target: str | None) -> tuple[str, str]:
    """(the attention path to compile here, its label) for `model.attention` on `target`."""
    target = target or jax.default_backend()
    impl = resolve_attention(cfg.model.attention, resolve_dtype(cfg.model.compute_dtype),
                             model_cfg.head_size, platform=target)
    if impl == "cudnn" and jax.default_backend() != "gpu":
        return "flash_standin", f"cudnn flash on {target} (a memory stand-in compiled on " \
                                f"{jax.default_backend()})"
    if impl == "splash" and jax.default_backend() != "tpu":  # off a TPU it would be interpreted
        return "flash_standin", f"splash (Pallas TPU flash) on {target} (a memory stand-in " \
                                f"compiled on {jax.default_backend()})"
    return impl, f"{impl} on {target}"


def plan(cfg, target: str | None = None, sampler: bool = False) -> dict:
    """Compile the config's train step on abstract inputs; returns sizes in bytes per device.

    target: the platform the run is for ('gpu', 'tpu', 'cpu'; None: this one), which decides the
    attention path. sampler: also compile the rollout's generation programs (prefill + decode of
    num_groups x group_size prompts of max_prompt_tokens, max_new_tokens new) and time it.
    """
    model_cfg = plan_model_config(cfg.model.path)
    problem = tensor_axis_problem(model_cfg.num_attention_heads, model_cfg.num_key_value_heads,
                                  cfg.mesh.tensor)
    if problem:
        raise ValueError(f"model.path={cfg.model.path}: {problem}")
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    t, r = cfg.train, cfg.rollout
    attention, attention_label = plan_attention(cfg, model_cfg, target)
    spec = lora_spec(cfg.model)
    graphdef, params = split_params(nnx.eval_shape(lambda: CausalLM(
        model_cfg, dtype=cfg.model.compute_dtype, param_dtype=cfg.model.dtype,
        rngs=nnx.Rngs(0), remat=t.remat, batch_mesh=mesh, scan_layers=cfg.model.scan_layers,
        attention=attention, lora=spec)))
    shardings = param_shardings(mesh, params)
    abs_params = _abstract(params, shardings)
    tx = build_optimizer(cfg)
    opt_shardings = opt_state_shardings(tx, trainable(params), mesh)
    abs_opt = _abstract(jax.eval_shape(tx.init, trainable(params)), opt_shardings)
    # the KL reference: a copy of the weights, or (LoRA) the same base with the adapters' B zero
    abs_ref = trainable(abs_params) if spec is not None else abs_params
    L = r.max_prompt_tokens + r.max_new_tokens
    M = t.mini_batch_size
    algorithm = build_algorithm(cfg, mesh, M // t.micro_batch_size)  # its state is never built
    parts = (algorithm, graphdef, tx, mesh, shardings, opt_shardings, abs_params, abs_opt)
    update = (plan_budget_update(cfg, *parts) if t.max_tokens_per_micro_batch
              else plan_fixed_update(cfg, *parts))
    n_dev = mesh.devices.size

    out = {
        "model": cfg.model.path, "mesh": dict(mesh.shape), "devices": n_dev,
        "platform": jax.devices()[0].platform, "params": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
        "seq_len": L, "mini_batch": M, "micro_batch": t.micro_batch_size, "remat": t.remat,
        "scan_layers": cfg.model.scan_layers, "attention": attention_label,
        "params_bytes": _bytes_per_device(abs_params), "opt_bytes": _bytes_per_device(abs_opt),
        "ref_params_bytes": _bytes_per_device(abs_ref), **update,
    }
    if spec is not None:
        out.update({"lora": {"rank": spec.rank, "alpha": spec.alpha, "targets": list(spec.targets)},
                    "adapter_params": sum(math.prod(x.shape)
                                          for x in jax.tree.leaves(trainable(params))),
                    "adapter_bytes": _bytes_per_device(trainable(abs_params))})
    # Peak of the update (`plan_fixed_update`, `plan_budget_update`), plus the frozen reference
    # weights that live beside it.
    out["peak_bytes"] = out.pop("update_peak_bytes") + out["ref_params_bytes"]
    state_plan = algorithm.plan_state(model_cfg, attention)
    state_resident = 0
    if state_plan is not None:  # lives beside the policy all run; its step runs before the actor's
        label = state_plan.label
        out.update(plan_state(state_plan, mesh, budget_shapes(cfg, mesh)))
        state_resident = out[f"{label}_params_bytes"] + out[f"{label}_opt_bytes"]
        resident_policy = out["params_bytes"] + out["opt_bytes"] + out["ref_params_bytes"]
        out["peak_bytes"] = max(out["peak_bytes"] + state_resident,
                                out[f"{label}_step_bytes"] + resident_policy)
    if sampler:
        resident = out["params_bytes"] + out["opt_bytes"] + out["ref_params_bytes"] + state_resident
        out.update(plan_sampler(cfg, graphdef, abs_params, mesh, resident))
    return out


def _memory(mem) -> dict:
    """A compiled program's memory analysis as `plan()`'s byte counts."""
    return {f"{k}_bytes": getattr(mem, f"{k}_size_in_bytes", 0)
            for k in ("argument", "output", "temp", "alias")}


def plan_fixed_update(cfg, algorithm, graphdef, tx, mesh, shardings, opt_shardings, abs_params,
                      abs_opt) -> dict:
    """The policy's update over fixed micro-batches (`Algorithm.policy_step`: one program for a
    mini-batch of mini_batch_size rows x the longest row, the micro-batches scanned inside),
    compiled: its `_memory`, `compile_s` and `update_peak_bytes` (arguments, params and optimizer
    state included, + temporaries + outputs that alias no donated argument), per device."""
    t, r = cfg.train, cfg.rollout
    rows = PolicyRows.spec(t.mini_batch_size, r.max_prompt_tokens + r.max_new_tokens,
                           token_advantages=algorithm.spec.token_advantages)
    step = algorithm.policy_step(graphdef, tx, mesh, shardings, opt_shardings)
    t0 = time.perf_counter()
    mem = step.lower(abs_params, abs_opt, _sharded(rows, mesh)).compile(
        compiler_options=plan_compiler_options(mesh)).memory_analysis()
    return {**_memory(mem), "compile_s": time.perf_counter() - t0,
            "update_peak_bytes": _step_peak_bytes(mem)}


def plan_budget_update(cfg, algorithm, graphdef, tx, mesh, shardings, opt_shardings, abs_params,
                       abs_opt) -> dict:
    """The policy's update over token-budget micro-batches (`Algorithm.policy_budget_step`:
    `train.max_tokens_per_micro_batch` tokens per device), compiled by `plan_budget_step` at
    `budget_shapes`: its `_memory`, `compile_s`, `token_budget`, `budget_micro_batch`,
    `budget_apply_bytes` and `update_peak_bytes`."""
    step = algorithm.policy_budget_step(graphdef, tx, cfg.train.max_tokens_per_micro_batch, mesh,
                                        shardings, opt_shardings)
    token_advantages = algorithm.spec.token_advantages

    def micro(rows: int, length: int) -> PolicyRows:
        return PolicyRows.spec(rows, length, weighted=True, token_advantages=token_advantages)

    out = plan_budget_step(step, abs_params, abs_opt, micro, budget_shapes(cfg, mesh), mesh)
    return {**out, "token_budget": cfg.train.max_tokens_per_micro_batch,
            "update_peak_bytes": out.pop("peak_bytes")}


def budget_shapes(cfg, mesh) -> list[tuple[int, int]]:
    """The token-budget micro-batches (rows per device, padded length) that bound an update's
    memory (`rl.batching.largest_micro_batches`) on `mesh`; none without a budget."""
    t = cfg.train
    if not t.max_tokens_per_micro_batch:
        return []
    return largest_micro_batches(t.max_tokens_per_micro_batch, budget_ladder(cfg.rollout, t),
                                 t.mini_batch_size, batch_shards(mesh))


def plan_budget_step(step, abs_params, abs_opt, micro, shapes, mesh) -> dict:
    """A token-budget update (`rl.update.BudgetStep`) compiled on abstract weights: its gradient
    step at each of `shapes` (rows per device, padded length; `micro(global rows, length)` the
    abstract micro-batch) and its optimizer step. Returns the worst gradient step's `_memory`,
    `budget_micro_batch` (its shape), `budget_apply_bytes` (the optimizer step's peak),
    `compile_s` (all programs) and `peak_bytes`: the larger of the gradient step's peak (params,
    gradient sums and micro-batch as arguments, + temporaries) with the optimizer state beside
    it, and the optimizer step's (params, optimizer state and gradient sums, + temporaries), per
    device."""
    abs_acc = jax.eval_shape(step.init, abs_params)
    options, shards = plan_compiler_options(mesh), batch_shards(mesh)
    t0, worst = time.perf_counter(), None
    for rows, length in shapes:
        mem = step.accumulate.lower(abs_params, abs_acc, _sharded(micro(rows * shards, length), mesh)
                                    ).compile(compiler_options=options).memory_analysis()
        if worst is None or _step_peak_bytes(mem) > _step_peak_bytes(worst[0]):
            worst = (mem, (rows, length))
    apply = step.apply.lower(abs_params, abs_opt, abs_acc).compile(
        compiler_options=options).memory_analysis()
    mem, shape = worst
    return {**_memory(mem), "budget_micro_batch": shape, "compile_s": time.perf_counter() - t0,
            "budget_apply_bytes": _step_peak_bytes(apply),
            "peak_bytes": max(_step_peak_bytes(mem) + _bytes_per_device(abs_opt),
                              _step_peak_bytes(apply))}


def _sharded(spec, mesh):
    """A batch spec (`rl.batching.TokenRows.spec`) with its arrays' shardings on `mesh`."""
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                        spec, batch_shardings(mesh, spec))


def plan_state(sp: StatePlan, mesh, shapes=()) -> dict:
    """Per-device bytes of the model an algorithm trains besides the policy (`StatePlan`, from
    `Algorithm.plan_state`: the step the run compiles, here on abstract weights): its weights, its
    optimizer state and the peak of its update step (arguments + temporaries; with token-budget
    micro-batches, `plan_budget_step` at `shapes`), as `{label}_params_bytes`,
    `{label}_opt_bytes`, `{label}_step_bytes`; its parameter count `{label}_params`, its `facts`
    as `{label}_{key}`, and `state_label`, `state_detail` for the printed plan.
    A model with adapters on the policy's frozen base (`models.lora.Adapted`: a LoRA run's
    critic) counts what trains only: the base is the policy's, resident already, so its bytes
    leave the params and the step's peak too."""
    abs_params = _abstract(sp.params, sp.shardings)
    abs_opt = _abstract(jax.eval_shape(sp.tx.init, trainable(sp.params)), sp.opt_shardings)
    shared = _bytes_per_device(abs_params.frozen) if isinstance(abs_params, Adapted) else 0
    if sp.budget_batch is None:
        step_bytes = _step_peak_bytes(sp.step.lower(abs_params, abs_opt, _sharded(sp.batch, mesh))
                                      .compile(compiler_options=plan_compiler_options(mesh))
                                      .memory_analysis())
    else:
        step_bytes = plan_budget_step(sp.step, abs_params, abs_opt, sp.budget_batch, shapes,
                                      mesh)["peak_bytes"]
    label = sp.label
    return {"state_label": label, "state_detail": sp.detail,
            f"{label}_params": sum(math.prod(x.shape) for x in jax.tree.leaves(trainable(sp.params))),
            **{f"{label}_{k}": v for k, v in sp.facts.items()},
            f"{label}_params_bytes": _bytes_per_device(trainable(abs_params)),
            f"{label}_opt_bytes": _bytes_per_device(abs_opt),
            f"{label}_step_bytes": step_bytes - shared}


def plan_sampler(cfg, graphdef, abs_params, mesh, resident_bytes: int) -> dict:
    """Per-device bytes of the rollout's generation programs, compiled for the config's largest
    generation batch (num_groups x group_size prompts, at most rollout.max_num_seqs, of
    max_prompt_tokens, max_new_tokens new) on abstract weights, as the trainer runs them (the
    policy's master weights, so no second copy).

    resident_bytes: what training keeps on each device during a rollout (master weights,
    optimizer state, reference weights; the algorithm's own model and its optimizer state where
    it has one: a critic).
    Each program's own bytes are its arguments less the weights (already resident), its
    temporaries and its outputs that do not alias an argument; the prefill's output is the
    decode's carry (the KV cache). sampler_peak_bytes = resident + the larger of the two.
    """
    from hgpo_jax.rl.sampling import compile_for_plan, prompt_bucket

    r = cfg.rollout
    rows = min(r.num_groups * r.group_size, r.max_num_seqs)  # a larger rollout: several batches
    t0 = time.perf_counter()
    programs = compile_for_plan(graphdef, abs_params, rows, prompt_bucket(r.max_prompt_tokens),
                                r.max_new_tokens, mesh, resolve_dtype(cfg.model.compute_dtype),
                                prefill_chunk=r.prefill_chunk)
    compile_s = time.perf_counter() - t0
    weights = _bytes_per_device(abs_params)
    out = {"sampler_shape": (rows, r.max_prompt_tokens, r.max_new_tokens),
           "sampler_rollout_rows": r.num_groups * r.group_size,
           "sampler_batch": programs["batch"], "sampler_prompt_slots": programs["prompt_slots"],
           "sampler_new_slots": programs["new_slots"], "sampler_prefill_chunk": programs["chunk"],
           "sampler_row_groups": programs["row_groups"],
           "sampler_prefill_attention": programs["prefill_attention"],
           "sampler_cache_dtype": str(programs["cache_dtype"]),
           "sampler_cache_bytes": programs["cache_bytes"], "sampler_compile_s": compile_s,
           "sampler_resident_bytes": resident_bytes}
    for name in ("prefill", "decode"):
        mem = programs[name].memory_analysis()
        args = getattr(mem, "argument_size_in_bytes", 0)
        temp = getattr(mem, "temp_size_in_bytes", 0)
        outs = max(getattr(mem, "output_size_in_bytes", 0) - getattr(mem, "alias_size_in_bytes", 0), 0)
        out[f"sampler_{name}_argument_bytes"] = args
        out[f"sampler_{name}_temp_bytes"] = temp
        out[f"sampler_{name}_output_bytes"] = outs
        out[f"sampler_{name}_bytes"] = max(args - weights, 0) + temp + outs
    programs_peak = max(out["sampler_prefill_bytes"], out["sampler_decode_bytes"])
    out["sampler_peak_bytes"] = resident_bytes + programs_peak
    # `hgpo-jax eval` plays with the policy alone (trainers.evaluator): its weights + the sampler
    out["sampler_eval_peak_bytes"] = weights + programs_peak
    return out


def plan_peak(p: dict) -> int:
    """The peak per device of `plan()`'s result a train run reaches (bytes): its update's, or
    its sampler's where that was planned and is larger (`trainers.memory.run_peak`)."""
    return run_peak(p["peak_bytes"], p.get("sampler_peak_bytes"))[0]


def format_plan(p: dict, device_bytes: int | None = None) -> str:
    """`plan()`'s result as the printed plan; its last line is `memory_line` (the memory fraction
    for a device of `device_bytes`, None: an 80 GB card, and whether an 80 GB card fits it)."""
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items())
    budget = p.get("token_budget", 0)
    if budget:
        rows, length = p["budget_micro_batch"]
        micro = (f"token-budget micro-batches of {budget} tokens per device (largest: {rows} rows "
                 f"x {length} tokens per device)")
        arguments = "params + gradient sums + micro-batch; the optimizer state waits beside"
    else:
        micro = f"micro-batch {p['micro_batch']} rows"
        arguments = "params + opt state + mini-batch"
    return "\n".join([
        f"plan: {p['model']} ({p['params'] / 1e9:.2f} B parameters) on {p['devices']} "
        f"{p['platform']} device(s), mesh {mesh}",
        f"  train step: mini-batch {p['mini_batch']} rows x {p['seq_len']} tokens, {micro}, "
        f"remat {p['remat']}, scanned layers {p['scan_layers']} (compiled in {p['compile_s']:.1f}s)",
        f"  attention: {p['attention']}",
        "  per device:",
        f"    parameters (master)   {g(p['params_bytes'])}",
        f"    optimizer state       {g(p['opt_bytes'])}",
        f"    reference parameters  {g(p['ref_params_bytes'])}",
        f"    step arguments        {g(p['argument_bytes'])}  ({arguments})",
        f"    step temporaries      {g(p['temp_bytes'])}  (gradients, activations, logits chunks)",
    ] + ([f"    optimizer step        {g(p['budget_apply_bytes'])}  (its arguments + "
          "temporaries)"] if budget else []) + _format_state(p) + [
        f"    estimated peak        {g(p['peak_bytes'])}",
    ] + (_format_sampler(p) if "sampler_peak_bytes" in p else [])
        + [memory_line(plan_peak(p), device_bytes)])


def _format_state(p: dict) -> list[str]:
    """The lines of the algorithm's own model (`plan_state`), none without one."""
    if "state_label" not in p:
        return []
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    label = p["state_label"]
    return [f"    {label + ' parameters':<22}{g(p[label + '_params_bytes'])}  "
            f"({p[label + '_params'] / 1e9:.2f} B, {p['state_detail']})",
            f"    {label + ' optimizer':<22}{g(p[label + '_opt_bytes'])}",
            f"    {label + ' step peak':<22}{g(p[label + '_step_bytes'])}  "
            "(its arguments + temporaries)"]


def _format_sampler(p: dict) -> list[str]:
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    rows, prompt, new = p["sampler_shape"]
    chunk = p["sampler_prefill_chunk"]
    total = p.get("sampler_rollout_rows", rows)
    return [
        f"  sampler: {rows} prompts"
        + (f" at a time (of {total}: rollout.max_num_seqs)" if total > rows else "")
        + f" x {prompt} tokens, {new} new (batch {p['sampler_batch']} x "
        f"{p['sampler_prompt_slots']} + {p['sampler_new_slots']} slots), prefill "
        f"{p['sampler_prefill_attention']}"
        + (f" in chunks of {chunk} tokens" if chunk and chunk < p["sampler_prompt_slots"] else "")
        + (f" in {p['sampler_row_groups']} row groups" if p["sampler_row_groups"] > 1 else "")
        + f", cache {p['sampler_cache_dtype']} (compiled in {p['sampler_compile_s']:.1f}s)",
        "  per device during a rollout:",
        f"    resident from training {g(p['sampler_resident_bytes'])}  (params + opt state + reference"
        + (f" + {p['state_label']})" if "state_label" in p else ")"),
        f"    KV cache               {g(p['sampler_cache_bytes'])}",
        f"    prefill                {g(p['sampler_prefill_bytes'])}  (temporaries "
        f"{p['sampler_prefill_temp_bytes'] / GIB:.2f} + outputs {p['sampler_prefill_output_bytes'] / GIB:.2f}"
        " + inputs)",
        f"    decode                 {g(p['sampler_decode_bytes'])}  (temporaries "
        f"{p['sampler_decode_temp_bytes'] / GIB:.2f} + carry and inputs)",
        f"    sampler peak           {g(p['sampler_peak_bytes'])}",
        "  per device during `hgpo-jax eval` (the policy alone: its weights + the sampler):",
        f"    eval peak              {g(p['sampler_eval_peak_bytes'])}",
    ]


# Keys of `plan()`'s result that `plan_json` puts in its "train_step" and "sampler" sections
# (and, with an algorithm's own model, `plan_state`'s `{label}_*_bytes`).
_TRAIN_KEYS = ("params_bytes", "opt_bytes", "ref_params_bytes", "argument_bytes", "output_bytes",
               "temp_bytes", "alias_bytes", "budget_apply_bytes")
_TRAIN_FACTS = ("seq_len", "mini_batch", "micro_batch", "compile_s", "token_budget",
                "budget_micro_batch")
_STATE_KEYS = ("params_bytes", "opt_bytes", "step_bytes")


def _train_keys(p: dict) -> tuple[str, ...]:
    label = p.get("state_label")
    return _TRAIN_KEYS + (tuple(f"{label}_{k}" for k in _STATE_KEYS) if label else ())


def plan_json(p: dict, device_bytes: int | None = None) -> dict:
    """`plan()`'s result as the JSON object `hgpo-jax plan --json` prints (docs/training.md,
    "Memory plan", names every key): byte counts become GiB (`*_gib`), grouped into
    "train_step" and "sampler" (present with --sampler) sections; the rest stays at the top, with
    `memory_keys` of the plan's peak for a device of `device_bytes` (None: an 80 GB card)."""
    gib = lambda b: round(b / GIB, 4)  # noqa: E731
    train_keys = _train_keys(p)
    top = {k: v for k, v in p.items()
           if k not in train_keys and k != "peak_bytes" and not k.startswith("sampler_")
           and k not in _TRAIN_FACTS}
    train = {"seq_len": p["seq_len"], "mini_batch": p["mini_batch"],
             "micro_batch": p["micro_batch"], "token_budget": p.get("token_budget", 0),
             "compile_s": round(p["compile_s"], 2), "peak_gib": gib(p["peak_bytes"])}
    if "budget_micro_batch" in p:
        train["budget_micro_batch"] = list(p["budget_micro_batch"])
    train.update({k.replace("_bytes", "_gib"): gib(p[k]) for k in train_keys if k in p})
    out = dict(top, **memory_keys(plan_peak(p), device_bytes), train_step=train)
    if "sampler_peak_bytes" in p:
        sampler = {}
        for k, v in p.items():
            if not k.startswith("sampler_"):
                continue
            name = k[len("sampler_"):]
            if name.endswith("_bytes"):
                sampler[name.replace("_bytes", "_gib")] = gib(v)
            else:
                sampler[name] = list(v) if isinstance(v, tuple) else v
        sampler["compile_s"] = round(sampler["compile_s"], 2)
        out["sampler"] = sampler
    return out
