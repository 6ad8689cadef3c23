"""`hgpo-jax export RUN_DIR OUT_DIR [--overwrite] [--critic]`: a run's latest policy (or a PPO
run's critic) as a Hugging Face folder."""

from __future__ import annotations

from hgpo_jax.commands.common import show_progress


def cmd_export(args) -> int:
    from hgpo_jax.models import save_pretrained
    from hgpo_jax.runs import check_export_folder, is_run_dir, load_model, write_export_record

    if not is_run_dir(args.run_dir):
        raise FileNotFoundError(f"{args.run_dir} is not a run folder (no config.yaml and "
                                "checkpoints/)")
    check_export_folder(args.run_dir, args.out_dir, args.overwrite)
    if args.critic:
        from hgpo_jax.runs import load_run_state_model

        model, tokenizer = load_run_state_model(args.run_dir, progress=show_progress(args))
    else:
        model, tokenizer, _ = load_model(args.run_dir, progress=show_progress(args))
    out = save_pretrained(model, args.out_dir, tokenizer=tokenizer, overwrite=args.overwrite)
    write_export_record(out, args.run_dir, "critic" if args.critic else "policy")
    print(f"exported the latest checkpoint's {'critic' if args.critic else 'policy'} of "
          f"{args.run_dir} to {out}")
    return 0
