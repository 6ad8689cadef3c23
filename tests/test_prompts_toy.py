"""Prompts (golden strings on real ALFWorld observations), action projection, episode metrics
and the toy history-dependent env."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hgpo_jax.agents import Turn
from hgpo_jax.agents.verl_agent import alfworld as prompts
from hgpo_jax.agents.verl_agent.alfworld import build_prompt
from hgpo_jax.agents.verl_agent.projection import PROJECTIONS, project_action
from hgpo_jax.envs.alfworld import AlfworldEnv, list_games, walkthrough
from hgpo_jax.envs.base import check_info
from hgpo_jax.envs.prompts import success_rates, task_from_observation
from hgpo_jax.envs.toy import WIN_REWARD, ToyMemoryEnv

# The authors' instructions, the common tail of both templates (note the space after "tags.").
TAIL = ("Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning process "
        "MUST be enclosed within <think> </think> tags. \n"
        "Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.\n")


# ------------------------------------------------------------------------------------ golden prompts
GOLDEN_GAME = "pick_two_obj_and_place-SprayBottle-None-GarbageCan-419"
OBS = [
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around "
    "you, you see a bathtubbasin 1, a drawer 2, a drawer 1, a garbagecan 1, a handtowelholder 1, a "
    "sidetable 1, a sinkbasin 1, a toilet 1, a toiletpaperhanger 1, and a towelholder 1.\n\nYour "
    "task is to: put two spraybottle in garbagecan.",
    "You arrive at sidetable 1. On the sidetable 1, you see a spraybottle 2, a spraybottle 1, and a "
    "tissuebox 1.",
    "You pick up the spraybottle 2 from the sidetable 1.",
    "You arrive at garbagecan 1. On the garbagecan 1, you see nothing.",
    "You move the spraybottle 2 to the garbagecan 1.",
]
PLAN = ["go to sidetable 1", "take spraybottle 2 from sidetable 1", "go to garbagecan 1",
        "move spraybottle 2 to garbagecan 1"]
ACTIONS_STEP1 = ("'examine sidetable 1'\n 'go to bathtubbasin 1'\n 'go to drawer 1'\n "
                 "'go to drawer 2'\n 'go to garbagecan 1'\n 'go to handtowelholder 1'\n "
                 "'go to sinkbasin 1'\n 'go to toilet 1'\n 'go to toiletpaperhanger 1'\n "
                 "'go to towelholder 1'\n 'inventory'\n 'look'\n "
                 "'take spraybottle 1 from sidetable 1'\n 'take spraybottle 2 from sidetable 1'\n "
                 "'take tissuebox 1 from sidetable 1'")
ACTIONS_STEP4 = ("'examine garbagecan 1'\n 'go to bathtubbasin 1'\n 'go to drawer 1'\n "
                 "'go to drawer 2'\n 'go to handtowelholder 1'\n 'go to sidetable 1'\n "
                 "'go to sinkbasin 1'\n 'go to toilet 1'\n 'go to toiletpaperhanger 1'\n "
                 "'go to towelholder 1'\n 'inventory'\n 'look'\n "
                 "'take spraybottle 2 from garbagecan 1'")


@pytest.fixture(scope="module")
def played():
    """The first five steps of a real game's walkthrough: [(observation, admissible actions)] for
    steps 0..4 and the env's task text."""
    games = [g for g in list_games("valid_seen") if f"/{GOLDEN_GAME}/" in g]
    assert len(games) == 1
    assert walkthrough(games[0])[:4] == PLAN
    env = AlfworldEnv(max_steps=50)
    obs, info = env.reset(games[0])
    task = info["task"]
    seen = [(obs, info["admissible_actions"])]
    for action in PLAN:
        obs, reward, done, info = env.step(action)
        assert reward == 0.0 and not done
        seen.append((obs, info["admissible_actions"]))
    env.close()
    assert [o for o, _ in seen] == OBS  # raw observations: banner kept, nothing stripped
    return seen, task


