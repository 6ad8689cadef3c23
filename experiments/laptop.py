"""The stage machinery of the laptop-scale studies (experiments/alfworld_laptop.py,
webshop_laptop.py and search_laptop.py): a study is a few resumable stages run through the
`hgpo-jax` CLI in subprocesses, with a record of every command and wall time. (Comparisons on the
toy envs, whose warm start is one per seed and whose runs are seconds, run in one process
through experiments/study.py, whose statistics these studies share.)

    stages: experts -> sft -> eval_warm -> rl -> report   (each study names its own experts and report)

- OUT (committed) keeps what later stages and readers need: the exported warm start
  (OUT/warm_start, a float32 transformers folder), each run's metrics.jsonl and config.yaml
  under OUT/logs/<name>/ and, where the study keeps them, each RL run's final policy as
  OUT/<run name>/. OUT/state.json records every command and each stage's wall time.
- RUNS (not committed) holds the run folders with their checkpoints.
A stage is finished when what it keeps is in OUT, not when a record says so: the run folders and
caches live on one machine and a session may get a fresh one. Runs resume from their last
checkpoint. The report is made again at every call from what OUT keeps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STAGES = ("experts", "sft", "eval_warm", "rl", "report")
# Agent-G2's guidance as the authors' scripts (docs/guidance.md), recording only the experts of
# the tasks a run draws (a few minutes instead of hours for ALFWorld's train split)
GUIDED = ["guidance.kind=g2", "guidance.sigma_mode=dynamic_sigma", "guidance.batch_acc_low=0.5",
          "guidance.batch_acc_high=0.5", "guidance.sft_coef=0.5", "guidance.expert_tasks=drawn"]
# the same with shallower prefixes: mu_global starts at 0.5 and aims at a batch success of 0.25
# (the authors': 0.8 and 0.5), so that the policy plays more of each episode than its last steps
SHALLOW = [o for o in GUIDED if not o.startswith("guidance.batch_acc")] + [
    "guidance.batch_acc_low=0.25", "guidance.batch_acc_high=0.25", "guidance.mu_global_init=0.5"]
ESTIMATORS = {"hgpo_k2": ["algo.estimator=hgpo", "algo.K=2"], "gigpo": ["algo.estimator=gigpo"],
              # GiGPO with similarity groups: anchors whose difflib ratio >= 0.9 share a step
              # group (verl-agent's algorithm.gigpo.similarity_thresh in their search script)
              "gigpo_sim": ["algo.estimator=gigpo", "algo.similarity_thresh=0.9"],
              "grpo": ["algo.estimator=grpo"],
              "grpo_g2": ["algo.estimator=grpo", *GUIDED],
              "hgpo_k2_g2": ["algo.estimator=hgpo", "algo.K=2", *GUIDED],
              "grpo_g2_shallow": ["algo.estimator=grpo", *SHALLOW]}
WARM_START = "warm_start"  # OUT/warm_start: the exported warm start (transformers folder)
LOGS = "logs"  # OUT/logs/<name>/metrics.jsonl: what the report reads of each run
EPISODES = "episodes"  # OUT/episodes/<name>.jsonl: each game of an evaluation (Study.keep_episodes)
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True)
class Study:
    """What differs between studies. `experts(args, state)` and `report(args, state)` are its own
    stages (each returns a JSON-able result); `experts_done(args)` says whether the first is
    finished (given that the warm start is not kept yet); `sft_overrides(args)` are the extra
    overrides of its SFT command. `more_sft`: further SFT rounds, (name, overrides or a function
    args -> overrides, called only when the round runs) each, every
    one continuing from the warm start exported so far (model.path=OUT/warm_start) in run folder
    RUNS/<name>, exported to OUT/warm_start in turn. `keep_policies`: export every RL run's final
    policy to OUT/<run name> (a float32 transformers folder). `eval_overrides`: overrides of each
    RL run's evaluation (say, the step limit the warm start is evaluated with). `keep_episodes`:
    the warm start's and every RL run's evaluation also write their episodes, one JSON line per
    game, to OUT/episodes/<name>.jsonl (`eval --episodes`; each-once evaluations only), for a
    goal-by-goal comparison in the report."""

    name: str
    sft_config: str
    rl_config: str
    experts: Callable
    report: Callable
    experts_done: Callable = lambda args: True
    sft_overrides: Callable = lambda args: []
    more_sft: tuple = ()
    keep_policies: bool = False
    eval_overrides: tuple = ()  # what each RL run's evaluation changes of its training config
    keep_episodes: bool = False
    add_arguments: Callable = lambda parser: None
    defaults: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------- state
def read_kept(out: str, name: str):
    """OUT/<name> read as JSON (what a stage kept, e.g. the experts' scores); None when absent."""
    path = os.path.join(out, name)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class State(dict):
    """A study's state.json as one process holds it, with `seen`: the dict entries as this
    process last read or wrote them, so that a save can tell the records this process changed
    from the stale copies of records another process has changed since."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.seen = json.loads(json.dumps(data))


def load_state(out: str) -> State:
    return State(read_kept(out, "state.json") or {"done": {}, "commands": []})


def save_state(out: str, state: dict) -> None:
    """Write `state` merged into what is on disk (atomically): stages or RL seeds run at once in
    separate processes (say, recording beside an SFT, or three seeds' runs) each keep what the
    others recorded. Dict entries are merged key by key: a record this process changed since it
    last read or wrote state.json wins, any other comes from disk (another process may have
    rewritten it: a run resumed for more iterations records its new wall time); commands are
    appended once. `state` is updated in place, its dicts included, so references into it stay
    live."""
    disk = load_state(out)
    seen = getattr(state, "seen", {})
    for key, value in disk.items():
        mine = state.get(key)
        if mine is None:
            state[key] = value
        elif isinstance(value, dict) and isinstance(mine, dict):
            before = seen.get(key, {}) if isinstance(seen.get(key), dict) else {}
            changed = {k: v for k, v in mine.items() if k not in before or before[k] != v}
            merged = {**mine, **value, **changed}
            mine.clear()
            mine.update(merged)
        elif key == "commands":
            mine[:] = value + [c for c in mine if c not in value]
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f"state.json.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(out, "state.json"))
    if isinstance(state, State):
        state.seen = json.loads(json.dumps(state))


# ----------------------------------------------------------------------------------- kept
def warm_start_dir(out: str) -> str:
    return os.path.join(out, WARM_START)


def is_model_folder(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, f)) for f in MODEL_FILES)


def has_warm_start(out: str) -> bool:
    return is_model_folder(warm_start_dir(out))


def kept_log(out: str, name: str) -> str:
    """The folder under OUT that keeps run `name`'s metrics.jsonl (experiments/plot.py reads it)."""
    return os.path.join(out, LOGS, name)


def has_log(out: str, name: str) -> bool:
    return os.path.isfile(os.path.join(kept_log(out, name), "metrics.jsonl"))


def keep_log(run_dir: str, out: str, name: str) -> str:
    """Copy `run_dir`'s config.yaml and its metrics (the training's metrics.jsonl, then the
    evaluations of its last checkpoint from eval/metrics.jsonl: `hgpo-jax eval` records there)
    into OUT/logs/<name>/, atomically. An evaluation of an earlier checkpoint (a run resumed for
    more iterations after it was evaluated) is left in the run folder: after the training's
    records its step would read as a rewind (`hgpo_jax.metrics.read_metrics`) and hide the
    iterations that came after it."""
    dest = kept_log(out, name)
    os.makedirs(dest, exist_ok=True)
    config = os.path.join(run_dir, "config.yaml")
    if os.path.isfile(config):
        tmp = os.path.join(dest, f"config.yaml.tmp{os.getpid()}")
        shutil.copyfile(config, tmp)
        os.replace(tmp, os.path.join(dest, "config.yaml"))
    lines = []  # metrics last: its presence marks the log kept
    train = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(train):
        with open(train, encoding="utf-8") as f:
            lines = f.read().splitlines()
    evals = os.path.join(run_dir, "eval", "metrics.jsonl")
    if os.path.isfile(evals):
        last = max((_step(line) for line in lines), default=-1)
        with open(evals, encoding="utf-8") as f:
            lines += [line for line in f.read().splitlines() if _step(line) >= last]
    if os.path.isfile(train) or os.path.isfile(evals):
        tmp = os.path.join(dest, f"metrics.jsonl.tmp{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as w:
            w.write("".join(line + "\n" for line in lines))
        os.replace(tmp, os.path.join(dest, "metrics.jsonl"))
    if not has_log(out, name):
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl to keep: did its command finish?")
    return dest


def _step(line: str) -> int:
    """The step of one metrics.jsonl line (-1 for a blank or unreadable one: a crash's last
    line, which read_metrics skips too)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return -1


# ----------------------------------------------------------------------------------- commands
def cli_env(devices: int) -> dict:
    """The subprocess environment: `devices` CPU devices for the data-parallel mesh."""
    env = dict(os.environ)
    flag = f"--xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count")) + " " + flag
    return env


def run_cli(args, argv: list[str], state: dict) -> float:
    """`hgpo-jax ARGV` in a subprocess (output streams through), or in this process with
    --in-process; its command is recorded in the state and its wall time returned."""
    state["commands"].append(" ".join(["hgpo-jax", *argv]))
    save_state(args.out, state)
    t0 = time.perf_counter()
    if getattr(args, "in_process", False):
        from hgpo_jax.cli import main as cli_main

        rc = cli_main([*argv, "--no-progress"])
        if rc:
            raise subprocess.CalledProcessError(rc, ["hgpo-jax", *argv])
    else:
        subprocess.run([sys.executable, "-m", "hgpo_jax.cli", *argv, "--no-progress"], check=True,
                       cwd=ROOT, env=cli_env(args.devices))
    return time.perf_counter() - t0


def newest_checkpoint(run_dir: str) -> int:
    """The iteration of the run's newest checkpoint (0: none)."""
    folder = os.path.join(run_dir, "checkpoints")
    steps = [int(n) for n in os.listdir(folder) if n.isdigit()] if os.path.isdir(folder) else []
    return max(steps, default=0)


def has_checkpoint(run_dir: str) -> bool:
    return os.path.isdir(os.path.join(run_dir, "checkpoints")) and bool(
        os.listdir(os.path.join(run_dir, "checkpoints")))


# ----------------------------------------------------------------------------------- stages
def stage_sft(study: Study, args, state: dict) -> dict:
    """Train the warm start (resuming from its last checkpoint), then export it to OUT/warm_start;
    then each of the study's further rounds (`Study.more_sft`), from the warm start kept so far.
    A round already kept (its log in OUT/logs/<name>) is not run again."""
    seconds, runs = 0.0, []
    rounds = [("sft", [])] + [(name, extra, True) for name, extra in study.more_sft]
    for name, extra, *later in rounds:
        run = os.path.join(args.runs, name)
        runs.append(run)
        if study.more_sft and has_warm_start(args.out) and has_log(args.out, name):
            continue  # a round of several, kept (its log is kept after its export)
        extra = extra(args) if callable(extra) else extra
        if later:
            extra = [f"model.path={warm_start_dir(args.out)}", *extra]
        argv = ["sft", study.sft_config, f"train.run_dir={run}", f"mesh.data={args.devices}",
                *study.sft_overrides(args), *extra, *args.set_sft]
        seconds += run_cli(args, argv + (["--resume"] if has_checkpoint(run) else []), state)
        seconds += run_cli(args, ["export", run, warm_start_dir(args.out), "--overwrite"], state)
        keep_log(run, args.out, name)
    return {"runs": runs, "warm_start": warm_start_dir(args.out), "seconds_this_sitting": seconds}


def rl_runs(args) -> dict[str, list[str]]:
    """{run name: overrides} of every RL run: each estimator x seed."""
    return {f"{est}_s{seed}": [*ESTIMATORS[est], f"train.seed={seed}"]
            for est in args.estimators for seed in args.seeds}


def stage_eval_warm(study: Study, args, state: dict) -> dict:
    """The kept warm start evaluated (the SFT config's eval section; its run folder only logs)."""
    run = os.path.join(args.runs, "eval_warm")
    argv = ["eval", study.sft_config, *args.set_sft, f"model.path={warm_start_dir(args.out)}",
            f"train.run_dir={run}", f"mesh.data={args.devices}", *args.set_eval,
            *episodes_flag(study, args, WARM_START)]
    seconds = run_cli(args, argv, state)
    keep_log(run, args.out, "eval_warm")
    return {"seconds": seconds}


def episodes_flag(study: Study, args, name: str) -> list[str]:
    """`eval`'s --episodes OUT/episodes/<name>.jsonl where the study keeps episodes, else []."""
    return ["--episodes", os.path.join(args.out, EPISODES, f"{name}.jsonl")] if study.keep_episodes else []


def rl_done(study: Study, args, name: str) -> bool:
    return has_log(args.out, f"rl_{name}") and (
        not study.keep_policies or is_model_folder(os.path.join(args.out, name)))


def stage_rl(study: Study, args, state: dict) -> dict:
    """Each RL run not kept yet: trained from the kept warm start (resuming from its checkpoint;
    not at all when it has done the iterations asked and only its evaluation is missing),
    evaluated, its metrics kept as OUT/logs/rl_<name> (and its final policy as OUT/<name>)."""
    from hgpo_jax.config import load_config

    for name, overrides in rl_runs(args).items():
        if rl_done(study, args, name):
            continue
        run = os.path.join(args.runs, f"rl_{name}")
        argv = ["train", study.rl_config, f"model.path={warm_start_dir(args.out)}",
                f"train.run_dir={run}", f"mesh.data={args.devices}", *overrides, *args.set_rl]
        asked = load_config(study.rl_config, argv[2:]).train.iterations
        took = {"run": run}  # no "seconds" when trained in an earlier sitting (its eval cut short)
        if newest_checkpoint(run) < asked:
            took["seconds"] = run_cli(args, argv + (["--resume"] if has_checkpoint(run) else []), state)
        if newest_checkpoint(run) < asked:  # SIGTERM: the trainer saved and stopped early
            raise SystemExit(f"{run}: stopped before its last iteration; run the same command "
                             "again to resume it")
        took["eval_seconds"] = run_cli(args, ["eval", run, f"mesh.data={args.devices}",
                                              *study.eval_overrides, *args.set_eval,
                                              *episodes_flag(study, args, name)], state)
        if study.keep_policies:
            run_cli(args, ["export", run, os.path.join(args.out, name), "--overwrite"], state)
        keep_log(run, args.out, f"rl_{name}")
        state.setdefault("rl_runs", {})[name] = took
        save_state(args.out, state)
    return {"runs": sorted(n for n in rl_runs(args) if rl_done(study, args, n))}


def finished(study: Study, stage: str, args, state: dict) -> bool:
    """Whether `stage`'s outputs are there: the experts' (not needed once the warm start is
    kept), the kept warm start, the kept logs of the warm start's evaluation and of every RL run
    of this invocation's estimators x seeds. The report is never finished (it is cheap and is
    made again from whatever is kept)."""
    if stage == "experts":
        return has_warm_start(args.out) or study.experts_done(args)
    if stage == "sft":
        return has_warm_start(args.out) and all(has_log(args.out, name) for name, _ in study.more_sft)
    if stage == "eval_warm":
        return has_log(args.out, "eval_warm")
    if stage == "rl":
        return all(rl_done(study, args, name) for name in rl_runs(args))
    return False


def stages_to_run(study: Study, args, state: dict) -> list[str]:
    """`--stage` alone, or every stage not finished yet, in order (the report always)."""
    if args.stage:
        return [args.stage]
    return [s for s in STAGES if not finished(study, s, args, state)]


def stage_func(study: Study, stage: str) -> Callable:
    return {"experts": study.experts, "report": study.report,
            "sft": lambda a, s: stage_sft(study, a, s), "eval_warm": lambda a, s: stage_eval_warm(study, a, s),
            "rl": lambda a, s: stage_rl(study, a, s)}[stage]


def parse_args(study: Study, doc: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--stage", choices=STAGES, default=None, help="run one stage only")
    parser.add_argument("--status", action="store_true", help="print what is done and exit")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results", study.name),
                        help="results and what later stages need (committed)")
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs", study.name),
                        help="run folders (checkpoints; not committed)")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices (data-parallel mesh)")
    parser.add_argument("--in-process", action="store_true",
                        help="run each hgpo-jax command in this process instead of a fresh "
                             "interpreter (no start-up per command: for smoke runs with tiny "
                             "settings; this process must have --devices JAX devices)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="RL seeds")
    parser.add_argument("--estimators", nargs="+", default=["hgpo_k2", "gigpo", "grpo"],
                        choices=list(ESTIMATORS), help="the *_g2 arms: with Agent-G2's guidance")
    study.add_arguments(parser)
    for stage in ("sft", "rl", "eval"):
        parser.add_argument(f"--set-{stage}", nargs="*", default=[], metavar="KEY=VALUE",
                            help=f"extra config overrides of the {stage} commands")
    return parser.parse_args(argv)


def main(study: Study, doc: str, argv=None) -> int:
    """Run the stages `argv` asks for (every unfinished one by default), or print --status."""
    args = parse_args(study, doc, argv)
    state = load_state(args.out)
    if args.status:
        for stage in STAGES[:-1]:
            d = state["done"].get(stage)
            took = f" (last sitting {d['seconds']:.0f} s, {d.get('finished', '')})" if d else ""
            print(f"{stage:>10}: " + ("done" if finished(study, stage, args, state) else "to do") + took)
        return 0
    for stage in stages_to_run(study, args, state):
        t0 = time.perf_counter()
        result = stage_func(study, stage)(args, state)
        state["done"][stage] = {"seconds": time.perf_counter() - t0, "result": result,
                                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        save_state(args.out, state)
        print(f"{stage}: done in {state['done'][stage]['seconds']:.0f} s: {result}", flush=True)
    return 0


# ----------------------------------------------------------------------------------- report
def mean_over_iterations(run_dir: str, prefix: str) -> dict[str, float]:
    """Mean over a run's iterations of every metric starting with `prefix`."""
    import numpy as np

    from hgpo_jax.metrics import read_metrics

    values: dict[str, list] = {}
    for record in read_metrics(run_dir):
        for k, v in record.items():
            if k.startswith(prefix) and isinstance(v, (int, float)):
                values.setdefault(k, []).append(float(v))
    return {k: float(np.nanmean(v)) if not np.isnan(v).all() else math.nan
            for k, v in sorted(values.items())}


def first_last(run_dir: str, key: str, n: int = 5) -> tuple[float, float]:
    """Mean of `key` over a run's first and last `n` iterations (NaN where none was logged)."""
    import numpy as np

    from hgpo_jax.metrics import metric_series, read_metrics

    _, values = metric_series(read_metrics(run_dir), key)
    if not values:
        return math.nan, math.nan
    return float(np.nanmean(values[:n])), float(np.nanmean(values[-n:]))


def num(v: float, fmt: str = "{:.3f}") -> str:
    return "-" if math.isnan(v) else fmt.format(v)


def cell(values: list[float], scale: float = 100.0, fmt: str = "{:.1f}") -> str:
    """'mean ± std' of `values` x `scale` (one value alone; '-' for none)."""
    import numpy as np

    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(scale * values[0])
    return f"{fmt.format(scale * np.mean(values))} ± {fmt.format(scale * np.std(values))}"


def run_lines(logs: dict[str, str], runs: dict,
              first_last_keys: dict[str, str]) -> tuple[list[str], dict, dict]:
    """Per RL run: each of `first_last_keys` ({column: metric}, in %) over the first vs last 5
    iterations, the Table 5 analogue (share of steps in a group of >= 2 at each context level,
    mean over iterations), the bias-vs-oracle diagnostic (mean |A - A_oracle| of each estimator on
    that run's rollouts) and wall times. Returns (table lines, levels, diagnostics) with the
    per-run means the table shows."""
    levels = {name: mean_over_iterations(log, "hierarchy/") for name, log in logs.items()}
    diag = {name: mean_over_iterations(log, "diag/") for name, log in logs.items()}
    n_levels = max((sum(k.endswith("_grouped_fraction") for k in v) for v in levels.values()), default=0)
    estimators = ("grpo", "gigpo", "hgpo")  # the trainer's diagnostic covers these
    head = ["run", *[f"{c} first 5 -> last 5 it. (%)" for c in first_last_keys],
            *[f"level {k} grouped (%)" for k in range(n_levels)],
            *[f"abs dev {e}" for e in estimators], "train s", "eval s"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, log in logs.items():
        cells = [name]
        for key in first_last_keys.values():
            a, b = first_last(log, key)
            cells.append(f"{num(100 * a, '{:.1f}')} -> {num(100 * b, '{:.1f}')}")
        cells += [num(100 * levels[name].get(f"hierarchy/level{k}_grouped_fraction", math.nan),
                      "{:.1f}") for k in range(n_levels)]
        cells += [num(diag[name].get(f"diag/{e}/abs_dev", math.nan)) for e in estimators]
        took = runs.get(name, {})
        cells += [num(took.get("seconds", math.nan), "{:.0f}"),
                  num(took.get("eval_seconds", math.nan), "{:.0f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines, levels, diag


def write_report(args, state: dict, *, last_eval: Callable, table1_lines: Callable, caption: str,
                 first_last_keys: dict[str, str], runs_caption: str, rows: dict | None = None,
                 plot_metrics: tuple[str, ...] = (), extra_results: dict | None = None,
                 extra_md: str = "") -> dict:
    """OUT/results.json, OUT/results.md and OUT/dynamics.png from what OUT keeps: Table 1 (`rows`
    first, then the warm start's and each estimator's evaluations, `last_eval(log)` of each, laid
    out by `table1_lines`) under `caption`, then the per-run lines (`run_lines`) under
    `runs_caption`; a study's own `extra_results` join results.json and `extra_md` ends results.md."""
    rows = dict(rows or {})
    if has_log(args.out, "eval_warm"):
        rows["warm start (SFT)"] = [last_eval(kept_log(args.out, "eval_warm"))]
    logs = kept_rl_logs(args)
    for est in args.estimators:
        rows[est] = [last_eval(logs[f"{est}_s{seed}"]) for seed in args.seeds if f"{est}_s{seed}" in logs]
    lines, levels, diag = run_lines(logs, state.get("rl_runs", {}), first_last_keys)
    results = {"table1": rows, "table5": levels, "diagnostic": diag, "state": state, "seeds": args.seeds,
               **(extra_results or {})}
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(f"{caption} RL rows: mean ± std over seeds {args.seeds}.\n\n"
                + "\n".join(table1_lines(rows)) + "\n")
        if logs:
            f.write(f"\n{runs_caption}; share of steps whose group at context level k holds >= 2"
                    " steps (Table 5 analogue); mean |A - A_oracle| of each estimator on the run's"
                    " rollouts (the bias-vs-oracle diagnostic); wall time of training and of the"
                    " evaluation.\n\n" + "\n".join(lines) + "\n")
        f.write(extra_md)
    plot_dynamics(args, logs, plot_metrics)
    return {"rows": list(rows)}


def kept_rl_logs(args) -> dict[str, str]:
    """{run name: its kept log folder} of the RL runs OUT keeps, in estimator x seed order."""
    return {name: kept_log(args.out, f"rl_{name}") for name in rl_runs(args)
            if has_log(args.out, f"rl_{name}")}


def plot_dynamics(args, logs: dict[str, str], metrics: tuple[str, ...] = ()) -> None:
    """OUT/dynamics.png: the training dynamics of each estimator's first-seed run (the paper's
    metrics and `metrics`)."""
    seed0 = [logs[f"{est}_s{args.seeds[0]}"] for est in args.estimators if f"{est}_s{args.seeds[0]}" in logs]
    if seed0:
        from experiments import plot

        plot.main([*seed0, "--out", os.path.join(args.out, "dynamics.png"),
                   *(["--metrics", *metrics] if metrics else [])])
