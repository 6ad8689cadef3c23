"""The agent layer (hgpo_jax.agents): the registry, the verl-agent agent's prompts byte for byte
(strings and hashes recorded from the env-owned prompt functions before they moved here), reply
parsing under both projections, the memory, the SFT reply, and rollouts driven by an agent."""

import dataclasses
import hashlib
import re

import numpy as np
import pytest

from hgpo_jax.agents import (DEFAULT_AGENT, Agent, Reply, Turn, agent_names, get_agent,
                             projection_names)
from hgpo_jax.agents.verl_agent import VerlAgent, env_formats
from hgpo_jax.agents.verl_agent.alfworld import TOY_INTRO
from hgpo_jax.envs.registry import env_names, get_env
from hgpo_jax.envs.toy import TASK, WIN_REWARD, toy_episodes
from hgpo_jax.rl.rollout import collect_rollouts, default_agent, default_spec
from hgpo_jax.sft.data import samples_from_episodes
from test_prompts_toy import TAIL as ALFWORLD_TAIL
from toy_policies import RecordingPool, ReplayPolicy

WEBSHOP_TAIL = (
    "Now it's your turn to take one action for the current step.\n"
    "You should first reason step-by-step about the current situation, then think carefully "
    "which admissible action best advances the shopping goal. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags.\n")


# ------------------------------------------------------------------------------------ registry
def test_registry_names_and_errors():
    assert agent_names() == ("verl-agent", "plan-execute") and DEFAULT_AGENT == "verl-agent"
    assert projection_names() == projection_names("verl-agent") == ("verl-agent", "strict")
    for env in env_names():  # the verl-agent agent has a prompt for every registered env
        agent = get_agent("verl-agent", env)
        assert isinstance(agent, Agent) and agent.name == "verl-agent"
        assert agent.projection == "verl-agent"
    assert get_agent("verl-agent", "webshop", projection="strict").projection == "strict"
    with pytest.raises(ValueError, match="unknown agent 'hiper'; use one of verl-agent"):
        get_agent("hiper", "alfworld")
    with pytest.raises(ValueError, match="has no prompt for env 'nethack'; it has prompts for "
                                         "alfworld, toy, toy-history, toy-lock, webshop"):
        get_agent("verl-agent", "nethack")
    with pytest.raises(ValueError, match="use one of verl-agent, strict"):
        get_agent("verl-agent", "alfworld", projection="lenient")
    with pytest.raises(ValueError, match="unknown agent"):
        projection_names("hiper")


def test_envs_build_no_prompts():
    for env in env_names():
        fields = {f.name for f in dataclasses.fields(get_env(env))}
        assert not fields & {"build_prompt", "project"}


# ------------------------------------------------------------------------------------ prompts
HISTORY = (Turn("You arrive at desk 1. On the desk 1, you see a {pen}.", "take pen 1 from desk 1"),
           Turn("You pick up the pen 1.", "go to drawer 1"),
           Turn("The drawer 1 is closed.", "open drawer 1"))
TASK_LINE = "put a pen in drawer."
WS_TASK = "i need a blue shirt, and price lower than 30.00 dollars"
WS_SEARCH = f"WebShop [SEP] Instruction: [SEP] {WS_TASK} [SEP] Search"
WS_RESULTS = (f"WebShop [SEP] Instruction: [SEP] {WS_TASK} [SEP] Back to Search [SEP] Page 1 "
              "(Total results: 50) [SEP] Next > [SEP] B01 [SEP] Blue Shirt [SEP] $12.99")


def alfworld_like_prompts(agent):
    """The four ALFWorld-template cases: step 0, history (H=2), memory 0, H=1."""
    return [agent.prompt(TASK_LINE, f"You are in a room.\n\nYour task is to: {TASK_LINE}",
                         ["go to desk 1", "help", "look"], [], 2),
            agent.prompt(TASK_LINE, "You open the drawer 1.",
                         ["close drawer 1", "put pen 1 in/on drawer 1"], HISTORY, 2),
            agent.prompt(TASK_LINE, "You open the drawer 1.", ["close drawer 1"], HISTORY, 0),
            agent.prompt("t", "o", ["a"], HISTORY, 1)]


def webshop_prompts(agent):
    """Step 0, a results page with one turn of memory, and the 13,000-character fallback."""
    return [agent.prompt(WS_TASK, WS_SEARCH, ["search[<your query>]"], [], 2),
            agent.prompt(WS_TASK, WS_RESULTS, ["click[back to search]", "click[next >]",
                                               "click[b01]"], [Turn(WS_SEARCH, "search[blue shirt]")], 2),
            agent.prompt(WS_TASK, WS_RESULTS, ["click[b01]"],
                         [Turn(WS_SEARCH + " x" * 7000, "search[a]")], 2)]


