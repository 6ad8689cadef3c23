"""The plan-execute agent (hgpo_jax.agents.plan_execute), HiPER's reply format: the authors'
option templates byte for byte, their reply projection, the token-level spans training reads,
the registry entry, the SFT reply, and a toy rollout that carries the sub-goal.

Reference values marked "authors'" were obtained by running the authors' own functions
(JonP07/HiPER-agent at 9d3c118: `alfworld_projection_options`, `webshop_projection_options`,
`make_hae_masks_and_switch(include_tags_mask=True)`, `compute_value_mask`, and the Options env
managers' `build_text_obs` with `SimpleMemory.fetch_options`) in a scratch folder outside the
project, on the inputs below (a stand-in tokenizer whose `batch_decode` returns the given pieces;
torch CPU); their outputs are pasted here as literals. None of their code is in the project.
"""

import hashlib

import numpy as np
import pytest

from hgpo_jax.agents import Agent, Reply, Turn, agent_names, get_agent, projection_names
from hgpo_jax.agents.plan_execute import (PlanExecuteAgent, ReplySpans, make_agent, project,
                                          reply_spans)
from hgpo_jax.agents.plan_execute import prompts
from hgpo_jax.agents.verl_agent.alfworld import TOY_INTRO
from hgpo_jax.envs.prompts import task_from_observation
from hgpo_jax.envs.registry import env_names
from hgpo_jax.envs.toy import TASK, WIN_REWARD, toy_episodes
from hgpo_jax.envs.webshop.prompts import admissible_actions
from hgpo_jax.envs.webshop.prompts import task_from_observation as webshop_task
from hgpo_jax.rl.rollout import collect_rollouts
from hgpo_jax.sft.data import samples_from_episodes
from toy_policies import RecordingPool, ReplayPolicy

ENVS = ("alfworld", "toy", "toy-history", "toy-lock", "webshop")

# ------------------------------------------------------------------------------------ templates
# Transcribed from /work/shared/design/hiper.md §1.2 (checked there against the authors' file):
# each template is the text shown between one leading and one trailing newline. The WebShop
# admissible-actions line ends with one space (written \x20), "e‑commerce" holds U+2011.
ALFWORLD_NO_HIS = """
You are an expert agent operating in the ALFRED Embodied Environment.

You will complete the task by maintaining a SHORT-TERM SUB-GOAL at each step. A sub-goal is a small high-level objective that can typically be achieved in a few actions. A sub-goal is NOT the full task and NOT a low-level action.

At every step, you reconsider your current sub-goal based on the latest observation, and may continue it or switch to a new short-term sub-goal.

Your current observation is:
{current_observation}

Your current sub-goal is:
{current_subgoal}
(If this is the first step of the episode, this will be "None".)

Your admissible actions are:
[{admissible_actions}]

At EVERY step, you MUST output EXACTLY THREE blocks, in the order shown below:
1) A <switch> block          (KEEP or SWITCH)
2) A <subgoal> block         (the sub-goal to follow next)
3) An <action> block         (one admissible action)

NO other text, comments, or reasoning is allowed before, after, or between these blocks.

STRICT FORMAT REQUIREMENTS:
- <switch> MUST contain ONLY "KEEP" or "SWITCH".
- <subgoal> MUST appear at EVERY step:
    * If <switch>KEEP</switch>, you MUST copy the EXACT current sub-goal.
    * If <switch>SWITCH</switch>, you MUST write a NEW short sub-goal achievable in a few actions.
- <action> MUST contain EXACTLY ONE action verbatim copied AS IS from the admissible actions list.

NOW RESPOND IN THIS EXACT FORMAT (no extra text):

<switch>KEEP or SWITCH</switch>
<subgoal>the sub-goal you will follow next</subgoal>
<action>EXACTLY one ADMISSIBLE action</action>
"""

ALFWORLD_HIS = """
You are an expert agent operating in the ALFRED Embodied Environment.
Your overall task is: {task_description}

You will complete the task by maintaining a SHORT-TERM SUB-GOAL at each step. A sub-goal is a small high-level objective that can typically be achieved in a few actions. A sub-goal is NOT the full task and NOT a low-level action.

At every step, you reconsider your current sub-goal based on the latest observation, and may continue it or switch to a new short-term sub-goal.

You have already taken {step_count} step(s).
Most recent {history_length} observations and actions:
{action_history}

Your current observation is:
{current_observation}

Your current sub-goal is:
{current_subgoal}

Your admissible actions are:
[{admissible_actions}]

At EVERY step, you MUST output EXACTLY THREE blocks, in the order shown below:
1) A <switch> block          (KEEP or SWITCH)
2) A <subgoal> block         (the sub-goal to follow next)
3) An <action> block         (one admissible action)

NO other text, comments, or reasoning is permitted anywhere in the output.

STRICT FORMAT REQUIREMENTS:
- <switch> MUST contain ONLY "KEEP" or "SWITCH".
- <subgoal> MUST appear at EVERY step:
    * If you KEEP, copy the EXACT current sub-goal into <subgoal>.
    * If you SWITCH, write a NEW short sub-goal achievable in a few actions and NOT the entire task.
- <action> MUST contain EXACTLY ONE action verbatim copied AS IS from the admissible actions list.

NOW RESPOND IN THIS EXACT FORMAT (no extra text):

<switch>KEEP or SWITCH</switch>
<subgoal>the sub-goal you will follow next</subgoal>
<action>EXACTLY one ADMISSIBLE action</action>
"""

