"""ALFWorld at laptop scale: the paper's pipeline end to end on real games, on a CPU (issue 15).

  python experiments/alfworld_laptop.py                 # every stage not finished yet, in order
  python experiments/alfworld_laptop.py --stage experts # one stage (resumes where it stopped)
  python experiments/alfworld_laptop.py --status        # what is done, with wall times

Stages (each resumable; a finished stage is recorded in OUT/state.json and skipped):
1. experts: the walkthrough of every one of the 3,553 train games played through the real engine
   (so each turn is exactly what a rollout shows), and ALFWorld's hand-coded expert on
   --search-games of them (it searches receptacle by receptacle, where the walkthrough goes
   straight to the hidden object: a model that only saw walkthroughs never learns to look),
   in shards of 100 games over --workers processes, cached under $HGPO_JAX_CACHE/expert/
   (`sft.data=expert+search:800 sft.episodes=3553` then reuses them).
2. sft: a small Qwen2 built here (`build:alfworld-<size>`, tokenizer trained on ALFWorld text),
   warm-started by `hgpo-jax sft alfworld_laptop_sft` on both kinds of episodes.
3. eval_warm: the warm start on every valid_seen (In) and valid_unseen (Out) game, once each,
   at the eval temperature 0.4: success overall and per task type.
4. rl: HGPO (K=2), GiGPO and GRPO from the warm start under equal compute
   (`hgpo-jax train alfworld_laptop_rl`, same iterations, groups, group size, steps), per seed.
5. eval_rl: each RL run evaluated as in 3.
6. report: OUT/results.json and OUT/results.md (the paper's Table 1 layout, the Table 5 analogue
   from the RL rollouts, the bias-vs-oracle diagnostic, wall times, commands) and the training
   dynamics plot (experiments/plot.py).

Runs live in --runs (default runs/alfworld_laptop, not committed); results in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

STAGES = ("experts", "sft", "eval_warm", "rl", "eval_rl", "report")
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
    are merged key by key (this process's win), commands appended once."""
    disk = load_state(out)
    merged = dict(disk)
    for key, value in state.items():
        if isinstance(value, dict) and isinstance(disk.get(key), dict):
            merged[key] = {**disk[key], **value}
        elif key == "commands":
            merged[key] = disk.get(key, []) + [c for c in value if c not in disk.get(key, [])]
        else:
            merged[key] = value
    state.update(merged)
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, f"state.json.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)
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


# ----------------------------------------------------------------------------------- CLI stages
ESTIMATORS = {"hgpo_k2": ["algo.estimator=hgpo", "algo.K=2"], "gigpo": ["algo.estimator=gigpo"],
              "grpo": ["algo.estimator=grpo"]}
SPLITS = ("valid_seen", "valid_unseen")  # In-distribution, Out-of-distribution
RUN_RECORDS = {"rl": "rl_runs", "eval_rl": "rl_evals"}  # state key of each RL stage's finished runs


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
    run = os.path.join(args.runs, "sft")
    argv = ["sft", "alfworld_laptop_sft", f"train.run_dir={run}", f"mesh.data={args.devices}",
            *([f"sft.episodes={args.games}"] if args.games else []),
            "sft.data=expert" + (f"+search:{args.search_games}" if args.search_games else ""),
            *args.set_sft]
    seconds = run_cli(args, argv + (["--resume"] if has_checkpoint(run) else []), state)
    return {"run": run, "seconds_this_sitting": seconds}


def rl_runs(args) -> dict[str, list[str]]:
    """{run name: overrides} of every RL run: each estimator x seed."""
    return {f"{est}_s{seed}": [*ESTIMATORS[est], f"train.seed={seed}"]
            for est in args.estimators for seed in args.seeds}


def stage_eval_warm(args, state: dict) -> dict:
    run = os.path.join(args.runs, "sft")
    return {"seconds": run_cli(args, ["eval", run, f"mesh.data={args.devices}", *args.set_eval], state)}


def stage_rl(args, state: dict) -> dict:
    done = state.setdefault(RUN_RECORDS["rl"], {})
    for name, overrides in rl_runs(args).items():
        if name in done:
            continue
        run = os.path.join(args.runs, f"rl_{name}")
        argv = ["train", "alfworld_laptop_rl", f"model.path={os.path.join(args.runs, 'sft')}",
                f"train.run_dir={run}", f"mesh.data={args.devices}", *overrides, *args.set_rl]
        seconds = run_cli(args, argv + (["--resume"] if has_checkpoint(run) else []), state)
        done[name] = {"run": run, "seconds": seconds}
        save_state(args.out, state)
    return {"runs": sorted(done)}


