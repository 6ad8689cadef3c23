"""WebShop's per-seed product prices and synthetic goals, as verl-agent's text env builds them.

The original env seeds Python's global `random` with the env seed, then draws, from that one
stream and in this order:
1. the product prices: one `uniform(low, high)` per product whose price is a range, in catalogue
   order (a single price is used as is; no price at all is 100.0);
2. one `price_upper` per product that has an instruction, in catalogue order: two distinct values
   sampled from the first four multiples of ten (10.0 .. 990.0) above the product's price, the
   larger one kept; fewer than two such multiples give 1000000 and no price clause;
3. after re-seeding with the same seed, one shuffle of the whole goal list.

Here each seed gets its own `random.Random(seed)` instance (a second, freshly seeded one for the
shuffle), drawing in exactly that order, so there is no hidden global state and the values are
those of the original for the same seed.

A product with an instruction gives one goal per combination of its option values (option names
sorted, values in page order; no options gives a single goal with no options). Every goal of a
product shares its `price_upper`. A goal's `weight` is the mean, over its attributes, of
1 / (number of attribute occurrences, counted over all goals' attribute lists).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

from hgpo_jax.envs.webshop.products import DEFAULT_PRICE, Product

PUBLIC_GOAL_KEYS = ("asin", "instruction_text", "attributes", "goal_options", "price_upper",
                    "weight")
PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # candidate upper bounds 10.0 .. 990.0
NO_PRICE_LIMIT = 1000000  # an int, as in the original
_CANDIDATE_UPPERS = 4  # only the first four steps above the price are candidates


def _draw_prices(products: list[Product], rng: random.Random) -> dict[str, float]:
    """{asin: price}: a range [low, high] draws `rng.uniform(low, high)`, in catalogue order."""
    prices = {}
    for product in products:
        pricing = product.pricing
        if not pricing:
            prices[product.asin] = DEFAULT_PRICE
        elif len(pricing) == 1:
            prices[product.asin] = pricing[0]
        else:
            prices[product.asin] = rng.uniform(pricing[0], pricing[1])
    return prices


def product_prices(products: list[Product], seed: int) -> dict[str, float]:
    """The price of every product for the env seed `seed` (the first draws of that seed)."""
    return _draw_prices(products, random.Random(seed))


def _price_limit(price: float, rng: random.Random) -> tuple[float | int, str]:
    """(price_upper, instruction suffix) for one product: the larger of two distinct samples
    from the first four price steps above `price`, or no limit when fewer than two exist."""
    candidates = [p for p in PRICE_STEPS if p > price][:_CANDIDATE_UPPERS]
    if len(candidates) < 2:
        return NO_PRICE_LIMIT, ""
    upper = max(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def _option_combinations(options: dict) -> list[dict]:
    """One {name: value} per element of the product of the value lists, names sorted."""
    names = sorted(options)
    return [dict(zip(names, combo))
            for combo in itertools.product(*(options[name] for name in names))]


def _option_text(goal_options: dict) -> str:
    """' with k1: v1, and k2: v2' (empty without options)."""
    if not goal_options:
        return ""
    return " with " + ", and ".join(f"{k}: {v}" for k, v in goal_options.items())


def _product_goals(product: Product, price: float, rng: random.Random) -> list[dict]:
    """The unweighted goals of one product with an instruction (draws its price limit once)."""
    attributes = list(product.instruction_attributes or ())
    if not attributes:
        raise ValueError(f"product {product.asin} has an instruction but no instruction "
                         "attributes (the original asserts there is at least one)")
    upper, price_text = _price_limit(price, rng)
    return [{"asin": product.asin,
             "instruction_text": f"{product.instruction_text}{_option_text(opts)}{price_text}",
             "attributes": list(attributes),
             "goal_options": opts,
             "price_upper": upper}
            for opts in _option_combinations(product.options)]


def _attribute_weight(attributes: list[str], counts: Counter) -> float:
    """Mean of 1/count over the attributes, summed left to right as plain floats."""
    total = 0
    for att in attributes:
        total += 1.0 / counts[att]
    return total / len(attributes)


def synthetic_goals(products: list[Product], seed: int) -> tuple[dict[str, float], list[dict]]:
    """(prices, goals) of the env seed `seed`: prices for every product, then the goals of every
    product with an instruction, weighted and shuffled as the original (module docstring).
    Each goal has exactly the keys of PUBLIC_GOAL_KEYS, in that order."""
    rng = random.Random(seed)
    prices = _draw_prices(products, rng)
    goals = []
    for product in products:
        if product.instruction_text is None:
            continue
        goals.extend(_product_goals(product, prices[product.asin], rng))
    counts = Counter(att for goal in goals for att in goal["attributes"])
    for goal in goals:
        goal["weight"] = _attribute_weight(goal["attributes"], counts)
    random.Random(seed).shuffle(goals)
    return prices, goals
