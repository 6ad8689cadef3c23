"""How fast a small Qwen2 learns to copy, by RoPE base (issue 28: the WebShop warm starts do not
copy queries or product ids out of their prompts).

A synthetic induction task at the laptop model's shape (`build:<env>-small`: 4 layers, width 128,
4 heads of 32, 2 KV heads, vocabulary 4,096): each row is a random string S of `--span` tokens,
`--gap` random filler tokens, a separator, then S again; the loss is on the second S only. Rows
are fresh every step (nothing to memorise). Reported per `--every` steps: the mean NLL and the
greedy next-token accuracy on the copied tokens of a fixed held-out batch, for each RoPE base.

    python -m experiments.copy_probe --thetas 1e6 1e4 --steps 400 --out docs/results/copy_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def batch(rng, rows: int, span: int, gap: int, vocab: int):
    """(ids [rows, 2 span + gap + 1], loss mask [same]: 1 where the next token is a copied one)."""
    import numpy as np

    s = rng.integers(3, vocab, (rows, span))
    filler = rng.integers(3, vocab, (rows, gap))
    ids = np.concatenate([s, filler, np.full((rows, 1), 1), s], axis=1).astype(np.int32)
    mask = np.zeros(ids.shape, np.float32)
    mask[:, span + gap + 1:] = 1.0  # the copied tokens (predicted from the position before)
    return ids, mask


def probe(theta: float, args) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from hgpo_jax.models import DecoderConfig, CausalLM

    cfg = DecoderConfig(vocab_size=args.vocab, hidden_size=128, intermediate_size=352,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      rope_theta=theta, max_position_embeddings=8192)
    graphdef, params = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(args.seed)), nnx.Param)
    tx = optax.adamw(args.lr)
    opt = tx.init(params)

    def loss_fn(p, ids, mask):
        logits = nnx.merge(graphdef, p)(ids).astype(jnp.float32)[:, :-1]
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
        m = mask[:, 1:]
        acc = (jnp.argmax(logits, -1) == ids[:, 1:]).astype(jnp.float32)
        return (nll * m).sum() / m.sum(), (acc * m).sum() / m.sum()

    @jax.jit
    def step(p, o, ids, mask):
        (loss, acc), g = jax.value_and_grad(loss_fn, has_aux=True)(p, ids, mask)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    rng = np.random.default_rng(args.seed)
    held = batch(np.random.default_rng(12345), 64, args.span, args.gap, args.vocab)
    evaluate = jax.jit(loss_fn)
    out, t0 = [], time.perf_counter()
    for i in range(1, args.steps + 1):
        params, opt, _ = step(params, opt, *batch(rng, args.rows, args.span, args.gap, args.vocab))
        if i % args.every == 0:
            nll, acc = evaluate(params, *held)
            out.append({"step": i, "nll": float(nll), "accuracy": float(acc),
                        "seconds": time.perf_counter() - t0})
            print(f"theta {theta:g} step {i}: copy NLL {float(nll):.3f} accuracy {float(acc):.3f}",
                  flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--thetas", type=float, nargs="+", default=[1e6, 1e4])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--span", type=int, default=16)
    p.add_argument("--gap", type=int, default=96)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    result = {"command": "python -m experiments.copy_probe " + " ".join(argv or sys.argv[1:]),
              "settings": vars(args), "curves": {f"{t:g}": probe(t, args) for t in args.thetas}}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