def stage_eval_rl(args, state: dict) -> dict:
    done = state.setdefault(RUN_RECORDS["eval_rl"], {})
    for name in rl_runs(args):
        if name not in done:
            run = os.path.join(args.runs, f"rl_{name}")
            done[name] = {"seconds": run_cli(args, ["eval", run, f"mesh.data={args.devices}",
                                                    *args.set_eval], state)}
            save_state(args.out, state)
    return {"runs": sorted(done)}


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
    return {k: float(np.mean(v)) for k, v in sorted(values.items())}


def _cell(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "-"
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"


def stage_report(args, state: dict) -> dict:
    rows = {"warm start (SFT)": [last_eval(os.path.join(args.runs, "sft", "eval"))]}
    probe = os.path.join(args.runs, "sft_walkthroughs_only", "eval")
    if os.path.isdir(probe):  # the ablation: SFT on the walkthroughs alone (docs/results.md)
        rows = {"SFT, walkthroughs only": [last_eval(probe)], **rows}
    runs = {name: os.path.join(args.runs, f"rl_{name}") for name in rl_runs(args)}
    for est in args.estimators:
        rows[est] = [last_eval(runs[f"{est}_s{seed}"]) for seed in args.seeds
                     if os.path.isdir(runs[f"{est}_s{seed}"])]
    levels = {name: mean_over_iterations(run, "hierarchy/") for name, run in runs.items()
              if os.path.isdir(run)}
    diag = {name: mean_over_iterations(run, "diag/") for name, run in runs.items() if os.path.isdir(run)}
    results = {"table1": rows, "table5": levels, "diagnostic": diag, "state": state,
               "seeds": args.seeds}
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    head = " | ".join(f"In {t}" for t in TYPES.values()) + " | " + " | ".join(
        f"Out {t}" for t in TYPES.values())
    lines = [f"| method | {head} |", "|---" * (1 + 2 * len(TYPES)) + "|"]
    for name, evals in rows.items():
        cells = [_cell([e[f"{split}/{t}"] for e in evals if f"{split}/{t}" in e])
                 for split in SPLITS for t in TYPES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write("Success (%) on every valid_seen (In) and valid_unseen (Out) game, temperature 0.4;"
                f" RL rows: mean ± std over seeds {args.seeds}.\n\n" + "\n".join(lines) + "\n")
    from experiments import plot

    seed0 = [runs[f"{est}_s{args.seeds[0]}"] for est in args.estimators
             if os.path.isdir(runs[f"{est}_s{args.seeds[0]}"])]
    if seed0:
        plot.main([*seed0, "--out", os.path.join(args.out, "dynamics.png")])
    return {"rows": list(rows)}


def finished(stage: str, args, state: dict) -> bool:
    """Whether `stage` is complete: recorded done and, for the RL stages, every run of this
    invocation's estimators x seeds recorded (a sitting with `--estimators hgpo_k2 --seeds 0`
    leaves the others to do)."""
    if stage not in state["done"]:
        return False
    records = RUN_RECORDS.get(stage)
    return records is None or set(rl_runs(args)) <= set(state.get(records, {}))


def stages_to_run(args, state: dict) -> list[str]:
    """`--stage` alone, or every stage not complete yet, in order; the report is cheap and is
    always made again (it reads whatever runs exist)."""
    if args.stage:
        return [args.stage]
    return [s for s in STAGES if s == "report" or not finished(s, args, state)]


STAGE_FUNCS = {"experts": stage_experts, "sft": stage_sft, "eval_warm": stage_eval_warm,
               "rl": stage_rl, "eval_rl": stage_eval_rl, "report": stage_report}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", choices=STAGES, default=None, help="run one stage only")
    parser.add_argument("--status", action="store_true", help="print what is done and exit")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "alfworld_laptop"))
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs", "alfworld_laptop"))
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
        for stage in STAGES:
            d = state["done"].get(stage)
            mark = "done" if finished(stage, args, state) else "partly done"
            print(f"{stage:>10}: " + (f"{mark} in {d['seconds']:.0f} s  {d.get('result', '')}" if d
                                      else "not done"))
        return 0
    todo = stages_to_run(args, state)
    for stage in todo:
        if stage not in STAGE_FUNCS:
            print(f"{stage}: not implemented yet", flush=True)
            break
        t0 = time.perf_counter()
        result = STAGE_FUNCS[stage](args, state)
        state["done"][stage] = {"seconds": time.perf_counter() - t0, "result": result,
                                "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        save_state(args.out, state)
        print(f"{stage}: done in {state['done'][stage]['seconds']:.0f} s: {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
