"""The memory plan of a command that runs on a GPU (train, eval), before JAX starts: the share of
each device JAX takes (`XLA_PYTHON_CLIENT_MEM_FRACTION`) from the plan's peak, or a refusal
before the weights load where the peak exceeds what the device can give (`trainers.memory`).

JAX reads the fraction when its GPU backend starts, and `plan` must compile, which needs a
backend: so the plan runs in a child process, `hgpo-jax plan CONFIG ... --sampler --json` on
JAX's CPU backend (virtual CPU devices for the config's mesh, as `plan` always does off the
mesh's accelerators), and this process sets the variable from its answer before anything here
starts JAX. It costs the child's compile: seconds for small models, about a minute for a 1.5B
config on 2 CPU cores (docs/training.md, "Memory plan").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

PLAN_TIMEOUT_S = 1800  # a 7B plan compiles for minutes on a few cores


def fit_device(args, kind: str, say=print) -> None:
    """Plan `args.config` with `args.overrides` for a command of `kind` ("rl": train, "eval") on
    this machine's GPU (`trainers.memory.device_memory_bytes`: none, nothing is planned, set or
    refused) and set XLA_PYTHON_CLIENT_MEM_FRACTION from its peak, unless the user set it (then
    theirs is kept, and the plan checked against it). Raises ValueError (one line: the peak, the
    device's memory, the knobs) when the peak does not fit. Before JAX's backends start."""
    from hgpo_jax.trainers.memory import (DEVICE_MEMORY_VAR, FRACTION_VAR, GIB, MAX_FRACTION,
                                          device_memory_bytes, fits, memory_fraction, refusal,
                                          run_peak)

    device = device_memory_bytes()
    if device is None:
        return
    user = os.environ.get(FRACTION_VAR)
    fraction = user_fraction(user) if user else MAX_FRACTION  # a bad value: refused before the plan
    t0 = time.perf_counter()
    plan = child_plan(args.config, args.overrides)
    sampler = plan.get("sampler", {}).get("peak_gib")
    evaluation = plan.get("sampler", {}).get("eval_peak_gib")
    peak, program = run_peak(int(plan["train_step"]["peak_gib"] * GIB),
                             None if sampler is None else int(sampler * GIB), kind,
                             None if evaluation is None else int(evaluation * GIB))
    source = f" ({DEVICE_MEMORY_VAR})" if os.environ.get(DEVICE_MEMORY_VAR, "").strip() else ""
    if not fits(peak, device, fraction):
        raise ValueError(refusal(peak, device, fraction, what=args.config,
                                 device=f"the device{source}",
                                 share=f"{FRACTION_VAR}={user}" if user else "", program=program))
    if not user:
        os.environ[FRACTION_VAR] = str(memory_fraction(peak, device))
    say(f"memory plan: peak {peak / GIB:.2f} GiB per device of {device / GIB:.4g} GiB{source} -> "
        f"{FRACTION_VAR}={os.environ[FRACTION_VAR]}{' (yours)' if user else ''} (planned on the "
        f"CPU in {time.perf_counter() - t0:.0f} s)", flush=True)


def user_fraction(value: str) -> float:
    """The user's XLA_PYTHON_CLIENT_MEM_FRACTION as a number in (0, 1] (a share of the device:
    above 1, JAX would ask for more than the device has, and the plan's check would be moot)."""
    try:
        fraction = float(value)
    except ValueError:
        fraction = 0.0
    if not 0 < fraction <= 1:
        raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={value!r}: give the share of each GPU "
                         "JAX may take, a number in (0, 1] (e.g. 0.9), or unset it to have it set "
                         "from the memory plan")
    return fraction


def child_plan(config: str, overrides) -> dict:
    """`hgpo-jax plan CONFIG OVERRIDES --sampler --json` in a child process on JAX's CPU backend:
    its JSON object (docs/training.md, "Memory plan"). Raises ValueError with the child's error
    line when it fails."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "hgpo_jax.cli", "plan", config, *overrides, "--sampler",
               "--json"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=PLAN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ValueError(f"the memory plan of {config} took over {PLAN_TIMEOUT_S} s; set "
                         "HGPO_JAX_DEVICE_MEMORY_GIB=0 to run without it") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
        why = errors[-1] if errors else f"exit code {done.returncode}"
        raise ValueError(f"the memory plan of {config} failed ({why}); fix what it says, or set "
                         "HGPO_JAX_DEVICE_MEMORY_GIB=0 to run without it")
    return json.loads(lines[-1])
