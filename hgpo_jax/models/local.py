"""Models built here (no download): a tokenizer trained on a corpus of text, Qwen2.5's chat
template, and a random-weight decoder of a preset size and family (qwen2 by default; qwen3, llama).

    tokenizer = train_tokenizer(texts, vocab_size=4096)
    folder = build_model(out_dir, tokenizer, size="small", family="qwen3")

Real Qwen2.5 checkpoints cannot be fetched here; learning experiments start from these models
and a supervised warm start (`hgpo-jax sft`). The tokenizer is a byte-level BPE without word
pre-splitting, so merges may cross spaces: the fixed parts of the env's prompts (the template's
instructions, frequent phrases, the action names) become few tokens and prompts stay short. Its
special tokens are Qwen's, and its chat template is Qwen2.5-Instruct's, verbatim.

Which corpus (an env's own text) and the `build:<env>-<size>` model paths are the recipe's
business (`hgpo_jax.build`): models know nothing of environments.
"""

from __future__ import annotations

import dataclasses
import os

from hgpo_jax.models.config import DecoderConfig
from hgpo_jax.models.families import get_family
from hgpo_jax.models.tokenizer import QWEN2_5_CHAT_TEMPLATE, Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Preset sizes of the models built here (parameters without the embeddings in brackets).
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),  # (~0.1 M)
    "small": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2),  # (~0.8 M)
    "base": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                 num_attention_heads=8, num_key_value_heads=4),  # (~4.6 M)
}
# What a built model of each family sets beyond the preset size (the rest: the family's defaults,
# e.g. Qwen3's per-head q/k norms, Llama's bias-free attention). A family with a head_dim default
# of its own (Qwen3: 128, larger than these models' hidden sizes) gets hidden / heads explicitly;
# the tokenizer and chat template are the same for every family.
FAMILY_SETTINGS = {
    "qwen2": dict(rope_theta=1_000_000.0),
    "qwen3": dict(rope_theta=1_000_000.0),
    "llama": dict(rope_theta=500_000.0),
}
PIECE_BOUNDARY = r"['\[\]\n]"  # tokens never cross a quote, a bracket or a line break


def train_tokenizer(texts: list[str], vocab_size: int, *, isolate: str | None = None,
                    chat_template: str = QWEN2_5_CHAT_TEMPLATE) -> Tokenizer:
    """A byte-level BPE (merges may cross spaces) with Qwen's special tokens, trained on `texts`.
    isolate: a regex whose matches are pieces of their own (no merge crosses their edges), e.g.
    capitalised words, so that a name is cut into the same tokens wherever it stands (after a
    space, a quote, a tag or at a line's start) and copying it is copying its tokens."""
    from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not texts:
        raise ValueError("train_tokenizer needs a non-empty corpus")
    raw = RawTokenizer(models.BPE())
    # pieces: lines, quoted spans and brackets stand alone (so an action such as 'go to desk 1'
    # is its own piece); inside a piece merges may cross spaces
    splits = [pre_tokenizers.Split(Regex(PIECE_BOUNDARY), behavior="isolated")]
    if isolate:
        splits.append(pre_tokenizers.Split(Regex(isolate), behavior="isolated"))
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    raw.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", chat_template=chat_template)
    return Tokenizer(hf)


def model_config(size: str, vocab_size: int, eos_token_id: int,
                 max_position_embeddings: int = 8192, family: str = "qwen2") -> DecoderConfig:
    """The config of a preset size and family for a vocabulary of `vocab_size` tokens."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; use one of {sorted(SIZES)}")
    if family not in FAMILY_SETTINGS:
        raise ValueError(f"no built models of family {family!r}; use one of "
                         f"{sorted(FAMILY_SETTINGS)}")
    shape = SIZES[size]
    settings = dict(FAMILY_SETTINGS[family])
    if get_family(family).default_head_dim is not None:
        settings["head_dim"] = shape["hidden_size"] // shape["num_attention_heads"]
    return DecoderConfig(model_type=family, vocab_size=vocab_size,
                         max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=True, eos_token_id=eos_token_id, bos_token_id=None,
                         **shape, **settings)


def build_model(out_dir: str | os.PathLike, tokenizer: Tokenizer, size: str = "small", seed: int = 0,
                overwrite: bool = False, family: str = "qwen2",
                rope_theta: float | None = None) -> str:
    """Write a random-weight HF folder of `family` (config, safetensors, tokenizer); returns it.
    rope_theta: RoPE's base instead of the family's (FAMILY_SETTINGS); the weights are the same
    either way (the base is not a weight)."""
    from flax import nnx

    from hgpo_jax.models.hf_io import save_pretrained
    from hgpo_jax.models.decoder import CausalLM

    config = model_config(size, tokenizer.vocab_size, tokenizer.end_of_turn_id, family=family)
    if rope_theta is not None:
        if not rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {rope_theta}")
        config = dataclasses.replace(config, rope_theta=float(rope_theta))
    config = dataclasses.replace(config, extra=dict(config.extra))
    model = CausalLM(config, rngs=nnx.Rngs(seed))
    return save_pretrained(model, out_dir, tokenizer=tokenizer, overwrite=overwrite)