WEBSHOP_NO_HIS = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. Your task is to: {task_description}.

You will complete the task by maintaining a SHORT-TERM SUB-GOAL at each step. A sub-goal is a small high-level objective that can typically be achieved in a few actions. A sub-goal is NOT the full task and NOT a low-level action.

At every step, you reconsider your current sub-goal based on the latest observation, and may continue it or switch to a new short-term sub-goal.

Your current observation is: {current_observation}.

Your current sub-goal is: {current_subgoal}.

Your admissible actions of the current situation are:\x20
[
{available_actions}
].

At EVERY step, you MUST output EXACTLY THREE blocks, in the order shown below:
1) A <switch> block          (KEEP or SWITCH)
2) A <subgoal> block         (the sub-goal to follow next)
3) An <action> block         (one admissible action)

NO other text, comments, or reasoning is allowed before, after, or between these blocks.

STRICT FORMAT REQUIREMENTS:
- <switch> MUST contain ONLY "KEEP" or "SWITCH".
- <subgoal> MUST appear at EVERY step:
    * If <switch>KEEP</switch>, you MUST copy the EXACT current sub-goal.
    * If <switch>SWITCH</switch>, you MUST write a NEW short sub-goal achievable in a few actions.
- <action> MUST contain EXACTLY ONE action verbatim copied AS IS from the admissible actions list.

NOW RESPOND IN THIS EXACT FORMAT (no extra text):

<switch>KEEP or SWITCH</switch>
<subgoal>the sub-goal you will follow next</subgoal>
<action>EXACTLY one ADMISSIBLE action</action>
"""

WEBSHOP_HIS = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. Your task is to: {task_description}.

You will complete the task by maintaining a SHORT-TERM SUB-GOAL at each step. A sub-goal is a small high-level objective that can typically be achieved in a few actions. A sub-goal is NOT the full task and NOT a low-level action.

At every step, you reconsider your current sub-goal based on the latest observation, and may continue it or switch to a new short-term sub-goal.

You have already taken {step_count} step(s). Below are the most recent {history_length} observations and the corresponding actions you took: {action_history}
You are now at step {current_step} and your current observation is: {current_observation}.

Your current sub-goal is: {current_subgoal}.

Your admissible actions of the current situation are:\x20
[
{available_actions}
].

At EVERY step, you MUST output EXACTLY THREE blocks, in the order shown below:
1) A <switch> block          (KEEP or SWITCH)
2) A <subgoal> block         (the sub-goal to follow next)
3) An <action> block         (one admissible action)

NO other text, comments, or reasoning is permitted anywhere in the output.

STRICT FORMAT REQUIREMENTS:
- <switch> MUST contain ONLY "KEEP" or "SWITCH".
- <subgoal> MUST appear at EVERY step:
    * If you KEEP, copy the EXACT current sub-goal into <subgoal>.
    * If you SWITCH, write a NEW short sub-goal achievable in a few actions and NOT the entire task.
- <action> MUST contain EXACTLY ONE action verbatim copied AS IS from the admissible actions list.

NOW RESPOND IN THIS EXACT FORMAT (no extra text):

<switch>KEEP or SWITCH</switch>
<subgoal>the sub-goal you will follow next</subgoal>
<action>EXACTLY one ADMISSIBLE action</action>
"""


def test_templates_are_the_authors_byte_for_byte():
    assert prompts.ALFWORLD_PLAN_NO_HISTORY == ALFWORLD_NO_HIS
    assert prompts.ALFWORLD_PLAN_WITH_HISTORY == ALFWORLD_HIS
    assert prompts.WEBSHOP_PLAN_NO_HISTORY == WEBSHOP_NO_HIS
    assert prompts.WEBSHOP_PLAN_WITH_HISTORY == WEBSHOP_HIS
    for t in (ALFWORLD_NO_HIS, ALFWORLD_HIS, WEBSHOP_NO_HIS, WEBSHOP_HIS):
        assert t.startswith("\nYou are an expert ") and t.endswith("action</action>\n")
    assert WEBSHOP_HIS.count("e\u2011commerce") == WEBSHOP_NO_HIS.count("e\u2011commerce") == 1
    assert WEBSHOP_HIS.count("are: \n[") == WEBSHOP_NO_HIS.count("are: \n[") == 1
    assert " \n" not in ALFWORLD_NO_HIS + ALFWORLD_HIS  # no trailing spaces in ALFWorld's


