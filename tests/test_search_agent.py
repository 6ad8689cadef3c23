"""The verl-agent search-QA agent (hgpo_jax.agents.verl_agent.search): projection, prompts and
memory equal the authors' on every case of the fixture tests/data/search_agent_reference.json
(their `search_projection` and `SearchEnvironmentManager` run outside the project:

    python tests/data/search_agent_reference.py <export of verl-agent 20bd331> \
        tests/data/search_agent_reference.json

), plus the templates' bytes, the SFT reply, the Turn adapter and the registration."""

import hashlib
import json
import pathlib
import pickle

import pytest

from hgpo_jax.agents import Reply, Turn, get_agent
from hgpo_jax.agents.registry import agent_spec
from hgpo_jax.agents.verl_agent import VerlAgent, env_formats, make_agent
from hgpo_jax.agents.verl_agent import search as s

FIXTURE = json.loads((pathlib.Path(__file__).parent / "data" / "search_agent_reference.json")
                     .read_text(encoding="utf-8"))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def turns_of(question: str, history) -> tuple[list[Turn], str]:
    """The agent memory's view of an authors' history: Turn(observation shown, action sent) per
    step (step 0 was shown the question, step k the observation step k-1 got), and the current
    observation."""
    shown = [question] + [obs for _, obs in history]
    return [Turn(shown[k], action) for k, (action, _) in enumerate(history)], shown[-1]


# ------------------------------------------------------------------------------ the fixture
def test_fixture_source():
    source = FIXTURE["source"]
    assert source["commit"] == "20bd331" and "alfworldauto" in source["repo"]
    assert "agent_system/environments/env_package/search/projection.py" in source["files"]
    assert len(FIXTURE["projection"]) >= 300 and len(FIXTURE["prompts"]) >= 200


def test_templates_equal_the_authors():
    assert FIXTURE["templates"] == [s.TEMPLATE_NO_HISTORY, s.TEMPLATE_WITH_HISTORY]


def test_projection_equals_the_authors_on_every_case():
    wrong = [(reply, action, valid, s.project_action(reply))
             for reply, action, valid in FIXTURE["projection"]
             if s.project_action(reply) != (action, valid)]
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:3]}"
    kinds = {(a.split(">")[0] + ">" if a else "", v) for _, a, v in FIXTURE["projection"]}
    assert kinds == {(k, v) for k in ("", "<search>", "<answer>") for v in (True, False)} - {
        ("", True)}  # the fixture covers every outcome


def test_prompts_equal_the_authors_at_every_step():
    wrong = []
    for case in FIXTURE["prompts"]:
        q, history, n = case["question"], case["history"], case["history_length"]
        got = [sha(s.build_prompt(q, history[:k], n)) for k in range(len(history) + 1)]
        if got != case["hashes"] or s.build_prompt(q, history, n) != case["prompt"]:
            wrong.append(case)
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:1]}"


def test_the_turn_adapter_equals_the_authors():
    """From the agent memory's turns (observation shown, action sent), the authors' prompt."""
    for case in FIXTURE["prompts"]:
        q, history, n = case["question"], case["history"], case["history_length"]
        turns, current = turns_of(q, history)
        assert s.prompt_from_turns(q, current, [], turns, n) == case["prompt"]
        agent = get_agent("verl-agent", "search")
        assert agent.prompt(q, current, [], turns, n) == case["prompt"]


# ------------------------------------------------------------------------------ templates
def test_template_bytes():
    no_his, his = s.TEMPLATE_NO_HISTORY, s.TEMPLATE_WITH_HISTORY
    for t in (no_his, his):
        assert t.startswith("\nYou are an expert agent tasked with answering the given question "
                            "step-by-step.\nYour question: {task_description}\n\n")
        assert "enclosed within <think> </think> tags. \nAfter completing" in t
        assert t.endswith("For example, <answer>Beijing</answer>.\n")
        assert not t.endswith("\n\n")
    assert (len(no_his), sha(no_his)) == (715, "267c5431c1c61ef6")  # the authors' file
    assert (len(his), sha(his)) == (1012, "a4d39bc70cfb1c0f")
    assert his == no_his.replace("\n\nNow it's", "\n\nPrior to this step, you have already taken "
                                 "{step_count} step(s). Below is the interaction history where "
                                 "<search> </search> wrapped your past search queries and "
                                 "<information> </information> wrapped the corresponding search "
                                 "results returned by the external search engine. History:\n"
                                 "{memory_context}\n\nNow it's")


