"""WebShop synthetic goals, per-seed prices and the purchase reward against the original's
golden outputs (webshop_golden_env.json: seed-0 goals, prices and 1000 scored purchases), plus
hand-made checks of the fuzzy matcher, colour normalization and the type-reward rules."""

import dataclasses
import random
from collections import Counter

import pytest

from hgpo_jax.envs.webshop.data import GOLDEN_FILE, read_data_json, resolve_data_dir
from hgpo_jax.envs.webshop.goals import PUBLIC_GOAL_KEYS, product_prices, synthetic_goals
from hgpo_jax.envs.webshop.products import Product, read_products
from hgpo_jax.envs.webshop.reward import (COLOR_SET, purchase_reward, type_match,
                                          canonical_color, title_score, token_set_ratio,
                                          type_reward)


@pytest.fixture(scope="module")
def folder():
    return resolve_data_dir()


@pytest.fixture(scope="module")
def products(folder):
    return read_products(folder)


@pytest.fixture(scope="module")
def by_asin(products):
    return {p.asin: p for p in products}


@pytest.fixture(scope="module")
def golden(folder):
    return read_data_json(folder, GOLDEN_FILE)


@pytest.fixture(scope="module")
def seed0(products):
    return synthetic_goals(products, 0)


# ------------------------------------------------------------------------- goals and prices


def test_seed0_goals_equal_golden(seed0, golden):
    _, goals = seed0
    expected = golden["seed0_goals"]
    assert len(goals) == len(expected) == 6910
    matching = sum(g == e and list(g) == list(e) for g, e in zip(goals, expected))
    assert matching == len(expected)
    assert all(tuple(g) == PUBLIC_GOAL_KEYS for g in goals)
    # exact floats and types, not just ==
    for g, e in zip(goals, expected):
        assert repr(g["weight"]) == repr(e["weight"])
        assert type(g["price_upper"]) is type(e["price_upper"])


def test_seed0_goal_counts(seed0):
    _, goals = seed0
    assert sum(g["price_upper"] == 1000000 for g in goals) == 15
    assert sum(not g["goal_options"] for g in goals) == 185
    assert len({g["asin"] for g in goals}) == 415


def test_seed0_prices_equal_golden(products, seed0, golden):
    prices, _ = seed0
    expected = golden["seed0_product_prices"]
    assert prices == expected
    assert list(prices) == list(expected) == [p.asin for p in products]
    assert all(repr(prices[a]) == repr(expected[a]) for a in expected)
    assert product_prices(products, 0) == prices


def test_no_global_random_state(products):
    random.seed(12345)
    state = random.getstate()
    synthetic_goals(products, 3)
    product_prices(products, 3)
    assert random.getstate() == state


def _goal_multiset(goals):
    return Counter((g["asin"], tuple(g["goal_options"].items())) for g in goals)


def test_other_seed_reorders_and_reprices(products, seed0):
    prices0, goals0 = seed0
    prices1, goals1 = synthetic_goals(products, 1)
    assert [g["asin"] for g in goals1] != [g["asin"] for g in goals0]
    assert prices1 != prices0
    assert set(prices1) == set(prices0)
    ranged = [p.asin for p in products if len(p.pricing) == 2]
    fixed = [p.asin for p in products if len(p.pricing) == 1]
    assert all(prices1[a] == prices0[a] for a in fixed)
    assert sum(prices1[a] != prices0[a] for a in ranged) == len(ranged)
    assert _goal_multiset(goals1) == _goal_multiset(goals0)
    assert product_prices(products, 1) == prices1
    again = synthetic_goals(products, 1)
    assert again == (prices1, goals1)


def test_goal_text_and_price_limit(products, seed0, by_asin):
    prices, goals = seed0
    for goal in goals[:200]:
        product = by_asin[goal["asin"]]
        text = goal["instruction_text"]
        assert text.startswith(product.instruction_text)
        for name, value in goal["goal_options"].items():
            assert f"{name}: {value}" in text
        if goal["price_upper"] == 1000000:
            assert "price lower than" not in text
        else:
            assert text.endswith(f", and price lower than {goal['price_upper']:.2f} dollars")
            steps_above = [10.0 * i for i in range(1, 100) if 10.0 * i > prices[goal["asin"]]]
            assert goal["price_upper"] in steps_above[1:4]


# ------------------------------------------------------------------------------- rewards


def test_seed0_rewards_equal_golden(golden, by_asin, seed0):
    prices, _ = seed0
    goals = golden["seed0_goals"]
    records = golden["seed0_rewards"]
    assert len(records) == 1000
    matching = 0
    for record in records:
        goal = goals[record["goal_index"]]
        assert record["price"] == prices[record["asin"]]
        reward, info = purchase_reward(by_asin[record["asin"]], goal, by_asin[goal["asin"]],
                                       record["price"], record["options"])
        if (reward == record["reward"] and repr(reward) == repr(record["reward"])
                and info == record["info"] and list(info) == list(record["info"])
                and type(info["r_price"]) is bool):
            matching += 1
    assert matching == len(records)


# --------------------------------------------------------------------- hand-made unit checks


