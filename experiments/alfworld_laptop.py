"""ALFWorld at laptop scale: the paper's pipeline end to end on real games, on a CPU (issue 15).

  python -m experiments.alfworld_laptop                 # every stage not finished yet, in order
  python -m experiments.alfworld_laptop --stage experts # one stage (resumes where it stopped)
  python -m experiments.alfworld_laptop --status        # what is done, with wall times

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

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from experiments import laptop

SHARD = 100  # games per recording shard
SEARCH_GAMES = 800  # train games with searching episodes (sft.data=expert+search:800)


# ----------------------------------------------------------------------------------- experts
def _record_shard(args: tuple) -> tuple[str, int, int, float]:
    """Record the winning episodes of one shard of train games into its JSONL file."""
    kind, index, games, path = args
    from hgpo_jax.envs.alfworld import alfworld_episodes
    from hgpo_jax.envs.episodes import save_episodes

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
    from hgpo_jax.envs.alfworld import alfworld_episodes_path
    from hgpo_jax.envs.episodes import load_episodes, save_episodes, spread

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


# ----------------------------------------------------------------------------------- sft
SPLITS = ("valid_seen", "valid_unseen")  # In-distribution, Out-of-distribution


def sft_overrides(args) -> list[str]:
    """The SFT command's episodes: --games walkthroughs and --search-games searching episodes."""
    return [*([f"sft.episodes={args.games}"] if args.games else []),
            "sft.data=expert" + (f"+search:{args.search_games}" if args.search_games else "")]


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


def table1_lines(rows: dict[str, list[dict]]) -> list[str]:
    """Table 1 layout: one row per method, In/Out x task type, mean ± std over its evaluations."""
    head = " | ".join(f"In {t}" for t in TYPES.values()) + " | " + " | ".join(
        f"Out {t}" for t in TYPES.values())
    lines = [f"| method | {head} |", "|---" * (1 + 2 * len(TYPES)) + "|"]
    for name, evals in rows.items():
        cells = [laptop.cell([e[f"{split}/{t}"] for e in evals if f"{split}/{t}" in e])
                 for split in SPLITS for t in TYPES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def stage_report(args, state: dict) -> dict:
    """The tables and the plot, from what OUT keeps (no run folder needed)."""
    return laptop.write_report(
        args, state, last_eval=last_eval, table1_lines=table1_lines,
        caption="Success (%) on every valid_seen (In) and valid_unseen (Out) game, temperature 0.4;",
        first_last_keys={"success": "success/all", "invalid": "rollout/invalid_action_rate"},
        runs_caption="RL runs: rollout success and invalid-action rate over the first and last 5"
                     " iterations")


# ----------------------------------------------------------------------------------- the study
def expert_caches(args) -> list[str]:
    """The episode files stage experts leaves in the cache."""
    from hgpo_jax.envs.alfworld import list_games
    from hgpo_jax.envs.alfworld import alfworld_episodes_path
    from hgpo_jax.envs.episodes import spread

    train = list_games("train")
    wanted = {"expert": args.games, **({"search": args.search_games} if args.search_games else {})}
    return [alfworld_episodes_path("train", len(spread(train, n)), kind) for kind, n in wanted.items()]


def add_arguments(parser) -> None:
    parser.add_argument("--workers", type=int, default=2, help="processes recording expert episodes")
    parser.add_argument("--games", type=int, default=0,
                        help="train games with expert episodes (0: all 3,553); smaller for a smoke test")
    parser.add_argument("--search-games", type=int, default=SEARCH_GAMES,
                        help="train games with the hand-coded expert's searching episodes (0: none)")


STUDY = laptop.Study(
    name="alfworld_laptop", sft_config="alfworld_laptop_sft", rl_config="alfworld_laptop_rl",
    experts=lambda args, state: stage_experts(args, state), report=lambda args, state: stage_report(args, state),
    experts_done=lambda args: all(os.path.isfile(p) for p in expert_caches(args)),
    sft_overrides=sft_overrides, add_arguments=add_arguments)


def finished(stage: str, args, state: dict) -> bool:
    return laptop.finished(STUDY, stage, args, state)


def stages_to_run(args, state: dict) -> list[str]:
    return laptop.stages_to_run(STUDY, args, state)


def main(argv=None) -> int:
    return laptop.main(STUDY, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
