"""Supervised warm start: expert episodes -> rollout-identical samples -> next-token loss on the
responses (docs/sft.md)."""
