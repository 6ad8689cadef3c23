"""What several commands share: the config a command runs (`command_config`: a config name,
YAML path or run folder, with the overrides), joining the multi-process job the command line asks
for (`start_distributed`), the start of a run (`start_run`: train and sft; train's memory plan,
`commands.fit`, first), printing on process 0 only (`printer`), progress bars only on a terminal
(`show_progress`), and the config as printed at start-up (`format_config`)."""

from __future__ import annotations

import sys
from typing import Any

from hgpo_jax.algo_specs import algorithm_names
from hgpo_jax.config import (SECTIONS, SECTIONS_OF_ALGORITHMS, Config, is_run_folder, load_config,
                             parse_override)
from hgpo_jax.config_checks import section_values
from hgpo_jax.guidance_specs import guidance_spec


def show_progress(args) -> bool:
    """Redrawn progress bars only on a terminal: with stderr redirected (CI, `make run > log`)
    runs print one line per iteration or step instead of tqdm's carriage-return frames."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def start_distributed(args, cfg) -> bool:
    """Join the multi-process job the command line asks for (--coordinator/--num-processes/
    --process-id, or --distributed), with the config's time-outs; returns whether this is
    process 0 (the one that prints). Before anything starts JAX's backends."""
    from hgpo_jax.distributed import DistributedArgs, detect_launcher, init_distributed

    dist_args = DistributedArgs(args.coordinator, args.num_processes, args.process_id,
                                args.distributed)
    launcher = (None if dist_args.requested or getattr(args, "single_process", False)
                else detect_launcher())
    if launcher:  # started by a multi-process launcher with no flags: join its job
        dist_args = DistributedArgs(auto=True)
    args.multi_process = init_distributed(dist_args, heartbeat_timeout_s=cfg.dist.heartbeat_timeout_s,
                                          init_timeout_s=cfg.dist.init_timeout_s)
    if not args.multi_process:
        return True
    import jax

    if jax.process_index() == 0:
        print(f"{jax.process_count()} processes, {jax.device_count()} devices "
              f"({jax.local_device_count()} per process, {jax.devices()[0].platform})"
              + (f"; launcher detected: {launcher}" if launcher else ""), flush=True)
    return jax.process_index() == 0


def printer(main: bool):
    """print on process 0, nothing elsewhere."""
    return print if main else (lambda *a, **k: None)


def command_config(args):
    """The config of train, sft and eval: for a run folder (CONFIG names one) its recorded config
    (with what its resumes changed), the folder where it lies, then the overrides; else the config
    name or YAML path with the overrides."""
    if is_run_folder(args.config):
        moved = [o for o in args.overrides if parse_override(o)[0] == "train.run_dir"]
        if moved:
            raise ValueError(f"{args.config} is a run folder: it is used where it lies; drop "
                             f"{moved[0]} (to start a new run from it: train CONFIG "
                             f"model.path={args.config})")
    return load_config(args.config, args.overrides)


def start_run(args, kind: str):
    """The start of a command that trains (train: kind "rl", sft: kind "sft"): its config
    (`command_config`) and its inputs checked (`trainers.checks.check_inputs`: the model folder,
    data, run folder); for "rl" on a GPU, the memory fraction set from its plan or the run refused
    (`commands.fit.fit_device`, before JAX starts); the multi-process job joined, the backend's
    checks passed (`trainers.checks.check_backend`) and the config printed; returns (cfg, say),
    say printing on process 0 only."""
    import jax

    from hgpo_jax.commands.fit import fit_device
    from hgpo_jax.trainers.checks import check_backend, check_inputs

    cfg = command_config(args)
    check_inputs(cfg, kind=kind, run_dir=cfg.run_path())  # before the plan: a typo fails at once
    if kind == "rl":  # the memory plan is the RL step's
        fit_device(args, kind, say=printer(not getattr(args, "process_id", None)))
    say = printer(start_distributed(args, cfg))
    check_backend(cfg, jax.default_backend())
    say(format_config(cfg), flush=True)
    return cfg, say


def format_config(cfg: Config) -> str:
    """Compact multi-line summary for printing at start-up: the name, run folder and agent, then
    one line per section, and one for the env's own options (`env.<env.name>`, if it has any)."""
    lines = [f"config {cfg.name}  (run dir {cfg.run_path()}, agent {cfg.agent.name})"]
    width = max(map(len, SECTIONS))
    for section in SECTIONS:
        if section in SECTIONS_OF_ALGORITHMS and section not in algo_sections(cfg):
            continue  # e.g. only a run with a critic shows the critic section
        if section == "guidance" and cfg.guidance.kind == "none":
            continue  # only a guided run shows its kind's options
        if section == "agent":
            continue  # one key, in the title
        values = section_values(getattr(cfg, section))  # and env.<env.name>'s own options
        if section == "guidance":
            values = {k: values[k] for k in ("kind", *guidance_spec(cfg.guidance.kind).reads())}
        groups = {f"{section}.{k}": values.pop(k) for k, v in list(values.items())
                  if isinstance(v, dict)}
        for name, group in {section: values, **groups}.items():
            items = " ".join(f"{k}={_short(v)}" for k, v in group.items())
            lines.append(f"  {name:<{width}}  {items}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def algo_sections(cfg: Config) -> tuple[str, ...]:
    """The sections `cfg`'s algorithm reads besides algo (none for an unknown algorithm)."""
    return cfg.algo.spec.sections if cfg.algo.estimator in algorithm_names() else ()
