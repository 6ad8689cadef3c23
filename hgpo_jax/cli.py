"""The `hgpo-jax` command line.

    hgpo-jax train CONFIG|RUN_DIR [key=value ...] [--resume [--allow-change]]
        Train (CONFIG: a name from hgpo_jax/configs, or a YAML path). Metrics go to
        RUN_DIR/metrics.jsonl and RUN_DIR/tb, checkpoints to RUN_DIR/checkpoints; `train RUN_DIR
        --resume` goes on with a run where its folder lies (docs/training.md, "Run folders").
    hgpo-jax eval CONFIG|RUN_DIR [key=value ...] [--split S] [--games N] [--json] [--episodes PATH]
        Success rate (overall and per task type) under eval.protocol at eval.temperature; a
        RUN_DIR evaluates its latest checkpoint (RL or supervised) and records the evaluation in
        RUN_DIR/eval/, never in the run's own record; a CONFIG evaluates its model.path.
    hgpo-jax sft CONFIG [key=value ...] [--resume]
        Supervised warm start (the `sft:` section) on expert episodes, random episodes (the
        reply format only) or a JSONL of {"prompt", "response"} turns; an RL run starts from it
        with model.path=RUN_DIR.
    hgpo-jax export RUN_DIR OUT_DIR [--overwrite] [--critic | --adapter]
        The latest checkpoint's policy (RL or supervised run) as a Hugging Face folder, into a new
        or empty folder outside any run (--overwrite: replace an earlier export); a LoRA run's
        merged, or its adapters alone as a PEFT folder (--adapter).
    hgpo-jax plan CONFIG [key=value ...]
        Compile the train step ahead of time for the config's mesh and print memory per device.
    hgpo-jax configs [PATTERN]
        The configs shipped with the package (their names are what CONFIG takes).
    hgpo-jax demo [--model DIR|RUN_DIR] [--prompt TEXT] [--max-new-tokens N] [--temperature T]
        Build (or load) a checkpoint (a HF folder of any supported family or a run's latest
        policy), decode a reply
        to a chat prompt with the batched sampler (`hgpo_jax.rl.sampling.generate`; temperature 0,
        greedy, by default), and print it with timings. Without --model a tiny random Qwen2 is
        built locally.
    hgpo-jax demo --model RUN_DIR --episode [--task INDEX] [--split S] [--temperature T]
                  [--max-steps N] [--seed N]
        Watch a run's latest policy play one episode of its env (task INDEX of split S: default
        0 of the env's first evaluation split) with its agent, as its rollouts play: each turn's
        observation, raw reply and parse (the action sent, valid; a plan-execute agent's switch
        and sub-goal), then the reward total, won and the agent's totals (SWITCH turns,
        segments).

train, eval and sft also run as one job of several processes (one per host, each started with the
same command; docs/multihost.md): --coordinator HOST:PORT --num-processes N --process-id I, or
--distributed alone where jax.distributed.initialize() finds the cluster itself (SLURM, TPU pods,
Open MPI, Kubernetes). Process 0 prints and writes the metrics.

Every failure is one line (what was wrong, how to fix it) and exit code 2; --debug shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys

from hgpo_jax.commands.demo import DEMO_NEW_TOKENS, cmd_demo
from hgpo_jax.commands.eval import cmd_eval
from hgpo_jax.commands.export import cmd_export
from hgpo_jax.commands.plan import cmd_plan
from hgpo_jax.commands.sft import cmd_sft
from hgpo_jax.commands.train import cmd_train


def _add_dist_flags(p) -> None:
    """The multi-process flags of train, eval and sft (docs/multihost.md)."""
    g = p.add_argument_group("multi-process (one process per host; docs/multihost.md)")
    g.add_argument("--coordinator", metavar="HOST:PORT",
                   help="address of process 0's coordination service (same on every process)")
    g.add_argument("--num-processes", type=int, metavar="N", help="processes in the job")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0..N-1")
    g.add_argument("--distributed", action="store_true",
                   help="let jax.distributed.initialize() detect the cluster (SLURM, TPU, Open "
                        "MPI, Kubernetes); the flags above, where given, take precedence. "
                        "Without any flag a launch of several processes by srun, mpirun, "
                        "a multi-host TPU VM or JAX_NUM_PROCESSES>1 is joined the same way")
    g.add_argument("--single-process", action="store_true",
                   help="run alone even under a multi-process launcher (no auto-detection)")


def _add_run_command(sub, name: str, help: str, example: str, func) -> None:
    """A command that starts or resumes a run from a config (train, sft)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("config", help="config name (hgpo_jax/configs) or YAML path")
    p.add_argument("overrides", nargs="*", help=f"key=value overrides, e.g. {example}")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in train.run_dir (or the run folder given as CONFIG) "
                        "from its latest checkpoint")
    p.add_argument("--allow-change", action="store_true",
                   help="with --resume: let the overrides change what the run is (estimator and "
                        "its options, optimizer, model, env, rollouts, data); the change is "
                        "recorded in RUN_DIR/config_changes.jsonl from the restored step on")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_dist_flags(p)
    p.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hgpo-jax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_command(sub, "train", "train a policy", "algo.K=4", cmd_train)
    ev = sub.add_parser("eval", help="success rate of a config's model or a run's checkpoint")
    ev.add_argument("config", help="config name, YAML path or run folder")
    ev.add_argument("overrides", nargs="*")
    ev.add_argument("--split", help="one split instead of the config's eval.splits")
    ev.add_argument("--games", type=int, default=0,
                    help="each-once protocol: games per split (0: eval.games)")
    ev.add_argument("--json", action="store_true",
                    help="also print {split: {score, success, episodes, ...}} as the last line")
    ev.add_argument("--episodes", metavar="PATH",
                    help="each-once protocol: also write every episode (split, index, task, task_type, "
                         "won, score, length, ended) to PATH as JSON lines, for paired comparisons")
    ev.add_argument("--no-progress", action="store_true")
    _add_dist_flags(ev)
    ev.set_defaults(func=cmd_eval)
    _add_run_command(sub, "sft", "supervised warm start on expert episodes or a JSONL", "sft.steps=100",
                     cmd_sft)
    ex = sub.add_parser("export", help="export a run's policy as a Hugging Face folder")
    ex.add_argument("run_dir", help="the run folder")
    ex.add_argument("out_dir", help="a new or empty folder, never one inside a run")
    ex.add_argument("--overwrite", action="store_true",
                    help="replace an earlier export in OUT_DIR (a folder holding only what "
                         "hgpo-jax export wrote, listed in its hgpo_jax_export.json)")
    ex.add_argument("--no-progress", action="store_true")
    ex.add_argument("--critic", action="store_true",
                    help="export a ppo or hiper run's critic (the family's transformers "
                         "...ForTokenClassification, e.g. Qwen2ForTokenClassification)")
    ex.add_argument("--adapter", action="store_true",
                    help="a LoRA run's adapters alone, as a PEFT folder (adapter_config.json + "
                         "adapter_model.safetensors) that peft.PeftModel.from_pretrained loads")
    ex.set_defaults(func=cmd_export)
    pl = sub.add_parser("plan", help="compile the train step and print memory per device")
    pl.add_argument("config")
    pl.add_argument("overrides", nargs="*")
    pl.add_argument("--target", choices=("gpu", "tpu", "cpu"), default="gpu",
                    help="the platform the run is for: it decides the attention path "
                         "(model.attention=auto: cuDNN flash on gpu) (default: gpu)")
    pl.add_argument("--sampler", action="store_true",
                    help="also compile the rollout's sampler (prefill and decode) and report its "
                         "memory per device during a rollout")
    pl.add_argument("--json", action="store_true",
                    help="print the plan as one JSON object (the last line of stdout; keys in "
                         "docs/training.md)")
    pl.set_defaults(func=cmd_plan)
    demo = sub.add_parser("demo", help="decode a reply to a prompt, or watch a run's policy "
                                       "play one episode (--episode)")
    demo.add_argument("--model", help="HF model folder or run folder (default: build a tiny "
                                      "random one); with --episode, a run folder")
    demo.add_argument("--prompt", help="the chat prompt (default: an ALFWorld-like request)")
    demo.add_argument("--max-new-tokens", type=int,
                      help=f"tokens per reply (default: {DEMO_NEW_TOKENS}; with --episode the "
                           "run's rollout.max_new_tokens)")
    demo.add_argument("--temperature", type=float, default=0.0,
                      help="sampling temperature (default 0: greedy)")
    demo.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    demo.add_argument("--dtype", choices=["float32", "bfloat16"],
                      help="weights' dtype (default: float32; with --episode the run's "
                           "model.dtype)")
    ep = demo.add_argument_group("episode (--episode)")
    ep.add_argument("--episode", action="store_true",
                    help="play one episode of the run's env with its agent, turn by turn")
    ep.add_argument("--task", type=int, metavar="INDEX",
                    help="the task's index in the split (default 0)")
    ep.add_argument("--split", help="the env's split (default: its first evaluation split)")
    ep.add_argument("--max-steps", type=int, metavar="N",
                    help="step limit (default: the run's env.max_steps)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_demo)
    cf = sub.add_parser("configs", help="list the configs shipped with the package (train, eval, "
                                        "sft and plan take their names)")
    cf.add_argument("pattern", nargs="?", default="", help="only names containing this")
    cf.set_defaults(func=cmd_configs)
    for command in sub.choices.values():
        command.add_argument("--debug", action="store_true",
                             help="on an error, show the whole traceback (not one line)")
    return parser


def cmd_configs(args) -> int:
    """The shipped configs' names (package data: hgpo_jax/configs), one per line, with their
    first comment line."""
    from hgpo_jax.config import CONFIG_DIR, available_configs

    names = [n for n in available_configs() if args.pattern in n]
    if not names:
        raise ValueError(f"no shipped config name contains {args.pattern!r}; "
                         "`hgpo-jax configs` lists them all")
    width = max(map(len, names))
    for name in names:
        with open(os.path.join(CONFIG_DIR, f"{name}.yaml"), encoding="utf-8") as f:
            first = next((line[1:].strip() for line in f if line.startswith("#")), "")
        print(f"{name:<{width}}  {first[:100]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also follow the flags (`train tiny_cpu --resume algo.K=4`)
    stray = [a for a in extra if "=" not in a or a.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        return args.func(args)
    except Exception as e:
        if getattr(args, "multi_process", False):
            stop_process(args.command, e)
        if args.debug:
            raise
        print(f"hgpo-jax {args.command}: error: {error_line(e)}", file=sys.stderr)
        return 2


USER_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
               PermissionError, ValueError)


def error_line(error: Exception) -> str:
    """An error as the one line the CLI prints: its message (a list of problems joined with
    '; '), prefixed by its type and followed by the --debug hint where it is no user error (one
    the checks did not foresee)."""
    from hgpo_jax.checkpoint import CheckpointError

    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] + (" " + "; ".join(lines[1:]) if len(lines) > 1 else "") if lines else ""
    if isinstance(error, (*USER_ERRORS, CheckpointError)):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text} (run it again with --debug for the traceback)"