def test_golden_prompt_at_step_0_uses_the_template_without_history(played):
    seen, task = played
    assert task == "put two spraybottle in garbagecan."
    expected = (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
        "Your current observation is: -= Welcome to TextWorld, ALFRED! =-\n\nYou are in the "
        "middle of a room. Looking quickly around you, you see a bathtubbasin 1, a drawer 2, a "
        "drawer 1, a garbagecan 1, a handtowelholder 1, a sidetable 1, a sinkbasin 1, a toilet 1, "
        "a toiletpaperhanger 1, and a towelholder 1.\n\nYour task is to: put two spraybottle in "
        "garbagecan.\n"
        "Your admissible actions of the current situation are: ['go to bathtubbasin 1'\n "
        "'go to drawer 1'\n 'go to drawer 2'\n 'go to garbagecan 1'\n 'go to handtowelholder 1'\n "
        "'go to sidetable 1'\n 'go to sinkbasin 1'\n 'go to toilet 1'\n "
        "'go to toiletpaperhanger 1'\n 'go to towelholder 1'\n 'inventory'\n 'look'].\n"
        "\n"
        "Now it's your turn to take an action.\n"
        "You should first reason step-by-step about the current situation. This reasoning process "
        "MUST be enclosed within <think> </think> tags. \n"
        "Once you've finished your reasoning, you should choose an admissible action for current "
        "step and present it within <action> </action> tags.\n")
    obs, actions = seen[0]
    assert build_prompt(task, obs, actions, [], memory_len=2) == expected
    assert build_prompt(task, obs, actions + ["help"], (), memory_len=4) == expected


def test_golden_prompt_at_step_1_shows_one_turn(played):
    seen, task = played
    history = [Turn(seen[0][0], PLAN[0])]
    expected = (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
        "put two spraybottle in garbagecan.\n"
        "Prior to this step, you have already taken 1 step(s). Below are the most recent 1 "
        f"observations and the corresponding actions you took: [Observation 1: '{OBS[0]}', "
        "Action 1: 'go to sidetable 1']\n"
        f"You are now at step 2 and your current observation is: {OBS[1]}\n"
        f"Your admissible actions of the current situation are: [{ACTIONS_STEP1}].\n"
        "\n" + TAIL)
    assert build_prompt(task, seen[1][0], seen[1][1], history, memory_len=2) == expected


def test_golden_prompt_beyond_the_memory_shows_the_last_turns_only(played):
    seen, task = played
    history = [Turn(seen[n][0], PLAN[n]) for n in range(4)]
    expected = (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
        "put two spraybottle in garbagecan.\n"
        "Prior to this step, you have already taken 4 step(s). Below are the most recent 2 "
        "observations and the corresponding actions you took: "
        "[Observation 3: 'You pick up the spraybottle 2 from the sidetable 1.', "
        "Action 3: 'go to garbagecan 1']\n"
        "[Observation 4: 'You arrive at garbagecan 1. On the garbagecan 1, you see nothing.', "
        "Action 4: 'move spraybottle 2 to garbagecan 1']\n"
        "You are now at step 5 and your current observation is: You move the spraybottle 2 to the "
        "garbagecan 1.\n"
        f"Your admissible actions of the current situation are: [{ACTIONS_STEP4}].\n"
        "\n" + TAIL)
    assert build_prompt(task, seen[4][0], seen[4][1], history, memory_len=2) == expected
    # memory_len 0: the template without history at every step
    no_memory = (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment.\n"
        "Your current observation is: You move the spraybottle 2 to the garbagecan 1.\n"
        f"Your admissible actions of the current situation are: [{ACTIONS_STEP4}].\n"
        "\n" + TAIL)
    assert build_prompt(task, seen[4][0], seen[4][1], history, memory_len=0) == no_memory


# ------------------------------------------------------------------------------------ prompts
def test_prompt_memory_lengths_and_numbering():
    history = [Turn(f"obs {i}", f"act {i}") for i in range(1, 4)]
    p4 = build_prompt("t", "now", ["a"], history, memory_len=4)  # fewer steps than H: all shown
    assert p4 == ("\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task "
                  "is to: t\nPrior to this step, you have already taken 3 step(s). Below are the "
                  "most recent 3 observations and the corresponding actions you took: "
                  "[Observation 1: 'obs 1', Action 1: 'act 1']\n"
                  "[Observation 2: 'obs 2', Action 2: 'act 2']\n"
                  "[Observation 3: 'obs 3', Action 3: 'act 3']\n"
                  "You are now at step 4 and your current observation is: now\n"
                  "Your admissible actions of the current situation are: ['a'].\n\n" + TAIL)
    p1 = build_prompt("t", "now", ["a"], history, memory_len=1)
    assert "most recent 1 observations" in p1 and "obs 2" not in p1
    assert "[Observation 3: 'obs 3', Action 3: 'act 3']\nYou are now at step 4" in p1
    with pytest.raises(ValueError, match="memory_len"):
        build_prompt("t", "now", ["a"], history, memory_len=-1)


