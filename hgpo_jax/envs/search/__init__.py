"""Search-augmented QA, GiGPO's third benchmark: an agent answers a question by searching a corpus.

    env = make_search_env(SearchOptions(), max_turns=4)   # the project's small set, embedded BM25
    obs, info = env.reset("test:0")
    obs, reward, done, info = env.step("<search>Christopher Nolan</search>")

verl-agent's search env (20bd331, a vendored SkyRL-gym env) over either retriever of
`retrieval.py`: the embedded BM25 index (default) or a user's server speaking verl-agent's
retrieval protocol (`env.search.url`, e.g. the e5 + wiki-18 server of their runs). The dynamics are
`env.py`'s, the texts and the EM reward `text.py`'s, the data `data.py`'s (docs/envs.md).

Tasks are "<split>:<index>" over the split's questions (after `env.search.data_sources`);
`task_type` is the question's data source, so success per task type is EM per data source (their
`val/{data_source}_success_rate`). Numbers on the project's small set are not the papers' (another
retriever, another corpus): say so wherever one is shown.
"""

from __future__ import annotations

import functools
import os

from hgpo_jax.envs.search.options import SearchOptions

SPLITS = ("train", "test")
OTHER_WORLDS, OTHER_WORLD_SEED = 8, 100  # the worlds of the "*_other" episode kinds
TOKENIZER_WORLD = 1  # the synthetic world whose text trains a built model's tokenizer
# RoPE base of a built search model (Qwen2's is 1e6, made for long contexts): with 1e4 the laptop
# study's warm start copied held-out cities better after its first SFT round (0.45/0.56 against
# 0.33/0.43), not after its third (0.49/0.57 against 0.49/0.54), and GiGPO from it reached a
# higher held-out EM (last third 0.46-0.51 against 0.36-0.39): docs/results/search_laptop
ROPE_THETA = 10_000.0
# a built model's tokenizer keeps each capitalised word a piece of its own: a made-up name is then
# the same tokens in the question, a query, a passage's title and text, and an answer
NAME_PIECE = r"[A-Z][a-z]+"


def _files(options: SearchOptions, data_dir: str | None) -> dict[str, str]:
    """{"corpus", "train", "test"}: the options' files; for those unset, the files of
    `options.dataset` (the project's small set, or the synthetic world written to the cache)."""
    given = {"corpus": options.corpus, "train": options.train, "test": options.test}
    if all(given.values()):
        return given
    if options.dataset == "synthetic":
        from hgpo_jax.envs.search.synthetic import world_files

        default = world_files()
    else:
        from hgpo_jax.envs.search.data import default_files

        default = default_files(data_dir)
    return {k: v or default[k] for k, v in given.items()}


@functools.lru_cache(maxsize=8)
def _questions(path: str, data_sources: tuple[str, ...], mtime: float) -> tuple:
    from hgpo_jax.envs.search.data import read_questions

    return tuple(read_questions(path, list(data_sources) or None))


def split_questions(options: SearchOptions, split: str, data_dir: str | None = None) -> tuple:
    """The questions of `split` (hgpo_jax.envs.search.data.Question), filtered by data source."""
    if split not in SPLITS:
        raise ValueError(f"unknown search split {split!r}; use one of {', '.join(SPLITS)}")
    path = _files(options, data_dir)[split]
    return _questions(path, tuple(options.data_sources), os.path.getmtime(path))


def task_table(options: SearchOptions, data_dir: str | None = None) -> dict:
    """Task id ("<split>:<index>") -> Question, over every split."""
    return {f"{split}:{i}": q for split in SPLITS
            for i, q in enumerate(split_questions(options, split, data_dir))}


def make_retriever(options: SearchOptions, data_dir: str | None = None):
    """The retriever the options name: an HTTP client of `url`, or the embedded BM25 index over
    the corpus (built once into the cache, loaded from there after)."""
    from hgpo_jax.envs.search import retrieval

    if options.url:
        return retrieval.HttpRetriever(options.url, topk=options.topk, timeout=options.timeout,
                                       retries=options.retries)
    return retrieval.corpus_index(_files(options, data_dir)["corpus"])


def make_search_env(options: SearchOptions, max_turns: int = 4, data_dir: str | None = None):
    """A SearchQAEnv over every split's questions and the options' retriever."""
    from hgpo_jax.envs.search.env import SearchQAEnv

    return SearchQAEnv(task_table(options, data_dir), make_retriever(options, data_dir),
                       max_turns=max_turns, topk=options.topk)


def check_ready(options: SearchOptions, data_dir: str | None = None) -> None:
    """Before a run: the retrieval server answers (url), or the corpus loads and its index is
    built (embedded); one-line errors otherwise (hgpo_jax.envs.search.retrieval.RetrievalError,
    ValueError for a bad corpus line)."""
    from hgpo_jax.envs.search import retrieval

    if options.url:
        retrieval.check_server(options.url, timeout=min(options.timeout, 10.0))
    else:
        make_retriever(options, data_dir)


def _make_env(env_cfg):
    return functools.partial(make_search_env, env_cfg.search, env_cfg.max_steps, env_cfg.data_dir)