COLLECTIVE_FAILURES = ("Gloo", "NCCL", "heartbeat", "Connection closed", "Connection reset",
                       "UNAVAILABLE", "DEADLINE_EXCEEDED")  # in the errors of a failed collective


def is_collective_failure(error: Exception) -> bool:
    """Whether an exception of a multi-process run comes from a collective that could not complete
    (a peer died, was killed or lost its link); JAX raises these as JaxRuntimeError or, from some
    host-side paths, as ValueError with the runtime's message."""
    import jax

    return isinstance(error, jax.errors.JaxRuntimeError) or any(
        s in str(error) for s in COLLECTIVE_FAILURES)


def stop_process(command: str, error: Exception) -> None:
    """End this process of a multi-process run at once after an error: say what went wrong (a
    failed collective: most likely another process died) and exit with status 1 (2 for a user
    error), skipping JAX's shutdown barrier, which would wait for a dead peer until the heartbeat
    time-out. The other processes then fail their next collective and stop the same way."""
    import traceback

    import jax

    where = f"hgpo-jax {command}: error: process {jax.process_index()} of {jax.process_count()}"
    if is_collective_failure(error):
        print(f"{where}: a collective with the other processes failed, most likely because another "
              f"process died or was killed (see its log); stopping.\n  {type(error).__name__}: "
              f"{str(error)[:500]}", file=sys.stderr, flush=True)
        status = 1
    elif isinstance(error, USER_ERRORS):
        print(f"{where}: {error}", file=sys.stderr, flush=True)
        status = 2
    else:
        traceback.print_exc()
        print(f"{where}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        status = 1
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
