"""ALFWorld at laptop scale: the paper's pipeline end to end on real games, on a CPU (issue 15).

  python experiments/alfworld_laptop.py                 # every stage not finished yet, in order
  python experiments/alfworld_laptop.py --stage experts # one stage (resumes where it stopped)
  python experiments/alfworld_laptop.py --status        # what is done, with wall times

Stages (each resumable):
1. experts: the walkthrough of every one of the 3,553 train games played through the real engine
   (so each turn is exactly what a rollout shows), and ALFWorld's hand-coded expert on
   --search-games of them (it searches receptacle by receptacle, where the walkthrough goes
   straight to the hidden object: a model that only saw walkthroughs never learns to look),
   in shards of 100 games over --workers processes, cached under $HGPO_JAX_CACHE/expert/
   (`sft.data=expert+search:800 sft.episodes=3553` then reuses them).
2. sft: a small Qwen2 built here (`build:alfworld-<size>`, tokenizer trained on ALFWorld text),
   warm-started by `hgpo-jax sft alfworld_laptop_sft` on both kinds of episodes, then exported
   (float32, the exact weights) to OUT/warm_start, a transformers folder of a few MB that is
   committed: every later stage starts from it, on this machine or a fresh one.
3. eval_warm: the warm start on every valid_seen (In) and valid_unseen (Out) game, once each,
   at the eval temperature 0.4: success overall and per task type.
4. rl: HGPO (K=2), GiGPO and GRPO from the warm start under equal compute
   (`hgpo-jax train alfworld_laptop_rl`, same iterations, groups, group size, steps), per seed;
   each run is evaluated as in 3 right after its training, in the same sitting (so its model
   is never needed again).
5. report: OUT/results.json and OUT/results.md (the paper's Table 1 layout, the Table 5 analogue
   from the RL rollouts, the bias-vs-oracle diagnostic, wall times, commands) and the training
   dynamics plot (experiments/plot.py).

Runs live in --runs (default runs/alfworld_laptop, not committed). What the later stages and the
report need is kept in --out (committed): the warm start, and each run's metrics.jsonl under
OUT/logs/<name>/. A stage is finished when what it keeps is there, not when a record says so:
the runs folder and the episode cache live on one machine, and a session may get a fresh one.
OUT/state.json records every command and wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

STAGES = ("experts", "sft", "eval_warm", "rl", "report")
SHARD = 100  # games per recording shard
SEARCH_GAMES = 800  # train games with searching episodes (sft.data=expert+search:800)


# ----------------------------------------------------------------------------------- state
def load_state(out: str) -> dict:
    path = os.path.join(out, "state.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return {"done": {}, "commands": []}


def save_state(out: str, state: dict) -> None:
    """Write `state` merged into what is on disk (atomically): two stages run at once in separate
    processes (say, recording beside an SFT) each keep what the other recorded. Dict entries
    are merged key by key (this process's win), commands appended once. `state` is updated in
    place, its dicts included, so references into it stay live."""
    disk = load_state(out)
    for key, value in disk.items():
        mine = state.get(key)
        if mine is None:
            state[key] = value
        elif isinstance(value, dict) and isinstance(mine, dict):
            merged = {**value, **mine}
            mine.clear()
            mine.update(merged)
        elif key == "commands":
            mine[:] = value + [c for c in mine if c not in value]
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f"state.json.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(out, "state.json"))


# ----------------------------------------------------------------------------------- experts
def _record_shard(args: tuple) -> tuple[str, int, int, float]:
    """Record the winning episodes of one shard of train games into its JSONL file."""
    kind, index, games, path = args
    from hgpo_jax.sft.data import alfworld_episodes, save_episodes

    t0 = time.perf_counter()
    # the same episodes as one alfworld_episodes call on all the games (sft.data without the experiment)
    episodes = alfworld_episodes(games, kind=kind, first_index=index * SHARD)
    save_episodes(episodes, path)
    return kind, index, len(episodes), time.perf_counter() - t0


def shard_jobs(kind: str, games: list[str], final: str) -> tuple[list[tuple], list[str]]:
    """(jobs still to record, every shard's path) for `kind`'s episodes of `games`."""
    base = os.path.basename(final)[:-len(".jsonl")]
    shard_dir = os.path.join(os.path.dirname(final), f"{base}-shards")
    os.makedirs(shard_dir, exist_ok=True)
    paths = [os.path.join(shard_dir, f"shard-{i // SHARD:04d}.jsonl") for i in range(0, len(games), SHARD)]
    jobs = [(kind, i, games[i * SHARD:(i + 1) * SHARD], path) for i, path in enumerate(paths)
            if not os.path.isfile(path)]
    return jobs, paths


def stage_experts(args, state: dict) -> dict:
    """Walkthrough episodes of the train games (kind "expert") and, for --search-games of them,
    the hand-coded expert's searching episodes (kind "search"), recorded in shards."""
    import multiprocessing

    from hgpo_jax.envs.alfworld import list_games
    from hgpo_jax.sft.data import alfworld_episodes_path, load_episodes, save_episodes, spread

    train = list_games("train")
    # the games `cached_alfworld_episodes("train", n, kind=...)` (sft.data=expert+search:n) plays
    wanted = {"expert": spread(train, args.games)}
    if args.search_games:
        wanted["search"] = spread(train, args.search_games)
    result, jobs, paths = {}, [], {}
    for kind, games in wanted.items():
        final = alfworld_episodes_path("train", len(games), kind)
        if os.path.isfile(final):
            result[kind] = {"games": len(games), "episodes": len(load_episodes(final)), "cached": final}
            continue
        todo, paths[kind] = shard_jobs(kind, games, final)
        jobs += todo
        print(f"{kind} episodes: {len(games)} train games, {len(paths[kind]) - len(todo)} of "
              f"{len(paths[kind])} shards cached", flush=True)
    if jobs:
        print(f"recording {len(jobs)} shards with {args.workers} processes", flush=True)
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            for done, (kind, index, n, seconds) in enumerate(pool.imap_unordered(_record_shard, jobs), 1):
                print(f"  {kind} shard {index:4d}: {n} winning episodes in {seconds:.0f} s "
                      f"({done}/{len(jobs)})", flush=True)
    for kind, shard_paths in paths.items():
        episodes = [ep for path in shard_paths for ep in load_episodes(path)]
        final = save_episodes(episodes, alfworld_episodes_path("train", len(wanted[kind]), kind))
        result[kind] = {"games": len(wanted[kind]), "episodes": len(episodes), "cached": final}
    return result


# ----------------------------------------------------------------------------------- kept
WARM_START = "warm_start"  # OUT/warm_start: the exported warm start (transformers folder)
LOGS = "logs"  # OUT/logs/<name>/metrics.jsonl: what the report reads of each run


def warm_start_dir(out: str) -> str:
    return os.path.join(out, WARM_START)


def has_warm_start(out: str) -> bool:
    return all(os.path.isfile(os.path.join(warm_start_dir(out), f))
               for f in ("config.json", "model.safetensors", "tokenizer.json"))


def kept_log(out: str, name: str) -> str:
    """The folder under OUT that keeps run `name`'s metrics.jsonl (experiments/plot.py reads it)."""
    return os.path.join(out, LOGS, name)


def has_log(out: str, name: str) -> bool:
    return os.path.isfile(os.path.join(kept_log(out, name), "metrics.jsonl"))


def keep_log(run_dir: str, out: str, name: str) -> str:
    """Copy `run_dir`'s metrics.jsonl (and config.yaml) into OUT/logs/<name>/, atomically."""
    import shutil

    dest = kept_log(out, name)
    os.makedirs(dest, exist_ok=True)
    for f in ("config.yaml", "metrics.jsonl"):  # metrics last: its presence marks the log kept
        if os.path.isfile(os.path.join(run_dir, f)):
            tmp = os.path.join(dest, f"{f}.tmp{os.getpid()}")
            shutil.copyfile(os.path.join(run_dir, f), tmp)
            os.replace(tmp, os.path.join(dest, f))
    if not has_log(out, name):
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl to keep: did its command finish?")
    return dest


# ----------------------------------------------------------------------------------- CLI stages
ESTIMATORS = {"hgpo_k2": ["algo.estimator=hgpo", "algo.K=2"], "gigpo": ["algo.estimator=gigpo"],
              "grpo": ["algo.estimator=grpo"]}
SPLITS = ("valid_seen", "valid_unseen")  # In-distribution, Out-of-distribution


def cli_env(devices: int) -> dict:
    """The subprocess environment: `devices` CPU devices for the data-parallel mesh."""
    env = dict(os.environ)
    flag = f"--xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count")) + " " + flag
    return env


