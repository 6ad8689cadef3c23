"""`hgpo-jax train CONFIG|RUN_DIR [key=value ...] [--resume [--allow-change]]`: an RL run, then
the per-iteration table and the start-vs-end summary of its success."""

from __future__ import annotations

from hgpo_jax.commands.common import show_progress, start_run


def cmd_train(args) -> int:
    from hgpo_jax.trainers.rl import Trainer

    cfg, say = start_run(args, kind="rl")
    with Trainer(cfg, resume=args.resume, progress=show_progress(args),
                 allow_change=args.allow_change) as trainer:
        start = trainer.iteration
        if args.resume:
            say(f"resuming {trainer.run_dir} at iteration {start}", flush=True)
        history = trainer.train()
        say(f"\n{cfg.name}: iterations {start + 1}..{trainer.iteration} "
            f"(run folder {trainer.run_dir})")
        if history:
            say(_summary(history, start))
        if trainer.main:
            report_learning(trainer)
    return 0


def _summary(history: list[dict], start: int = 0) -> str:
    """The per-iteration table printed at the end of a run (held-out success columns included)."""
    columns = {"success/all": "success"}
    for key in sorted({k for m in history for k in m}):
        if key.startswith("eval/") and key.endswith("/all") and key.count("/") == 2:
            columns[key] = key[5:-4]
    columns.update({"rollout/mean_step_reward": "step_reward",
                    "rollout/invalid_action_rate": "invalid_rate", "train/loss": "loss",
                    "train/pg_loss": "pg_loss", "train/kl_loss": "kl_loss",
                    "train/pg_clipfrac": "pg_clipfrac", "train/mean_advantage": "mean_adv",
                    "time/iteration": "seconds"})
    lines = [f"{'iteration':>9} " + " ".join(f"{c:>12}" for c in columns.values())]
    for i, m in enumerate(history, start + 1):
        lines.append(f"{i:>9} " + " ".join(f"{m.get(k, float('nan')):>12.4g}" for k in columns))
    return "\n".join(lines)


def report_learning(trainer) -> None:
    """Start-vs-end success (first vs last third of the iterations) with standard errors: printed,
    logged to metrics.jsonl as summary/..., and the curves drawn to RUN_DIR/learning_curves.png."""
    from hgpo_jax.metrics import read_metrics
    from hgpo_jax.summary import format_summary, learning_summary, plot_learning_curves, summary_metrics

    records = read_metrics(trainer.run_dir)
    summary = learning_summary(records)
    if not summary:
        return
    trainer.logger.log(trainer.iteration, summary_metrics(summary))
    png = plot_learning_curves(trainer.run_dir, records)
    print("\nsuccess, first vs last third of the iterations (mean +/- binomial standard error):")
    print(format_summary(summary))
    print(f"curves: {png}")