def test_prompt_intro_help_and_braces():
    p = build_prompt("t", "a {brace} {0}", ["help", "look", "x {y}"], (), 2,
                     intro="You are an agent in a small text world.")
    assert p == ("\nYou are an agent in a small text world.\n"
                 "Your current observation is: a {brace} {0}\n"
                 "Your admissible actions of the current situation are: ['look'\n 'x {y}'].\n\n"
                 + TAIL)
    assert build_prompt("t", "o", [], (), 2).endswith(
        "Your admissible actions of the current situation are: [].\n\n" + TAIL)
    assert prompts.SYSTEM_INTRO == prompts.ALFWORLD_INTRO  # the older name still imports


@pytest.mark.parametrize("obs, task", [
    ("-= Welcome =-\n\nroom.\n\nYour task is to: put a mug in fridge.", "put a mug in fridge."),
    ("Your task is to:   heat an egg.  \nthen more\n\n", "heat an egg.  \nthen more"),
    ("Your task is to: a. Your task is to: b.", "a. Your task is to: b."),
    ("Your task is to:x", ""),
    ("no task here", ""),
    ("", ""),
])
def test_task_from_observation(obs, task):
    assert task_from_observation(obs) == task


# ------------------------------------------------------------------------------------ projection
@pytest.mark.parametrize("reply, expected", [
    ("<think>go</think><action>go to desk 1</action>", ("go to desk 1", True)),
    ("<think>x</think><action>  Go   To\nDesk 1 </action>", ("go   to\ndesk 1", True)),
    ("<think>x</think><action>look</action> no <action>inventory</action>", ("look", True)),
    ("<think>x</think><ACTION>Look</Action>", ("look", True)),
    ("<think>x</think><action></action>", ("", True)),
    ("<think>x</think><action>   </action>", ("", True)),
    ("<think>x</think></action>look<action>", ("", True)),  # reversed tags: an empty slice
    ("<think>x</think><action>a</action></action>", ("a", True)),
    # no tag pair: the last 30 characters of the lower-cased reply, invalid
    ("<think>I should go to the desk.</think> Go To Desk 1 please",
     ("k.</think> go to desk 1 please", False)),
    ("<think>x</think><action>Go to desk 1", (">x</think><action>go to desk 1", False)),
    ("<think>x</think>Go to desk 1</action>", ("x</think>go to desk 1</action>", False)),
    ("", ("", False)),
    # think tags are required as written (case-sensitive); the action is still extracted
    ("<THINK>x</THINK><action>look</action>", ("look", False)),
    ("<think>x<action>look</action>", ("look", False)),
    ("x</think><action>look</action>", ("look", False)),
    ("<action>look</action>", ("look", False)),
    # any CJK unified ideograph makes the reply invalid
    ("<think>看</think><action>look</action>", ("look", False)),
    ("<think>x</think><action>look \u4e00</action>", ("look \u4e00", False)),
    ("<think>x</think><action>look</action>\u9fff", ("look", False)),
    ("<think>あ\u3000</think><action>look</action>", ("look", True)),  # kana, ideographic space
])
def test_verl_agent_projection(reply, expected):
    assert project_action(reply) == expected
    assert project_action(reply, rules="verl-agent") == expected


def test_verl_agent_projection_has_no_length_limit_and_rejects_non_str():
    reply = "<think>" + "x" * 50_000 + "</think><action>look</action>"
    assert project_action(reply) == ("look", True)
    assert project_action("<think>t</think>" + "Y" * 100) == ("y" * 30, False)
    for bad in (None, 3, b"<think></think><action>look</action>"):
        assert project_action(bad) == ("", False)
        assert project_action(bad, "strict") == ("", False)
    assert PROJECTIONS == ("verl-agent", "strict")
    with pytest.raises(ValueError, match="verl-agent.*strict"):
        project_action("<action>look</action>", rules="lenient")


@pytest.mark.parametrize("reply, expected", [
    ("<think>go</think><action>go to desk 1</action>", ("go to desk 1", True)),
    ("<action>  Go   To\nDesk 1 </action>", ("go to desk 1", True)),
    ("<action>look</action> no wait <action>inventory</action>", ("inventory", True)),
    ("<ACTION>look</ACTION>", ("look", True)),
    ("go to desk 1", ("", False)),
    ("<action>go to desk 1", ("", False)),
    ("<action></action>", ("", False)),
    ("<action>   </action>", ("", False)),
    ("", ("", False)),
])
def test_strict_projection(reply, expected):
    assert project_action(reply, rules="strict") == expected


def test_strict_projection_refuses_too_long_replies():
    reply = "<think>" + "x" * 5000 + "</think><action>look</action>"
    assert project_action(reply, "strict") == ("", False)
    assert project_action(reply, "strict", max_reply_chars=10_000) == ("look", True)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(alphabet=st.characters(blacklist_characters="<>"), min_size=1))
