"""What a rollout samples with: the policy (weights, tokenizer, sampling settings and its sampler)
and how a step's prompt text becomes token ids (the chat template, cut from the left to
`max_prompt_tokens`, the cuts counted and the first one warned about)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any


def encode_prompt(tokenizer, text: str, max_prompt_tokens: int) -> list[int]:
    """The token ids a step's prompt text becomes: the tokenizer's chat template around one user
    message, cut to its last `max_prompt_tokens` tokens (left truncation, as the authors')."""
    return encode_prompt_with_length(tokenizer, text, max_prompt_tokens)[0]


def encode_prompt_with_length(tokenizer, text: str, max_prompt_tokens: int) -> tuple[list[int], int]:
    """(`encode_prompt`'s token ids, the prompt's length in tokens before the cut): the prompt
    lost its start when the length is beyond `max_prompt_tokens`."""
    ids = tokenizer.chat_prompt([{"role": "user", "content": text}])
    return ids[-max_prompt_tokens:], len(ids)


_warned_prompt_cut = False  # the first prompt cut in this process warns; later ones are counted only


def prompt_cut_message(max_prompt_tokens: int, longest: int) -> str:
    """The warning of the first prompt `rollout.max_prompt_tokens` cuts (one line)."""
    return (f"rollout.max_prompt_tokens={max_prompt_tokens} cut the start of a prompt: the longest "
            f"prompt so far has {longest} tokens, of which the model sees the last "
            f"{max_prompt_tokens} (the task and the oldest memory go first); raise "
            f"rollout.max_prompt_tokens to at least {longest} or shorten the prompts "
            "(env.memory_len), and watch rollout/truncated_prompt_rate")


@dataclasses.dataclass
class PromptCuts:
    """What a policy's `encode_prompt` has done so far: prompts encoded, prompts cut to
    `max_prompt_tokens` (left truncation) and the longest prompt seen, in tokens before any cut.
    The first cut in a process warns once (`prompt_cut_message`)."""

    prompts: int = 0
    cut: int = 0
    longest: int = 0

    def add(self, length: int, max_prompt_tokens: int) -> None:
        """Count one prompt of `length` tokens (before the cut)."""
        global _warned_prompt_cut
        self.prompts += 1
        self.longest = max(self.longest, length)
        if length > max_prompt_tokens:
            self.cut += 1
            if not _warned_prompt_cut:
                _warned_prompt_cut = True
                warnings.warn(prompt_cut_message(max_prompt_tokens, self.longest), UserWarning,
                              stacklevel=3)


@dataclasses.dataclass
class Policy:
    """What a rollout needs of the model: weights, tokenizer, sampling settings and the sampler
    whose compiled programs it generates with (`hgpo_jax.rl.sampling.Sampler`: a run passes its
    own to every policy it makes, so its programs are reused across iterations and go with the
    run; default: a sampler of this policy's own)."""

    model: Any
    tokenizer: Any
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    max_prompt_tokens: int = 2048
    prefill_chunk: int = -1  # the sampler's prefill chunk (-1 = auto; `generate`'s prefill_chunk)
    decode_attention: str = "auto"  # the sampler's decode attention (`generate`'s decode)
    max_num_seqs: int = 0  # the most prompts generated at once (`generate`'s max_rows; 0 = all)
    sampler: Any = dataclasses.field(default=None, repr=False, compare=False)
    # prompts encoded and cut so far (collect_rollouts reports each rollout's share)
    prompt_cuts: PromptCuts = dataclasses.field(default_factory=PromptCuts, repr=False, compare=False)

    def __post_init__(self):
        if self.sampler is None:
            from hgpo_jax.rl.sampling import Sampler

            self.sampler = Sampler()

    @classmethod
    def of_rollout(cls, model, tokenizer, rollout, temperature: float, sampler=None) -> "Policy":
        """The policy a config's `rollout` section samples with (its top_p, top_k, max_new_tokens,
        max_prompt_tokens, prefill_chunk, decode_attention, max_num_seqs), at `temperature`,
        generating with `sampler` (None: a sampler of its own)."""
        return cls(model, tokenizer, temperature=temperature, top_p=rollout.top_p,
                   top_k=rollout.top_k, max_new_tokens=rollout.max_new_tokens,
                   max_prompt_tokens=rollout.max_prompt_tokens, prefill_chunk=rollout.prefill_chunk,
                   decode_attention=rollout.decode_attention, max_num_seqs=rollout.max_num_seqs,
                   sampler=sampler)

    def encode_prompt(self, text: str) -> list[int]:
        """Chat-template a user message; keeps the last `max_prompt_tokens` tokens if too long
        (counted in `prompt_cuts`)."""
        ids, length = encode_prompt_with_length(self.tokenizer, text, self.max_prompt_tokens)
        self.prompt_cuts.add(length, self.max_prompt_tokens)
        return ids

    def generate(self, prompts: list[list[int]], rng, row_ids=None):
        """Sample a reply to each prompt; row_ids: each prompt's row (its env's global index),
        which makes the samples independent of the batch and of the process count."""
        from hgpo_jax.rl.sampling import generate

        return generate(self.model, prompts, self.max_new_tokens, temperature=self.temperature,
                        top_p=self.top_p, top_k=self.top_k,
                        eos_token_id=self.tokenizer.eos_token_ids, rng=rng,
                        prefill_chunk=self.prefill_chunk, row_ids=row_ids,
                        decode=self.decode_attention, max_rows=self.max_num_seqs,
                        sampler=self.sampler)
