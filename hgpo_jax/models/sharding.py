"""Device mesh and the partition rules of every decoder parameter (all families).

One `Mesh` with axes (data, fsdp, tensor). Weights are split FSDP-style on one dimension and
tensor-parallel on heads / MLP width (docs: shared design, "Sharding"). A dimension that an axis
does not divide (say 2 KV heads on a tensor axis of 4) is replicated along that axis instead, so
every rule works on every mesh.
"""

from __future__ import annotations

import math
import os
import re

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # batch dimensions shard over these

# (regex on the dotted Flax path, spec); first match wins.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens\.embedding$", P("tensor", "fsdp")),
    (r"self_attn\.[qkv]_proj\.kernel$", P("fsdp", "tensor")),
    (r"self_attn\.[qkv]_proj\.bias$", P("tensor")),
    (r"self_attn\.o_proj\.kernel$", P("tensor", "fsdp")),
    (r"self_attn\.o_proj\.bias$", P()),
    (r"mlp\.(gate|up)_proj\.kernel$", P("fsdp", "tensor")),
    (r"mlp\.(gate|up)_proj\.bias$", P("tensor")),
    (r"mlp\.down_proj\.kernel$", P("tensor", "fsdp")),
    (r"mlp\.down_proj\.bias$", P()),
    (r"norm\.scale$", P()),  # the layers' norms, the final norm, Qwen3's per-head q_norm / k_norm
    (r"lm_head\.kernel$", P("fsdp", "tensor")),
    # the critic's value head: [D, H] and [H], replicated (under `train.` when it trains beside
    # adapters: models.lora.Adapted)
    (r"(^|\.)score\.(kernel|bias)$", P()),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes, each
    process's devices contiguous, so that each process holds a contiguous block of the batch
    axes: see hgpo_jax.distributed).

    Use -1 for at most one axis to take the remaining devices. A mesh smaller than the device
    list uses its first data*fsdp*tensor devices (e.g. a 1x1x1 mesh on an 8-GPU host).
    """
    devices = list(sorted(jax.devices(), key=lambda d: d.process_index) if devices is None
                   else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh sizes {sizes}: at most one axis may be -1")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        sizes[sizes.index(-1)] = len(devices) // max(known, 1)
    if any(s < 1 for s in sizes) or math.prod(sizes) > len(devices):
        raise ValueError(f"mesh data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]} needs "
                         f"{math.prod(sizes)} devices, but {len(devices)} are available: set "
                         f"mesh.data (or mesh.fsdp) so that data x fsdp x tensor <= {len(devices)}, "
                         "or -1 for all remaining devices (on a CPU host, more devices: "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    return Mesh(np.asarray(devices[:math.prod(sizes)]).reshape(sizes), MESH_AXES)


def request_cpu_devices(count: int | None = None) -> int:
    """Split the CPU into `count` JAX devices (default: one per core); returns the count.

    On a CPU host JAX starts one device whose ops share the cores through XLA's intra-op thread
    pool, which leaves cores idle on the many small ops of a decode loop. With one device per core
    and the params on a data-parallel mesh (`load_pretrained(path, mesh=make_mesh(data=count))`),
    `generate` (and the train step, with `mesh.data=count`) splits the batch over the cores:
    the sampler benchmark goes from ~1.8x to ~2.1-2.3x transformers' speed on a 2-core CPU
    (docs/sampling.md, "CPU hosts"). Must run before JAX's first computation (it sets `jax_num_cpu_devices`, which JAX
    reads when it starts its backends); asking for a different count later raises RuntimeError.
    No effect on GPU/TPU devices.
    """
    if count is None:
        count = os.cpu_count() or 1
    if count < 1:
        raise ValueError(f"request_cpu_devices needs a positive device count, got {count}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError as err:
        raise RuntimeError(
            f"request_cpu_devices({count}) came after JAX started its backends; call it right "
            "after `import jax`, before any array is created or any function runs (or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count} before starting Python)"
        ) from err
    return count


STACKED_LAYERS = re.compile(r"(^|\.)layers\.(?!\d+\.)")  # model.layers.mlp... (scanned layers)


def is_stacked_path(path: str) -> bool:
    """A scanned model's stacked layer weight ('model.layers.mlp.up_proj.kernel': no layer
    index after 'layers'), whose arrays carry a leading [L] axis."""
    return STACKED_LAYERS.search(path) is not None


def param_partition_spec(path: str) -> P:
    """PartitionSpec for a dotted Flax parameter path, e.g. 'model.layers.0.mlp.up_proj.kernel'.
    Stacked layer weights ('model.layers.mlp.up_proj.kernel' [L, D, I]) get the same rule behind
    an unsplit layer axis. An adapter of a linear layer (`...q_proj.lora_a` [in, r], `lora_b`
    [r, out]: models/lora.py) splits its in (A) or out (B) dimension as the layer's kernel does,
    its rank dimension never."""
    head, _, leaf = path.rpartition(".")
    if leaf in ("lora_a", "lora_b"):
        kernel = tuple(param_partition_spec(f"{head}.kernel"))
        kernel = kernel[1:] if is_stacked_path(path) else kernel
        kernel += (None,) * (2 - len(kernel))
        spec = P(kernel[0], None) if leaf == "lora_a" else P(None, kernel[1])
        return P(None, *spec) if is_stacked_path(path) else spec
    for pattern, spec in PARAM_RULES:
        if re.search(pattern, path):
            return P(None, *spec) if is_stacked_path(path) else spec
    raise KeyError(f"no partition rule for parameter {path!r}; add one to PARAM_RULES")


def fit_spec(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """Drop axes from `spec` where the mesh axis size does not divide that dimension."""
    fitted = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axis,) if isinstance(axis, str) else tuple(axis or ())
        size = math.prod(mesh.shape[a] for a in names)
        fitted.append(axis if names and dim % size == 0 else None)
    while fitted and fitted[-1] is None:  # P('fsdp', None) == P('fsdp'): keep the short form
        fitted.pop()
    return P(*fitted)


def rows_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Dim 0 (rows) of an array of `shape` over the batch axes (data, fsdp) where they divide
    it, the other dims replicated."""
    return NamedSharding(mesh, fit_spec(P(BATCH_AXES), shape, mesh))