def test_toy_templates_swap_only_the_first_sentence():
    intro = "You are an expert agent operating in the ALFRED Embodied Environment."
    assert prompts.TOY_PLAN_NO_HISTORY == ALFWORLD_NO_HIS.replace(intro, TOY_INTRO)
    assert prompts.TOY_PLAN_WITH_HISTORY == ALFWORLD_HIS.replace(intro, TOY_INTRO)
    assert "ALFRED" not in prompts.TOY_PLAN_WITH_HISTORY + prompts.TOY_PLAN_NO_HISTORY


# ------------------------------------------------------------------------------------ prompts
ALF_OBS0 = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly "
            "around you, you see a countertop 1, a drawer 1, and a sinkbasin 1.\n\nYour task is to: "
            "put a clean mug in coffeemachine.")
# (observation, admissible actions, the reply given at that step)
ALF_EPISODE = [
    (ALF_OBS0, ["go to countertop 1", "go to drawer 1", "help", "inventory", "look"],
     "<switch>SWITCH</switch>\n<subgoal>find the mug</subgoal>\n<action>go to countertop 1</action>"),
    ("You arrive at countertop 1. On the countertop 1, you see a mug 1.",
     ["take mug 1 from countertop 1", "go to drawer 1", "help", "look"],
     "<subgoal>take the mug</subgoal>\n<action>take mug 1 from countertop 1</action>"),  # no switch
    ("You pick up the mug 1 from the countertop 1.", ["go to sinkbasin 1", "look"],
     "<switch>SWITCH</switch>\n<subgoal>Clean The Mug</subgoal>\n<action>go to sinkbasin 1</action>"),
    ("You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.",
     ["clean mug 1 with sinkbasin 1"], "I will clean the mug with the sinkbasin now"),  # no tags
    ("Nothing happens.", ["clean mug 1 with sinkbasin 1", "look"],
     "<switch>KEEP</switch>\n<subgoal>Clean The Mug</subgoal>\n<action>clean mug 1 with sinkbasin 1"
     "</action>"),
    ("You clean the mug 1 using the sinkbasin 1.", ["go to countertop 1"], ""),
]
WS_TASK = "i need a blue shirt, and price lower than 30.00 dollars"
WS_SEARCH = f"WebShop [SEP] Instruction: [SEP] {WS_TASK} [SEP] Search"
WS_RESULTS = (f"WebShop [SEP] Instruction: [SEP] {WS_TASK} [SEP] Back to Search [SEP] Page 1 (Total "
              "results: 50) [SEP] Next > [SEP] B01 [SEP] Blue Shirt [SEP] $12.99")
WS_LONG = (f"WebShop [SEP] Instruction: [SEP] {WS_TASK} [SEP] Back to Search [SEP] < Prev [SEP] "
           + " [SEP] ".join(f"feature {i}: soft cotton blend, machine wash" for i in range(160))
           + " [SEP] Buy Now")
ITEM = {"has_search_bar": False, "clickables": ["back to search", "< prev", "buy now"]}
RESULTS = {"has_search_bar": False, "clickables": ["back to search", "next >", "b01"]}
# (observation, the env's available actions, the reply given at that step)
WS_EPISODE = [
    (WS_SEARCH, {"has_search_bar": True, "clickables": []},
     "<switch>SWITCH</switch>\n<subgoal>search for blue shirts</subgoal>\n<action>search[blue shirt]"
     "</action>"),
    (WS_RESULTS, RESULTS,
     "<switch>maybe</switch>\n<subgoal>open b01</subgoal>\n<action>click[b01]</action>"),
    (WS_LONG, ITEM, "<action>click[< prev]</action>"),
    (WS_LONG, ITEM,
     "<switch>SWITCH</switch>\n<subgoal>buy it</subgoal>\n<action>click[buy now]</action>"),
    (WS_RESULTS, RESULTS, ""),
]
# authors': sha256[:16] of the prompt of each step of the episodes above, built by the Options env
# managers' build_text_obs (projection -> SimpleMemory.store -> fetch_options -> template), for
# env.history_length 2, 1 and 0. WebShop's steps 3 (H=2, H=1) and 4 (H=2) exceed 13,000
# characters with history and fall back to the first-turn template.
AUTHORS_PROMPT_HASHES = {
    ("alfworld", 2): ["1caef2d59aeb4f6a", "d1fcb868fd44f87b", "a663b9dc8d17745c",
                      "e7b94edd5055c77d", "039ec71462439ee5", "f595651992ec8eec"],
    ("alfworld", 1): ["1caef2d59aeb4f6a", "d1fcb868fd44f87b", "6d3a5d388842db35",
                      "d0a656004ab9ba7b", "741d7162f60cee7d", "d688d6acf3b554bb"],
    ("alfworld", 0): ["1caef2d59aeb4f6a", "0cf0ebbf4171ce72", "af5f9eb20eee5540",
                      "12731d0ebfedd604", "39f006f5cc7c7ef3", "21067840d079703a"],
    ("webshop", 2): ["05bfc19b82860f65", "2ac12db1d0c090e4", "7a0b9a2e65064883",
                     "443b7538650d9d21", "e7c7331cdef65b23"],
    ("webshop", 1): ["05bfc19b82860f65", "2ac12db1d0c090e4", "e27d1635243efd0f",
                     "443b7538650d9d21", "253325b22b56ba2c"],
    ("webshop", 0): ["05bfc19b82860f65", "1585a43823830179", "443b7538650d9d21",
                     "443b7538650d9d21", "1585a43823830179"],
}


