"""WebShop env: the golden expert episodes replayed observation for observation, pages the golden
file does not show (from the original's templates), prompts byte for byte, projection, registry."""

from __future__ import annotations

import json
import os

import pytest

from hgpo_jax.agents import Turn
from hgpo_jax.agents.verl_agent import webshop as wp
from hgpo_jax.envs.webshop.prompts import format_observation
from hgpo_jax.envs.webshop import ENV_SPECS, WebShopEngine, WebShopEnv, train_reward
from hgpo_jax.envs.webshop.data import GOLDEN_FILE, WebShopDataError, resolve_data_dir
from hgpo_jax.envs.webshop.env import split_action
from hgpo_jax.envs.webshop.expert import (InstructionShopper, best_result, instruction_query,
                                        named_options, price_limit, results_on_page, title_actions,
                                        wanted_words)
from hgpo_jax.envs.webshop.pages import SEP, page_text


@pytest.fixture(scope="module")
def engine():
    return WebShopEngine()


@pytest.fixture(scope="module")
def golden(engine):
    with open(os.path.join(engine.folder, GOLDEN_FILE), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture()
def env(engine):
    return WebShopEnv(seed=0, engine=engine)


def test_expert_episodes_replay_exactly(engine, golden, env):
    trajectories = golden["seed0_expert_trajectories"]
    assert len(trajectories) == 10
    for i, steps in enumerate(trajectories):
        obs, info = env.reset(i)
        assert obs == steps[0]["obs"] and info["available_actions"] == steps[0]["avail"]
        for step in steps[1:]:
            obs, reward, done, info = env.step(step["action"])
            assert obs == step["obs"], (i, step["action"])
            assert (reward, done) == (step["reward"], step["done"])
            assert info["available_actions"] == step["avail"]  # after the buy: a fresh search page
        assert info["won"] and info["task_score"] == 1.0 and train_reward(reward, info) == 10.0
        # the scripted purchase used for SFT is the golden pattern
        goal = engine.goals(0)[i]
        assert title_actions(goal, engine.by_asin[goal["asin"]]) == [s["action"] for s in steps[1:]]


def test_contract_seed_and_goals(engine):
    env = WebShopEnv(seed=0, engine=engine)
    goals = engine.goals(0)
    obs, info = env.reset(5)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {goals[5]['instruction_text']} [SEP] Search"
    assert info["task"] == goals[5]["instruction_text"] and info["anchor"] == "'Search'"
    assert info["admissible_actions"] == ["search[<your query>]", "click[search]"]
    other = WebShopEnv(seed=1, engine=engine).reset(5)[1]["task"]
    assert other == engine.goals(1)[5]["instruction_text"]


def results_of(env, query):
    obs, reward, done, info = env.step(f"search[{query}]")
    return obs, info


def test_results_pages_and_navigation(env, engine):
    env.reset(0)
    hits = engine.search("women shoes", 50)
    obs, info = results_of(env, "women shoes")
    assert len(hits) == 50
    assert f"Page 1 (Total results: {len(hits)}) [SEP] Next > [SEP] {hits[0][0]}" in obs
    assert "< Prev" not in obs
    obs, _, _, info = env.step("click[next >]")
    assert f"Page 2 (Total results: {len(hits)}) [SEP] < Prev [SEP] Next > [SEP] {hits[10][0]}" in obs
    assert info["available_actions"]["clickables"][:3] == ["back to search", "< prev", "next >"]
    for _ in range(4):
        obs, _, _, info = env.step("click[next >]")
    # page 6 is past the 50 results: no products, "Next >" still shown (the original's template)
    assert obs.endswith("Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >")
    obs, _, _, _ = env.step("click[< prev]")
    assert "Page 5 (Total results: 50)" in obs and hits[40][0] in obs


def test_item_sub_pages_and_noops(env, engine):
    product = next(p for p in engine.products if "" in p.bullet_points and p.options)
    env.reset(0)
    results_of(env, product.title.lower())
    item, _, _, info = env.step(f"click[{product.asin.lower()}]")
    assert item.endswith("Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    # no-ops: unknown click, bad case, malformed, 'search' clicked, empty search
    for bad in ("click[nothing here]", "Click[buy now]", "buy now", "click[search]", "search[]", None):
        obs, reward, done, info2 = env.step(bad)
        assert (obs, reward, done) == (item, 0.0, False) and info2["available_actions"] == info["available_actions"]
    feats, _, _, _ = env.step("click[features]")
    assert "" in feats.split(SEP)  # an empty bullet point leaves an empty segment
    reviews, _, _, info = env.step("click[< prev]")
    assert reviews == item
    reviews, _, _, info = env.step("click[reviews]")
    assert reviews.endswith("Back to Search [SEP] < Prev")
    assert info["available_actions"] == {"has_search_bar": False, "clickables": ["back to search", "< prev"]}
    # search works from any page, and "< Prev" on an item page searches again
    obs, _, _, _ = env.step("search[red shoes]")
    assert "Page 1 (Total results:" in obs


def test_options_and_purchase(env, engine):
    goals = engine.goals(0)
    i = next(k for k, g in enumerate(goals) if len(g["goal_options"]) >= 2)
    goal, product = goals[i], engine.by_asin[goals[i]["asin"]]
    env.reset(i)
    results_of(env, product.title.lower())
    env.step(f"click[{product.asin.lower()}]")
    # a wrong option first, then the right ones: the last click per option name counts
    name, value = next(iter(goal["goal_options"].items()))
    wrong = next(v for v in product.options[name] if v != value)
    env.step(f"click[{wrong}]")
    for v in goal["goal_options"].values():
        env.step(f"click[{v}]")
    obs, reward, done, info = env.step("click[buy now]")
    expected = engine.reward(goal, product.asin, dict(goal["goal_options"]),
                             engine.product_prices(0)[product.asin])[0]
    assert done and reward == expected and info["task_score"] == expected
    assert obs.startswith("Thank you for shopping with us!") and f"{SEP}{reward}{SEP}" in obs
    assert info["anchor"] == obs  # the done page has no instruction: shown (and grouped) as is


def test_parse_action():
    assert split_action("search[a [b] c]") == ("search[a ", "b] c")  # greedy, as the original
    assert split_action("click[< Prev]") == ("click", "< Prev")
    assert split_action("click") == ("click", None)


def test_max_steps(engine):
    env = WebShopEnv(seed=0, engine=engine, max_steps=2)
    env.reset(0)
    assert env.step("click[nothing]")[2] is False
    assert env.step("click[nothing]")[2] is True


def test_page_text_rule():
    assert page_text(["a", "\n  ", " b ", " ", "", "c"]) == "a [SEP] b [SEP]  [SEP] c"


# ------------------------------------------------------------------------------------ prompts
def test_prompt_templates_bytes():
    assert "e\u2011commerce environment. \nYour task" in wp.TEMPLATE_NO_HISTORY
    assert "e\u2011commerce environment.\nYour task" in wp.TEMPLATE_WITH_HISTORY
    for t in (wp.TEMPLATE_NO_HISTORY, wp.TEMPLATE_WITH_HISTORY):
        assert t.startswith("\nYou are an expert autonomous agent") and t.endswith("tags.\n")
        assert "are: \n[\n{available_actions}\n].\n\nNow it's your turn to take one action" in t
        assert "<think> </think> tags. \nOnce you've finished" in t


def test_prompt_without_and_with_history(env):
    obs0, info0 = env.reset(0)
    task = info0["task"]
    p0 = wp.build_prompt(task, obs0, info0["admissible_actions"], [], 2)
    assert p0 == wp.TEMPLATE_NO_HISTORY.format(
        task_description=task, current_observation="'Search'",
        available_actions="'search[<your query>]',\n'click[search]',")
    obs1, _, _, info1 = env.step("search[jeans]")
    obs2, _, _, info2 = env.step("click[next >]")
    obs3, _, _, info3 = env.step("click[< prev]")
    history = [Turn(obs0, "search[jeans]"), Turn(obs1, "click[next >]"), Turn(obs2, "click[< prev]")]
    p3 = wp.build_prompt(task, obs3, info3["admissible_actions"], history, 2)
    f1, f2, f3 = (format_observation(o, task) for o in (obs1, obs2, obs3))
    assert f1.startswith("'Back to Search' [SEP] 'Page 1 (Total results:")
    memory = (f"[Observation 2: '{f1}', Action 2: 'click[next >]']\n"
              f"[Observation 3: '{f2}', Action 3: 'click[< prev]']")
    actions = "\n".join(f"'{a}'," for a in info3["admissible_actions"])
    assert p3 == wp.TEMPLATE_WITH_HISTORY.format(
        task_description=task, step_count=3, history_length=2, action_history=memory,
        current_step=4, current_observation=f3, available_actions=actions)
    assert info3["anchor"] == f3
    # memory 0: never history; an over-long prompt falls back to the template without history
    assert wp.build_prompt(task, obs3, info3["admissible_actions"], history, 0).startswith(
        wp.TEMPLATE_NO_HISTORY[:80])
    long = [Turn(obs1 + " x" * 7000, "click[next >]")]
    assert "Prior to this step" not in wp.build_prompt(task, obs3, info3["admissible_actions"], long, 2)


def test_projection_rules():
    assert wp.project("<think>ok</think><action>Click[Buy Now]</action>") == ("click[buy now]", True)
    reply = "<think>x</think> I would click the first result now"
    assert wp.project(reply) == (reply.lower()[-20:], False)  # 20 characters (ALFWorld: 30)
    assert wp.project("<action>search[x]</action>") == ("search[x]", False)  # no <think>
    assert wp.project("<think>\u4e2d</think><action>search[x]</action>") == ("search[x]", False)


# ------------------------------------------------------------------------------------ registry, data
def test_registry_entry(tmp_path):
    from hgpo_jax.config import load_config
    from hgpo_jax.envs.registry import get_env

    cfg = load_config("tiny_cpu_webshop")
    spec = get_env("webshop")
    assert spec.list_tasks(cfg.env, "test") == list(range(500))
    train = spec.list_tasks(cfg.env, "train")
    assert (train[0], train[-1], len(train)) == (500, 6909, 6410)
    env = spec.make_env(cfg.env)()
    assert env.max_steps == cfg.env.max_steps and spec.score_key == "task_score"
    with pytest.warns(UserWarning, match="1 WebShop goals skipped"):  # goal 500 cannot score 1
        episodes = spec.record_episodes(cfg.env, "train", 3, "expert")
    assert len(episodes) == 3 and all(ep.won for ep in episodes)
    with pytest.raises(ValueError, match="unknown env 'webshp'"):
        get_env("webshp")


def test_data_errors(tmp_path, monkeypatch):
    with pytest.raises(WebShopDataError, match="lacks"):
        resolve_data_dir(tmp_path)
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path))
    with pytest.raises(WebShopDataError, match=r"\$WEBSHOP_DATA"):
        resolve_data_dir()


