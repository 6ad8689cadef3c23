"""Rotary position embeddings: plain (`rope_theta`) and scaled with type `llama3`.

The frequencies are transformers' to the last bit where it matters (float32 throughout, the same
order of operations), so logits agree with its models at long positions too.
"""

from __future__ import annotations

import math

import jax.numpy as jnp


def inv_frequencies(head_size: int, theta: float, scaling=None):
    """The hd/2 inverse frequencies float32 [hd/2] of a head of `head_size`; `scaling`: a
    `config.RopeScaling` (llama3) or None.

    llama3: wavelengths longer than original_max_position_embeddings / low_freq_factor are
    stretched by `factor`, those shorter than original / high_freq_factor kept, and the band
    between interpolated with weight (original / wavelength - low) / (high - low).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_size, 2, dtype=jnp.float32) / head_size))
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    stretched = jnp.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((old_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * stretched / scaling.factor + smooth * stretched
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return jnp.where(medium, smoothed, stretched).astype(jnp.float32)


def rope_cos_sin(positions, inv_freq):
    """positions int [B, T], inv_freq float32 [hd/2] -> (cos, sin) float32 [B, T, hd] (HF's
    non-interleaved layout)."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, hd/2]
    cos, sin = jnp.cos(freqs), jnp.sin(freqs)                     # each half once
    return jnp.concatenate([cos, cos], axis=-1), jnp.concatenate([sin, sin], axis=-1)


def apply_rope(x, cos, sin, *, heads_first: bool = True):
    """x [B, heads, T, hd] (or [B, T, heads, hd] with heads_first=False) rotated by position
    (cos/sin [B, T, hd]); math in float32."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos, sin = (cos[:, None], sin[:, None]) if heads_first else (cos[:, :, None], sin[:, :, None])
    return (x32 * cos + rotated * sin).astype(x.dtype)
