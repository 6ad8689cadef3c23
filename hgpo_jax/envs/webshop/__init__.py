"""WebShop (Yao et al. 2022), the paper's second benchmark: a text shopping website.

    from hgpo_jax.envs.webshop import WebShopEngine, WebShopEnv
    engine = WebShopEngine()            # catalogue, BM25 search, goals, prices, reward
    env = WebShopEnv(seed=0)            # tasks: indices of engine.goals(0)
    obs, info = env.reset(0)

A reimplementation of the original text env (princeton-nlp/WebShop, in the copy and "small"
mode verl-agent trains GiGPO and HGPO with): 1,000 products, 6,910 synthetic goals, the same
pages and text observations, the same search ranking as its Lucene index (pure Python BM25),
the same reward; checked against golden outputs of the original (docs/envs.md, tests).
Splits, as verl-agent's: "test" is goals 0..499 of the seed's order, "train" goals 500..6909.
"""

from __future__ import annotations

import os

from hgpo_jax.envs.webshop.engine import WebShopEngine, shared_engine
from hgpo_jax.envs.webshop.env import WebShopEnv

SPLITS = ("train", "test")
TEST_GOALS = 500  # verl-agent: the first 500 goals are held out for validation
WIN_REWARD = 10.0  # training reward of a purchase that scores 1 (the paper's)
SCORE_KEY = "task_score"  # the info key of an episode's task score (0..1)
WEBSHOP_KINDS = ("expert", "search", "first")  # the episode kinds _record_episodes records


def train_reward(reward: float, info: dict) -> float:
    """10 x won: only a perfect purchase (task score 1) is rewarded, as in verl-agent."""
    return WIN_REWARD if info.get("won") else 0.0


def score_reward(reward: float, info: dict) -> float:
    """`env.reward=score` (not the authors'): 10 x the task score of the purchase (0..1, so
    partly right purchases earn part of it), 0 on other steps: a dense signal for policies that
    rarely buy exactly the right item."""
    return WIN_REWARD * float(reward)


def _make_env(env_cfg):
    import functools

    return functools.partial(WebShopEnv, seed=env_cfg.seed, data_dir=env_cfg.data_dir,
                             max_steps=env_cfg.max_steps)


def _list_tasks(env_cfg, split: str) -> list[int]:
    n = shared_engine(env_cfg.data_dir).num_goals(env_cfg.seed)
    return list(range(TEST_GOALS)) if split == "test" else list(range(TEST_GOALS, n))


def _record_episodes(env_cfg, split: str, n: int, kind: str, *, seed: int = 0,
                     progress: bool = False) -> list:
    """n scripted episodes on goals spread over the split (envs.webshop.expert).

    kind "expert": the title shopper's purchases that score 1 (a goal whose purchase scores below
    1, e.g. an attribute the reward cannot find in the product's text, is replaced by the next
    goal of the split). kind "search": the instruction shopper's episodes on n goals, whatever
    they score (they teach a procedure a policy can follow from the page alone); kind "first":
    the same shopper opening the first affordable result instead of the best-matching title.
    """
    import warnings

    from hgpo_jax.envs.webshop.expert import InstructionShopper, title_actions
    from hgpo_jax.envs.episodes import play_episode, spread

    if kind not in WEBSHOP_KINDS:
        raise ValueError(f"sft.data kind {kind!r} is not recorded for WebShop; use expert (the "
                         "target's title searched), search (the instruction's words searched) or "
                         "first (the same, opening the first affordable result)")
    env = WebShopEnv(seed=env_cfg.seed, data_dir=env_cfg.data_dir)
    tasks = _list_tasks(env_cfg, split)
    first = spread(tasks, n)
    if kind in ("search", "first"):
        pick = "first" if kind == "first" else "words"
        return [play_episode(env, task, InstructionShopper(pick), env_cfg.max_steps,
                             source=f"webshop-{kind}:{env_cfg.seed}:{task}", score_key=SCORE_KEY)
                for task in first]
    chosen = set(first)
    out, skipped = [], 0
    for task in first + [t for t in tasks if t not in chosen]:
        if len(out) == n:
            break
        goal = env.engine.goal(env_cfg.seed, task)
        plan = title_actions(goal, env.engine.by_asin[goal["asin"]])
        ep = play_episode(env, task, lambda obs, info, t, plan=plan: plan[t], len(plan),
                          source=f"webshop:{env_cfg.seed}:{task}", score_key=SCORE_KEY)
        if ep.won:
            out.append(ep)
        else:
            skipped += 1
    if skipped:
        warnings.warn(f"{skipped} WebShop goals skipped: their scripted purchase scored below 1")
    return out


