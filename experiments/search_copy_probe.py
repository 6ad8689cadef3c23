"""How well a search model copies names it never saw (issue 59, item 7: the study's failure sort
found garbled copies of unseen names capping held-out EM; docs/results.md section 10).

    python -m experiments.search_copy_probe MODEL [MODEL ...] [--questions 300] [--config C] [--world SEED] [--out FILE.json]

MODEL: a transformers folder of the search laptop study (OUT/warm_start, an exported policy).
The scripted expert plays the held-out questions of the synthetic world (`env.search.dataset=
synthetic`, split test: people and cities no warm start ever saw) through the env; each of its
turns becomes the prompt the rollout builds and the reply SFT teaches (sft/data.py). In each reply
the span inside <search> or <answer> is a name to copy: the question's person (first query), the
top passage's city (second query) or the answer. Measured per reply, teacher-forced up to the
span's first token, then greedy:
- `first_token`: the model's top token at the span's start is the expert's (the choice of what to
  copy, not the copy);
- `copy`: given the span's first token, the greedy continuation reproduces the rest of the span
  exactly (a name of one token counts as copied);
- `copy_tokens`: the share of the span's later tokens predicted right, teacher-forced.
Per kind of span: `query_name` (first search), `query_city` (second search, two-hop),
`answer_city` (one-hop answer), `answer_country` (two-hop answer; 12 shared countries, seen in
training)."""

from __future__ import annotations

import argparse
import json
import sys
import time

SPAN_KINDS = ("query_name", "query_city", "answer_city", "answer_country")


def span_of(response: str) -> tuple[int, int, str] | None:
    """(start, end, tag) of the text inside the reply's action tags; None without one."""
    for tag in ("search", "answer"):
        open_, close = f"<{tag}>", f"</{tag}>"
        i = response.find(open_)
        if i >= 0:
            j = response.find(close, i)
            if j > i:
                return i + len(open_), j, tag
    return None


def span_kind(tag: str, turn: int, data_source: str) -> str:
    if tag == "search":
        return "query_name" if turn == 0 else "query_city"
    return "answer_city" if data_source == "onehop" else "answer_country"


def expert_turns(cfg, questions: int, world: int | None = None) -> list[tuple[str, str, str]]:
    """(prompt text, reply text, span kind) of each expert reply that names something, on the
    first `questions` held-out questions of `cfg`'s env (its search options, turns, memory and
    agent: the study's SFT config), as the rollout prompts and SFT replies them. world: the
    test questions of that other synthetic world instead (envs.search.world_options)."""
    from hgpo_jax.agents import get_agent
    from hgpo_jax.envs.search import make_search_env, split_questions, synthetic, world_options
    from hgpo_jax.sft.data import samples_from_episodes

    e = cfg.env
    options = e.search if world is None else world_options(world)
    env = make_search_env(options, e.max_steps, e.data_dir)
    tasks = [f"test:{i}" for i in range(min(questions, len(split_questions(options, "test"))))]
    agent = get_agent(cfg.agent.name, e.name, projection=e.projection)
    out = []
    for task, ep in zip(tasks, synthetic.record(env, tasks, "expert", max_turns=e.max_steps)):
        source = env.questions[task].data_source
        for turn, (prompt, response) in enumerate(samples_from_episodes([ep], e.memory_len, agent)):
            span = span_of(response)
            if span is not None:
                out.append((prompt, response, span_kind(span[2], turn, source)))
    return out


def probe_rows(tokenizer, turns: list[tuple[str, str, str]], max_prompt_tokens: int) -> list[dict]:
    """`expert_turns` in `tokenizer`'s ids: {ids (prompt + reply through the span's end), start
    (index of the span's first token), end, kind}."""
    from hgpo_jax.rl.policy import encode_prompt

    rows = []
    for prompt, response, kind in turns:
        start, end, _ = span_of(response)
        head = tokenizer.encode(response[:start])
        upto = tokenizer.encode(response[:end])
        if upto[:len(head)] != head or len(upto) == len(head):
            continue  # the span's tokens do not start at a token boundary: not probed
        p = encode_prompt(tokenizer, prompt, max_prompt_tokens)
        rows.append({"ids": p + upto, "start": len(p) + len(head), "end": len(p) + len(upto),
                     "kind": kind})
    return rows


