"""Why a search run's held-out questions fail: each lost episode of a run's greedy evaluation
replayed and sorted by what went wrong (docs/results.md, section 10).

    python -m experiments.search_failures RUN EPISODES [--out FILE.json]

RUN: an RL run folder (its latest policy); EPISODES: the `hgpo-jax eval --episodes` file of that
run (the study keeps one per run in docs/results/search_laptop/episodes/). Each episode it lost is
played again, greedy, through `hgpo_jax.rl.episodes.watch_episode` (the same play as `hgpo-jax
demo --episode`), and put into one class by its last `<answer>` against the golden answer and
the passages the episode was shown:
- `miscopied`: the golden answer was shown in an `<information>` block, and the answer is a near
  copy of it (difflib ratio >= 0.6), not the name itself;
- `other name shown`: the answer is another name shown (a two-hop episode: the city, or a
  country of the wrong city);
- `one search, name shown` (two-hop only): the same after a single search, the city shortcut;
- `name not shown`: neither shown nor a near copy of the golden answer (a garbled copy of
  another name, or of a miscopied query's passages);
- `no answer`: the episode ended without an `<answer>` (the 4th turn, or invalid replies).
A lost two-hop episode of the synthetic world (`env.search.dataset=synthetic`) also gets the
class of its second query against the city the person's passage gives (`second_query_class`).
Prints one line per episode and the counts per data source and class."""

from __future__ import annotations

import argparse
import difflib
import json
import sys

NEAR_COPY = 0.6  # difflib ratio from which an answer counts as a garbled copy of the gold


def classify(task_type: str, answer: str | None, gold: str, shown: str, searches: int) -> str:
    """The failure class of one lost episode (the module docstring's classes). `shown`: every
    observation of the episode joined."""
    if answer is None:
        return "no answer"
    if answer in shown:
        return ("one search, name shown" if task_type == "twohop" and searches == 1
                else "other name shown")
    near = difflib.SequenceMatcher(None, answer, gold).ratio() >= NEAR_COPY
    return "miscopied" if near and gold in shown else "name not shown"


def second_query_class(queries: list[str], city: str | None) -> str:
    """A two-hop episode's second search against the person's city: `city`, `garbled city` (a
    near copy of it), `other` (another query), `none` (no second search), `unknown` (the first
    query named no known person, so the city is not known)."""
    if len(queries) < 2:
        return "none"
    if city is None:
        return "unknown"
    if queries[1] == city:
        return "city"
    near = difflib.SequenceMatcher(None, queries[1], city).ratio() >= NEAR_COPY
    return "garbled city" if near else "other"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="an RL run folder")
    parser.add_argument("episodes", help="that run's `hgpo-jax eval --episodes` file")
    parser.add_argument("--out", help="also write the counts and the episodes' lines as JSON")
    args = parser.parse_args(argv)

    from hgpo_jax.agents import get_agent
    from hgpo_jax.cli import build_parser
    from hgpo_jax.commands.demo import choose_episode
    from hgpo_jax.envs.search.env import query_of
    from hgpo_jax.envs.search.text import extract_answer
    from hgpo_jax.rl.episodes import watch_episode
    from hgpo_jax.rl.policy import Policy
    from hgpo_jax.runs import load_model

    with open(args.episodes, encoding="utf-8") as f:
        lost = [e for e in map(json.loads, f) if not e["won"]]
    demo = build_parser().parse_args(["demo", "--model", args.run, "--episode", "--task", "0"])
    choice = choose_episode(demo)
    cfg = choice.cfg
    agent = get_agent(cfg.agent.name, cfg.env.name, projection=cfg.env.projection)
    model, tokenizer, _ = load_model(args.run, dtype=demo.dtype, progress=False)
    policy = Policy.of_rollout(model, tokenizer, cfg.rollout, 0.0)
    env = choice.spec.make_env(cfg.env)()
    world = None
    if getattr(cfg.env, "search", None) is not None and cfg.env.search.dataset == "synthetic":
        from hgpo_jax.envs.search import synthetic

        world = synthetic.world()
    rows, counts, second = [], {}, {}
    try:
        for e in lost:
            episode = watch_episode(policy, env, e["task"], choice.max_steps, cfg.env.memory_len,
                                    rng=0, spec=choice.spec, agent=agent)
            gold = env.questions[e["task"]].golden_answers[0]
            answer = extract_answer(episode.turns[-1].reply)
            queries = [q for q in map(query_of, (t.reply for t in episode.turns)) if q is not None]
            searches = len(queries)
            kind = classify(e["task_type"], answer, gold, " ".join(t.observation for t in episode.turns),
                            searches)
            key = f"{e['task_type']}: {kind}"
            counts[key] = counts.get(key, 0) + 1
            row = {"task": e["task"], "task_type": e["task_type"], "answer": answer,
                   "gold": gold, "searches": searches, "queries": queries, "class": kind}
            if world is not None and e["task_type"] == "twohop":
                person = world.person(queries[0]) if queries else None
                row["second_query_class"] = second_query_class(queries, person and person.city)
                second[row["second_query_class"]] = second.get(row["second_query_class"], 0) + 1
            rows.append(row)
            print(f"{e['task']:>8} {e['task_type']:>6} searches {searches} answer {answer!r} "
                  f"gold {gold!r}: {kind}", flush=True)
    finally:
        env.close()
    summary = {"run": args.run, "lost": len(lost), "counts": dict(sorted(counts.items())),
               "twohop_second_query": dict(sorted(second.items()))}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({**summary, "command": "python -m experiments.search_failures "
                       + " ".join(sys.argv[1:] if argv is None else argv), "episodes": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