def test_prompt_strings():
    info = '<information>{"result": "Doc 1: \\"T\\"\\nx\\n"}</information>'
    history = [("<search>a</search>", info), ("", ""), ("<search>b</search>", info)]
    prompt = s.build_prompt("Who?", history, 2)
    assert ("Your question: Who?\n\nPrior to this step, you have already taken 3 step(s). "
            in prompt)
    assert ("History:\nStep 2: \n\nStep 3:<search>b</search> " + info + "\n\n\nNow it's your turn"
            in prompt)
    assert s.build_prompt("Who?", history, 0) == s.build_prompt("Who?", (), 4) == \
        s.TEMPLATE_NO_HISTORY.format(task_description="Who?")
    assert s.build_prompt("{step_count}?", [("", "")], 1).count("{step_count}?") == 1
    with pytest.raises(ValueError, match="memory_len must be >= 0"):
        s.build_prompt("Who?", history, -1)


# ------------------------------------------------------------------------------ replies
@pytest.mark.parametrize("reply, expected", [
    ("<think>t</think><search> Who wrote X? </search>", ("<search>Who wrote X?</search>", True)),
    ("<ANSWER> Paris </ANSWER>", ("<answer>Paris</answer>", True)),  # <think> is never checked
    ("<search></search>", ("<search></search>", True)),                # an empty query is valid
    ("<search>q</search><answer>a</answer>", ("<search>q</search>", False)),  # both: invalid
    ("<answer>a</answer><search>q</search>", ("<search>q</search>", False)),  # search first
    ("<search>q</search><search>r</search>", ("<search>q</search>", False)),
    ("<search>q", ("", False)),
    ("<ſearch>q</search>", ("<search>q</search>", True)),  # Unicode case folding
    ("", ("", False)),
    (None, ("", False)),
    (42, ("", False)),
])
def test_project_action(reply, expected):
    assert s.project_action(reply) == expected
    assert get_agent("verl-agent", "search").parse(reply) == Reply(*expected)


def test_only_the_authors_rules():
    assert s.project("<answer>a</answer>", "verl-agent") == ("<answer>a</answer>", True)
    with pytest.raises(ValueError, match="search format has projection rules verl-agent only"):
        s.project("<answer>a</answer>", "strict")
    with pytest.raises(ValueError, match="no projection rules 'strict' for env 'search'"):
        get_agent("verl-agent", "search", projection="strict")
    with pytest.raises(ValueError, match="unknown projection rules 'lenient'"):
        make_agent("search", "lenient")


@pytest.mark.parametrize("action", ["<search>who wrote the Iliad</search>",
                                    "<answer>Homer</answer>", "<search>東京 café?</search>",
                                    "<answer></answer>"])
def test_scripted_reply_round_trips(action):
    agent = get_agent("verl-agent", "search")
    reply = agent.scripted_reply(action)
    assert reply.startswith("<think>") and reply.endswith("</think>" + action)
    assert agent.parse(reply) == Reply(action, True)


# ------------------------------------------------------------------------------ registration
def test_registration():
    agent = get_agent("verl-agent", "search")
    assert isinstance(agent, VerlAgent) and agent.projection == "verl-agent"
    assert agent.build_prompt is s.prompt_from_turns and agent.script is s.scripted_reply
    assert pickle.loads(pickle.dumps(agent)) == agent
    assert list(env_formats()) == ["alfworld", "toy", "toy-history", "toy-lock", "webshop", "search"]
    assert agent_spec("verl-agent").envs == tuple(env_formats())
    # the other envs keep today's SFT reply
    assert get_agent("verl-agent", "webshop").scripted_reply("click[b01]") == (
        "<think>I will click[b01].</think><action>click[b01]</action>")


def test_the_memory_pairs_each_action_with_what_followed():
    turns = [Turn("Q?", "<search>a</search>"), Turn("<information>A</information>", "")]
    assert s.steps_from_turns(turns, "") == [("<search>a</search>", "<information>A</information>"),
                                             ("", "")]
    assert s.steps_from_turns([], "Q?") == []
    assert s.prompt_from_turns("Q?", "Q?", [], [], 4) == s.build_prompt("Q?")