def test_instruction_shopper_parses_the_instruction():
    text = ("Find me machine wash men's dress shirts with cotton spandex, classic fit, short sleeve "
            "with color: patina green, and size: medium, and price lower than 40.00 dollars")
    assert instruction_query(text) == ("machine wash men's dress shirts with cotton spandex, classic "
                                       "fit, short sleeve with color: patina green, and size: medium")
    assert wanted_words(text) == "machine wash men's dress shirts with cotton spandex, classic fit, short sleeve"
    assert named_options(text) == {"color": "patina green", "size": "medium"}
    assert price_limit(text) == 40.0
    plain = "Find me gluten free snacks, and price lower than 20.00 dollars"
    assert instruction_query(plain) == wanted_words(plain) == "gluten free snacks"
    assert named_options(plain) == {} and price_limit(plain) == 20.0


def test_best_result_matches_words_within_the_price():
    results = [("a1", "Red Wool Socks", 9.0), ("a2", "Gluten Free Snack Bars", 30.0),
               ("a3", "Gluten Free Crackers", 12.0), ("a4", "Free Crackers", 5.0)]
    assert best_result(results, "gluten free crackers", 20.0) == "a3"
    assert best_result(results, "gluten free snack bars", 20.0) == "a3"  # a2 costs too much
    assert best_result(results, "gluten free snack bars", None) == "a2"
    assert best_result(results, "nothing shared", 1.0) == "a1"  # none affordable: all, first on a tie


