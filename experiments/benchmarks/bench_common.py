"""What the model and sampler benchmarks share: the tiny Qwen2 of the issue spec, built once
with transformers and loaded into Flax with the same weights. Benchmarks only (imports torch)."""

from __future__ import annotations

import tempfile

import torch
from transformers import Qwen2Config as HFConfig
from transformers import Qwen2ForCausalLM as HFModel

from hgpo_jax.models import load_pretrained

# 4 layers, hidden 256, 4 heads, 2 kv heads, intermediate 704, vocab 4096 (issue 5's benchmark).
BENCH_SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def bench_hf_model(seed: int = 0, folder=None):
    """The transformers model of BENCH_SHAPE (eval mode), its weights transformers' random init
    from `seed`; saved to `folder` when given."""
    torch.manual_seed(seed)
    hf = HFModel(HFConfig(**BENCH_SHAPE)).eval()
    if folder is not None:
        hf.save_pretrained(folder)
    return hf


def paired_models(seed: int = 0, meshes=()):
    """(transformers model in eval mode, the Flax model loaded from its saved checkpoint, then
    one more Flax model per mesh in `meshes`, loaded onto that mesh)."""
    hf = bench_hf_model(seed)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        return (hf, load_pretrained(d), *(load_pretrained(d, mesh=m) for m in meshes))
