"""Command line shared by the multi-process test scripts (tests/multihost_*.py).

    python tests/multihost_SCRIPT.py OUT                                    # one process
    python tests/multihost_SCRIPT.py OUT --coordinator HOST:PORT --num-processes N --process-id I

`init(argv)` parses that line and joins the run (jax.distributed) before JAX is used; with no
`--coordinator` it stays a single process.
"""

import argparse


def init(argv=None) -> argparse.Namespace:
    """Parse `OUT [--coordinator --num-processes --process-id]` and initialize jax.distributed."""
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--coordinator")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    args = p.parse_args(argv)

    from hgpo_jax import distributed as dist

    dist.init_distributed(dist.DistributedArgs(args.coordinator, args.num_processes, args.process_id),
                          heartbeat_timeout_s=20, init_timeout_s=60)
    return args
