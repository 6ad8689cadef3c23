"""Qwen2 / Qwen2.5 in Flax NNX, with torch-free Hugging Face weight port and export."""

from hgpo_jax.models.config import ConfigError, Qwen2Config
from hgpo_jax.models.hf_io import CheckpointError, load_pretrained, save_pretrained
from hgpo_jax.models.qwen2 import KVCache, Qwen2Critic, Qwen2ForCausalLM
from hgpo_jax.models.safetensors_io import SafetensorsError
from hgpo_jax.models.sharding import make_mesh, param_partition_spec, request_cpu_devices
from hgpo_jax.models.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "CheckpointError", "ConfigError", "KVCache", "Qwen2Config", "Qwen2Critic", "Qwen2ForCausalLM",
    "SafetensorsError", "Tokenizer", "load_pretrained", "load_tokenizer", "make_mesh",
    "param_partition_spec", "request_cpu_devices", "save_pretrained",
]