def episode_prompts(env: str, memory_len: int) -> list[str]:
    """The agent's prompt at each step of the env's episode above, the memory built as the
    rollout builds it (parse, then remember)."""
    agent = get_agent("plan-execute", env)
    if env == "webshop":
        task, steps = webshop_task(WS_SEARCH), [(o, admissible_actions(a), r) for o, a, r in WS_EPISODE]
    else:
        task, steps = task_from_observation(ALF_OBS0), ALF_EPISODE
    history, out = [], []
    for obs, admissible, reply in steps:
        out.append(agent.prompt(task, obs, admissible, history, memory_len))
        history.append(agent.remember(obs, agent.parse(reply)))
    return out


@pytest.mark.parametrize("env, memory_len", sorted(AUTHORS_PROMPT_HASHES))
def test_prompts_match_the_authors_env_managers(env, memory_len):
    texts = episode_prompts(env, memory_len)
    assert [hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts] == \
        AUTHORS_PROMPT_HASHES[env, memory_len]


def test_alfworld_prompt_placeholders():
    first, second, _, fourth, *_ = episode_prompts("alfworld", 2)
    assert first == ALFWORLD_NO_HIS.format(
        current_observation=ALF_OBS0, current_subgoal="None",
        admissible_actions="'go to countertop 1'\n 'go to drawer 1'\n 'inventory'\n 'look'")
    assert second == ALFWORLD_HIS.format(
        task_description="put a clean mug in coffeemachine.", step_count=1, history_length=1,
        action_history=f"[Observation 1: '{ALF_OBS0}', Action 1: 'go to countertop 1']",
        current_observation=ALF_EPISODE[1][0], current_subgoal="find the mug",
        admissible_actions="'take mug 1 from countertop 1'\n 'go to drawer 1'\n 'look'")
    assert fourth == ALFWORLD_HIS.format(
        task_description="put a clean mug in coffeemachine.", step_count=3, history_length=2,
        action_history="[Observation 2: 'You arrive at countertop 1. On the countertop 1, you see "
                       "a mug 1.', Action 2: 'take mug 1 from countertop 1']\n[Observation 3: 'You "
                       "pick up the mug 1 from the countertop 1.', Action 3: 'go to sinkbasin 1']",
        current_observation=ALF_EPISODE[3][0], current_subgoal="Clean The Mug",
        admissible_actions="'clean mug 1 with sinkbasin 1'")
    # the sub-goal carried is the projection's, valid or not: no switch -> the action's last 30
    # characters; no action tags -> ""
    third, fifth = episode_prompts("alfworld", 2)[2], episode_prompts("alfworld", 2)[4]
    assert "Your current sub-goal is:\ntake mug 1 from countertop 1\n\n" in third
    assert "Your current sub-goal is:\n\n\n" in fifth
    # memory 0: the first-turn template at every step, sub-goal "None"
    for text in episode_prompts("alfworld", 0):
        assert "Your current sub-goal is:\nNone\n(If this is the first step" in text


