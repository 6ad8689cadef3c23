"""The decoder of every model family in Flax NNX (Qwen2 / Qwen2.5, Qwen3, Llama 3.x: `families`).

What the families differ in is read from the `DecoderConfig` (biases, per-head q/k norms, head
size, RoPE scaling); everything else is one code path. Module and attribute names mirror Hugging
Face's causal LMs (`model.layers.3.self_attn.q_proj`, `...self_attn.q_norm`), so the weight port in
`hf_io.py` is a rename plus a transpose of linear kernels.

Shapes: B batch, T new tokens, S cache slots, D hidden, H query heads, K kv heads, hd head size,
V vocabulary.

One attention code path serves three uses:
- full forward (no cache): tokens occupy slots 0..T-1, keys are the same tokens;
- prefill and decode (with a `KVCache`): the T new tokens are written at slots
  `cache.index .. cache.index+T-1`, and every query attends to the valid slots at or before its own;
- decode into a ragged cache (`KVCache(ragged=True)`, after a right-padded prefill): each row's
  one new token is written at its own next slot (`cache.pos`), so a row's tokens are always its
  first slots, and its query reads those slots only (`gpu_attention.ragged_decode_attention`).
Left-padded rows are handled by `attention_mask` (0 on padding): padded slots are never attended to,
and RoPE positions count real tokens only, so a left-padded row gives the logits of the unpadded row.

The pieces live beside it: the attention paths in `attention.py`, the KV cache in `kv_cache.py`,
the layers in `layers.py`, the critic (value heads on the backbone) in `critic.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hgpo_jax.models.attention import resolve_attention
from hgpo_jax.models.config import DecoderConfig, resolve_dtype
from hgpo_jax.models.kv_cache import KVCache, layer_kv
from hgpo_jax.models.layers import (INIT, Decoder, remat_layer_output, stack_layers,
                                    unstack_layers)
from hgpo_jax.models.lora import LoraSpec, is_adapter_path, new_adapter_value
from hgpo_jax.models.rope import inv_frequencies, rope_cos_sin
from hgpo_jax.models.sharding import place_param, rows_sharding


class CausalLM(nnx.Module):
    """A causal language model of any registered family (`config.model_type`).

    `model(input_ids)` -> logits [B, T, V]. With `cache=` it returns `(logits, new_cache)`.
    `dtype` is the compute dtype, `param_dtype` the storage dtype of the weights. `remat=True`
    keeps only each layer's input for the backward pass and recomputes the layer (training at
    long sequence lengths; no effect on the values). `batch_mesh`: a Mesh whose batch axes
    ("data", "fsdp") split the batch dim of the activations between layers (set by
    `load_pretrained(mesh=...)`); without it XLA may split FSDP-sharded layers along the hidden
    dim instead, which defeats remat (a 4 -> 8 layer plan grew 0.97 -> 1.57 GiB, with it
    0.52 -> 0.56 GiB). No effect on the values.

    scan_layers: stacked layer weights run by `jax.lax.scan` (one compiled layer instead of L; see
    Decoder); same values as the unrolled form. attention: the training forward's attention
    path ('auto', 'einsum', 'xla', 'cudnn'; `resolve_attention`), used when rows are right-padded.
    lora: low-rank adapters on the linear layers it targets (`lora.py`; None: none), their A
    drawn from `lora_seed`, their B zero.
    """

    def __init__(self, config: DecoderConfig, *, dtype="float32", param_dtype="float32",
                 rngs: nnx.Rngs | None = None, remat: bool = False, batch_mesh=None,
                 scan_layers: bool = False, attention: str = "auto", lm_head: bool = True,
                 lora: LoraSpec | None = None, lora_seed: int = 0):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        resolve_attention(attention, jnp.float32, config.head_size)  # validates the name
        self.config = config
        self.remat = remat  # recompute each layer in the backward pass (training memory)
        self.batch_mesh = batch_mesh  # split activations' batch dim over its batch axes
        self.scan_layers = scan_layers
        self.attention = attention
        self.lora = lora
        self.dtype, self.param_dtype = resolve_dtype(dtype), resolve_dtype(param_dtype)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, rngs=rngs)
        self.model = Decoder(config, scan_layers=scan_layers, lora=lora, lora_seed=lora_seed, **kw)
        self.lm_head = (None if config.tie_word_embeddings or not lm_head else
                        nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False,
                                   kernel_init=INIT, **kw))

    def __call__(self, input_ids, *, positions=None, attention_mask=None, cache: KVCache | None = None):
        """input_ids int [B, T]; positions int [B, T] (default: count of real tokens before each,
        continuing from the cache); attention_mask {0,1} [B, T] (default all ones).

        Returns logits [B, T, V] in the compute dtype, or (logits, KVCache) when a cache is given.
        """
        hidden, new_cache = self.hidden_states(input_ids, positions=positions,
                                               attention_mask=attention_mask, cache=cache)
        logits = self.logits(hidden)
        return logits if cache is None else (logits, new_cache)

    def logits(self, hidden):
        """Final hidden states [B, T, D] -> logits [B, T, V]."""
        if self.lm_head is None:
            return self.model.embed_tokens.attend(hidden)
        return self.lm_head(hidden)

    def new_cache(self, batch: int, max_len: int, dtype="float32", ragged: bool = False
                  ) -> KVCache:
        """An empty KVCache in this model's layout (stacked for scanned layers); `ragged` for a
        ragged decode (`KVCache`; unrolled layers only)."""
        return KVCache.init(self.config, batch, max_len, dtype, stacked=self.scan_layers,
                            ragged=ragged)

    def hidden_states(self, input_ids, *, positions=None, attention_mask=None, cache=None,
                      last_only: bool = False, right_padded: bool = False):
        """Everything but the LM head: -> (hidden [B, T, D] after the final norm, new cache or None).

        last_only (a prefill that needs only the next-token logits): hidden is [B, 1, D], the last
        slot's, and the last layer computes keys and values for all T tokens but its queries,
        attention output and MLP for the last slot only (same values as hidden[:, -1:]).
        right_padded: the caller promises every row's real tokens come first (attention_mask a
        prefix of ones), which lets a forward without a cache take the fused attention path
        (`self.attention`); rows of all padding are fine. With a cache it is a prefill into an
        EMPTY cache (index 0; the caller's promise): the fused path (no [T, T] scores) where
        `self.attention` resolves to one, else the einsum path; keys/values of all T slots are
        written, key_mask marks the real ones, `pos` becomes the rows' lengths, and with
        last_only hidden is each row's LAST REAL token's (slot length-1; a row of only padding
        gives slot 0's, finite and meaningless).

        A ragged cache (`KVCache(ragged=True)`): filled by a right-padded prefill as above, then
        decoded one token per row per call (T = 1, not right_padded): each row's token is written
        at its slot `cache.pos` and reads its slots [0, pos] only (`Attention._ragged_decode`);
        a row whose attention_mask is 0 (finished) does not advance.
        """
        B, T = input_ids.shape
        new_mask = (jnp.ones((B, T), bool) if attention_mask is None
                    else attention_mask.astype(bool))
        start_pos = jnp.zeros((B,), jnp.int32) if cache is None else cache.pos
        if positions is None:
            counted = jnp.cumsum(new_mask.astype(jnp.int32), axis=1) - 1
            positions = jnp.maximum(start_pos[:, None] + counted, 0)
        if cache is None:
            key_mask, q_slots, S, index = new_mask, jnp.arange(T), T, None
        else:
            index, S = cache.index, cache.max_len
            key_mask = jax.lax.dynamic_update_slice(cache.key_mask, new_mask, (0, index))
            q_slots = index + jnp.arange(T)
        fused, last_slot = None, None
        if cache is not None and cache.ragged and not right_padded:
            if T != 1:
                raise ValueError(f"a ragged KV cache decodes one token per row per call, not {T}: "
                                 "fill it with a right-padded prefill (right_padded=True)")
            fused, last_only = ("ragged", self.batch_mesh), False
        elif (right_padded and cache is not None) or (
                cache is None and not last_only and (right_padded or attention_mask is None)):
            fused = resolve_attention(self.attention, self.dtype, self.config.head_size)
            fused = None if fused == "einsum" else (fused, self.batch_mesh)
        if right_padded and cache is not None and last_only:
            last_slot = jnp.maximum(new_mask.sum(axis=1) - 1, 0).astype(jnp.int32)  # [B]
        if fused is not None and fused[0] == "ragged":  # each row's slot stands for the mask
            mask = cache.pos                                                  # [B]
            key_mask = cache.key_mask
        elif fused is not None:  # the rows' lengths stand for the mask (at least 1: finite rows)
            mask = jnp.maximum(new_mask.sum(axis=1), 1).astype(jnp.int32)   # [B]
        else:
            causal = jnp.arange(S)[None, :] <= q_slots[:, None]              # [T, S]
            mask = (key_mask[:, None, None, :] & causal[None, None])          # [B, 1, T, S]

        cfg = self.config
        cos, sin = rope_cos_sin(positions, inv_frequencies(cfg.head_size, cfg.rope_theta,
                                                           cfg.rope_scaling))
        x = self._split_batch(self.model.embed_tokens(input_ids))
        run = self._scanned_layers if self.scan_layers else self._unrolled_layers
        x, kv = run(x, cos, sin, mask, cache, index, last_only, fused, last_slot)
        hidden = self.model.norm(x)
        if cache is None:
            return hidden, None
        return hidden, KVCache(k=kv[0], v=kv[1], key_mask=key_mask,
                               pos=start_pos + new_mask.sum(axis=1).astype(jnp.int32),
                               index=index + T, ragged=cache.ragged)

    def _unrolled_layers(self, x, cos, sin, mask, cache, index, last_only, fused, last_slot=None):
        """The L layers one after the other -> (x, (keys, values) tuples or None)."""
        new_k, new_v = [], []
        for i, layer in enumerate(self.model.layers):
            last = last_only and i == len(self.model.layers) - 1
            if cache is None and self.remat and not last:
                x = self._split_batch(remat_layer_output(layer, x, cos, sin, mask, fused))
                continue
            cache_kv = None if cache is None else layer_kv(cache, i)
            x, kv = layer(x, cos, sin, mask, cache_kv, index, last_query_only=last, fused=fused,
                          last_slot=last_slot)
            x = self._split_batch(x)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        return x, (None if cache is None else (tuple(new_k), tuple(new_v)))

    def _scanned_layers(self, x, cos, sin, mask, cache, index, last_only, fused, last_slot=None):
        """The stacked layers under `jax.lax.scan` -> (x, stacked (keys, values) or None).

        Without a cache the weights are the scan's xs (their gradients come back stacked), each
        layer rematerialized with `remat`. With a cache, the stacked keys/values ride in the carry
        and each layer writes only its T new slots. last_only: L-1 layers in the scan, the last one
        after it (its queries cover the last slot only).
        """
        if cache is not None and cache.ragged:
            raise ValueError("a ragged KV cache is one array per layer: run the model's layers "
                             "unrolled (relayout_layers(model, False)) to decode into it")
        graphdef, state = nnx.split(self.model.layers)
        L = self.config.num_hidden_layers
        n = L - 1 if last_only else L

        def apply(st, x, cache_kv=None, last=False):
            return nnx.merge(graphdef, st)(x, cos, sin, mask, cache_kv, index,
                                           last_query_only=last, fused=fused, last_slot=last_slot)

        layer_at = lambda i: jax.tree.map(lambda a: a[i], state)  # noqa: E731
        if cache is None:
            def body(x, st):
                f = lambda st, x: apply(st, x)[0]  # noqa: E731
                f = jax.checkpoint(f) if self.remat else f
                return self._split_batch(f(st, x)), None

            x, _ = jax.lax.scan(body, x, state if n == L else jax.tree.map(lambda a: a[:n], state))
            if last_only:
                x = self._split_batch(apply(layer_at(L - 1), x, last=True)[0])
            return x, None

        T = x.shape[1]

        def with_layer(carry, i, last=False):
            x, ks, vs = carry
            x, (ck, cv) = apply(layer_at(i), x, (ks[i], vs[i]), last)
            B, K, hd, _ = ck.shape
            new_k = jax.lax.dynamic_slice(ck, (0, 0, 0, index), (B, K, hd, T))
            new_v = jax.lax.dynamic_slice(cv, (0, 0, index, 0), (B, K, T, hd))
            ks = jax.lax.dynamic_update_slice(ks, new_k[None], (i, 0, 0, 0, index))
            vs = jax.lax.dynamic_update_slice(vs, new_v[None], (i, 0, 0, index, 0))
            return self._split_batch(x), ks, vs

        carry, _ = jax.lax.scan(lambda c, i: (with_layer(c, i), None), (x, cache.k, cache.v),
                                jnp.arange(n))
        if last_only:
            carry = with_layer(carry, L - 1, last=True)
        x, ks, vs = carry
        return x, (ks, vs)

    def _split_batch(self, x):
        """x [B, ...] constrained to be split over batch_mesh's batch axes (where they divide
        B); unchanged without a batch_mesh."""
        if self.batch_mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, rows_sharding(self.batch_mesh, x.shape))

    def num_params(self) -> int:
        return sum(x.size for x in jax.tree.leaves(nnx.state(self, nnx.Param)))


def cast_to_compute(model: CausalLM) -> CausalLM:
    """The model with its floating-point weights stored in its compute dtype (`model.dtype`), e.g.
    fp32 master weights as bf16. Outputs are unchanged: every layer (Linear, Embed, RMSNorm) casts
    its weights to the compute dtype where it uses them. Inside a jitted program that loops over
    the same weights (the sampler's decode), calling this before the loop converts each weight once
    per call instead of once per step. Changes `model` in place and returns it (unchanged when the
    weights are already in the compute dtype)."""
    dtype = jnp.dtype(model.dtype)
    if jnp.dtype(model.param_dtype) == dtype:
        return model
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    nnx.update(model, params)
    return model


def relayout_layers(model: CausalLM, scan_layers: bool) -> CausalLM:
    """The model with its layers in the other layout (stacked for `scan_layers`, else a list of
    L layers), same weights (placed where XLA puts them: `hgpo_jax.rl.update.shard_params` puts them
    back on a mesh's partition rules). Changes `model` in place and returns it (unchanged when the
    layout already matches)."""
    if model.scan_layers == scan_layers:
        return model
    layers = model.model.layers
    model.model.layers = (stack_layers(list(layers)) if scan_layers
                          else nnx.List(unstack_layers(layers)))
    model.scan_layers = scan_layers
    return model


def add_adapters(model, spec: LoraSpec, seed: int = 0):
    """`model` (a CausalLM without adapters) with new adapters of `spec`: the same base arrays
    (not copied), A from `seed` and each layer's path (`new_adapter_value`), B zero, placed as
    the partition rules say on the model's `batch_mesh`."""
    if getattr(model, "lora", None) is not None:
        raise ValueError("the model already has adapters")
    options = dict(remat=model.remat, batch_mesh=model.batch_mesh, scan_layers=model.scan_layers,
                   attention=model.attention, lora=spec)
    abstract = nnx.eval_shape(lambda: CausalLM(model.config, dtype=model.dtype,
                                               param_dtype=model.param_dtype, rngs=nnx.Rngs(0),
                                               **options))
    graphdef, state = nnx.split(abstract)
    base = dict(nnx.to_flat_state(nnx.state(model)))
    filled = []
    for path, var in nnx.to_flat_state(state):
        if is_adapter_path(path):
            dotted = ".".join(str(p) for p in path)
            host = new_adapter_value(dotted, var.shape, np.float32, seed)
            value = place_param(host, model.batch_mesh, dotted)
        else:
            value = base[path][...]
        filled.append((path, var.replace(value=value)))
    return nnx.merge(graphdef, nnx.from_flat_state(filled))
