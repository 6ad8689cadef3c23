"""The critic: a policy's backbone with value heads in place of the LM head (PPO's and HiPER's
`Algorithm.state_model`), and the value heads' initialisation (`hgpo_jax.models.decoder`)."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
from flax import nnx

from hgpo_jax.models.config import DecoderConfig
from hgpo_jax.models.decoder import CausalLM
from hgpo_jax.models.layers import INIT
from hgpo_jax.models.lora import is_adapter_path


class CriticModel(CausalLM):
    """A decoder backbone with `num_heads` value heads and no LM head: Hugging Face's
    `...ForTokenClassification` of the family (`Qwen2ForTokenClassification`, ...) with
    `num_labels=num_heads` (1: the critic verl builds for PPO).

    `critic(input_ids, attention_mask=...)` -> values float32 [B, T] with one head, [B, T, H] with
    H = num_heads > 1, one per position (the value of the state that the tokens up to and
    including that position make; head h is one learned value, e.g. of one level of a hierarchy).
    The head `score` is a Linear(hidden, num_heads) with a bias, initialized as transformers does
    a missing head: N(0, 0.02) weights, zero bias. The options are CausalLM's.
    """

    def __init__(self, config: DecoderConfig, *, dtype="float32", param_dtype="float32",
                 rngs: nnx.Rngs | None = None, num_heads: int = 1, **options):
        num_heads = check_num_heads(num_heads)
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, lm_head=False,
                         **options)
        self.num_heads = num_heads
        self.score = nnx.Linear(config.hidden_size, num_heads, use_bias=True, kernel_init=INIT,
                                bias_init=nnx.initializers.zeros_init(), dtype=self.dtype,
                                param_dtype=self.param_dtype, rngs=rngs)

    def __call__(self, input_ids, *, positions=None, attention_mask=None, cache=None):
        if cache is not None:
            raise ValueError("a critic scores whole rows; it takes no KV cache")
        hidden, _ = self.hidden_states(input_ids, positions=positions, attention_mask=attention_mask)
        return self.values(hidden)

    def values(self, hidden):
        """Final hidden states [..., D] -> values float32 [...] (one head: the head axis dropped)
        or [..., H] (H = num_heads > 1)."""
        values = self.score(hidden).astype(jnp.float32)
        return values[..., 0] if self.num_heads == 1 else values

    def logits(self, hidden):
        raise TypeError("a CriticModel has no LM head: use values()")


def check_num_heads(num_heads) -> int:
    """`num_heads` as an int >= 1 (a critic's value heads); ValueError otherwise."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"a critic needs num_heads >= 1 value heads (an int), got {num_heads!r}")
    return int(num_heads)


def new_value_head(leaf: str, shape: tuple[int, ...], dtype, seed: int):
    """A new critic head's `kernel` [D, H] (N(0, 0.02), transformers' initializer_range) or `bias`
    [H] (0), as a host (NumPy) array; one key for the whole kernel, so H = 1 draws what it always
    has for `seed`."""
    import numpy as np

    if leaf == "bias":
        return np.zeros(shape, dtype)
    return (0.02 * np.asarray(jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32))).astype(dtype)


def critic_from_policy(policy: CausalLM, seed: int = 0, num_heads: int = 1) -> CriticModel:
    """A CriticModel whose backbone is a copy of `policy`'s (same layout, dtypes, placement and
    options) with `num_heads` new value heads (`new_value_head`, seeded with `seed`): verl's
    critic, started from the policy's checkpoint. A policy with adapters gives a critic with its
    own copy of them on the SAME frozen base arrays (not copied: nothing trains them)."""
    lora = getattr(policy, "lora", None)
    options = dict(remat=policy.remat, batch_mesh=policy.batch_mesh, scan_layers=policy.scan_layers,
                   attention=policy.attention, lora=lora)
    abstract = nnx.eval_shape(lambda: CriticModel(policy.config, dtype=policy.dtype,
                                                  param_dtype=policy.param_dtype,
                                                  rngs=nnx.Rngs(0), num_heads=num_heads, **options))
    graphdef, state = nnx.split(abstract)
    backbone = dict(nnx.to_flat_state(nnx.state(policy.model)))
    filled = []
    for path, var in nnx.to_flat_state(state):
        if path[0] == "model":
            value = backbone[path[1:]][...]
            value = jnp.copy(value) if lora is None or is_adapter_path(path) else value
        else:  # the head, replicated like the backbone's scales
            value = jnp.asarray(new_value_head(path[-1], var.shape, var.dtype, seed))
        filled.append((path, var.replace(value=value)))
    return nnx.merge(graphdef, nnx.from_flat_state(filled))
