"""Per-program XLA compiler options, chosen by the platform the program runs on.

XLA:CPU (jaxlib 0.10) hands dot-centred subgraphs to YNNPACK ("ynn fusions") by default. For a
compute-bound prefill that is slower than XLA's own dot and loop emitters: 16 x 256 tokens
through the tiny benchmark Qwen2 take ~320 ms with it and ~255 ms without it on a 2-core CPU;
for the decode loop's batch-16 products it is faster (`docs/sampling.md`). The options are passed
to `Lowered.compile(compiler_options=...)` of the programs this package compiles, so they affect
nothing else in the process (no XLA_FLAGS). GPU and TPU programs get no options.

`plan_compiler_options` is for memory planning (`hgpo-jax plan`): XLA:CPU's default scheduler
orders work for concurrency and runs the recomputation of rematerialized layers early, so the
peak it reports ignores `jax.checkpoint` (a 6-layer attention stack: 0.54 GiB of temporaries with
or without remat). Its memory-optimized scheduler keeps the recomputation next to its use, as the
memory-aware GPU/TPU schedulers do (the same stack: 0.44 GiB without remat, 0.12 GiB with it).
"""

from __future__ import annotations

import jax

NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}  # "" = no YNNPACK fusions
# per workload: compute-bound programs (a prefill) run faster without YNNPACK fusions; the
# decode loop's small per-token products faster with them (3.2 vs 4.4 ms per step, bench shapes)
CPU_OPTIONS = {"prefill": NO_YNN, "decode": {}}
CPU_PLAN_OPTIONS = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


def platform_of(mesh=None, tree=None) -> str:
    """The platform ('cpu', 'gpu', 'tpu', ...) of `mesh`'s devices, else of the first array in
    `tree`, else jax's default backend."""
    if mesh is not None:
        return mesh.devices.flat[0].platform
    for leaf in jax.tree.leaves(tree):
        devices = getattr(leaf, "devices", None)
        if callable(devices):
            return next(iter(devices())).platform
    return jax.default_backend()


def compiler_options(mesh=None, tree=None, workload: str = "prefill") -> dict:
    """Options for `Lowered.compile` of a `workload` ('prefill' or 'decode') program on `mesh`
    (or on the devices of `tree`)."""
    if workload not in CPU_OPTIONS:
        raise ValueError(f"unknown workload {workload!r}; use one of {sorted(CPU_OPTIONS)}")
    return dict(CPU_OPTIONS[workload]) if platform_of(mesh, tree) == "cpu" else {}


def plan_compiler_options(mesh=None, tree=None) -> dict:
    """Options for compiling a program only to read its memory analysis (see the module doc)."""
    if platform_of(mesh, tree) != "cpu":
        return {}
    return {**NO_YNN, **CPU_PLAN_OPTIONS}
