"""The search env's dynamics on scripted episodes (verl-agent's SearchEnv rules, docs/envs.md),
through the embedded BM25 index and through the HTTP protocol of a loopback server."""

from __future__ import annotations

import json

import pytest

from hgpo_jax.agents import get_agent
from hgpo_jax.envs.base import check_info
from hgpo_jax.envs.registry import get_env
from hgpo_jax.envs.search import SearchOptions, make_search_env, retrieval
from hgpo_jax.envs.search.data import Question
from hgpo_jax.envs.search.env import SearchQAEnv, ends_episode, query_of
from hgpo_jax.envs.search.text import contents_text, search_error_text

CORPUS = [
    {"id": "0", "title": "Ada Vell", "text": "Ada Vell is a painter born in Korin."},
    {"id": "1", "title": "Korin", "text": "Korin is a city in Ostria."},
    {"id": "2", "title": "Bram Tolt", "text": "Bram Tolt is a baker born in Velm."},
    {"id": "3", "title": "Velm", "text": "Velm is a town in Dusk."},
]
QUESTIONS = [
    {"id": "q0", "question": "where was Ada Vell born", "golden_answers": ["Korin"],
     "data_source": "toyqa"},
    {"id": "q1", "question": "In which country was Bram Tolt born?", "golden_answers": ["Dusk"],
     "data_source": "twohop"},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("searchqa")
    paths = {}
    for name, rows in (("corpus", CORPUS), ("train", QUESTIONS), ("test", QUESTIONS[:1])):
        paths[name] = str(folder / f"{name}.jsonl")
        with open(paths[name], "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return paths


@pytest.fixture(scope="module")
def options(files, tmp_path_factory):
    return SearchOptions(corpus=files["corpus"], train=files["train"], test=files["test"])


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HGPO_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def play(env, task, actions):
    obs, info = env.reset(task)
    seen = [(obs, 0.0, False, check_info(info))]
    for action in actions:
        seen.append(env.step(action))
        if seen[-1][2]:
            break
    return seen


def test_answer_on_turn_one_ends_with_exact_match(options):
    env = make_search_env(options, max_turns=4)
    (obs, _, _, info), (last, reward, done, end) = play(env, "train:0", ["<answer>korin</answer>"])
    assert obs == "where was Ada Vell born?"  # Search-R1's preparation: stripped, "?" appended
    assert info["anchor"] == obs and info["task"] == obs and info["task_type"] == "toyqa"
    assert info["admissible_actions"] == []
    assert (last, reward, done, end["won"]) == ("", 1.0, True, True)
    *_, (_, reward, _, end) = play(env, "train:0", ["<answer>Velm</answer>"])
    assert (reward, end["won"]) == (0.0, False)


def test_three_searches_then_an_answer_two_hops(options):
    env = make_search_env(options, max_turns=4)
    steps = play(env, "train:1", ["<search>Bram Tolt</search>", "<search>Velm</search>",
                                  "<search>Dusk</search>", "<answer>Dusk</answer>"])
    assert [s[2] for s in steps[1:]] == [False, False, False, True]
    assert [s[1] for s in steps[1:]] == [0.0, 0.0, 0.0, 1.0]
    first = steps[1][0]
    assert first.startswith('<information>{"result": "Doc 1: \\"Bram Tolt\\"\\nBram Tolt is')
    assert first == contents_text([h.contents for h in env.retriever.search("Bram Tolt", 3)])
    assert "Velm" in first and steps[1][3]["anchor"] == first and steps[1][3]["tool_calling"]
    assert '\\"Velm\\"\\nVelm is a town in Dusk.' in steps[2][0]


def test_a_search_on_the_last_turn_ends_the_episode_at_zero(options):
    env = make_search_env(options, max_turns=4)
    steps = play(env, "train:1", ["<search>Bram Tolt</search>"] * 4)
    assert len(steps) == 5 and steps[-1][:3] == ("", 0.0, True)
    # an earlier answer in the history is what counts, even if the episode ran out of turns
    env2 = make_search_env(options, max_turns=1)
    assert play(env2, "train:0", ["<search>Korin</search>"])[-1][:3] == ("", 0.0, True)


def test_invalid_replies_cost_a_turn_and_show_nothing(options):
    env = make_search_env(options, max_turns=4)
    agent = get_agent("verl-agent", "search")
    replies = ["I do not know", "<think>hmm</think> the answer is Korin",
               "<search>Ada Vell</search><answer>Korin</answer>"]
    actions = [agent.parse(r) for r in replies]
    assert [(a.action, a.valid) for a in actions] == [
        ("", False), ("", False), ("<search>Ada Vell</search>", False)]
    steps = play(env, "train:0", [a.action for a in actions] + ["<answer>Korin</answer>"])
    assert [s[0] for s in steps[1:3]] == ["", ""]
    assert [s[3]["anchor"] for s in steps[1:3]] == ["", ""]
    assert "Ada Vell" in steps[3][0]  # the invalid reply's search still runs, as theirs does
    assert steps[4][1:3] == (1.0, True)


def test_query_and_end_rules():
    assert query_of("<search> a b </search>") == "a b"
    assert query_of("<answer>x</answer>") is None and query_of("") is None
    assert query_of("<search></search>") == ""
    assert ends_episode("<answer>x</answer>", 1, 4) and ends_episode("", 4, 4)
    assert not ends_episode("<search>x</search>", 3, 4)


class Down:
    def search(self, query, k):
        raise retrieval.RetrievalError("retrieval server http://127.0.0.1:9/retrieve is down")


def test_a_failed_search_shows_the_error_text_and_is_counted():
    env = SearchQAEnv({"t:0": Question("q", "who?", ("x",), "nq")}, Down(), max_turns=4)
    env.reset("t:0")
    with pytest.warns(RuntimeWarning, match="search failed"):
        obs, reward, done, info = env.step("<search>x</search>")
    assert obs == search_error_text("retrieval server http://127.0.0.1:9/retrieve is down")
    assert info["search_errors"] == 1 and not done


def test_episodes_through_the_http_protocol_equal_the_embedded_index(options, files):
    embedded = make_search_env(options)
    with retrieval.serve(retrieval.corpus_index(files["corpus"])) as server:
        remote = make_search_env(SearchOptions(url=server.url, corpus=files["corpus"],
                                               train=files["train"], test=files["test"]))
        actions = ["<search>Bram Tolt</search>", "<search>Velm</search>", "<answer>Dusk</answer>"]
        assert play(remote, "train:1", actions) == play(embedded, "train:1", actions)


def test_registry_lists_tasks_and_refuses_a_server_that_is_down(options, files):
    from hgpo_jax.config import Config

    spec = get_env("search")
    cfg = Config().env
    cfg.name, cfg.max_steps = "search", 4
    cfg.search = options
    assert spec.list_tasks(cfg, "train") == ["train:0", "train:1"]
    assert spec.list_tasks(cfg, "test") == ["test:0"]
    env = spec.make_env(cfg)()
    assert env.reset("test:0")[0] == "where was Ada Vell born?"
    cfg.search = SearchOptions(url="http://127.0.0.1:9/retrieve", train=files["train"],
                               test=files["test"], corpus=files["corpus"], timeout=2.0)
    with pytest.raises(retrieval.RetrievalError, match="127.0.0.1:9") as e:
        spec.list_tasks(cfg, "train")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override, says", [
    ("env.search.url=http://127.0.0.1:9/retrieve", "is the retrieval server running?"),
    ("env.search.data_sources=[nope]", "no question of data source(s) ['nope']"),
    ("env.search.corpus={bad_corpus}", "bad_corpus.jsonl:2: not JSON"),
    ("env.search.train={no_answers}", "no_answers.jsonl:1: 'golden_answers' is missing"),
])
def test_bad_input_is_one_line_before_anything_is_written(override, says, files, tmp_path, capsys):
    from hgpo_jax.cli import main

    bad_corpus, no_answers = tmp_path / "bad_corpus.jsonl", tmp_path / "no_answers.jsonl"
    bad_corpus.write_text('{"id": "0", "title": "A", "text": "x"}\nnot json\n')
    no_answers.write_text('{"question": "q", "data_source": "nq"}\n')
    run = tmp_path / "run"
    given = {"corpus": files["corpus"], "train": files["train"], "test": files["test"]}
    key = override.partition("=")[0].rpartition(".")[2]
    paths = [f"env.search.{k}={v}" for k, v in given.items() if k != key]
    rc = main(["train", "gigpo_search_qwen2.5_3b", "model.path=tiny", f"train.run_dir={run}",
               "mesh.fsdp=1", "rollout.max_prompt_tokens=1024", "env.search.timeout=2",
               *paths, override.format(bad_corpus=bad_corpus, no_answers=no_answers)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and says in err and "Traceback" not in err
    assert len(err.splitlines()) == 1 and not run.exists()
