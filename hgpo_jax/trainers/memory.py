"""What a run's memory plan asks of its device: the share of the device JAX may take, and whether
the planned peak fits at all.

    memory_fraction(peak_bytes, device_bytes) -> float   # XLA_PYTHON_CLIENT_MEM_FRACTION to set
    fits(peak_bytes, device_bytes) -> bool               # else the run is refused before it loads
    refusal(peak_bytes, device_bytes, ...) -> str        # the one-line message of that refusal
    device_memory_bytes() -> int | None                  # the GPU's memory, read before JAX starts

JAX's GPU client takes a fixed share of each device (`XLA_PYTHON_CLIENT_MEM_FRACTION`, 0.75 by
default: 59.4 GiB of an 80 GB H100's 79.2) when its backend starts, and a program that needs more
fails there, after the weights have loaded. The decision here is pure arithmetic on the plan's
peak per device (`trainers.plan`: the train step's and the sampler's); `commands.fit` plans and
sets the variable before JAX starts. docs/training.md, "Memory plan", describes both.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping

GIB = 2**30
CARD_80GB_BYTES = int(79.2 * GIB)  # what JAX sees of an 80 GB card (H100 80GB HBM3: 79.2 GiB)
JAX_DEFAULT_FRACTION = 0.75  # JAX's own default share
# The most a run is given: the CUDA context, NCCL's buffers and the driver's allocations live
# outside XLA's pool (the 1.5B HiPER run peaked at 66.6 GiB on one H100 with 0.95).
MAX_FRACTION = 0.95
# Added to the plan's peak: what no planned program holds (the log-prob and value passes'
# outputs, host-to-device staging, the allocator's fragmentation). The plan itself errs high:
# the H100 compiled that HiPER update at 67.8 GiB, 1.2 GiB above what it used.
HEADROOM_BYTES = 1 * GIB
FRACTION_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # JAX's share of each device, read at its start
DEVICE_MEMORY_VAR = "HGPO_JAX_DEVICE_MEMORY_GIB"  # the device's memory, simulated (0: no plan)
FSDP_KNOB = "mesh.fsdp (more devices share the weights and optimizer state)"
KNOBS = {  # what lowers the peak of each planned program
    "update": ("train.micro_batch_size (fewer rows per micro-batch)",
               "train.max_tokens_per_micro_batch (a smaller token budget)", FSDP_KNOB,
               "train.remat=true (recompute activations)"),
    "sampler": ("rollout.num_groups or rollout.group_size (fewer rows per rollout batch)",
                "rollout.max_prompt_tokens (shorter prompts)", FSDP_KNOB),
}


def memory_fraction(peak_bytes: int, device_bytes: int) -> float:
    """The share of the device a run with this peak per device should have, in (0, 1]: the peak
    plus `HEADROOM_BYTES`, as a fraction of `device_bytes`, at least JAX's default (0.75: the plan
    does not compile every program a run runs, so a small plan never shrinks JAX's pool) and at
    most `MAX_FRACTION` (0.95; a peak beyond that does not `fits`)."""
    if device_bytes <= 0:
        raise ValueError(f"memory_fraction: device_bytes must be > 0, got {device_bytes}")
    need = (max(peak_bytes, 0) + HEADROOM_BYTES) / device_bytes
    return round(min(MAX_FRACTION, max(JAX_DEFAULT_FRACTION, need)), 4)


def fits(peak_bytes: int, device_bytes: int, fraction: float = MAX_FRACTION) -> bool:
    """Whether a peak per device (bytes) plus `HEADROOM_BYTES` fits `fraction` of a device of
    `device_bytes` (default: the most a run is given, `MAX_FRACTION`; a user's own
    XLA_PYTHON_CLIENT_MEM_FRACTION where set)."""
    return peak_bytes + HEADROOM_BYTES <= fraction * device_bytes


def refusal(peak_bytes: int, device_bytes: int, fraction: float = MAX_FRACTION,
            what: str = "the run", device: str = "the device", share: str = "",
            program: str = "update") -> str:
    """The one-line refusal of a run whose planned peak does not `fits` `fraction` of the
    device: the peak and the program that reaches it (`program`: "update" or "sampler"), the
    device's memory (`device`: how it was found) and the share the run may take (`share`: how it
    was set, default "at most 0.95"), and the knobs that lower that program's peak (`KNOBS`)."""
    share = share or f"at most {fraction:.2f}"
    where = "its update" if program == "update" else "the rollout's sampler"
    return (f"{what} does not fit {device}: its memory plan peaks at {peak_bytes / GIB:.1f} GiB "
            f"per device in {where} (+{HEADROOM_BYTES / GIB:.0f} GiB headroom), and the device "
            f"has {device_bytes / GIB:.1f} GiB, of which the run may take {share} "
            f"({fraction * device_bytes / GIB:.1f} GiB); lower the peak with "
            f"{', '.join(KNOBS[program])} (`hgpo-jax plan CONFIG ... --sampler` shows it), or set "
            f"{DEVICE_MEMORY_VAR}=0 to run without the plan")