def run_cli(args, argv: list[str], state: dict) -> float:
    """`hgpo-jax ARGV` in a subprocess (output streams through); its command is recorded in the
    state and its wall time returned."""
    state["commands"].append(" ".join(["hgpo-jax", *argv]))
    save_state(args.out, state)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hgpo_jax.cli", *argv, "--no-progress"], check=True,
                   cwd=ROOT, env=cli_env(args.devices))
    return time.perf_counter() - t0


def has_checkpoint(run_dir: str) -> bool:
    return os.path.isdir(os.path.join(run_dir, "checkpoints")) and bool(
        os.listdir(os.path.join(run_dir, "checkpoints")))


def stage_sft(args, state: dict) -> dict:
    """Train the warm start (resuming from its last checkpoint), then export it to OUT/warm_start."""
    run = os.path.join(args.runs, "sft")
    argv = ["sft", "alfworld_laptop_sft", f"train.run_dir={run}", f"mesh.data={args.devices}",
            *([f"sft.episodes={args.games}"] if args.games else []),
            "sft.data=expert" + (f"+search:{args.search_games}" if args.search_games else ""),
            *args.set_sft]
    seconds = run_cli(args, argv + (["--resume"] if has_checkpoint(run) else []), state)
    seconds += run_cli(args, ["export", run, warm_start_dir(args.out), "--overwrite"], state)
    keep_log(run, args.out, "sft")
    return {"run": run, "warm_start": warm_start_dir(args.out), "seconds_this_sitting": seconds}


