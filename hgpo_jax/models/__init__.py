"""Decoder LLMs in Flax NNX (Qwen2 / Qwen2.5, Qwen3, Llama 3.x: `families`), with a torch-free
Hugging Face weight port and export."""

from hgpo_jax.models.config import ConfigError, DecoderConfig, RopeScaling
from hgpo_jax.models.critic import CriticModel
from hgpo_jax.models.decoder import CausalLM
from hgpo_jax.models.kv_cache import KVCache
from hgpo_jax.models.families import Family, family_names, get_family
from hgpo_jax.models.hf_io import CheckpointError, load_pretrained, save_pretrained
from hgpo_jax.models.safetensors_io import SafetensorsError
from hgpo_jax.models.sharding import make_mesh, param_partition_spec, request_cpu_devices
from hgpo_jax.models.tokenizer import Tokenizer, load_tokenizer

# The names these classes had when Qwen2 was the only family; same objects.
Qwen2Config, Qwen2ForCausalLM, Qwen2Critic = DecoderConfig, CausalLM, CriticModel

__all__ = [
    "CausalLM", "CheckpointError", "ConfigError", "CriticModel", "DecoderConfig", "Family",
    "KVCache", "Qwen2Config", "Qwen2Critic", "Qwen2ForCausalLM", "RopeScaling", "SafetensorsError",
    "Tokenizer", "family_names", "get_family", "load_pretrained", "load_tokenizer", "make_mesh",
    "param_partition_spec", "request_cpu_devices", "save_pretrained",
]