def _list_tasks(env_cfg, split: str) -> list[str]:
    """The split's task ids; checks first that the retriever is ready (once per process and
    setting), so a run with a server that is down or a bad corpus stops before anything heavy."""
    _ready(env_cfg.search.url, env_cfg.search.corpus, env_cfg.search.timeout, env_cfg.data_dir,
           env_cfg.search.dataset)
    return [f"{split}:{i}" for i in range(len(split_questions(env_cfg.search, split,
                                                               env_cfg.data_dir)))]


@functools.lru_cache(maxsize=8)
def _ready(url: str, corpus: str | None, timeout: float, data_dir: str | None,
           dataset: str = "searchqa-small") -> None:
    check_ready(SearchOptions(url=url, corpus=corpus, timeout=timeout, dataset=dataset), data_dir)


def _record_episodes(env_cfg, split: str, n: int, kind: str, *, seed: int = 0,
                     progress: bool = False) -> list:
    """n scripted episodes of the split's questions, in order (cycling when n exceeds them),
    played through the env: kind "expert" (search the name, [search the city], answer the span:
    wins every question) or "random" (the right kinds of actions with random choices: the format,
    queries from the question's words and an entity of the top passage copied, not the choices), hgpo_jax.envs.search.synthetic. Kinds "expert_other" and
    "random_other": the same policies on the train questions of OTHER_WORLDS other synthetic
    worlds (other people, cities and countries; n spread over them), where no name recurs often
    enough to be memorised: the answer can only be copied from <information>. The synthetic
    world only (env.search.dataset=synthetic): the scripts read its sentence templates."""
    from hgpo_jax.envs.search import synthetic

    options = env_cfg.search
    if options.dataset != "synthetic" or options.corpus or options.train or options.test:
        raise ValueError("search episodes are recorded on the synthetic world only "
                         "(env.search.dataset=synthetic, no env.search.corpus/train/test): their "
                         "scripts read its passages' sentences")
    if kind.endswith("_other"):
        out = []
        for j in range(OTHER_WORLDS):
            other = world_options(OTHER_WORLD_SEED + j)
            env = make_search_env(other, env_cfg.max_steps)
            tasks = [f"train:{i}" for i in range(len(split_questions(other, "train")))]
            count = n // OTHER_WORLDS + (j < n % OTHER_WORLDS)
            out += synthetic.record(env, [tasks[i % len(tasks)] for i in range(count)],
                                    kind[:-len("_other")], seed=seed + 7919 * j,
                                    max_turns=env_cfg.max_steps)
        return out
    env = make_search_env(options, env_cfg.max_steps, env_cfg.data_dir)
    tasks = [f"{split}:{i}" for i in range(len(split_questions(options, split)))]
    return synthetic.record(env, [tasks[i % len(tasks)] for i in range(n)], kind, seed=seed,
                            max_turns=env_cfg.max_steps)


def corpus_episodes() -> list:
    """The episodes whose turns train a built search model's tokenizer
    (`model.path=build:search-<size>`): expert and random episodes of the train questions of
    another synthetic world (seed 1: the same syllables and sentences, other people and cities),
    and expert episodes of 300 train questions of each of the OTHER_WORLDS (the worlds of the warm
    start's episodes). No person or city of the world trained and evaluated on is a token of its
    own, and with names seen in many worlds the merges inside a name (`NAME_PIECE`) are its
    syllables, so train and test names are cut into the same few pieces (a test city: 2.6 tokens
    on average, was 3.4 with the first world's text alone and no name pieces)."""
    from hgpo_jax.envs.search import synthetic

    env = make_search_env(world_options(TOKENIZER_WORLD), max_turns=4)
    tasks = [f"train:{i}" for i in range(600)]
    out = synthetic.record(env, tasks, "expert") + synthetic.record(env, tasks, "random", seed=1)
    for j in range(OTHER_WORLDS):
        out += synthetic.record(make_search_env(world_options(OTHER_WORLD_SEED + j), max_turns=4),
                                [f"train:{i}" for i in range(300)], "expert")
    return out


def world_options(seed: int) -> SearchOptions:
    """The options of the synthetic world of `seed` (its corpus, train and test files in the
    cache, written on first use): another world than the one `env.search.dataset=synthetic`
    plays, for the episodes of the `*_other` kinds and a built model's tokenizer."""
    from hgpo_jax.envs.search.synthetic import world_files

    files = world_files(seed=seed)
    return SearchOptions(corpus=files["corpus"], train=files["train"], test=files["test"])


def _env_specs() -> dict:
    from hgpo_jax.envs.registry import BuiltModel, EnvSpec
    from hgpo_jax.envs.search.synthetic import KINDS

    return {"search": EnvSpec(name="search", make_env=_make_env, list_tasks=_list_tasks,
                              splits=SPLITS, eval_splits=("test",), options=SearchOptions,
                              record_episodes=_record_episodes,
                              episode_kinds=(*KINDS, *(f"{k}_other" for k in KINDS)),
                              built_model=BuiltModel(vocab=1024, episodes=corpus_episodes,
                                                     memory_len=4, isolate=NAME_PIECE,
                                                     rope_theta=ROPE_THETA, version=3))}


ENV_SPECS = _env_specs()
__all__ = ["ENV_SPECS", "SPLITS", "SearchOptions", "check_ready", "make_search_env",
           "split_questions", "task_table"]