def rl_runs(args) -> dict[str, list[str]]:
    """{run name: overrides} of every RL run: each estimator x seed."""
    return {f"{est}_s{seed}": [*ESTIMATORS[est], f"train.seed={seed}"]
            for est in args.estimators for seed in args.seeds}


def stage_eval_warm(args, state: dict) -> dict:
    """The kept warm start evaluated (the SFT config's eval section; its run folder only logs)."""
    run = os.path.join(args.runs, "eval_warm")
    argv = ["eval", "alfworld_laptop_sft", *args.set_sft, f"model.path={warm_start_dir(args.out)}",
            f"train.run_dir={run}", f"mesh.data={args.devices}", *args.set_eval]
    seconds = run_cli(args, argv, state)
    keep_log(run, args.out, "eval_warm")
    return {"seconds": seconds}


def stage_rl(args, state: dict) -> dict:
    """Each RL run not kept yet: trained from the kept warm start (resuming from its checkpoint),
    evaluated, and its metrics kept as OUT/logs/rl_<name>."""
    for name, overrides in rl_runs(args).items():
        if has_log(args.out, f"rl_{name}"):
            continue
        run = os.path.join(args.runs, f"rl_{name}")
        argv = ["train", "alfworld_laptop_rl", f"model.path={warm_start_dir(args.out)}",
                f"train.run_dir={run}", f"mesh.data={args.devices}", *overrides, *args.set_rl]
        train_s = run_cli(args, argv + (["--resume"] if has_checkpoint(run) else []), state)
        eval_s = run_cli(args, ["eval", run, f"mesh.data={args.devices}", *args.set_eval], state)
        keep_log(run, args.out, f"rl_{name}")
        state.setdefault("rl_runs", {})[name] = {"run": run, "seconds": train_s, "eval_seconds": eval_s}
        save_state(args.out, state)
    return {"runs": sorted(n for n in rl_runs(args) if has_log(args.out, f"rl_{n}"))}


