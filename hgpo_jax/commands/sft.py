"""`hgpo-jax sft CONFIG [key=value ...] [--resume]`: the supervised warm start, then its
held-out losses."""

from __future__ import annotations

from hgpo_jax.commands.common import show_progress, start_run


def cmd_sft(args) -> int:
    from hgpo_jax.trainers.sft import SftTrainer

    cfg, say = start_run(args, kind="sft")
    with SftTrainer(cfg, resume=args.resume, progress=show_progress(args),
                    allow_change=args.allow_change) as trainer:
        start = trainer.step
        info = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in trainer.data_info.items())
        say(f"supervised data: {info}", flush=True)
        if args.resume:
            say(f"resuming {trainer.run_dir} at step {start}", flush=True)
        before = trainer.heldout_nll() if start == 0 and trainer.has_heldout else None
        history = trainer.train()
        say(f"\n{cfg.name}: steps {start + 1}..{trainer.step} (run folder {trainer.run_dir})")
        evals = [(start + i + 1, m) for i, m in enumerate(history) if "heldout/nll" in m]
        if not trainer.has_heldout:
            say("  no held-out loss (sft.heldout=0): every episode is trained on"
                + (f"; last train NLL {history[-1]['train/nll']:.4f}" if history else ""))
        elif start == 0:
            say(f"  held-out NLL per response token: {before:.4f} before training")
        for step, m in evals:
            say(f"  step {step:>6}: train NLL {m['train/nll']:.4f}, held-out NLL {m['heldout/nll']:.4f}")
        say(f"start an RL run from it with model.path={trainer.run_dir}")
    return 0
