"""Tiny Qwen2 checkpoints built locally (no download): random weights and a small BPE tokenizer.

Used by the demo, the tests and the `tiny_cpu` training config. The tokenizer is a byte-level BPE
trained in a second on a built-in ALFWorld-style corpus, with Qwen's chat special tokens.
"""

from __future__ import annotations

import dataclasses
import os

from flax import nnx

from hgpo_jax.models.config import DecoderConfig
from hgpo_jax.models.hf_io import save_pretrained
from hgpo_jax.models.decoder import CausalLM
from hgpo_jax.models.tokenizer import CHATML_TEMPLATE, Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TINY_CONFIG = DecoderConfig(
    vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    rope_theta=1_000_000.0, tie_word_embeddings=True)

_CORPUS = """\
You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a clean
mug in coffeemachine. Your current observation is: You are in the middle of a room. Looking quickly
around you, you see a cabinet 1, a countertop 1, a drawer 2, a fridge 1, a microwave 1, a sinkbasin 1,
a stoveburner 3, a toaster 1, and a garbagecan 1. Your admissible actions of the current situation
are: go to cabinet 1, go to countertop 1, open fridge 1, take mug 1 from countertop 1, clean mug 1
with sinkbasin 1, heat egg 2 with microwave 1, cool apple 1 with fridge 1, use desklamp 1, examine
book 3, inventory, look. Now it's your turn to take an action. You should first reason step-by-step
about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and
present it within <action> </action> tags. On the countertop 1, you see a mug 1, a knife 2 and a
peppershaker 1. You pick up the mug 1 from the countertop 1. Nothing happens. The fridge 1 is
closed. You open the fridge 1. You clean the mug 1 using the sinkbasin 1. You put the mug 1 in/on
the coffeemachine 1. Prior to this step, you have already taken 3 step(s). Below are the most
recent 2 observations and the corresponding actions you took: [Observation 1: ..., Action 1: ...]
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 a b c d e f g h i j k l m n o p q r s t u v w x y z
"""


def train_tiny_tokenizer(vocab_size: int = 1024) -> Tokenizer:
    """A byte-level BPE with Qwen's special tokens, trained on the built-in corpus."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    raw.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE)
    return Tokenizer(hf)


def build_tiny_pretrained(out_dir: str | os.PathLike, config: DecoderConfig = TINY_CONFIG,
                          seed: int = 0, overwrite: bool = False) -> str:
    """Write a random-weight Qwen2 HF folder with a trained tokenizer; returns the folder."""
    tokenizer = train_tiny_tokenizer(config.vocab_size)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, more than the config's "
                         f"vocab_size {config.vocab_size}")
    config = dataclasses.replace(config, eos_token_id=tokenizer.eos_token_ids[0],
                                 bos_token_id=None, extra=dict(config.extra))
    model = CausalLM(config, rngs=nnx.Rngs(seed))
    return save_pretrained(model, out_dir, tokenizer=tokenizer, overwrite=overwrite)