def test_instruction_shopper_acts_on_the_page_alone(engine, env):
    """Its episodes: search the instruction's words, open a result of page 1, click the named
    options the item offers, buy; each action follows from the observation shown."""
    scores = []
    for task in range(40):
        obs, info = env.reset(task)
        shopper, actions = InstructionShopper(), []
        for t in range(10):
            actions.append(shopper(obs, info, t))
            if t == 1:  # the clicked result is one the results page showed
                shown = [r[0] for r in results_on_page(obs, info["available_actions"]["clickables"])]
                assert len(shown) == 10 and actions[-1][len("click["):-1] in shown
            obs, _, done, info = env.step(actions[-1])
            if done:
                break
        assert done and actions[0] == f"search[{instruction_query(info['task'])}]"
        assert actions[-1] == "click[buy now]"
        options = named_options(info["task"])
        assert all(a[len("click["):-1] in options.values() for a in actions[2:-1])
        scores.append(info["task_score"])
    # partial scores mostly (the best-matching title is often not the target), some purchases perfect
    assert 0.3 < sum(scores) / len(scores) < 0.8 and 1.0 in scores and max(scores) <= 1.0


def test_record_search_episodes_for_sft():
    from hgpo_jax.config import EnvConfig

    spec = ENV_SPECS["webshop"]
    episodes = spec.record_episodes(EnvConfig(name="webshop", max_steps=15), "train", 6, "search")
    assert len(episodes) == 6 and all(ep.source.startswith("webshop-search:0:") for ep in episodes)
    for ep in episodes:
        assert ep.steps[0].action == f"search[{instruction_query(ep.task)}]"
        assert ep.steps[-1].action == "click[buy now]"
    with pytest.raises(ValueError, match="use expert .*, search .* or first"):
        spec.record_episodes(EnvConfig(name="webshop"), "train", 2, "random")