def place_param(host, mesh: Mesh | None, path: str) -> jax.Array:
    """A host (NumPy) parameter on the device(s): into its `param_sharding` on `mesh`, or on the
    default device without one."""
    if mesh is None:
        return jax.device_put(host)
    return jax.device_put(host, param_sharding(mesh, path, host.shape))


def param_sharding(mesh: Mesh, path: str, shape: tuple[int, ...]) -> NamedSharding:
    """The NamedSharding of one parameter on `mesh`."""
    return NamedSharding(mesh, fit_spec(param_partition_spec(path), shape, mesh))


def tensor_axis_problem(num_heads: int, num_kv_heads: int, tensor: int) -> str | None:
    """Why a tensor axis of size `tensor` cannot split a model's attention heads (None: it can).

    Tensor parallelism gives each device whole query heads: `tensor` must divide the query heads.
    Key/value heads are split the same way or, where there are fewer of them than devices, each
    is repeated on tensor / kv_heads devices (then `tensor` must be a multiple of them)."""
    if tensor <= 1:
        return None
    if num_heads % tensor:
        fits = [t for t in range(2, num_heads + 1) if num_heads % t == 0
                and (num_kv_heads % t == 0 or t % num_kv_heads == 0)]
        return (f"mesh.tensor={tensor} does not divide the model's {num_heads} query heads; use "
                f"a tensor axis of {', '.join(map(str, fits[:6])) or '1'} (or 1), and put the "
                "other devices on mesh.fsdp / mesh.data")
    if num_kv_heads % tensor and tensor % num_kv_heads:
        return (f"mesh.tensor={tensor} neither divides the model's {num_kv_heads} key/value heads "
                f"nor is a multiple of them; use a tensor axis that divides {num_kv_heads} or is "
                f"a multiple of it (and divides the {num_heads} query heads)")
    return None
