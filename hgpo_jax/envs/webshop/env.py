"""WebShop's text environment: one shopping session per episode.

    env = WebShopEnv(seed=0)
    obs, info = env.reset(3)                     # plays engine.goals(0)[3]
    obs, reward, done, info = env.step("search[men's jeans]")
    obs, reward, done, info = env.step("click[b07gyww3ny]")

Behaviour of the original text env (princeton-nlp/WebShop, as verl-agent runs it):
- actions are `search[...]` (from any page) and `click[...]` on what the current page lists in
  `info["available_actions"]["clickables"]` (never "search"); anything else changes nothing and
  re-shows the page. Parsing: the name is what precedes the first "[" that has a "]" after it
  (greedy, case-sensitive), the argument is lower-cased; a search's words are split on " ".
- pages: search -> results (10 per page, "Next >" / "< Prev") -> item (options, "Description",
  "Features", "Reviews", "Buy Now") -> sub-pages; "< Prev" on an item page searches again (the
  chosen options are forgotten), "Back to Search" keeps the goal.
- "Buy Now" ends the episode with the reward: the task score in [0, 1] (`info["task_score"]`);
  `info["won"]` is score == 1. Training uses 10 x won, as the paper (the env registry's reward).
  After the purchase the env is back on its search page (the original starts a new session), so
  `info["available_actions"]` is that page's.
Divergence: the original finds the current page by a substring test on its URL, which holds the
search words; a search such as "search_results" can confuse it. Here the page kind is tracked.
"""

from __future__ import annotations

import random
import re

from hgpo_jax.envs.webshop import pages
from hgpo_jax.envs.webshop.engine import shared_engine
from hgpo_jax.envs.webshop.prompts import admissible_actions, format_observation

_ACTION = re.compile(r"(.+)\[(.+)\]")


def split_action(action: str) -> tuple[str, str | None]:
    """'click[Buy Now]' -> ('click', 'Buy Now'); no match: (action, None)."""
    m = _ACTION.match(action)
    return (action, None) if m is None else (m.group(1), m.group(2))


class WebShopEnv:
    """One WebShop session at a time; tasks are goal indices of `engine.goals(seed)`.

    seed: fixes the goal order and the prices of products sold at a range of prices;
    data_dir: the WebShop data (None: $WEBSHOP_DATA or the project's small set);
    max_steps: end an episode (reward 0) after this many steps (None: never, as the original);
    engine: a WebShopEngine to use instead of the process's shared one.
    """

    def __init__(self, seed: int = 0, data_dir: str | None = None, max_steps: int | None = None,
                 *, engine=None):
        self.seed = int(seed)
        self.engine = engine if engine is not None else shared_engine(data_dir)
        self.max_steps = max_steps
        self.rng = random.Random(self.seed)  # for the '<r>' (random products) search only
        self.goal = None
        self.steps = 0

    # ------------------------------------------------------------------ protocol
    def reset(self, task) -> tuple[str, dict]:
        """Start the session of goal `task` (an index of engine.goals(seed)) on the search page."""
        self.goal = self.engine.goal(self.seed, int(task))
        self.task_type = self.engine.by_asin[self.goal["asin"]].category
        self.steps = 0
        self._to_search_page()
        obs = self.observation
        return obs, self._info(obs, won=False, score=0.0)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply `action`; returns (observation, reward, done, info). reward: the task score on
        "Buy Now", else 0."""
        if self.goal is None:
            raise RuntimeError("call reset(task) before step()")
        self.steps += 1
        name, arg = split_action(action if isinstance(action, str) else str(action))
        arg = arg.lower() if arg is not None else None
        reward, done = 0.0, False
        if name == "search" and arg:
            self._results(arg.split(" "), page=1)
        elif name == "click" and arg in self.clickables and arg != "search":
            reward, done = self._click(arg)
        obs = self.observation
        if done:
            self._to_search_page()  # the original starts a new session after a purchase
        elif self.max_steps is not None and self.steps >= self.max_steps:
            done = True
        return obs, reward, done, self._info(obs, won=done and reward == 1.0, score=reward)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ state
    @property
    def observation(self) -> str:
        return pages.page_text(self.nodes)

    def available_actions(self) -> dict:
        """{'has_search_bar': bool, 'clickables': [str]} of the current page."""
        return {"has_search_bar": self.kind == "search", "clickables": list(self.clickables)}

    def _info(self, obs: str, won: bool, score: float) -> dict:
        instruction = self.goal["instruction_text"]
        available = self.available_actions()
        return {"available_actions": available, "admissible_actions": admissible_actions(available),
                "won": bool(won), "task_score": float(score), "task_type": self.task_type,
                "anchor": format_observation(obs, instruction), "task": instruction}

    def _show(self, kind: str, page) -> None:
        self.kind = kind
        self.nodes, self.clickables = page

    def _to_search_page(self) -> None:
        self.keywords, self.page, self.asin, self.options = None, None, None, {}
        self._show("search", pages.search_page(self.goal["instruction_text"]))

    def _results(self, keywords: list[str], page: int) -> None:
        self.keywords, self.page, self.asin, self.options = keywords, page, None, {}
        hits = self.engine.search_products(keywords, self.rng)
        shown = hits[(page - 1) * pages.RESULTS_PER_PAGE:page * pages.RESULTS_PER_PAGE]
        self._show("results", pages.results_page(self.goal["instruction_text"], shown, page, len(hits)))

    def _item(self) -> None:
        product = self.engine.by_asin[self.asin]
        self._show("item", pages.product_page(self.goal["instruction_text"], product))

    def _click(self, name: str) -> tuple[float, bool]:
        """The original's dispatch on the clicked name, in its order."""
        if name == "buy now":
            price = self.engine.price(self.seed, self.asin)
            reward, _ = self.engine.reward(self.goal, self.asin, self.options, price)
            self._show("done", pages.done_page(self.asin, self.options, reward))
            return reward, True
        if name == "back to search":
            self._to_search_page()
        elif name == "next >" and self.kind == "results":
            self._results(self.keywords, self.page + 1)
        elif name == "< prev" and self.kind == "results":
            self._results(self.keywords, self.page - 1)
        elif name == "< prev" and self.kind == "sub":
            self._item()
        elif name == "< prev" and self.kind == "item":
            self._results(self.keywords, self.page)
        elif name in pages.SUB_PAGES:
            product = self.engine.by_asin[self.asin]
            self._show("sub", pages.sub_page(self.goal["instruction_text"], product, name))
        else:
            what, target = self.clickables[name]
            if what == "product":
                self.asin = target
            elif what == "option":
                self.options[target] = name
            self._item()
        return 0.0, False