def run_peak(update_bytes: int, sampler_bytes: int | None = None, kind: str = "rl",
             eval_bytes: int | None = None) -> tuple[int, str]:
    """The planned peak per device of a command of `kind` (bytes) and the program that reaches
    it ("update" or "sampler"): train ("rl"): the larger of its update's and its sampler's
    (`trainers.plan`; None: the sampler was not planned); eval: `eval_bytes`, the policy's
    weights and its sampler (`trainers.evaluator` makes nothing else), or where that was not
    planned the training sampler's, else the update's."""
    if kind == "eval" and eval_bytes is not None:
        return eval_bytes, "sampler"
    if sampler_bytes is not None and (kind == "eval" or sampler_bytes > update_bytes):
        return sampler_bytes, "sampler"
    return update_bytes, "update"


def memory_keys(peak_bytes: int, device_bytes: int | None = None) -> dict:
    """What `plan` reports of a peak per device: `memory_fraction` (the share a run would set on
    a device of `device_bytes`; None: an 80 GB card's 79.2 GiB), `device_memory_gib` (that
    device's), `fits_device` (whether it fits that device, as `train` decides; None without one)
    and `fits_80gb` (whether it fits an 80 GB card)."""
    device = device_bytes or CARD_80GB_BYTES
    return {"memory_fraction": memory_fraction(peak_bytes, device),
            "device_memory_gib": round(device / GIB, 2),
            "fits_device": fits(peak_bytes, device_bytes) if device_bytes else None,
            "fits_80gb": fits(peak_bytes, CARD_80GB_BYTES)}


def memory_line(peak_bytes: int, device_bytes: int | None = None) -> str:
    """`memory_keys` as the printed plan's line."""
    keys = memory_keys(peak_bytes, device_bytes)
    room = MAX_FRACTION * CARD_80GB_BYTES - HEADROOM_BYTES
    here = ("" if keys["fits_device"] is None else
            f"; fits this device: {'yes' if keys['fits_device'] else 'NO (train and eval refuse it)'}")
    return (f"  memory: peak {peak_bytes / GIB:.2f} GiB per device -> {FRACTION_VAR}="
            f"{keys['memory_fraction']} on a device of {keys['device_memory_gib']} GiB{here}; fits an "
            f"80 GB card: {'yes' if keys['fits_80gb'] else 'no'} (at most {room / GIB:.1f} GiB: "
            f"{MAX_FRACTION} of {CARD_80GB_BYTES / GIB:.1f}, less {HEADROOM_BYTES / GIB:.0f} GiB "
            "headroom)")


# ------------------------------------------------------------------------------- the device
def device_memory_bytes(environ: Mapping[str, str] = os.environ,
                        smi: Callable[[], str | None] | None = None) -> int | None:
    """The memory of this machine's smallest GPU in bytes, read without starting JAX:
    `HGPO_JAX_DEVICE_MEMORY_GIB` where set (a simulated device, e.g. on a CPU for tests; 0 turns
    the plan off: None), else nvidia-smi's total less what the driver reserves (what JAX sees:
    79.2 GiB of an 80 GB H100). None where JAX will not run on a GPU (JAX_PLATFORMS without cuda
    or gpu, no nvidia-smi, no GPU listed). smi: the nvidia-smi query (tests pass a stand-in)."""
    simulated = environ.get(DEVICE_MEMORY_VAR, "").strip()
    if simulated:
        try:
            gib = float(simulated)
        except ValueError:
            raise ValueError(f"{DEVICE_MEMORY_VAR}={simulated!r}: give the device's memory in GiB "
                             "(e.g. 79.2), or 0 to run without the memory plan") from None
        if gib < 0:
            raise ValueError(f"{DEVICE_MEMORY_VAR}={simulated!r}: give a memory >= 0 GiB (0: no plan)")
        return int(gib * GIB) or None
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return None
    return smallest_gpu_bytes((smi or nvidia_smi_memory)())


def smallest_gpu_bytes(table: str | None) -> int | None:
    """The smallest GPU's usable memory (bytes) of nvidia-smi's `memory.total, memory.reserved`
    CSV lines in MiB (the reserved column may be missing or "[N/A]"); None for no GPU."""
    sizes = []
    for line in (table or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        try:
            total = float(cells[0])
        except ValueError:
            continue
        reserved = float(cells[1]) if len(cells) > 1 and cells[1].replace(".", "").isdigit() else 0.0
        sizes.append(int((total - reserved) * 2**20))
    return min(sizes) if sizes else None


def nvidia_smi_memory() -> str | None:
    """nvidia-smi's `memory.total, memory.reserved` per GPU (MiB, CSV without header or units;
    total alone where the driver does not report the reserved memory), None without nvidia-smi."""
    for fields in ("memory.total,memory.reserved", "memory.total"):
        try:
            done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}",
                                   "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0:
            return done.stdout
    return None