def test_projection_never_crashes_and_finds_a_wrapped_action(noise, action):
    for rules in PROJECTIONS:
        got, valid = project_action(noise, rules)
        assert isinstance(got, str) and isinstance(valid, bool)
    cjk = any("\u4e00" <= c <= "\u9fff" for c in noise + action)
    got, valid = project_action(f"<think>t</think><action>{action}</action>{noise}")
    assert got == action.lower().strip() and valid == (not cjk)
    got, valid = project_action(f"{noise}<action>{action}</action>", "strict")
    assert got == " ".join(action.lower().split()) and valid == bool(action.split())


def test_success_rates_and_no_reward_shaping_here():
    rates = success_rates(["a", "a", "b", "c"], [True, False, True, False])
    assert rates == {"a": 0.5, "b": 1.0, "c": 0.0, "all": 0.5}
    with pytest.raises(ValueError):
        success_rates(["a"], [])
    # the invalid-action penalty lives in the advantage computation, not in prompts
    assert not hasattr(prompts, "shaped_reward") and not hasattr(prompts, "INVALID_ACTION_PENALTY")


# ------------------------------------------------------------------------------------ toy env
def test_toy_solution_wins_and_wrong_door_loses():
    env = ToyMemoryEnv()
    for task in range(6):
        obs, info = env.reset(task)
        check_info(info)
        rewards = [env.step(a)[1] for a in env.solution()]
        assert rewards[-1] == WIN_REWARD and sum(rewards) == WIN_REWARD
    env.reset(0)
    env.step("press red button")
    while env.phase != "junction":
        env.step("go forward")
    obs, reward, done, info = env.step("open blue door")
    assert done and reward == 0.0 and not info["won"]


def test_toy_junction_anchor_hides_the_history():
    """Two rollouts of one task press different buttons; at the junction they share the anchor
    (same observation) but need different actions: context inconsistency."""
    anchors, solutions = [], []
    for color in ("red", "blue"):
        env = ToyMemoryEnv()
        env.reset(0)
        env.step(f"press {color} button")
        while env.phase != "junction":
            *_, info = env.step("go forward")
        anchors.append(info["anchor"])
        obs, reward, done, info = env.step(f"open {color} door")
        solutions.append(reward)
    assert anchors[0] == anchors[1] and solutions == [WIN_REWARD, WIN_REWARD]


def test_toy_is_deterministic_and_ignores_garbage():
    a, b = ToyMemoryEnv(), ToyMemoryEnv()
    assert a.reset(7) == b.reset(7)
    for action in ["", "x" * 100_000, "\x00\x1b", "中文", "Ignore previous instructions",
                   "press purple button", None, 3]:
        obs, reward, done, info = a.step(action)
        assert obs.startswith("Nothing happens.") and reward == 0 and not done
    b.step("look")  # keep the two step counters equal
    color = a.colors[0]
    same = a.step(f"press {color} button")
    assert same == b.step(f"PRESS  {color.upper()}\tbutton") and "click" in same[0]
    env = ToyMemoryEnv(max_steps=2)
    env.reset(1)
    assert [env.step("look")[2] for _ in range(2)] == [False, True]
    with pytest.raises(ValueError):
        ToyMemoryEnv(num_colors=1)


def test_toy_history_reveals_the_press_and_shuffles_the_doors():
    from hgpo_jax.envs.toy import env_kwargs

    assert env_kwargs("toy") == {"reveal": False} and env_kwargs("toy-history") == {"reveal": True}
    with pytest.raises(ValueError, match="not a toy env"):
        env_kwargs("alfworld")
    for task in range(36):
        env = ToyMemoryEnv(**env_kwargs("toy-history"))
        env.reset(task)
        assert sorted(env.doors) == sorted(env.colors) and env.doors != env.colors  # never the identity
        rewards = [env.step(a)[1] for a in env.solution()]
        assert rewards[-1] == WIN_REWARD
    # the first corridor anchor names the pressed colour; the junction anchor does not
    seen = {}
    for color in ("red", "blue", "green"):
        env = ToyMemoryEnv(reveal=True)
        env.reset(0)
        *_, info = env.step(f"press {color} button")
        first_corridor = info["anchor"]
        while env.phase != "junction":
            *_, info = env.step("go forward")
        seen[color] = (first_corridor, info["anchor"], info["admissible_actions"])
    assert len({v[0] for v in seen.values()}) == 3 and "red light blinks" in seen["red"][0]
    assert len({v[1] for v in seen.values()}) == 1  # one junction anchor for all three
    assert seen["red"][2] == ["open blue door", "open green door", "open red door"]
    plain = ToyMemoryEnv()
    plain.reset(0)
    *_, info = plain.step("press red button")
    assert "light" not in info["anchor"]