def test_token_set_ratio_edge_cases():
    assert token_set_ratio("", "") == 0
    assert token_set_ratio("", "abc") == 0
    assert token_set_ratio("!!!", "abc") == 0  # empty after processing
    assert token_set_ratio(None, "abc") == 0
    assert token_set_ratio("Machine-Washable", "machine washable") == 100
    assert token_set_ratio("long lasting", "lasting long extra") == 100  # token subset
    assert token_set_ratio("abc", "abd") == 67  # rounded to an int
    assert isinstance(token_set_ratio("abc", "abd"), int)
    # thefuzz drops code points 128-255 before processing; others (CJK, 'ł') are kept
    assert token_set_ratio("caf\u00e9", "caf") == 100
    assert token_set_ratio("\u00e9\u00e8", "x") == 0
    assert token_set_ratio("\u0142\u00f3d\u017a", "\u0142d\u017a") == 100
    assert token_set_ratio("\u65e5\u672c", "\u65e5\u672c") == 100
    # a tuple is compared as its str()
    assert token_set_ratio("color navy blue", ("color", "navy blue")) == 100


def test_color_set():
    assert len(COLOR_SET) == 102 and len(set(COLOR_SET)) == 102
    assert COLOR_SET[0] == "alabaster" and COLOR_SET[-1] == "yellow"
    assert list(COLOR_SET) == sorted(COLOR_SET)


def test_normalize_color_string_and_tuple():
    assert canonical_color("light blue") == "blue"  # 'blue' precedes 'light'
    assert canonical_color("black forest") == "black"
    assert canonical_color("123alabaster") == "alabaster"
    assert canonical_color("webshop") == "webshop"
    assert canonical_color("") == ""
    # a (name, value) pair: only an element equal to a colour word is replaced
    assert canonical_color(("color", "navy blue")) == ("color", "navy blue")
    assert canonical_color(("color", "navy")) == "navy"
    assert canonical_color(("size", "large")) == ("size", "large")


def _product(asin="A", query="q", category="a › b › c", nouns=("shirt",), **kw):
    fields = dict(asin=asin, title="t", description="", bullet_points=(), price_tag="$1.0",
                  pricing=(1.0,), options={}, attributes=(), instruction_text=None,
                  instruction_attributes=None, query=query, category="c",
                  product_category=category, nouns=tuple(nouns))
    fields.update(kw)
    return Product(**fields)


def test_title_score_rules():
    assert title_score(["shirt"], ["shirt", "shirt", "cotton", "men"]) == 0.25  # dups count
    assert title_score(["shirt", "shirt"], ["shirt"]) == 1.0
    assert title_score(["x"], []) == 0.2
    assert title_score([], ["x"]) == 0.0


def test_type_reward_rules():
    assert type_reward(True, False, 0.5) == 1.0
    assert type_reward(False, True, 0.15) == 1.0
    assert type_reward(False, False, 0.25) == 1.0
    assert type_reward(False, False, 0.2) == 0.5  # 0.2 is not above 0.2
    assert type_reward(False, False, 0.15) == 0.5
    assert type_reward(True, True, 0.05) == 0.1  # low noun score overrides matches
    assert type_reward(False, False, 0.05) == 0.1
    assert type_reward(True, True, 0.0) == 0.0


def test_get_type_reward_on_products():
    goal = _product(asin="G", query="men shirt", category="Clothing › Men › Shirts",
                    nouns=("shirt", "cotton"))
    same_category = _product(query="other", category=" Clothing›Men › Pants ", nouns=("shirt",))
    info = type_match(same_category, goal)
    assert info == {"r_type": 1.0, "query_match": False, "category_match": True,
                    "title_score": 0.5}
    one_part = _product(query="other", category="Clothing › Women", nouns=("shirt",))
    assert type_match(one_part, goal)["category_match"] is False
    no_nouns = _product(query="men shirt", category="x", nouns=("pants",))
    info = type_match(no_nouns, goal)
    assert info["query_match"] is True and info["r_type"] == 0.0
    goal_without_nouns = dataclasses.replace(goal, nouns=())
    info = type_match(_product(query="other", category="x"), goal_without_nouns)
    assert info["title_score"] == 0.2 and info["r_type"] == 0.5


def test_get_reward_breakdown_by_hand():
    goal_product = _product(asin="G", query="q", nouns=("jeans",))
    bought = _product(asin="B", query="q", nouns=("jeans",), title="Slim Jeans",
                      attributes=("machine wash",), description="Made of stretch denim.")
    goal = {"asin": "G", "attributes": ["machine wash", "stretch denim", "button fly"],
            "goal_options": {}, "price_upper": 50.0}
    reward, info = purchase_reward(bought, goal, goal_product, 60.0, {})
    assert reward == 2 / 4
    assert list(info) == ["r_type", "r_att", "w_att", "query_match", "category_match",
                          "title_score", "r_price", "w_price"]
    assert info["r_att"] == 2 / 3 and info["w_att"] == 3 / 4
    assert info["r_price"] is False and info["w_price"] == 1 / 4

    goal = dict(goal, attributes=["machine wash"],
                goal_options={"color": "navy", "size": "32w x 30l"})
    options = {"size": "32w x 30l", "color": "navy blue"}
    reward, info = purchase_reward(bought, goal, goal_product, 50.0, options)
    # the goal's ('color', 'navy') pair becomes 'navy' (an element equals a colour word) while
    # the bought 'navy blue' becomes 'blue' (first colour word contained): no match; the
    # ('size', '32w x 30l') pair stays a pair and its text still matches the bought size
    assert info["r_option"] == 1 / 2 and info["w_option"] == 2 / 4
    assert info["r_price"] is True
    assert reward == (1 + 1 + True) / 4
    assert list(info)[-4:] == ["r_option", "w_option", "r_price", "w_price"]
    # a goal colour that is no exact colour word stays a pair and matches by its tokens
    goal = dict(goal, goal_options={"color": "light blue"})
    reward, info = purchase_reward(bought, goal, goal_product, 50.0, {"color": "blue"})
    assert info["r_option"] == 1.0 and reward == 1.0