def test_webshop_prompt_placeholders_and_the_13000_character_fallback():
    texts = episode_prompts("webshop", 2)
    assert texts[0] == WEBSHOP_NO_HIS.format(
        task_description=WS_TASK, current_observation="'Search'", current_subgoal="None",
        available_actions="'search[<your query>]',")
    assert texts[1] == WEBSHOP_HIS.format(
        task_description=WS_TASK, step_count=1, history_length=1,
        action_history="[Observation 1: ''Search'', Action 1: 'search[blue shirt]']", current_step=2,
        current_observation="'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >' "
                            "[SEP] 'B01' [SEP] 'Blue Shirt' [SEP] '$12.99'",
        current_subgoal="search for blue shirts",
        available_actions="'click[back to search]',\n'click[next >]',\n'click[b01]',")
    # step 2: an invalid switch carries "" (WebShop labels it KEEP)
    assert "Your current sub-goal is: .\n" in texts[2] and "You have already taken 2" in texts[2]
    # steps 3, 4: over 13,000 characters with history -> the first-turn template, with the carried
    # sub-goal ("None" after a reply without a switch block, then "buy it")
    results = ("'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] 'Next >' [SEP] 'B01' [SEP] "
               "'Blue Shirt' [SEP] '$12.99'")
    assert texts[4] == WEBSHOP_NO_HIS.format(
        task_description=WS_TASK, current_observation=results, current_subgoal="buy it",
        available_actions="'click[back to search]',\n'click[next >]',\n'click[b01]',")
    assert "You have already taken" not in texts[3] and "Your current sub-goal is: None." in texts[3]
    # the boundary: a prompt with history of exactly 13,000 characters is kept, one more falls back
    agent = get_agent("plan-execute", "webshop")

    def prompt(n: int) -> str:  # n characters of remembered observations
        history = [Turn("x" * (n // 2), "a", "s"), Turn("y" * (n - n // 2), "a", "s")]
        return agent.prompt(WS_TASK, WS_SEARCH, ["search[<your query>]"], history, 2)

    n = 13000 - (len(prompt(0)))
    assert len(prompt(n)) == 13000 and "You have already taken 2 step(s)" in prompt(n)
    assert prompt(n + 1) == WEBSHOP_NO_HIS.format(
        task_description=WS_TASK, current_observation="'Search'", current_subgoal="s",
        available_actions="'search[<your query>]',")


def test_toy_prompts():
    agent = get_agent("plan-execute", "toy")
    first = agent.prompt(TASK, "You are in a room with a red button.", ["press red button"], [], 2)
    assert first == prompts.TOY_PLAN_NO_HISTORY.format(
        current_observation="You are in a room with a red button.", current_subgoal="None",
        admissible_actions="'press red button'")
    later = agent.prompt(TASK, "o2", ["look", "help"], [Turn("o1", "press red button", "go")], 2)
    assert later.startswith(f"\n{TOY_INTRO}\nYour overall task is: {TASK}\n")
    assert "Your current sub-goal is:\ngo\n" in later and "['look']" in later
    with pytest.raises(ValueError, match="memory_len must be >= 0"):
        agent.prompt(TASK, "o", [], [], -1)


# ------------------------------------------------------------------------------------ projection
# authors': (alfworld_projection_options, webshop_projection_options) on each reply, as
# (action, subgoal, switch, valid); one row per line of the design's table and the quirks
PROJECTED = {
    "<switch>SWITCH</switch>\n<subgoal> Find The Mug </subgoal>\n<action> Go To Desk 1 </action>":
        (("go to desk 1", "Find The Mug", "SWITCH", 1), ("go to desk 1", "Find The Mug", "SWITCH", 1)),
    "<switch> keep </switch><subgoal>find the mug</subgoal><action>look</action>":
        (("look", "find the mug", "KEEP", 1), ("look", "find the mug", "KEEP", 1)),
    # no action pair: the lower-cased reply's last 30 / 20 characters, nothing else read
    "<switch>KEEP</switch><subgoal>s</subgoal> I think I Should GO TO DESK 1 now":
        (("hink i should go to desk 1 now", "", "", 0), ("uld go to desk 1 now", "", "", 0)),
    "Look Around": (("look around", "", "", 0), ("look around", "", "", 0)),
    "<switch>KEEP</switch><subgoal>s</subgoal><action>look":
        (("ubgoal>s</subgoal><action>look", "", "", 0), ("subgoal><action>look", "", "", 0)),
    # no switch pair: ALFWorld carries the action's last 30 characters, WebShop "None"
    "<subgoal>s</subgoal><action>take the very long named object 12 from shelf 3</action>":
        (("take the very long named object 12 from shelf 3", "g named object 12 from shelf 3", "",
          0), ("take the very long named object 12 from shelf 3", "None", "", 0)),
    "<action>Look</action>": (("look", "look", "", 0), ("look", "None", "", 0)),
    # switch text neither SWITCH nor KEEP: ALFWorld labels "", WebShop "KEEP"
    "<switch>maybe</switch><subgoal>s</subgoal><action>look</action>":
        (("look", "", "", 0), ("look", "", "KEEP", 0)),
    "<switch></switch><subgoal>s</subgoal><action>look</action>":
        (("look", "", "", 0), ("look", "", "KEEP", 0)),
    # no sub-goal pair
    "<switch>SWITCH</switch><action>look</action>":
        (("look", "", "SWITCH", 0), ("look", "", "SWITCH", 0)),
    # CJK: invalid, all else read
    "<switch>SWITCH</switch><subgoal>\u627e\u676f\u5b50</subgoal><action>look</action>":
        (("look", "\u627e\u676f\u5b50", "SWITCH", 0), ("look", "\u627e\u676f\u5b50", "SWITCH", 0)),
    "\u627e\u676f\u5b50 look": (("\u627e\u676f\u5b50 look", "", "", 0),
                                ("\u627e\u676f\u5b50 look", "", "", 0)),
    # a close tag before its open tag counts as found: empty text between
    "<switch>KEEP</switch><subgoal>s</subgoal></action><action>":
        (("", "s", "KEEP", 1), ("", "s", "KEEP", 1)),
    "<switch>KEEP</switch></subgoal>s<subgoal><action>look</action>":
        (("look", "", "KEEP", 1), ("look", "", "KEEP", 1)),
    "</switch>KEEP<switch><subgoal>s</subgoal><action>look</action>":
        (("look", "", "", 0), ("look", "", "KEEP", 0)),
    # switch and sub-goal tags are case-sensitive, the action's are not
    "<SWITCH>KEEP</SWITCH><subgoal>s</subgoal><action>look</action>":
        (("look", "look", "", 0), ("look", "None", "", 0)),
    "<switch>KEEP</switch><SUBGOAL>s</SUBGOAL><action>look</action>":
        (("look", "", "KEEP", 0), ("look", "", "KEEP", 0)),
    "<switch>KEEP</switch><subgoal>s</subgoal><ACTION>Look</Action>":
        (("look", "s", "KEEP", 1), ("look", "s", "KEEP", 1)),
    "<switch>SWITCH</switch>\n<subgoal>open the first result</subgoal>\n<action>click[B07XYZ]</action>":
        (("click[b07xyz]", "open the first result", "SWITCH", 1),
         ("click[b07xyz]", "open the first result", "SWITCH", 1)),
}


@pytest.mark.parametrize("reply", list(PROJECTED))
def test_project_matches_the_authors(reply):
    alfworld, webshop = PROJECTED[reply]
    for env, expected in (("alfworld", alfworld), ("toy", alfworld), ("toy-history", alfworld),
                          ("webshop", webshop)):
        action, subgoal, switch, valid = project(reply, env)
        assert (action, subgoal, switch, int(valid)) == expected
        assert isinstance(valid, bool)


def test_project_admissibility_is_not_checked_and_errors():
    assert project("<switch>KEEP</switch><subgoal>s</subgoal><action>fly</action>", "alfworld") == \
        ("fly", "s", "KEEP", True)
    assert project(None, "webshop") == ("", "", "", False)
    with pytest.raises(ValueError, match="no rules for env 'nethack'; it has rules for alfworld"):
        project("<action>a</action>", "nethack")


# ------------------------------------------------------------------------------------ spans
EOS = "<|im_end|>"
# design §1.4's example, 32 Qwen tokens. The design gives where the blocks' tokens fall (switch
# 0-7 with ">\n" merged, sub-goal 8-18 with ">\n" merged, action 19-30, <|im_end|> 31); the split
# inside each block is a guess of Qwen's BPE (it does not change the masks).
EXAMPLE_PIECES = ["<", "switch", ">", "SW", "ITCH", "</", "switch", ">\n",
                  "<", "sub", "goal", ">", "find", " the", " mug", "</", "sub", "goal", ">\n",
                  "<", "action", ">", "go", " to", " counter", "top", " ", "1", "</", "action", ">",
                  EOS]


def span(mask) -> tuple[int, int] | None:
    """(first, stop) of a mask's True run (which must be one run), None if empty."""
    on = [i for i, b in enumerate(mask) if b]
    if not on:
        return None
    assert on == list(range(on[0], on[-1] + 1)), "a mask must be one run"
    return on[0], on[-1] + 1


def test_the_design_example():
    assert len(EXAMPLE_PIECES) == 32
    assert "".join(EXAMPLE_PIECES) == ("<switch>SWITCH</switch>\n<subgoal>find the mug</subgoal>\n"
                                       "<action>go to countertop 1</action>" + EOS)
    s = reply_spans(EXAMPLE_PIECES)
    assert isinstance(s, ReplySpans) and len(s.action) == len(s.subgoal) == len(s.switch) == 32
    assert (span(s.switch), span(s.subgoal), span(s.action)) == ((0, 8), (8, 19), (19, 31))
    assert not (s.action[31] or s.subgoal[31] or s.switch[31])  # <|im_end|> in no mask
    assert s.new_segment and s.low_value_index == 19


# authors': make_hae_masks_and_switch(include_tags_mask=True) -> (action, subgoal, switch) as
# (first, stop) token ranges, is_new_subgoal; compute_value_mask -> value_mask_low's position
# (the same on boundary and non-boundary turns)
SPAN_CASES = {
    "no action block: the whole reply, EOS included": (
        ["<", "switch", ">", "KEEP", "</", "switch", ">\n", "<", "sub", "goal", ">", "x", "</", "sub",
         "goal", ">\n", "go", " to", " desk", " ", "1", EOS],
        ((0, 22), (7, 16), (0, 7), False, 16)),
    "no switch block: KEEP": (
        ["<", "sub", "goal", ">", "find", "</", "sub", "goal", ">\n", "<", "action", ">", "look",
         "</", "action", ">", EOS],
        ((9, 16), (0, 9), None, False, 9)),
    "<switch>maybe</switch> is a SWITCH; low value after the switch": (
        ["<", "switch", ">", "maybe", "</", "switch", ">\n", "<", "action", ">", "look", "</",
         "action", ">", EOS],
        ((7, 14), None, (0, 7), True, 7)),
    "lower-case keep with blanks: KEEP": (
        ["<", "switch", ">", " keep", " ", "</", "switch", ">", "<", "action", ">", "look", "</",
         "action", ">", EOS],
        ((8, 15), None, (0, 8), False, 8)),
    "blank switch: KEEP": (
        ["<", "switch", ">", " ", "</", "switch", ">", "<", "sub", "goal", ">", "s", "</", "sub",
         "goal", ">", "<", "action", ">", "look", "</", "action", ">", EOS],
        ((16, 23), (7, 16), (0, 7), False, 16)),
    "close variants .</subgoal> and ]</action>": (
        ["<", "switch", ">", "SW", "ITCH", "</", "switch", ">\n", "<", "sub", "goal", ">", "find",
         " it", ".</", "sub", "goal", ">\n", "<", "action", ">", "click", "[b", "01", "]</",
         "action", ">\n", EOS],
        ((18, 27), (8, 18), (0, 8), True, 18)),
    "close variant )</x>": (
        ["<", "sub", "goal", ">", "(x", ")</", "sub", "goal", ">", "<", "action", ">", "f", "(x",
         ")</", "action", ">", EOS],
        ((9, 17), (0, 9), None, False, 9)),
    "straddling '><' tokens are in two masks; low value after the straddler": (
        ["<", "switch", ">", "KEEP", "</", "switch", "><", "sub", "goal", ">", "s", "</", "sub",
         "goal", "><", "action", ">", "look", "</", "action", "><|im_end|>"],
        ((14, 21), (6, 15), (0, 7), False, 15)),
    "a token '</subgoal>\\n<action>'": (
        ["<switch>", "KEEP", "</switch>", "<subgoal>", "s", "</subgoal>\n<action>", "look",
         "</action>", EOS],
        ((5, 8), (3, 6), (0, 3), False, 6)),
    "nothing after the sub-goal: low value after the switch": (
        ["<", "switch", ">", "SW", "ITCH", "</", "switch", ">", "<", "sub", "goal", ">", "abc", "</",
         "sub", "goal", ">"],
        ((0, 17), (8, 17), (0, 8), True, 8)),
    "no tags: low value 0": (["hello", " world", EOS], ((0, 3), None, None, False, 0)),
    "empty reply": ([], (None, None, None, False, 0)),
    "sub-goal close before its open: no block": (
        ["</", "sub", "goal", ">", "<", "sub", "goal", ">", "x", "<", "action", ">", "a", "</",
         "action", ">", EOS],
        ((9, 16), None, None, False, 0)),
    "blocks in another order": (
        ["<", "action", ">", "look", "</", "action", ">", "<", "switch", ">", "KEEP", "</", "switch",
         ">", "<", "sub", "goal", ">", "s", "</", "sub", "goal", ">", EOS],
        ((0, 7), (14, 23), (7, 14), False, 23)),
    "two action blocks: the first": (
        ["<", "action", ">", "a", "</", "action", ">", " ", "<", "action", ">", "b", "</", "action",
         ">", EOS],
        ((0, 7), None, None, False, 0)),
}


@pytest.mark.parametrize("case", list(SPAN_CASES))
def test_reply_spans_match_the_authors(case):
    pieces, (action, subgoal, switch, new_segment, low) = SPAN_CASES[case]
    s = reply_spans(pieces)
    assert len(s.action) == len(s.subgoal) == len(s.switch) == len(pieces)
    assert (span(s.action), span(s.subgoal), span(s.switch)) == (action, subgoal, switch)
    assert (s.new_segment, s.low_value_index) == (new_segment, low)


def test_reply_spans_close_tag_ties_and_errors():
    # "</subgoal>" and "</subgoal>\n" start at the same place: the first wins, so the block ends
    # before the newline and the low value sits on the token after the one holding it
    s = reply_spans(["<subgoal>", "s", "</subgoal>", "\n", "<action>", "a", "</action>"])
    assert span(s.subgoal) == (0, 3) and s.low_value_index == 3
    assert reply_spans(("<action>", "a", "</action>")) == reply_spans(["<action>", "a", "</action>"])
    with pytest.raises(TypeError, match="decoded one at a time"):
        reply_spans([1, 2, 3])


# ------------------------------------------------------------------------------------ the agent
def test_registry_entry():
    assert "plan-execute" in agent_names()
    assert projection_names("plan-execute") == ("verl-agent",)
    for env in ENVS:
        agent = get_agent("plan-execute", env)
        assert isinstance(agent, PlanExecuteAgent) and isinstance(agent, Agent)
        assert agent == make_agent(env) and agent.name == "plan-execute" and agent.env == env
    assert set(ENVS) <= set(env_names())
    with pytest.raises(ValueError, match="agent 'plan-execute' has no prompt for env 'nethack'; it "
                                         "has prompts for alfworld, toy, toy-history, toy-lock, webshop"):
        get_agent("plan-execute", "nethack")
    with pytest.raises(ValueError, match="has no projection rules 'strict'; use one of verl-agent"):
        get_agent("plan-execute", "alfworld", projection="strict")
    with pytest.raises(ValueError, match="no prompt for env 'nethack'"):
        PlanExecuteAgent(env="nethack")


def test_parse_remember_and_scripted_reply():
    agent = get_agent("plan-execute", "alfworld")
    reply = agent.parse("<switch>KEEP</switch>\n<subgoal>Find It</subgoal>\n<action>Look</action>")
    assert reply == Reply("look", True, plan="Find It")
    assert agent.remember("obs", reply) == Turn("obs", "look", "Find It")
    assert agent.parse("<action>look</action>") == Reply("look", False, plan="look")
    assert get_agent("plan-execute", "webshop").parse("<action>look</action>") == Reply(
        "look", False, plan="None")
    assert agent.parse(None) == Reply("", False, "")
    assert agent.scripted_reply("go to desk 1") == (
        "<switch>SWITCH</switch>\n<subgoal>go to desk 1</subgoal>\n<action>go to desk 1</action>")
    for env in ENVS:
        a = get_agent("plan-execute", env)
        for action in ("click[b01]", "search[blue shirt]", "go to desk 1", "put mug 1 in/on sinkbasin 1"):
            assert a.parse(a.scripted_reply(action)) == Reply(action, True, plan=action)
        spans = reply_spans(list(a.scripted_reply("look")) + [EOS])  # one character per token
        assert spans.new_segment


def test_sft_samples_carry_the_scripted_sub_goals():
    episodes = toy_episodes([0], "expert")
    agent = get_agent("plan-execute", "toy")
    texts = samples_from_episodes(episodes, 2, agent)
    steps = episodes[0].steps
    assert [r for _, r in texts] == [agent.scripted_reply(s.action) for s in steps]
    assert "Your current sub-goal is:\nNone\n" in texts[0][0]
    assert f"Your current sub-goal is:\n{steps[-2].action}\n" in texts[-1][0]


def test_toy_rollout_carries_the_sub_goal():
    replies = ["<switch>SWITCH</switch>\n<subgoal>press a button</subgoal>\n<action>press red button"
               "</action>",
               "<action>go forward</action>",                         # no switch: invalid
               "<switch>SWITCH</switch>\n<subgoal>open the door</subgoal>\n<action>Open RED door"
               "</action>"]
    policy, pool = ReplayPolicy(replies), RecordingPool(1)
    batch = collect_rollouts(policy, pool, [0], group_size=1, max_steps=5, memory_len=2,
                             agent=get_agent("plan-execute", "toy"))
    assert pool.received == [["press red button", "go forward", "open red door"]]
    np.testing.assert_array_equal(batch.valid, [True, False, True])
    np.testing.assert_array_equal(batch.reward, [0.0, 0.0, WIN_REWARD])
    assert batch.won.all()
    first, second, third = policy.prompts
    assert first.startswith(f"\n{TOY_INTRO}\n\nYou will complete the task")
    assert "Your current sub-goal is:\nNone\n(If this is the first step" in first
    assert f"Your overall task is: {TASK}\n" in second
    assert "Your current sub-goal is:\npress a button\n\n" in second
    assert "[Observation 1: 'Task 0: open the door" in second
    # an invalid reply without a switch block carries its action's last 30 characters
    assert "Your current sub-goal is:\ngo forward\n\n" in third
    assert "Action 2: 'go forward']" in third
