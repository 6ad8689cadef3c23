"""PPO clipped surrogate with dual clip, a KL penalty to the reference policy and an entropy bonus
(verl semantics).

Pure, jittable and differentiable. Shapes: S sequences of L tokens; `mask` [S, L] marks the
response tokens that count (1) and padding (0).

  ratio   = exp(clamp(logp - old_logp, -20, 20))
  pg1     = -A * ratio,  pg2 = -A * clip(ratio, 1 - clip_low, 1 + clip_high)
  pg      = max(pg1, pg2), and for A < 0: min(pg, -A * dual_clip)
  kl      = low_var_kl (k3): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]
            kl (k1): logp - ref        mse (k2): 0.5 * (logp - ref)^2
  entropy = per-token entropy of the policy's next-token distribution over the vocabulary,
            logsumexp(z) - sum_v softmax(z)_v z_v of the fp32 logits z (`softmax_entropy`;
            an input here, computed by `hgpo_jax.rl.update.token_logprobs(..., with_entropy=True)`)
  loss    = agg(pg) - entropy_coef * agg(entropy) + kl_coef * agg(kl)

Aggregation `agg`: "token-mean" = sum(x * mask) / sum(mask) over the whole batch; "seq-mean" =
mean over sequences that have at least one token of their masked token mean (verl's
"seq-mean-token-mean"). An all-zero mask gives 0, not NaN. Metrics: pg_loss, kl_loss (the two
aggregated terms), pg_clipfrac = token-mean of (pg2 > pg1), ppo_kl = token-mean of
(old_logp - logp), and, when an entropy is given, entropy = agg(entropy) (with the same `agg`).
Without an entropy (None) there is no entropy term and no `entropy` metric.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from hgpo_jax.algo_specs import AGGS, KL_TYPES


def mean_over(x, mask):
    """sum(x * mask) / sum(mask) over all entries; 0 when the mask is empty. Scalar."""
    total = jnp.sum(mask)
    safe = jnp.where(total > 0, total, 1.0)
    return jnp.where(total > 0, jnp.sum(x * mask) / safe, 0.0)


def aggregate(x, mask, agg: str):
    """Reduce per-token values x [S, L] under mask [S, L] to a scalar ("token-mean" or "seq-mean")."""
    if agg == "token-mean":
        return mean_over(x, mask)
    if agg == "seq-mean":
        per_seq_tokens = jnp.sum(mask, axis=-1)  # [S]
        has = per_seq_tokens > 0
        seq_mean = jnp.sum(x * mask, axis=-1) / jnp.where(has, per_seq_tokens, 1.0)  # [S]
        return mean_over(seq_mean, has.astype(x.dtype))
    raise ValueError(f"unknown agg {agg!r}; expected one of {AGGS}")


def softmax_entropy(logits, logz=None):
    """Entropy of softmax(logits) over the last axis: logits [..., V] -> [...], in logits' dtype.

    `logz` = logsumexp(logits, -1) when the caller has it already. Summed as
    sum_v p_v (logz - z_v), whose terms are all >= 0: the same value as logz - sum_v p_v z_v
    without the cancellation between two large numbers. Differentiable. The logits must be
    finite (a -inf logit gives 0 * inf = NaN); a linear LM head's always are.
    """
    if logz is None:
        logz = jax.nn.logsumexp(logits, axis=-1)
    neg_logp = logz[..., None] - logits
    return jnp.sum(jnp.exp(-neg_logp) * neg_logp, axis=-1)


def kl_estimate(logp, ref_logp, kl_type: str):
    """Per-token KL estimate between the policy and the reference. [S, L]."""
    if kl_type == "low_var_kl":
        log_ratio = ref_logp - logp
        return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)
    if kl_type == "kl":
        return logp - ref_logp
    if kl_type == "mse":
        return 0.5 * jnp.square(logp - ref_logp)
    raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")


def ppo_kl_loss(logp, old_logp, ref_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: float | None = 3.0, kl_coef: float = 0.01, kl_type: str = "low_var_kl",
                agg: str = "token-mean", entropy=None, entropy_coef: float = 0.0):
    """PPO-clip + dual-clip surrogate - entropy_coef * entropy + kl_coef * KL(policy || reference).

    Args:
      logp, old_logp, ref_logp: float [S, L] token log-probs under the current, rollout-time and
        reference policies. Gradients flow through `logp` only in practice (the others are data).
      advantages: float [S] (one value per sequence, broadcast over tokens) or [S, L].
      mask: [S, L], 1 for tokens that count, 0 for padding (bool or float).
      clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].
      dual_clip: bound -A * dual_clip on the loss of tokens with A < 0 (must be > 1); None = off.
      kl_coef: weight of the KL term. kl_type: "low_var_kl" (k3), "kl" (k1) or "mse" (k2).
      agg: "token-mean" or "seq-mean".
      entropy: float [S, L] per-token entropy of the current policy (differentiated: gradients
        flow through it to the logits), or None for no entropy term.
      entropy_coef: weight of the entropy bonus (subtracted from the loss). A nonzero Python
        number without an entropy is an error; a Python 0 leaves the loss exactly as without it.
    Returns:
      (loss scalar, {"pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss"} scalars, plus "entropy" when
      an entropy is given).
    Raises:
      ValueError (at trace time) for an unknown kl_type/agg, bad shapes, dual_clip <= 1, or an
      entropy_coef other than a Python 0 without an entropy.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")
    if agg not in AGGS:
        raise ValueError(f"unknown agg {agg!r}; expected one of {AGGS}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
    logp = jnp.asarray(logp)
    if logp.ndim != 2:
        raise ValueError(f"logp must be [S, L], got shape {logp.shape}")
    static_coef = isinstance(entropy_coef, (int, float))
    if entropy is None and not (static_coef and entropy_coef == 0):
        raise ValueError(f"entropy_coef={entropy_coef} needs an entropy [S, L]: pass entropy=... "
                         "(token_logprobs(..., with_entropy=True)), or leave entropy_coef at a "
                         "Python 0 (a traced entropy_coef always needs an entropy)")
    named = [("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)]
    if entropy is not None:
        named.append(("entropy", entropy))
    for name, a in named:
        if jnp.shape(a) != logp.shape:
            raise ValueError(f"{name} must have logp's shape {logp.shape}, got {jnp.shape(a)}")
    adv = jnp.asarray(advantages, logp.dtype)
    if adv.shape == logp.shape[:1]:
        adv = adv[:, None]
    elif adv.shape != logp.shape:
        raise ValueError(f"advantages must be [S]={logp.shape[:1]} or [S, L]={logp.shape}, got {adv.shape}")
    mask = jnp.asarray(mask).astype(logp.dtype)

    neg_approx_kl = jnp.clip(logp - old_logp, -20.0, 20.0)
    ratio = jnp.exp(neg_approx_kl)
    pg1 = -adv * ratio
    pg2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = jnp.maximum(pg1, pg2)
    if dual_clip is not None:
        pg = jnp.where(adv < 0, jnp.minimum(pg, -adv * dual_clip), pg)

    pg_loss = aggregate(pg, mask, agg)
    kl_loss = aggregate(kl_estimate(logp, ref_logp, kl_type), mask, agg)
    loss = pg_loss
    metrics = {
        "pg_loss": pg_loss,
        "pg_clipfrac": mean_over((pg2 > pg1).astype(logp.dtype), mask),
        "ppo_kl": mean_over(-neg_approx_kl, mask),
        "kl_loss": kl_loss,
    }
    if entropy is not None:
        entropy_loss = aggregate(jnp.asarray(entropy, logp.dtype), mask, agg)
        metrics["entropy"] = entropy_loss
        if not (static_coef and entropy_coef == 0):  # a Python 0: no term, no gradient work
            loss = loss - entropy_coef * entropy_loss
    loss = loss + kl_coef * kl_loss
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


ppo_kl_loss_jit = partial(jax.jit, static_argnames=("kl_type", "agg", "dual_clip"))(ppo_kl_loss)
