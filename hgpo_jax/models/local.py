"""Models built here (no download): a tokenizer trained on an environment's own text, Qwen2.5's
chat template, and a random-weight Qwen2 of a preset size.

    model.path=build:toy-small        # built once into $HGPO_JAX_CACHE/models/toy-small
    folder = resolve_model_path("build:alfworld-base")

Real Qwen2.5 checkpoints cannot be fetched here; learning experiments start from these models
and a supervised warm start (`hgpo-jax sft`). The tokenizer is a byte-level BPE without word
pre-splitting, so merges may cross spaces: the fixed parts of the env's prompts (the template's
instructions, frequent phrases, the action names) become few tokens and prompts stay short. Its
special tokens are Qwen's, and its chat template is Qwen2.5-Instruct's, verbatim.

The corpus is the env's own text: the (prompt, response) turns of its episodes rendered with the
chat template (`hgpo_jax.sft.data`): toy env: expert and random episodes of its train tasks;
ALFWorld: expert (walkthrough) episodes of 200 train games played on the real engine; WebShop:
200 scripted purchases of train goals.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid

from hgpo_jax.models.config import Qwen2Config
from hgpo_jax.models.tokenizer import QWEN2_5_CHAT_TEMPLATE, Tokenizer

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BUILD_PREFIX = "build:"
BUILD_VERSION = 1  # bump when the corpus, tokenizer or sizes change: older cached builds are not reused
ENVS = ("toy", "alfworld", "webshop")
CORPUS_EPISODES = 200  # expert episodes of the train split whose turns train the tokenizer
# Preset sizes of the models built here (parameters without the embeddings in brackets).
SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),  # (~0.1 M)
    "small": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2),  # (~0.8 M)
    "base": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=6,
                 num_attention_heads=8, num_key_value_heads=4),  # (~4.6 M)
}
VOCAB = {"toy": 1024, "alfworld": 4096, "webshop": 4096}
PIECE_BOUNDARY = r"['\[\]\n]"  # tokens never cross a quote, a bracket or a line break


def train_tokenizer(texts: list[str], vocab_size: int, *,
                    chat_template: str = QWEN2_5_CHAT_TEMPLATE) -> Tokenizer:
    """A byte-level BPE (merges may cross spaces) with Qwen's special tokens, trained on `texts`."""
    from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not texts:
        raise ValueError("train_tokenizer needs a non-empty corpus")
    raw = RawTokenizer(models.BPE())
    # pieces: lines, quoted spans and brackets stand alone (so an action such as 'go to desk 1'
    # is its own piece); inside a piece merges may cross spaces
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PIECE_BOUNDARY), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    raw.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", chat_template=chat_template)
    return Tokenizer(hf)


def model_config(size: str, vocab_size: int, eos_token_id: int,
                 max_position_embeddings: int = 8192) -> Qwen2Config:
    """The Qwen2 config of a preset size for a vocabulary of `vocab_size` tokens."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; use one of {sorted(SIZES)}")
    return Qwen2Config(vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
                       rope_theta=1_000_000.0, tie_word_embeddings=True, eos_token_id=eos_token_id,
                       bos_token_id=None, **SIZES[size])


def build_model(out_dir: str | os.PathLike, tokenizer: Tokenizer, size: str = "small", seed: int = 0,
                overwrite: bool = False) -> str:
    """Write a random-weight Qwen2 HF folder (config, safetensors, tokenizer); returns it."""
    from flax import nnx

    from hgpo_jax.models.hf_io import save_pretrained
    from hgpo_jax.models.qwen2 import Qwen2ForCausalLM

    config = model_config(size, tokenizer.vocab_size, tokenizer.end_of_turn_id)
    config = dataclasses.replace(config, extra=dict(config.extra))
    model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(seed))
    return save_pretrained(model, out_dir, tokenizer=tokenizer, overwrite=overwrite)


def env_corpus(env: str) -> list[str]:
    """The env's own text: its episodes' turns rendered with the chat template (toy: both the
    'toy' and the 'toy-history' variant)."""
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.sft import data

    if env == "toy":
        episodes = [ep for reveal in (False, True) for ep in
                    data.toy_episodes(range(300), "expert", reveal=reveal)
                    + data.toy_episodes(range(300), "random", seed=1, max_steps=12, reveal=reveal)]
        texts = data.samples_from_episodes(episodes, 4, get_env("toy").build_prompt)
    elif env in ENVS:  # expert episodes of train tasks, recorded by the env's registry entry
        from hgpo_jax.config import EnvConfig

        spec = get_env(env)
        episodes = spec.record_episodes(EnvConfig(name=env), "train", CORPUS_EPISODES, "expert")
        texts = data.samples_from_episodes(episodes, 2, spec.build_prompt)
    else:
        raise ValueError(f"no corpus for env {env!r}; use one of {ENVS}")
    return data.chat_texts(texts, QWEN2_5_CHAT_TEMPLATE)


def parse_build_spec(path: str) -> tuple[str, str]:
    """'build:toy-small' -> ('toy', 'small')."""
    spec = path[len(BUILD_PREFIX):]
    env, _, size = spec.rpartition("-")
    if env not in ENVS or size not in SIZES:
        raise ValueError(f"model.path {path!r}: expected build:<env>-<size> with env in {ENVS} and "
                         f"size in {sorted(SIZES)}, e.g. build:toy-small")
    return env, size


def build_for_env(path: str, folder: str, seed: int = 0) -> str:
    """Build `path` ('build:<env>-<size>') into `folder` atomically (once; a half-built folder is
    never used)."""
    env, size = parse_build_spec(path)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    tmp = f"{folder}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tokenizer = train_tokenizer(env_corpus(env), VOCAB[env])
        build_model(tmp, tokenizer, size, seed=seed)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not os.path.isfile(os.path.join(folder, "config.json")):
                raise  # not a concurrent build that won the race
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def resolve_model_path(path: str) -> str:
    """A model folder (config.json + weights + tokenizer) for `model.path`:
    'tiny' -> a tiny random Qwen2 built once in the cache; 'build:<env>-<size>' -> a Qwen2 of that
    size with a tokenizer trained on the env's text, built once in the cache; anything else must
    be an existing folder."""
    from hgpo_jax.envs.data import cache_root

    if path == "tiny":
        from hgpo_jax.models.tiny import build_tiny_pretrained

        folder = os.path.join(cache_root(), "tiny-qwen2")
        if not os.path.isfile(os.path.join(folder, "config.json")):
            print(f"building a tiny random Qwen2 in {folder} ...", flush=True)
            build_tiny_pretrained(folder, overwrite=True)
        return folder
    if path.startswith(BUILD_PREFIX):
        env, size = parse_build_spec(path)
        folder = os.path.join(cache_root(), "models", f"{env}-{size}-v{BUILD_VERSION}")
        if not os.path.isfile(os.path.join(folder, "config.json")):
            print(f"building {path} (tokenizer trained on the {env} env's text, random "
                  f"{size} Qwen2) in {folder} ...", flush=True)
            build_for_env(path, folder)
        return folder
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"model.path {path!r} is not a local folder. Download the checkpoint (e.g. "
            "`huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir DIR`) and pass "
            "model.path=DIR, use a run folder of hgpo-jax (its latest checkpoint), or build one "
            "here: model.path=tiny or model.path=build:<env>-<size> (e.g. build:toy-small)")
    return path