def model_next_tokens(model_dir: str):
    """A function ids [B, L] -> the model's top next token at each position [B, L] (jitted)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from hgpo_jax.models.hf_io import load_pretrained

    graphdef, params = nnx.split(load_pretrained(model_dir), nnx.Param)

    @jax.jit
    def top(p, ids):
        return jnp.argmax(nnx.merge(graphdef, p)(ids), -1)

    return lambda ids: np.asarray(top(params, jnp.asarray(ids)))


def measure(next_tokens, rows: list[dict], batch: int = 64) -> dict:
    """The module docstring's three measures, overall and per span kind. next_tokens: ids [B, L]
    -> top next token [B, L] (`model_next_tokens`); rows: `probe_rows`'."""
    import numpy as np

    length = -(-(max(r["end"] for r in rows) + 1) // 32) * 32
    out = {"first_token": [], "copy": [], "copy_tokens": [], "kind": []}
    for b in range(0, len(rows), batch):
        part = rows[b:b + batch]
        ids = np.zeros((batch, length), np.int32)  # right padding: a causal model never reads it
        for i, r in enumerate(part):
            ids[i, :r["end"]] = r["ids"]
        teacher = next_tokens(ids)
        # greedy continuation after the span's first token (teacher-forced up to it)
        free = ids.copy()
        for i, r in enumerate(part):
            free[i, r["start"] + 1:] = 0
        for k in range(max(r["end"] - r["start"] - 1 for r in part)):
            top = next_tokens(free)
            for i, r in enumerate(part):
                pos = r["start"] + 1 + k
                if pos < r["end"]:
                    free[i, pos] = top[i, pos - 1]
        for i, r in enumerate(part):
            s, e = r["start"], r["end"]
            out["first_token"].append(float(teacher[i, s - 1] == ids[i, s]))
            out["copy"].append(float(np.array_equal(free[i, s + 1:e], ids[i, s + 1:e])))
            out["copy_tokens"].append([float(teacher[i, j - 1] == ids[i, j]) for j in range(s + 1, e)])
            out["kind"].append(r["kind"])

    def summary(mask) -> dict:
        n = sum(mask)
        tokens = [t for m, ts in zip(mask, out["copy_tokens"]) if m for t in ts]
        return {"replies": n,
                "first_token": sum(v for m, v in zip(mask, out["first_token"]) if m) / max(n, 1),
                "copy": sum(v for m, v in zip(mask, out["copy"]) if m) / max(n, 1),
                "copy_tokens": sum(tokens) / max(len(tokens), 1)}

    result = {"all": summary([True] * len(out["kind"]))}
    for kind in SPAN_KINDS:
        result[kind] = summary([k == kind for k in out["kind"]])
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="transformers folders")
    parser.add_argument("--questions", type=int, default=300, help="held-out questions played")
    parser.add_argument("--config", default="search_laptop_sft",
                        help="the config whose env, agent and prompt length the probe uses")
    parser.add_argument("--world", type=int, default=None,
                        help="probe the test split of this other synthetic world instead of the "
                             "study's held-out one (for choosing a recipe without looking at the "
                             "held-out questions; e.g. 100, the first of the *_other worlds, whose "
                             "test split no SFT data comes from)")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args(argv)

    from hgpo_jax.config import load_config
    from hgpo_jax.models.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    cfg = load_config(args.config, [])
    turns, results = expert_turns(cfg, args.questions, world=args.world), {}
    for model_dir in args.models:  # each model's own tokenizer
        rows = probe_rows(load_tokenizer(model_dir), turns, cfg.rollout.max_prompt_tokens)
        results[model_dir] = measure(model_next_tokens(model_dir), rows)
        r = results[model_dir]
        print(f"{model_dir}: " + "; ".join(
            f"{k} copy {v['copy']:.3f} (tokens {v['copy_tokens']:.3f}, first {v['first_token']:.3f},"
            f" n {v['replies']})" for k, v in r.items()), flush=True)
    record = {"command": " ".join(["python -m experiments.search_copy_probe", *(argv or sys.argv[1:])]),
              "questions": args.questions, "world": args.world, "seconds": time.perf_counter() - t0, "models": results}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
