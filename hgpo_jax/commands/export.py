"""`hgpo-jax export RUN_DIR OUT_DIR [--overwrite] [--critic | --adapter]`: a run's latest policy
(or a PPO run's critic) as a Hugging Face folder; a LoRA run's policy merged (W + scale A B), or
with --adapter its adapters alone as a PEFT folder over the run's base."""

from __future__ import annotations

import os

from hgpo_jax.commands.common import show_progress


def cmd_export(args) -> int:
    from hgpo_jax.models import save_pretrained
    from hgpo_jax.runs import check_export_folder, is_run_dir, load_model, write_export_record

    if not is_run_dir(args.run_dir):
        raise FileNotFoundError(f"{args.run_dir} is not a run folder (no config.yaml and "
                                "checkpoints/)")
    check_export_folder(args.run_dir, args.out_dir, args.overwrite)
    adapter = getattr(args, "adapter", False)
    if args.critic and adapter:
        raise ValueError("--critic and --adapter: export one of them at a time")
    if args.critic:
        from hgpo_jax.runs import load_run_state_model

        model, tokenizer = load_run_state_model(args.run_dir, progress=show_progress(args))
    else:
        model, tokenizer, base = load_model(args.run_dir, progress=show_progress(args))
    what = "critic" if args.critic else "adapter" if adapter else "policy"
    if adapter:
        from hgpo_jax.models.hf_io import save_adapter

        if model.lora is None:
            raise ValueError(f"{args.run_dir} trained every weight (model.lora_rank=0): it has no "
                             "adapters; export it without --adapter")
        out = save_adapter(model, args.out_dir, base=os.path.abspath(base), overwrite=args.overwrite)
    else:
        out = save_pretrained(model, args.out_dir, tokenizer=tokenizer, overwrite=args.overwrite)
    write_export_record(out, args.run_dir, what)
    print(f"exported the latest checkpoint's {what} of {args.run_dir} to {out}")
    return 0
