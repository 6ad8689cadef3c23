"""Evaluation protocols: success rates of a policy on an evaluation split.

    rates = evaluate_split(policy, env_pool, tasks, protocol="verl-agent", seeds=(123, 456, 789),
                           batches=4, batch_size=128, max_steps=50, memory_len=2)

"verl-agent" (the default: how the authors' scripts produce their published numbers): for each
seed, `batches` batches of `batch_size` episodes; env i of a batch walks its own shuffled cycle
of the split (a random order seeded `seed + 1000 + i`, reshuffled after each full pass), so batch
b plays the b-th game of every env's cycle; games can repeat within and across batches. The
seed's success rate is the mean of its batch rates (a task type's rate: the mean over the batches
that hold that type); the result is the mean over seeds, with their standard deviation.

"each-once": every game of the split (or its first `games`) played once; one seed.

Both sample at the policy's temperature (the paper's 0.4). Episodes lost to env failures are
counted in `failed` and left out of the rates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from hgpo_jax.config_checks import EVAL_PROTOCOLS

SEED_OFFSET = 1000  # the authors' validation envs are seeded env.seed + 1000 + env index


def shuffled_cycle_schedule(tasks: Sequence, seed: int, batches: int, batch_size: int) -> list[list]:
    """[batches][batch_size] tasks: batch b holds the b-th task of each env's shuffled cycle.

    Env i's cycle: `tasks` shuffled by numpy RandomState(seed + 1000 + i), then reshuffled by the
    same generator after every full pass (TextWorld's gym env walks its game pool this way).
    """
    if not tasks:
        raise ValueError("no tasks to evaluate on")
    schedule = [[None] * batch_size for _ in range(batches)]
    for i in range(batch_size):
        rng = np.random.RandomState(seed + SEED_OFFSET + i)
        order = list(tasks)
        rng.shuffle(order)
        for b in range(batches):
            if b and b % len(order) == 0:
                rng.shuffle(order)
            schedule[b][i] = order[b % len(order)]
    return schedule


def _batch_rates(won: Sequence[bool], types: Sequence[str]) -> dict[str, float]:
    by_type = defaultdict(list)
    for w, t in zip(won, types):
        by_type[t].append(bool(w))
    rates = {t: float(np.mean(v)) for t, v in by_type.items()}
    rates["all"] = float(np.mean(won)) if len(won) else float("nan")
    return rates


def _mean_of_batches(batch_rates: list[dict[str, float]]) -> dict[str, float]:
    """Mean over batches per key, over the batches that hold the key (NaN batches skipped)."""
    keys = sorted({k for r in batch_rates for k in r})
    out = {}
    for k in keys:
        values = [r[k] for r in batch_rates if k in r and not np.isnan(r[k])]
        out[k] = float(np.mean(values)) if values else float("nan")
    return out


def evaluate_each_once(policy, env_pool, tasks: Sequence, *, seeds: Sequence[int] = (123, 456, 789),
                       games: int = 0, max_steps: int = 50, memory_len: int = 2, rollout_kwargs=None,
                       progress: bool = False):
    """The "each-once" protocol: the first `games` of `tasks` (all for 0), each played once,
    sampling from seeds[0]; returns (the rates, as `evaluate_split`, [hgpo_jax.rl.rollout.
    EpisodeResult] in task order). `hgpo-jax eval --episodes` writes the episodes out, one per
    goal, for paired comparisons of two policies."""
    from hgpo_jax.rl.episodes import play_each_once, summarize_episodes

    kw = dict(rollout_kwargs or {})
    chosen = list(tasks[:games] if games else tasks)
    episodes, failed = play_each_once(policy, env_pool, chosen, max_steps, memory_len,
                                      rng=int(seeds[0]) if seeds else 0, progress=progress, **kw)
    spec = kw.get("spec")
    return summarize_episodes(episodes, failed, scored=spec is not None and spec.score_key is not None), episodes


def evaluate_split(policy, env_pool, tasks: Sequence, *, protocol: str = "verl-agent",
                   seeds: Sequence[int] = (123, 456, 789), batches: int = 4, batch_size: int = 128,
                   games: int = 0, max_steps: int = 50, memory_len: int = 2, rollout_kwargs=None,
                   progress: bool = False) -> dict[str, float]:
    """Success rates of `policy` on `tasks` under `protocol`.

    Returns {'all', task types..., 'mean_length', 'ended', 'episodes', 'failed'} ('score' too for
    an env with a task score, and under "each-once" its standard error 'score_sem';
    `hgpo_jax.rl.episodes.evaluate`); "verl-agent" adds 'all_std' (std over
    seeds) and 'seed<s>/all' per seed. rollout_kwargs go to `hgpo_jax.rl.episodes.evaluate`
    (spec, agent).
    """
    from hgpo_jax.rl.episodes import evaluate

    kw = dict(rollout_kwargs or {})
    if protocol == "each-once":
        return evaluate_each_once(policy, env_pool, tasks, seeds=seeds, games=games, max_steps=max_steps,
                                  memory_len=memory_len, rollout_kwargs=kw, progress=progress)[0]
    if protocol != "verl-agent":
        raise ValueError(f"unknown evaluation protocol {protocol!r}; use one of {EVAL_PROTOCOLS}")
    per_seed, episodes, failed = [], 0.0, 0.0
    for seed in seeds:
        rates = []
        for b, batch in enumerate(shuffled_cycle_schedule(tasks, int(seed), batches, batch_size)):
            result = evaluate(policy, env_pool, batch, max_steps, memory_len, rng=int(seed) * 1000 + b,
                              progress=progress, **kw)
            played = result.pop("episodes")
            episodes += played
            failed += result.pop("failed")
            result.pop("score_sem", None)  # a batch's standard error says nothing of the seeds' mean
            if played:  # a batch whose episodes all failed has no rate
                rates.append(result)
        per_seed.append(_mean_of_batches(rates))
    out = _mean_of_batches(per_seed)
    all_rates = [r.get("all", float("nan")) for r in per_seed]
    out["all_std"] = float(np.std(all_rates)) if len(all_rates) > 1 else 0.0
    for seed, r in zip(seeds, per_seed):
        out[f"seed{seed}/all"] = r.get("all", float("nan"))
    out.update({"episodes": episodes, "failed": failed})
    return out
