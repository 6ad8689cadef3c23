"""Does a WebShop warm start copy? Teacher-forced NLL of its reply tokens on the first-result
shopper's episodes (`InstructionShopper(pick="first")`, test goals 0..N-1), split by what the
action's argument holds: the search query (copied from the instruction), a product id (copied
from the page), an option value, and every other reply token (the format and the <think> line,
which repeats the action). A model that copies would put the query and id tokens near 0.

    python -m experiments.webshop_copy_nll MODEL_FOLDER --goals 15
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    import jax.numpy as jnp
    import numpy as np

    from hgpo_jax.agents import get_agent
    from hgpo_jax.envs.episodes import play_episode
    from hgpo_jax.envs.webshop import SCORE_KEY, WebShopEnv
    from hgpo_jax.envs.webshop.expert import InstructionShopper
    from hgpo_jax.rl.update import token_logprobs
    from hgpo_jax.runs import load_model
    from hgpo_jax.sft.data import samples_from_episodes, tokenize_samples

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="a transformers folder or a run folder")
    p.add_argument("--goals", type=int, default=15)
    args = p.parse_args(argv)
    model, tok, _ = load_model(args.model)
    agent, env = get_agent("verl-agent", "webshop"), WebShopEnv(seed=0, max_steps=15)
    episodes = [play_episode(env, t, InstructionShopper("first"), 15, score_key=SCORE_KEY)
                for t in range(args.goals)]
    texts = samples_from_episodes(episodes, 2, agent)
    stats = {"query": [], "id": [], "option": [], "other": []}
    for (_, response), s in zip(texts, tokenize_samples(texts, tok, 2560, 160)):
        ids = jnp.asarray([list(s.prompt_ids) + list(s.response_ids)])
        logp = np.asarray(token_logprobs(model, ids, jnp.ones_like(ids)))[0]
        start = response.index("<action>")
        a0, a1 = response.index("[", start) + 1, response.rindex("]")  # the action's argument
        arg = response[a0:a1]
        kind = "query" if response[start:].startswith("<action>search[") else (
            "id" if arg.startswith("b0") or arg.startswith("b1") else "option")
        prev, P = 0, len(s.prompt_ids)
        for i in range(len(s.response_ids) - 1):  # the end-of-turn token left out
            cur = len(tok.decode(list(s.response_ids[:i + 1])))
            stats[kind if prev >= a0 and cur <= a1 + 1 else "other"].append(-logp[P + i])
            prev = cur
    for k, v in stats.items():
        print(f"{k:7s} tokens {len(v):5d}  mean NLL {np.mean(v) if v else float('nan'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
