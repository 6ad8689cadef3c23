"""Supervised data for the warm start: recorded episodes and JSONL turns -> rollout-identical
samples (docs/sft.md; the trainer is `hgpo_jax.trainers.sft`)."""
