"""One toy rollout of the tiny model, sampled at temperature 1, for tests/test_multihost.py.

    python tests/multihost_rollout.py OUT.json                                   # one process
    python tests/multihost_rollout.py OUT.json --coordinator localhost:PORT --num-processes 2 --process-id I

2 tasks x 3 rollouts, at most 4 steps, on a data-parallel mesh over every device; each process
plays its contiguous share of the tasks (as the trainer does) with the same rng. Process 0
writes every step's row, keyed by the env's global index and the step, with the sampled tokens
and their log-probs, so a 1-process and a 2-process run can be compared row by row.
"""

import json
import sys

import multihost_common  # tests/, the script's folder

TASKS, GROUP, STEPS = 2, 3, 4  # 3 envs per process: its rows sit at 4..6 of the 8-row batch, not 3..5


def main(argv=None) -> int:
    args = multihost_common.init(argv)
    from hgpo_jax import distributed as dist
    import jax

    from hgpo_jax.config import load_config
    from hgpo_jax.envs.pool import EnvPool
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.models import make_mesh
    from hgpo_jax.rl.policy import Policy
    from hgpo_jax.rl.rollout import collect_rollouts
    from hgpo_jax.runs import load_model

    cfg = load_config("tiny_cpu_toy")
    spec = get_env("toy")
    model, tokenizer, _ = load_model("tiny", "float32", "float32", make_mesh(-1, 1, 1))
    policy = Policy(model, tokenizer, temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens,
                    max_prompt_tokens=cfg.rollout.max_prompt_tokens)
    tasks = list(spec.list_tasks(cfg.env, "train"))[:TASKS]
    lo, hi = dist.process_share(TASKS, "tasks")
    with EnvPool(spec.make_env(cfg.env), num_envs=(hi - lo) * GROUP, num_workers=1) as pool:
        batch = collect_rollouts(policy, pool, tasks[lo:hi], GROUP, STEPS, cfg.env.memory_len,
                                 rng=jax.random.PRNGKey(5), spec=spec)
    first = lo * GROUP  # global index of this process's env 0
    rows = [[first + int(traj), int(step), list(map(int, toks)), [float(x) for x in logp]]
            for traj, step, toks, logp in zip(batch.traj_id, batch.step_id, batch.response_ids,
                                              batch.sample_logp)]
    everything = sorted(r for part in dist.allgather_json(rows) for r in part)
    if jax.process_index() == 0:
        with open(args.out, "w") as f:
            json.dump(everything, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