# ----------------------------------------------------------------------------------- report
TYPES = {"pick_and_place_simple": "Pick", "look_at_obj_in_light": "Look",
         "pick_clean_then_place_in_recep": "Clean", "pick_heat_then_place_in_recep": "Heat",
         "pick_cool_then_place_in_recep": "Cool", "pick_two_obj_and_place": "Pick2", "all": "All"}


def last_eval(run_dir: str) -> dict[str, float]:
    """The last logged evaluation of a run: {split/type: success}."""
    from hgpo_jax.metrics import read_metrics

    out = {}
    for record in read_metrics(run_dir):
        for split in SPLITS:
            for t in TYPES:
                key = f"eval/{split}/{t}"
                if key in record:
                    out[f"{split}/{t}"] = float(record[key])
    return out


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


def _num(v: float, fmt: str = "{:.3f}") -> str:
    return "-" if math.isnan(v) else fmt.format(v)


def table1_lines(rows: dict[str, list[dict]]) -> list[str]:
    """Table 1 layout: one row per method, In/Out x task type, mean ± std over its evaluations."""
    head = " | ".join(f"In {t}" for t in TYPES.values()) + " | " + " | ".join(
        f"Out {t}" for t in TYPES.values())
    lines = [f"| method | {head} |", "|---" * (1 + 2 * len(TYPES)) + "|"]
    for name, evals in rows.items():
        cells = [_cell([e[f"{split}/{t}"] for e in evals if f"{split}/{t}" in e])
                 for split in SPLITS for t in TYPES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def run_lines(logs: dict[str, str], levels: dict, diag: dict, runs: dict) -> list[str]:
    """Per RL run: rollout success and invalid rate (first vs last 5 iterations), the Table 5
    analogue (share of steps in a group of >= 2 at each context level, mean over iterations), the
    bias-vs-oracle diagnostic (mean |A - A_oracle| of each estimator on that run's rollouts) and
    wall times."""
    n_levels = max((len(v) for v in levels.values()), default=0)
    estimators = ("grpo", "gigpo", "hgpo")  # the trainer's diagnostic covers these
    head = ["run", "success first 5 -> last 5 it. (%)", "invalid first 5 -> last 5 (%)",
            *[f"level {k} grouped (%)" for k in range(n_levels)],
            *[f"abs dev {e}" for e in estimators], "train s", "eval s"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, log in logs.items():
        s0, s1 = first_last(log, "success/all")
        i0, i1 = first_last(log, "rollout/invalid_action_rate")
        cells = [name, f"{_num(100 * s0, '{:.1f}')} -> {_num(100 * s1, '{:.1f}')}",
                 f"{_num(100 * i0, '{:.1f}')} -> {_num(100 * i1, '{:.1f}')}"]
        cells += [_num(100 * levels[name].get(f"hierarchy/level{k}_grouped_fraction", math.nan),
                       "{:.1f}") for k in range(n_levels)]
        cells += [_num(diag[name].get(f"diag/{e}/abs_dev", math.nan)) for e in estimators]
        took = runs.get(name, {})
        cells += [_num(took.get("seconds", math.nan), "{:.0f}"),
                  _num(took.get("eval_seconds", math.nan), "{:.0f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "-"
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"


def stage_report(args, state: dict) -> dict:
    """The tables and the plot, from what OUT keeps (no run folder needed)."""
    rows = {}
    if has_log(args.out, "eval_warm"):
        rows["warm start (SFT)"] = [last_eval(kept_log(args.out, "eval_warm"))]
    logs = {name: kept_log(args.out, f"rl_{name}") for name in rl_runs(args)
            if has_log(args.out, f"rl_{name}")}
    for est in args.estimators:
        rows[est] = [last_eval(logs[f"{est}_s{seed}"]) for seed in args.seeds if f"{est}_s{seed}" in logs]
    levels = {name: mean_over_iterations(log, "hierarchy/") for name, log in logs.items()}
    diag = {name: mean_over_iterations(log, "diag/") for name, log in logs.items()}
    results = {"table1": rows, "table5": levels, "diagnostic": diag, "state": state,
               "seeds": args.seeds}
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write("Success (%) on every valid_seen (In) and valid_unseen (Out) game, temperature 0.4;"
                f" RL rows: mean ± std over seeds {args.seeds}.\n\n" + "\n".join(table1_lines(rows))
                + "\n")
        if logs:
            f.write("\nRL runs: rollout success and invalid-action rate over the first and last 5"
                    " iterations; share of steps whose group at context level k holds >= 2 steps"
                    " (Table 5 analogue); mean |A - A_oracle| of each estimator on the run's"
                    " rollouts (the bias-vs-oracle diagnostic); wall time of training and of the"
                    " evaluation.\n\n" + "\n".join(run_lines(logs, levels, diag,
                                                              state.get("rl_runs", {}))) + "\n")
    seed0 = [logs[f"{est}_s{args.seeds[0]}"] for est in args.estimators if f"{est}_s{args.seeds[0]}" in logs]
    if seed0:
        from experiments import plot

        plot.main([*seed0, "--out", os.path.join(args.out, "dynamics.png")])
    return {"rows": list(rows)}


# ----------------------------------------------------------------------------------- stages
def expert_caches(args) -> list[str]:
    """The episode files stage experts leaves in the cache."""
    from hgpo_jax.envs.alfworld import list_games
    from hgpo_jax.sft.data import alfworld_episodes_path, spread

    train = list_games("train")
    wanted = {"expert": args.games, **({"search": args.search_games} if args.search_games else {})}
    return [alfworld_episodes_path("train", len(spread(train, n)), kind) for kind, n in wanted.items()]


def finished(stage: str, args, state: dict) -> bool:
    """Whether `stage`'s outputs are there: the episode caches (not needed once the warm start is
    kept), the kept warm start, the kept logs of the warm start's evaluation and of every RL run
    of this invocation's estimators x seeds. The report is never finished (it is cheap and is
    made again from whatever is kept)."""
    if stage == "experts":
        return has_warm_start(args.out) or all(os.path.isfile(p) for p in expert_caches(args))
    if stage == "sft":
        return has_warm_start(args.out)
    if stage == "eval_warm":
        return has_log(args.out, "eval_warm")
    if stage == "rl":
        return all(has_log(args.out, f"rl_{name}") for name in rl_runs(args))
    return False


def stages_to_run(args, state: dict) -> list[str]:
    """`--stage` alone, or every stage not finished yet, in order (the report always)."""
    if args.stage:
        return [args.stage]
    return [s for s in STAGES if not finished(s, args, state)]


STAGE_FUNCS = {"experts": stage_experts, "sft": stage_sft, "eval_warm": stage_eval_warm,
               "rl": stage_rl, "report": stage_report}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=STAGES, default=None, help="run one stage only")
    parser.add_argument("--status", action="store_true", help="print what is done and exit")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "alfworld_laptop"),
                        help="results and what later stages need (committed)")
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs", "alfworld_laptop"),
                        help="run folders (checkpoints; not committed)")
    parser.add_argument("--workers", type=int, default=2, help="processes recording expert episodes")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices (data-parallel mesh)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="RL seeds")
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument("--games", type=int, default=0,
                        help="train games with expert episodes (0: all 3,553); smaller for a smoke test")
    parser.add_argument("--search-games", type=int, default=SEARCH_GAMES,
                        help="train games with the hand-coded expert's searching episodes (0: none)")
    for stage in ("sft", "rl", "eval"):
        parser.add_argument(f"--set-{stage}", nargs="*", default=[], metavar="KEY=VALUE",
                            help=f"extra config overrides of the {stage} commands")
    args = parser.parse_args(argv)
    state = load_state(args.out)
    if args.status:
        for stage in STAGES[:-1]:
            d = state["done"].get(stage)
            took = f" (last sitting {d['seconds']:.0f} s, {d.get('finished', '')})" if d else ""
            print(f"{stage:>10}: " + ("done" if finished(stage, args, state) else "to do") + took)
        return 0
    for stage in stages_to_run(args, state):
        t0 = time.perf_counter()
        result = STAGE_FUNCS[stage](args, state)
        state["done"][stage] = {"seconds": time.perf_counter() - t0, "result": result,
                                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        save_state(args.out, state)
        print(f"{stage}: done in {state['done'][stage]['seconds']:.0f} s: {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
