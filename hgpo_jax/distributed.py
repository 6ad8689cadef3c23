"""Multi-host runs on JAX's multi-controller runtime: start-up, each process's share of the work,
global arrays from per-process rows, and host values reduced across processes.

    init_distributed(coordinator="node0:1234", num_processes=2, process_id=0)   # or auto=True
    lo, hi = process_share(num_groups)            # this process's groups [lo, hi)
    x = global_rows(mesh, local_rows_array)       # [S_local, ...] -> global [S, ...] on the mesh
    y = local_rows(x, mesh)                       # global [S, ...] -> this process's [S_local, ...]
    totals = allgather_json({"rows": 3})          # one value per process, in process order

Every process runs the same program (SPMD, one controller per host). A process contributes the
rows that its own devices hold: `make_mesh` keeps each process's devices contiguous, so process p
owns rows [p S/P, (p+1) S/P) of every batch-sharded array. With one process every
helper here is the identity (or a local computation) and runs no collective, so single-process
runs do exactly what they did before multi-host support.

Collectives are XLA's (`jax.experimental.multihost_utils.process_allgather`, jitted programs on
the global mesh); on CPU they need the gloo implementation, which `init_distributed` selects. A
process that dies is noticed by the coordination service after `heartbeat_timeout_s` (its peers
stop with an error instead of waiting forever); a collective whose peer has gone raises
`jax.errors.JaxRuntimeError` at once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class DistributedArgs:
    """How this process joins a multi-process job (the CLI's --coordinator / --num-processes /
    --process-id / --distributed). `auto`: let `jax.distributed.initialize()` read the cluster
    (SLURM, TPU pod, Open MPI, Kubernetes/GKE, or the JAX_COORDINATOR_ADDRESS etc. variables)."""

    coordinator: str | None = None  # HOST:PORT of process 0's coordination service
    num_processes: int | None = None
    process_id: int | None = None
    auto: bool = False

    @property
    def requested(self) -> bool:
        return self.auto or self.coordinator is not None or self.num_processes is not None \
            or self.process_id is not None


def detect_launcher(environ=None) -> str | None:
    """The multi-process launcher this process was started by, read from its environment, or None
    (a single process). Only launches of more than one process count, so a one-task SLURM job or a
    single-host TPU VM runs as before. With no flags, `hgpo-jax train/eval/sft` then joins the job
    as `--distributed` would (`jax.distributed.initialize()` reads the same variables).

    JAX's own variables (JAX_COORDINATOR_ADDRESS with JAX_NUM_PROCESSES > 1), SLURM (srun:
    SLURM_STEP_NUM_TASKS or SLURM_NTASKS > 1 with SLURM_PROCID), Open MPI (OMPI_COMM_WORLD_SIZE
    > 1), a multi-host Cloud TPU VM slice (TPU_WORKER_HOSTNAMES naming several hosts). A
    Kubernetes pod is not detected from its environment alone: pass --distributed there.
    """
    env = dict(os.environ if environ is None else environ)

    def more_than_one(name: str) -> bool:
        try:
            return int(env.get(name, "1")) > 1
        except ValueError:
            return False

    if env.get("JAX_COORDINATOR_ADDRESS") and more_than_one("JAX_NUM_PROCESSES"):
        return f"JAX_NUM_PROCESSES={env['JAX_NUM_PROCESSES']}"
    if "SLURM_PROCID" in env:
        for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
            if name in env:
                return f"SLURM ({name}={env[name]})" if more_than_one(name) else None
    if more_than_one("OMPI_COMM_WORLD_SIZE"):
        return f"Open MPI (OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']})"
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1:
        return f"Cloud TPU ({len(hosts)} hosts in TPU_WORKER_HOSTNAMES)"
    return None


def check_coordinator(address: str) -> tuple[str, int]:
    """(host, port) of a --coordinator HOST:PORT; ValueError naming the flag when it is not one
    (no port, a port that is not a number or outside 1..65535, no host)."""
    host, sep, port = address.strip().rpartition(":")
    example = "give HOST:PORT (e.g. 10.0.0.1:1234)"
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--coordinator {address!r}: {example}")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"--coordinator {address!r}: port {int(port)} is outside 1..65535; {example}")
    return host, int(port)


def init_distributed(args: DistributedArgs, *, heartbeat_timeout_s: int = 100,
                     init_timeout_s: int = 300) -> bool:
    """Join the job described by `args` (no-op when nothing was requested); returns whether
    `jax.distributed` was initialized. Must run before JAX's first computation.

    heartbeat_timeout_s: a process silent for that long counts as dead, and the job stops with an
    error on every other process. init_timeout_s: how long to wait for all processes to connect.
    """
    if not args.requested:
        return False
    explicit = (args.coordinator, args.num_processes, args.process_id)
    if not args.auto and None in explicit:
        raise ValueError("a multi-process run needs all of --coordinator HOST:PORT, "
                         "--num-processes N and --process-id I (got "
                         f"coordinator={args.coordinator}, num_processes={args.num_processes}, "
                         f"process_id={args.process_id}); or pass --distributed alone to let "
                         "jax.distributed.initialize() detect the cluster")
    if args.num_processes is not None and args.num_processes < 1:
        raise ValueError(f"--num-processes must be >= 1, got {args.num_processes}")
    if args.process_id is not None and args.num_processes is not None \
            and not 0 <= args.process_id < args.num_processes:
        raise ValueError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}")
    if args.coordinator is not None:
        check_coordinator(args.coordinator)  # JAX's own parse fails with an IndexError
    # CPU collectives across processes (XLA's default CPU client has none); harmless on GPU/TPU
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                               initialization_timeout=init_timeout_s,
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
    return True


def is_main() -> bool:
    """Process 0: the one that writes metrics, progress and run-folder files."""
    return jax.process_index() == 0


def process_share(n: int, what: str = "items") -> tuple[int, int]:
    """This process's contiguous share [lo, hi) of n items split evenly over the processes.
    Raises ValueError when the process count does not divide n."""
    count, index = jax.process_count(), jax.process_index()
    if n % count:
        raise ValueError(f"{what}={n} cannot be split evenly over {count} processes (each process "
                         f"runs whole groups of envs); make it a multiple of {count}")
    per = n // count
    return index * per, (index + 1) * per


def check_rows_local(mesh) -> None:
    """Every shard of a batch-sharded array must live on one process only (each process feeds its
    own rows). Raises ValueError when a row shard spans processes (a tensor axis wider than a
    host)."""
    from hgpo_jax.models.sharding import BATCH_AXES

    if jax.process_count() == 1:
        return
    order = [a for a in mesh.axis_names if a in BATCH_AXES] + \
            [a for a in mesh.axis_names if a not in BATCH_AXES]
    devs = np.transpose(mesh.devices, [mesh.axis_names.index(a) for a in order])
    rows = devs.reshape(math.prod(mesh.shape[a] for a in BATCH_AXES), -1)
    for shard in rows:
        if len({d.process_index for d in shard}) > 1:
            raise ValueError(
                f"mesh {dict(mesh.shape)}: a shard of the batch spans devices of several processes "
                f"({jax.local_device_count()} devices per process); make mesh.tensor a divisor of "
                "the devices per process so that each process holds whole rows")
    owners = [rows[i, 0].process_index for i in range(rows.shape[0])]
    if owners != sorted(owners):
        raise ValueError(f"mesh {dict(mesh.shape)}: the processes' devices are not contiguous along "
                         "the batch axes; build the mesh with hgpo_jax.models.make_mesh")


# --------------------------------------------------------------------------- global arrays
def global_rows(x: np.ndarray, sharding) -> jax.Array | np.ndarray:
    """This process's rows x [S_local, ...] -> the global array [S_local * P, ...] with
    `sharding` (rows over the batch axes); every process passes the same S_local. One process:
    x unchanged (the jitted function places it)."""
    if jax.process_count() == 1:
        return x
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))


def global_tree(tree, shardings):
    """`global_rows` over a dict/pytree of host arrays with matching shardings."""
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(global_rows, tree, shardings)


def local_rows(x, mesh) -> np.ndarray:
    """A global array [S, ...] on `mesh` -> this process's rows [S / P, ...] as NumPy: the rows
    it fed with `global_rows` (the whole array with one process). An array laid out otherwise
    (replicated, split on another dim) is first resharded to rows over the batch axes, a
    collective that every process runs at once."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(x)
    from hgpo_jax.models.sharding import rows_sharding

    target = rows_sharding(mesh, x.shape)
    if not x.sharding.is_equivalent_to(target, x.ndim):
        x = jax.jit(lambda a: a, out_shardings=target)(x)
    shards = {}
    for s in x.addressable_shards:
        shards.setdefault(s.index[0].start or 0, s.data)
    return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)], axis=0)


def to_host(x) -> np.ndarray:
    """Any array -> the whole of it as NumPy on every process (an allgather when it spans
    processes)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


# --------------------------------------------------------------------------- host reductions
def allgather_json(value) -> list:
    """Each process's JSON-able `value`, as a list in process order (every process gets all).
    One process: [value], no collective."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int64(data.size))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, sizes)]


def max_over_processes(*values: int) -> tuple[int, ...]:
    """The elementwise maximum of small integers over the processes (one process: the values)."""
    if jax.process_count() == 1:
        return tuple(int(v) for v in values)
    from jax.experimental import multihost_utils

    got = np.asarray(multihost_utils.process_allgather(np.asarray(values, np.int64)))
    return tuple(int(v) for v in got.reshape(-1, len(values)).max(axis=0))


def any_process(flag: bool) -> bool:
    """True when `flag` is true on any process (one process: `flag`)."""
    return bool(max_over_processes(int(bool(flag)))[0])


def barrier(name: str) -> None:
    """Wait until every process gets here (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
