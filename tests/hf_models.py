"""Tiny random models of every family built with transformers (torch), the numerical reference
of the tests: Qwen2 (`TINY_SHAPES`), Qwen3 and Llama (`FAMILY_SHAPES`)."""

import numpy as np
import torch
import transformers
from transformers import Qwen2Config as HFQwen2Config
from transformers import Qwen2ForCausalLM as HFQwen2ForCausalLM

# Several shapes: tied and untied embeddings, GQA ratios 1, 2 and 6, odd hidden sizes.
TINY_SHAPES = {
    "tied_gqa2": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "untied_gqa1": dict(vocab_size=150, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "untied_gqa6_odd": dict(vocab_size=97, hidden_size=36, intermediate_size=70, num_hidden_layers=2,
                            num_attention_heads=6, num_key_value_heads=1, tie_word_embeddings=False,
                            rope_theta=1_000_000.0),
    "tied_gqa2_odd3l": dict(vocab_size=211, hidden_size=60, intermediate_size=150,
                            num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
                            tie_word_embeddings=True, rms_norm_eps=1e-5),
}


# Qwen3 and Llama shapes (family, transformers config kwargs): tied and untied, head_dim other than
# hidden / heads, GQA ratios 1 to 6, llama3 RoPE scaling (original context 16 tokens, so that the
# test sequences reach all three frequency bands), and a Llama with every bias.
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
FAMILY_SHAPES = {
    "qwen3_untied_hd16_gqa6": ("qwen3", dict(
        vocab_size=120, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)),
    "qwen3_tied_gqa2": ("qwen3", dict(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
        rope_theta=1_000_000.0)),
    "llama_tied_llama3rope_gqa4": ("llama", dict(
        vocab_size=130, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
        rope_theta=500_000.0, rms_norm_eps=1e-5, rope_scaling=LLAMA3_ROPE)),
    "llama_untied_hd24_gqa1_bias": ("llama", dict(
        vocab_size=110, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=24, tie_word_embeddings=False,
        attention_bias=True, mlp_bias=True)),
    "llama_untied_gqa3": ("llama", dict(
        vocab_size=100, hidden_size=36, intermediate_size=72, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
        rope_scaling=LLAMA3_ROPE)),
}
HF_CLASSES = {  # family -> (config, causal LM, token classification) classes of transformers
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForTokenClassification"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForTokenClassification"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaForTokenClassification"),
}


def hf_class(family: str, kind: int):
    """transformers' class of `family`: kind 0 config, 1 causal LM, 2 token classification."""
    return getattr(transformers, HF_CLASSES[family][kind])


def random_model(make, folder=None, seed: int = 0, **save_kwargs):
    """`make()` (a transformers model) with every weight random from `seed`: norm scales near 1,
    the rest N(0, 0.08) (biases included); saved to `folder` when given."""
    torch.manual_seed(seed)
    model = make().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    if folder is not None:
        model.save_pretrained(folder, **save_kwargs)
    return model


def build_family_model(name: str, folder=None, seed: int = 0, **save_kwargs):
    """The transformers model of FAMILY_SHAPES[name] with every weight random, saved to `folder`."""
    family, shape = FAMILY_SHAPES[name]
    return random_model(lambda: hf_class(family, 1)(hf_class(family, 0)(**shape)), folder, seed,
                        **save_kwargs)


def build_hf_model(shape: dict, folder=None, seed: int = 0, **save_kwargs) -> HFQwen2ForCausalLM:
    """A transformers Qwen2 with every weight random (biases and norm scales included)."""
    return random_model(lambda: HFQwen2ForCausalLM(HFQwen2Config(**shape)), folder, seed,
                        **save_kwargs)


def hf_logits(model, input_ids, attention_mask=None) -> np.ndarray:
    with torch.no_grad():
        kw = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
        return model(torch.tensor(np.asarray(input_ids)), **kw).logits.float().numpy()


def load_hf(folder, dtype=torch.float32):
    """The causal LM in `folder`, whatever its family (transformers' Auto class)."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def right_padded_batch(vocab: int, lengths, seed: int = 0):
    """(ids int32 [R, max(lengths)], mask) of random tokens, row r real for its first lengths[r]
    tokens, 0 after."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, vocab, (len(lengths), max(lengths))).astype(np.int32)
    mask = np.zeros_like(ids)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
        ids[r, n:] = 0
    return ids, mask


def real_tokens_error(ours, ref, lengths) -> float:
    """The largest |ours - ref| over each row's real tokens (its first lengths[r])."""
    return max(float(np.abs(np.asarray(ours)[r, :n] - ref[r, :n]).max()) for r, n in enumerate(lengths))
