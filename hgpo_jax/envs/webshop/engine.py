"""The WebShop engine: catalogue, search, synthetic goals with their prices, and the reward.

    engine = WebShopEngine()                       # the small set (1,000 products) by default
    engine.search("men's straight leg jeans")      # [(asin, score)], the original's order
    goals = engine.goals(0)                        # the synthetic goals in the original's order
    engine.reward(goals[0], asin, {"color": "navy"}, engine.product_prices(0)[asin])

One engine serves any number of envs of a process (`shared_engine`): it is read-only once built
(goals and prices are computed once per seed).
"""

from __future__ import annotations

import random
from functools import lru_cache

from hgpo_jax.envs.webshop.data import resolve_data_dir
from hgpo_jax.envs.webshop.goals import PUBLIC_GOAL_KEYS, synthetic_goals
from hgpo_jax.envs.webshop.products import read_products
from hgpo_jax.envs.webshop.reward import purchase_reward

SEARCH_RESULTS = 50  # hits a search returns (the results pages show them 10 at a time)
SEARCH_BACKENDS = ("bm25", "pyserini")


class WebShopEngine:
    """The catalogue of a WebShop data folder and what the env computes from it.

    data_dir: a folder with the WebShop files (None: $WEBSHOP_DATA or the project's small set).
    search_backend: "bm25" (pure Python, equal to the original's Lucene ranking) or "pyserini"
    (a Lucene index, `index_dir`, e.g. the full 1.18M-product catalogue's).
    """

    def __init__(self, data_dir=None, *, search_backend: str = "bm25", index_dir: str | None = None):
        if search_backend not in SEARCH_BACKENDS:
            raise ValueError(f"unknown search backend {search_backend!r}; use one of {SEARCH_BACKENDS}")
        if search_backend == "pyserini" and not index_dir:
            raise ValueError("search_backend='pyserini' needs index_dir=<a Lucene index folder>")
        self.folder = resolve_data_dir(data_dir)
        self.products = read_products(self.folder)
        self.by_asin = {p.asin: p for p in self.products}
        self._backend, self._index_dir = search_backend, index_dir
        self._searcher = None
        self._seeded: dict[int, tuple[dict, list]] = {}
        self._attribute_asins = None

    # ------------------------------------------------------------------ search
    @property
    def searcher(self):
        if self._searcher is None:
            from hgpo_jax.envs.webshop import search

            self._searcher = (search.BM25Index.from_products(self.products) if self._backend == "bm25"
                              else search.PyseriniSearcher(self._index_dir))
        return self._searcher

    def search(self, query: str, k: int = SEARCH_RESULTS) -> list[tuple[str, float]]:
        """[(asin, score)] of the top `k` products for `query`, best first (scores to 4 decimals,
        near ties nudged by 1e-6 as Anserini returns them)."""
        return self.searcher.search(query, k)

    def search_products(self, keywords: list[str], rng: random.Random) -> list:
        """The products a search shows, as the original picks them: the first keyword may be
        '<r>' (random products), '<c> CATEGORY', '<q> QUERY' or '<a> ATTRIBUTE' (exact matches);
        anything else is a text search. (The original fails on '<a>'; here it lists the products
        holding that attribute.)"""
        head = keywords[0] if keywords else ""
        rest = " ".join(keywords[1:]).strip()
        if head == "<r>":
            return rng.sample(self.products, k=min(SEARCH_RESULTS, len(self.products)))
        if head == "<c>":
            category = keywords[1].strip() if len(keywords) > 1 else ""
            return [p for p in self.products if p.category == category]
        if head == "<q>":
            return [p for p in self.products if p.query == rest]
        if head == "<a>":
            return [p for p in self.products if rest in p.attributes]
        hits = self.search(" ".join(keywords), SEARCH_RESULTS)
        return [self.by_asin[a] for a, _ in hits if a in self.by_asin]

    # ------------------------------------------------------------------ goals and prices
    def _for_seed(self, seed: int) -> tuple[dict, list]:
        if seed not in self._seeded:
            self._seeded[seed] = synthetic_goals(self.products, seed)
        return self._seeded[seed]

    def goals(self, seed: int) -> list[dict]:
        """The synthetic goals for `seed`, in the original env's order: dicts with
        asin, instruction_text, attributes, goal_options, price_upper, weight."""
        return [{k: g[k] for k in PUBLIC_GOAL_KEYS} for g in self._for_seed(seed)[1]]

    def num_goals(self, seed: int) -> int:
        return len(self._for_seed(seed)[1])

    def goal(self, seed: int, index: int) -> dict:
        """One goal of `goals(seed)` (without copying the whole list)."""
        goals = self._for_seed(seed)[1]
        if not 0 <= index < len(goals):
            raise IndexError(f"goal index {index} is out of range: seed {seed} has {len(goals)} goals")
        return goals[index]

    def product_prices(self, seed: int) -> dict[str, float]:
        """{asin: price} for `seed` (a price range is drawn uniformly within it, per seed)."""
        return dict(self._for_seed(seed)[0])

    def price(self, seed: int, asin: str) -> float:
        return self._for_seed(seed)[0][asin]

    # ------------------------------------------------------------------ reward
    def reward(self, goal: dict, asin: str, options: dict, price: float) -> tuple[float, dict]:
        """(score in [0, 1], breakdown) of buying `asin` with `options` at `price` for `goal`,
        as the original computes it (type, attributes, options and price terms)."""
        if asin not in self.by_asin:
            raise KeyError(f"unknown product {asin!r}")
        if goal["asin"] not in self.by_asin:
            raise KeyError(f"the goal's product {goal['asin']!r} is not in the catalogue")
        return purchase_reward(self.by_asin[asin], goal, self.by_asin[goal["asin"]], price, options)


@lru_cache(maxsize=4)
def shared_engine(data_dir: str | None = None, search_backend: str = "bm25",
                  index_dir: str | None = None) -> WebShopEngine:
    """One engine per (data_dir, backend) in a process, shared by its envs."""
    return WebShopEngine(data_dir, search_backend=search_backend, index_dir=index_dir)