# --------------------------------------------------------------------------- expert trajectories
# One direct purchase per goal (expert.purchase_actions), for expert-guided rollouts
# (hgpo_jax.envs.experts). Raise EXPERT_RECORDER_VERSION whenever a change could alter what is
# recorded: the log's name holds it, the env seed and the data's digest.
EXPERT_RECORDER_VERSION = 1


def expert_log_path(seed: int, data_folder: str) -> str:
    """The log of the direct purchases of env seed `seed`'s goals on the data in `data_folder`."""
    from hgpo_jax.envs.experts import experts_folder
    from hgpo_jax.envs.webshop.data import data_digest

    name = f"purchase-seed{seed}-{data_digest(data_folder)}-r{EXPERT_RECORDER_VERSION}.jsonl"
    return os.path.join(experts_folder("webshop"), name)


def _play_purchase(env: WebShopEnv, task: int) -> dict:
    """The log record of the direct purchase of goal `task`: won when it scores 1."""
    from hgpo_jax.envs.episodes import play_episode
    from hgpo_jax.envs.webshop.expert import purchase_actions, webshop_target_key

    goal = env.engine.goal(env.seed, task)
    plan = purchase_actions(goal, env.engine.by_asin[goal["asin"]])
    episode = play_episode(env, task, lambda obs, info, t: plan[t], len(plan), score_key=SCORE_KEY)
    return {"won": episode.won, "actions": plan, "score": episode.score,
            "target": webshop_target_key(goal)}


def _expert_trajectories(env_cfg, split: str, *, progress: bool = False, workers: int = 1,
                         tasks=None) -> dict[int, tuple[str, ...]]:
    """The registry's expert_trajectories: per goal index of the split, the direct purchase of
    its target (search the title, open it, its options, buy now) where it scores 1 (about 9% of
    goals cannot: an attribute the reward does not find in the product's text)."""
    import functools

    from hgpo_jax.envs.experts import ExpertLog, chosen_tasks, record_missing, won_actions

    if split not in SPLITS:
        raise ValueError(f"unknown WebShop split {split!r}; use one of {SPLITS}")
    engine = shared_engine(env_cfg.data_dir)
    goals = chosen_tasks(_list_tasks(env_cfg, split), tasks, "webshop", split)
    jobs = {str(task): task for task in goals}
    records = record_missing(
        ExpertLog(expert_log_path(env_cfg.seed, engine.folder)), jobs, _play_purchase,
        functools.partial(WebShopEnv, seed=env_cfg.seed, data_dir=env_cfg.data_dir),
        workers=workers, progress=progress, desc="webshop experts")
    return won_actions(records, jobs)


def _env_specs() -> dict:
    from hgpo_jax.envs.registry import BuiltModel, EnvSpec

    return {"webshop": EnvSpec(
        name="webshop", make_env=_make_env, list_tasks=_list_tasks, splits=SPLITS,
        eval_splits=("test",), train_reward=train_reward, rewards=(("score", score_reward),), score_key=SCORE_KEY,
        record_episodes=_record_episodes, episode_kinds=WEBSHOP_KINDS,
        expert_trajectories=_expert_trajectories, built_model=BuiltModel(vocab=4096))}


ENV_SPECS = _env_specs()
__all__ = ["WebShopEngine", "WebShopEnv", "ENV_SPECS", "SCORE_KEY", "SPLITS"]
