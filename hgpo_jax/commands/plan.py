"""`hgpo-jax plan CONFIG [key=value ...]`: the train step compiled ahead of time for the config's
mesh, on virtual CPU devices, and its memory per device, with the memory fraction a run would
set (`trainers.memory`) on the GPU here or, without one, on an 80 GB card."""

from __future__ import annotations

import json
import os


def cmd_plan(args) -> int:
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.memory import device_memory_bytes
    from hgpo_jax.trainers.plan import devices_needed, format_plan, plan, plan_json

    cfg = load_config(args.config, args.overrides)
    use_plan_xla_flags(devices_needed(cfg))
    device = device_memory_bytes()  # the GPU here (None: none; the plan reports an 80 GB card's)
    result = plan(cfg, target=args.target, sampler=args.sampler)
    print(json.dumps(plan_json(result, device)) if args.json else format_plan(result, device))
    return 0


def use_plan_xla_flags(devices: int) -> None:
    """XLA_FLAGS for a plan, set before JAX starts its backends (unless they already ask for a
    device count): `devices` virtual CPU devices for the mesh, and no LLVM optimization (a plan
    never runs the code, and buffer sizes are fixed before code generation: same numbers, a
    faster compile)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags += (f" --xla_force_host_platform_device_count={devices}"
                  " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
        os.environ["XLA_FLAGS"] = flags.strip()