def test_first_result_shopper_opens_the_first_affordable_result(env):
    """kind "first": the instruction shopper opening the first result priced within the limit
    (the engine's best match) instead of the best-matching title: on these goals it scores more
    than the "words" pick; its episodes are recorded with their own source."""
    from hgpo_jax.config import EnvConfig
    from hgpo_jax.envs.webshop.expert import affordable, price_limit

    with pytest.raises(ValueError, match="pick must be one of"):
        InstructionShopper("best")
    scores = {"words": [], "first": []}
    for pick in scores:
        for task in range(40):
            obs, info = env.reset(task)
            shopper = InstructionShopper(pick)
            for t in range(10):
                action = shopper(obs, info, t)
                if t == 1 and pick == "first":
                    shown = results_on_page(obs, info["available_actions"]["clickables"])
                    assert action == f"click[{affordable(shown, price_limit(info['task']))[0][0]}]"
                obs, _, done, info = env.step(action)
                if done:
                    break
            scores[pick].append(info["task_score"])
    assert sum(scores["first"]) > sum(scores["words"])
    episodes = ENV_SPECS["webshop"].record_episodes(EnvConfig(name="webshop", max_steps=15), "train", 3, "first")
    assert [ep.source.split(":")[0] for ep in episodes] == ["webshop-first"] * 3
    assert all(ep.steps[-1].action == "click[buy now]" for ep in episodes)


def test_the_dense_score_reward_is_an_option():
    """env.reward=score (WebShop only): 10 x the purchase's task score instead of 10 x won; the
    default stays the authors'; an unknown name is refused by the config, naming the choices."""
    from hgpo_jax.config import load_config
    from hgpo_jax.config_checks import ConfigError
    from hgpo_jax.envs.registry import get_env, reward_names, with_reward

    spec = get_env("webshop")
    assert reward_names(spec) == ("default", "score")
    partial = {"won": False, "task_score": 0.5}
    assert spec.train_reward(0.5, partial) == 0.0  # the authors': only a perfect purchase
    assert with_reward(spec, "score").train_reward(0.5, partial) == 5.0
    assert with_reward(spec, "score").train_reward(0.0, {"won": False}) == 0.0  # not a purchase
    assert with_reward(spec, "default") is spec
    with pytest.raises(ValueError, match="has no training reward 'dense'; use one of default, score"):
        with_reward(spec, "dense")
    assert load_config("tiny_cpu_webshop", ["env.reward=score"]).env.reward == "score"
    with pytest.raises(ConfigError, match="env.reward='score' is not allowed; use one of default"):
        load_config("tiny_cpu", ["env.reward=score"])  # ALFWorld has its own reward only