# sha256[:16] of each case's prompt from the env-owned functions (envs.prompts.build_prompt,
# envs.webshop.prompts.build_prompt, the toy's partial with TOY_INTRO) before the move
GOLDEN_HASHES = {
    "alfworld": ["d8adf3dfd3af0cf7", "e29d5b199c5baa59", "684d197713ecaa35", "fd7748594de60a86"],
    "toy": ["1430ca085746384f", "9a76abf3605a3014", "5d15530c87cee73e", "882cfcff4eca73fb"],
    "toy-history": ["1430ca085746384f", "9a76abf3605a3014", "5d15530c87cee73e", "882cfcff4eca73fb"],
    "webshop": ["47e2c7f5194c5f26", "08d3e1e4777bfc58", "5256befb9b977197"],
}


@pytest.mark.parametrize("env", sorted(GOLDEN_HASHES))
def test_prompts_are_byte_identical_to_the_env_owned_ones(env):
    agent = get_agent("verl-agent", env)
    texts = webshop_prompts(agent) if env == "webshop" else alfworld_like_prompts(agent)
    assert [hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts] == GOLDEN_HASHES[env]


def test_prompt_strings():
    """A few of the recorded prompts in full."""
    alfworld = alfworld_like_prompts(get_agent("verl-agent", "alfworld"))
    assert alfworld[1] == (
        "\nYou are an expert agent operating in the ALFRED Embodied Environment. Your task is to: "
        "put a pen in drawer.\nPrior to this step, you have already taken 3 step(s). Below are the "
        "most recent 2 observations and the corresponding actions you took: [Observation 2: 'You "
        "pick up the pen 1.', Action 2: 'go to drawer 1']\n[Observation 3: 'The drawer 1 is "
        "closed.', Action 3: 'open drawer 1']\nYou are now at step 4 and your current observation "
        "is: You open the drawer 1.\nYour admissible actions of the current situation are: ['close "
        "drawer 1'\n 'put pen 1 in/on drawer 1'].\n\n" + ALFWORLD_TAIL)
    toy = alfworld_like_prompts(get_agent("verl-agent", "toy"))
    assert toy[0] == (
        f"\n{TOY_INTRO}\nYour current observation is: You are in a room.\n\nYour task is to: put a "
        "pen in drawer.\nYour admissible actions of the current situation are: ['go to desk 1'\n "
        "'look'].\n\n" + ALFWORLD_TAIL)
    webshop = webshop_prompts(get_agent("verl-agent", "webshop"))
    assert webshop[0] == (
        "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment. "
        f"\nYour task is to: {WS_TASK}.\nYour current observation is: 'Search'.\nYour admissible "
        "actions of the current situation are: \n[\n'search[<your query>]',\n].\n\n" + WEBSHOP_TAIL)
    assert webshop[1] == (
        "\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment."
        f"\nYour task is to: {WS_TASK}.\nPrior to this step, you have already taken 1 step(s). "
        "Below are the most recent 1 observations and the corresponding actions you took: "
        "[Observation 1: ''Search'', Action 1: 'search[blue shirt]']\nYou are now at step 2 and "
        "your current observation is: 'Back to Search' [SEP] 'Page 1 (Total results: 50)' [SEP] "
        "'Next >' [SEP] 'B01' [SEP] 'Blue Shirt' [SEP] '$12.99'.\nYour admissible actions of the "
        "current situation are: \n[\n'click[back to search]',\n'click[next >]',\n'click[b01]',\n]."
        "\n\n" + WEBSHOP_TAIL)
    assert "Prior to this step" not in webshop[2]  # over 13,000 characters: no history


# ------------------------------------------------------------------------------------ replies
@pytest.mark.parametrize("env, reply, projection, expected", [
    ("alfworld", "<think>ok</think><action> Go To Desk 1 </action>", "verl-agent",
     Reply("go to desk 1", True)),
    ("alfworld", "<think>ok</think> I go to desk 1, then I look around the room", "verl-agent",
     Reply("1, then i look around the room", False)),           # no tags: the last 30 characters
    ("alfworld", "<action>look</action>", "verl-agent", Reply("look", False)),      # no <think>
    ("alfworld", "<think>\u4e2d</think><action>look</action>", "verl-agent", Reply("look", False)),
    ("alfworld", None, "verl-agent", Reply("", False)),
    ("alfworld", "<action>a</action> <action> Go  To </action>", "strict", Reply("go to", True)),
    ("alfworld", "<think>ok</think> go to desk 1", "strict", Reply("", False)),
    ("alfworld", "<action> </action>", "strict", Reply("", False)),
    ("toy", "<think>t</think><action>press red button</action>", "verl-agent",
     Reply("press red button", True)),
    ("webshop", "<think>x</think> I would click the first result now", "verl-agent",
     Reply("the first result now", False)),                     # the last 20 characters
    ("webshop", "<think>ok</think><action>Click[Buy Now]</action>", "strict",
     Reply("click[buy now]", True)),
])
def test_parse(env, reply, projection, expected):
    assert get_agent("verl-agent", env, projection=projection).parse(reply) == expected


