"""`hgpo-jax eval CONFIG|RUN_DIR [key=value ...] [--split S] [--games N] [--json] [--episodes
PATH]`: the success rates of a config's model or a run's latest checkpoint, recorded in the run's
eval/ folder (never in the run's own record), and their checks and output formats."""

from __future__ import annotations

import dataclasses
import json
import os
import time

from hgpo_jax.commands.common import command_config, printer, show_progress, start_distributed
from hgpo_jax.commands.fit import fit_device


def cmd_eval(args) -> int:
    from hgpo_jax.config import is_run_folder
    from hgpo_jax.runs import latest_checkpoint
    import jax

    from hgpo_jax.trainers.checks import check_backend, check_inputs, check_output_file
    from hgpo_jax.trainers.evaluator import Evaluator

    cfg = command_config(args)
    check_eval_args(cfg, args.split, args.games, args.episodes)
    splits = [args.split] if args.split else cfg.eval.splits
    check_inputs(cfg, kind="eval", run_dir=None, eval_splits=splits)  # before the plan
    if args.episodes:
        check_output_file(args.episodes, "--episodes")
    fit_device(args, "eval", say=printer(not getattr(args, "process_id", None)))  # before JAX starts
    main = start_distributed(args, cfg)  # before latest_checkpoint, which reads checkpoints with JAX
    say = printer(main)
    check_backend(cfg, jax.default_backend())
    run = os.path.abspath(args.config) if is_run_folder(args.config) else None
    found = latest_checkpoint(run) if run else None
    if run and found is None:
        raise ValueError(f"{args.config} has no checkpoint to evaluate yet; evaluate it after its "
                         "first checkpoint (train.save_every), or evaluate its CONFIG")
    if found:  # the run's latest weights as the model (runs.load_model reads a run folder)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=run))
    e = cfg.eval
    how = (f"{e.batches} batches x {e.batch_size} episodes per seed, seeds {e.seeds}"
           if e.protocol == "verl-agent" else "each game once")
    what = f"{run} at {'iteration' if found[0] == 'rl' else 'step'} {found[1]}" if found else (
        f"{cfg.name}'s model.path {cfg.model.path}")
    say(f"evaluating {what}: protocol {e.protocol} ({how}), temperature {e.temperature}", flush=True)
    results, episodes = {}, []
    # where the evaluation is recorded: the run's eval/; a config's model, in train.run_dir/eval/
    # unless that folder holds a run (another model: then nothing is recorded)
    home = run or (None if is_run_folder(cfg.run_path()) else os.path.abspath(cfg.run_path()))
    label = f"{found[0]}{found[1]}" if found else "model"
    record = eval_record_path(home, label) if home else None
    with Evaluator.load(cfg, progress=show_progress(args)) as evaluator:  # the policy alone
        for split in splits:
            if args.episodes:
                rates, played = evaluator.evaluate_episodes(split, args.games or None)
                episodes += [{"split": split, **dataclasses.asdict(ep)} for ep in played]
                results.update(rates)
            else:
                results.update(evaluator.evaluate(split, args.games or None))
            if record and main:  # each split's results kept at once, beside the settings they had
                write_eval_record(record, found, cfg, args, results)
    if main:
        say(f"recorded in {record}" if record else f"not recorded: {cfg.run_path()} holds a run "
            "(evaluate that run with hgpo-jax eval RUN_DIR)")
    if args.episodes and main:
        write_episodes(args.episodes, episodes)
        say(f"wrote {len(episodes)} episodes to {args.episodes}")
    for k, v in results.items():
        say(f"  {k:<60} {v:.4f}")
    if args.json:
        say(json.dumps(eval_json(results, splits)))
    return 0


EVAL_FOLDER = "eval"  # evaluations: RUN_DIR/eval/<time>-<kind><step>.json and metrics.jsonl


def eval_record_path(folder: str, label: str) -> str:
    """A new FOLDER/eval/<started>-<label>[-n].json for one evaluation (label: the checkpoint's
    kind and step, e.g. rl12, or "model" for a config's model.path)."""
    base = os.path.join(folder, EVAL_FOLDER, f"{time.strftime('%Y%m%d-%H%M%S')}-{label}")
    path, n = base + ".json", 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}.json"
    return path


def write_eval_record(path: str, found: tuple[str, int] | None, cfg, args, results: dict) -> None:
    """An evaluation, beside a run's own record (which it never touches): `path` holds the
    command, the checkpoint (`found`: kind and step; None for a config's model.path), the whole
    config it ran under and its results (rewritten atomically as each split's come in), and
    eval/metrics.jsonl gets them at the checkpoint's step (0 for a config's model; records of one
    step merge when read)."""
    from hgpo_jax.config import config_to_dict
    from hgpo_jax.metrics import MetricsLogger, write_atomically

    kind, step = found or ("model", 0)
    record = {"folder": os.path.dirname(os.path.dirname(path)), "kind": kind, "step": step,
              "model.path": cfg.model.path,
              "time": time.time(), "split": args.split, "games": args.games,
              "overrides": list(args.overrides), "results": results, "config": config_to_dict(cfg)}
    write_atomically(path, (json.dumps(record, indent=1) + "\n").encode("utf-8"))
    logger = MetricsLogger(os.path.dirname(path), tensorboard=False)
    try:
        logger.log(step, results)
    finally:
        logger.close()


def write_episodes(path: str, records: list[dict]) -> None:
    """`eval --episodes PATH`: one JSON object per episode per line, written atomically (a crash
    leaves the old file or the new one)."""
    from hgpo_jax.metrics import write_atomically

    write_atomically(path, "".join(json.dumps(r, default=str) + "\n" for r in records).encode("utf-8"))


def check_eval_args(cfg, split: str | None, games: int, episodes: str | None = None) -> None:
    """`eval`'s flags against the config, before anything heavy starts: --split one of the env's
    splits, --games >= 0 and --games and --episodes only under the each-once protocol (which plays
    N games, each once)."""
    from hgpo_jax.envs.registry import get_env

    splits = get_env(cfg.env.name).splits
    if split is not None and split not in splits:
        raise ValueError(f"--split {split!r}: env {cfg.env.name!r} has the splits {', '.join(splits)}")
    if games < 0:
        raise ValueError(f"--games {games}: give a number of games >= 1 (or 0: eval.games)")
    if games and cfg.eval.protocol != "each-once":
        raise ValueError(f"--games {games} counts the games of eval.protocol=each-once; this config "
                         f"evaluates under {cfg.eval.protocol!r} (eval.seeds x eval.batches x "
                         "eval.batch_size episodes): add eval.protocol=each-once, or set those keys")
    if episodes and cfg.eval.protocol != "each-once":
        raise ValueError(f"--episodes writes one line per game of eval.protocol=each-once; this config "
                         f"evaluates under {cfg.eval.protocol!r}: add eval.protocol=each-once")


def eval_json(results: dict[str, float], splits: list[str]) -> dict[str, dict]:
    """`eval --json`'s object: per split evaluated, 'score' (mean task score, None where the env
    has none), 'success', 'episodes' and every other rate of that split by its short name (task
    types, 'mean_length', 'ended', 'failed', 'all_std', ...). NaN becomes None (JSON has no NaN)."""
    out = {}
    for split in splits:
        prefix = f"eval/{split}/"
        rates = {k[len(prefix):]: (None if v != v else float(v)) for k, v in results.items()
                 if k.startswith(prefix)}
        out[split] = {"score": rates.pop("score", None), "success": rates.pop("all", None),
                      "episodes": int(rates.pop("episodes", 0) or 0), **rates}
    return out
