"""How similar the search env's observations are within a question, on the synthetic world: why
GiGPO's similarity groups at the authors' 0.9 (`algo.similarity_thresh`) equal its exact-anchor
groups there (docs/results.md, section 10).

    python -m experiments.search_similarity [--questions 40] [--episodes 30] [--thresh 0.9]

For each of the first train questions, the distinct observations that random-policy episodes
(`synthetic.record(..., "random")`, the warm start's data) meet after their first step, and the
largest difflib ratio between two of them (the measure `rl/similarity.py` clusters by)."""

from __future__ import annotations

import argparse
import difflib
import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    import numpy as np

    from hgpo_jax.envs.search import SearchOptions, make_search_env, synthetic

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--thresh", type=float, default=0.9)
    args = parser.parse_args(argv)
    env = make_search_env(SearchOptions(dataset="synthetic"), max_turns=4)
    best, counts = [], []
    for t in range(args.questions):
        task = f"train:{t}"
        seen = set()
        for s in range(args.episodes):
            episode = synthetic.record(env, [task], "random", seed=1000 * t + s)[0]
            seen.update(step.observation for step in episode.steps[1:])
        pairs = itertools.combinations(sorted(seen), 2)
        best.append(max((difflib.SequenceMatcher(None, a, b).ratio() for a, b in pairs), default=0.0))
        counts.append(len(seen))
    print(f"{args.questions} questions x {args.episodes} random episodes: distinct observations per "
          f"question median {np.median(counts):.0f}; the most similar two distinct ones: median "
          f"{np.median(best):.3f}, max {max(best):.3f}; questions with a pair >= {args.thresh}: "
          f"{sum(b >= args.thresh for b in best)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