def test_remember_and_scripted_reply():
    agent = get_agent("verl-agent", "alfworld")
    assert agent.remember("You see a desk.", Reply("go to desk 1", False)) == Turn(
        "You see a desk.", "go to desk 1", "")
    assert Turn("o", "a") == Turn("o", "a", "")  # plan: "" for agents without one
    assert agent.remember("o", Reply("a", True, plan="find the pen")).plan == "find the pen"
    # today's SFT response (what sft.data.response_text was)
    assert agent.scripted_reply("go to desk 1") == (
        "<think>I will go to desk 1.</think><action>go to desk 1</action>")
    formats = env_formats()
    sample = {"search": "<search>who wrote it</search>"}  # its actions are the tagged blocks
    for env in env_names():
        assert set(formats[env].projections) <= set(projection_names("verl-agent"))
        for projection in formats[env].projections:
            a = get_agent("verl-agent", env, projection=projection)
            action = sample.get(env, "click[b01]")
            assert a.parse(a.scripted_reply(action)) == Reply(action, True)


def test_sft_samples_use_the_agent():
    episodes = toy_episodes([0], "expert")
    agent = get_agent("verl-agent", "toy")
    texts = samples_from_episodes(episodes, 2, agent)
    steps = episodes[0].steps
    assert [r for _, r in texts] == [agent.scripted_reply(s.action) for s in steps]
    history = [agent.remember(s.observation, agent.parse(agent.scripted_reply(s.action)))
               for s in steps]
    assert texts[-1][0] == agent.prompt(episodes[0].task, steps[-1].observation,
                                        steps[-1].admissible, history[:-1], 2)


# ------------------------------------------------------------------------------------ rollouts
def test_rollout_through_the_verl_agent_agent():
    replies = ["<think>a</think><action>Press RED button</action>",
               "<think>b</think><action>go forward</action>",
               "<think>c</think><action>open red door</action>"]
    policy, pool = ReplayPolicy(replies), RecordingPool(1)
    batch = collect_rollouts(policy, pool, [0], group_size=1, max_steps=5, memory_len=2,
                             agent=get_agent("verl-agent", "toy"))
    assert pool.received == [["press red button", "go forward", "open red door"]]
    assert batch.valid.all() and batch.won.all()
    np.testing.assert_array_equal(batch.reward, [0.0, 0.0, WIN_REWARD])
    assert policy.prompts[0].startswith(f"\n{TOY_INTRO}\n")
    assert "Action 1: 'press red button'" in policy.prompts[2]


def test_rollout_defaults_to_the_envs_verl_agent_agent():
    assert default_agent() == get_agent("verl-agent", "alfworld")
    assert default_agent(default_spec()) == get_agent("verl-agent", "alfworld")
    assert default_agent(get_env("toy")) == get_agent("verl-agent", "toy")
    assert default_agent(get_env("webshop")) == get_agent("verl-agent", "webshop")
    assert isinstance(default_agent(), VerlAgent)


@dataclasses.dataclass(frozen=True)
class PlanAgent(Agent):
    """A plan-execute format: <subgoal>...</subgoal><action>...</action>; the memory keeps the
    sub-goal (what HiPER's agent will do; here only to show the rollout is the agent's)."""

    name: str = "plan-test"

    def prompt(self, task, observation, admissible_actions, history, memory_len):
        memory = " | ".join(f"{t.plan} -> {t.action}" for t in list(history)[-memory_len:])
        return f"task: {task}\nmemory: {memory}\nnow: {observation}\n"

    def parse(self, reply):
        plan = re.search(r"<subgoal>(.*?)</subgoal>", reply)
        action = re.search(r"<action>(.*?)</action>", reply)
        return Reply(action.group(1) if action else "", bool(plan and action),
                     plan.group(1) if plan else "")

    def scripted_reply(self, action):
        return f"<subgoal>{action}</subgoal><action>{action}</action>"


def test_rollout_carries_a_plan_agents_sub_goals():
    replies = ["<subgoal>get a colour</subgoal><action>press blue button</action>",
               "<action>go forward</action>",                       # no sub-goal: invalid
               "<subgoal>open the door</subgoal><action>open blue door</action>"]
    policy, pool = ReplayPolicy(replies), RecordingPool(1)
    batch = collect_rollouts(policy, pool, [0], group_size=1, max_steps=5, memory_len=2,
                             agent=PlanAgent())
    assert pool.received == [["press blue button", "go forward", "open blue door"]]
    np.testing.assert_array_equal(batch.valid, [True, False, True])
    assert batch.won.all()
    assert policy.prompts[0].startswith(f"task: {TASK}\nmemory: \n")
    assert "memory: get a colour -> press blue button |  -> go forward\n" in policy.prompts[2]
