"""The XLA flags of the test session, and the environment of the Python processes tests start.

Compiling dominates the suite's time (tiny models run in milliseconds, their programs take
tenths of a second to compile), so every process of the session compiles with XLA:CPU's cheapest
code generation (docs/testing.md, "Where the time goes"): no backend optimization passes and no
expensive LLVM passes, the older elemental emitters instead of the MLIR fusion emitters (half
the compile time of a model test file), and each program's LLVM module compiled whole instead of
split for parallel code generation (the programs are small). The numbers a program computes are
the same up to float rounding, within every test's tolerance.
"""

from __future__ import annotations

import os

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
                 "--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")


def xla_flags(devices: int | None, flags: str = "", fast_compile: bool = True) -> str:
    """`flags` (an XLA_FLAGS value) with the session's compile flags it lacks (fast_compile=False:
    without them, XLA's optimized code) and `devices` CPU devices (None: no device-count flag,
    JAX's single CPU device)."""
    kept = [f for f in flags.split() if not f.startswith(DEVICE_COUNT_FLAG)]
    names = {f.split("=")[0] for f in COMPILE_FLAGS}
    if fast_compile:
        kept += [f for f in COMPILE_FLAGS if f.split("=")[0] not in {k.split("=")[0] for k in kept}]
    else:
        kept = [f for f in kept if f.split("=")[0] not in names]
    if devices is not None:
        kept.insert(0, f"{DEVICE_COUNT_FLAG}={devices}")
    return " ".join(kept)


def child_env(devices: int | None = None, fast_compile: bool = True, **extra: str) -> dict:
    """This process's environment for a child Python: the session's compile flags (fast_compile=
    False: none, for a child that runs more than it compiles) and compilation cache, `devices`
    CPU devices (None: one), and `extra` variables."""
    env = dict(os.environ, **extra)
    env["XLA_FLAGS"] = xla_flags(devices, env.get("XLA_FLAGS", ""), fast_compile)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
