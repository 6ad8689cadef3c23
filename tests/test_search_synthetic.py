"""The synthetic search world (env.search.dataset=synthetic): deterministic, answerable through the
real retrieval, held-out people and cities disjoint from the trained ones; its scripted episodes
(the expert wins every question through the env, the random policy writes valid replies); and
experiments/search_laptop.py end to end with tiny settings, in process."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hgpo_jax.agents.verl_agent.search import project_action, scripted_reply  # noqa: E402
from hgpo_jax.envs.search import (SearchOptions, make_retriever, make_search_env,  # noqa: E402
                                  split_questions, synthetic)
from hgpo_jax.envs.search.data import read_corpus, read_questions  # noqa: E402

SYNTHETIC = SearchOptions(dataset="synthetic")


@pytest.fixture(scope="module")
def env():
    return make_search_env(SYNTHETIC, max_turns=4)


def test_the_world_is_deterministic_and_its_files_are_the_projects_formats(tmp_path):
    a, b = synthetic.make_world(0), synthetic.make_world(0)
    assert a == b and synthetic.make_world(1).passages != a.passages
    folder = synthetic.write_world(a, str(tmp_path / "w"))
    files = {n: os.path.join(folder, f"{n}.jsonl") for n in ("corpus", "train", "test")}
    assert [p.title for p in read_corpus(files["corpus"])] == [p["title"] for p in a.passages]
    test = read_questions(files["test"])
    assert [q.question for q in test] == [r.question for r in a.test]
    assert {q.data_source for q in test} == {synthetic.ONEHOP, synthetic.PROFESSION, synthetic.TWOHOP}
    again = synthetic.write_world(a, folder)  # written once
    assert again == folder and sorted(os.listdir(folder)) == sorted(
        [".complete", "corpus.jsonl", "train.jsonl", "test.jsonl"])
    # the option selects it; explicit files still override
    assert [q.question for q in split_questions(SYNTHETIC, "test")] == [r.question for r in a.test]
    given = SearchOptions(dataset="synthetic", test=files["train"])
    assert len(split_questions(given, "test")) == len(a.train)
    assert SearchOptions(dataset="wiki").problems() and not SYNTHETIC.problems()


def test_held_out_people_and_cities_are_never_trained_on():
    w = synthetic.world()
    train_people = {r.person.name for r in w.train}
    test_people = {r.person.name for r in w.test}
    assert train_people and test_people and not train_people & test_people
    train_cities = {r.person.city for r in w.train}
    test_cities = {r.person.city for r in w.test}
    assert not train_cities & test_cities
    # a two-hop answer is a country, shared by both splits: only its city is new
    assert {w.country_of[c] for c in test_cities} <= {w.country_of[c] for c in train_cities}
    # first and last names recur across people: the distractors BM25 has to rank below the asked one
    firsts = [p.name.split()[0] for p in w.people]
    assert max(firsts.count(f) for f in firsts) >= 5


def test_every_question_is_answerable_by_the_experts_queries():
    w = synthetic.world()
    retriever = make_retriever(SYNTHETIC)
    for row in w.train + w.test:
        top = retriever.search(row.person.name, 3)[0]
        assert top.contents == f'"{row.person.name}"\n{synthetic.person_text(row.person)}'
        if row.data_source == synthetic.TWOHOP:
            city = retriever.search(row.person.city, 3)[0]
            assert city.contents.endswith(f"is a city in {row.answer}.")


def test_the_expert_wins_every_question_through_the_env(env):
    for split in ("train", "test"):
        tasks = [f"{split}:{i}" for i in range(len(split_questions(SYNTHETIC, split)))]
        episodes = synthetic.record(env, tasks, "expert")
        assert all(ep.won for ep in episodes)
        turns = {len(ep.steps) for ep in episodes}
        assert turns == {2, 3}  # one-hop: search, answer; two-hop: search, search, answer


def test_random_episodes_are_valid_replies_near_chance_and_deterministic(env):
    tasks = [f"train:{i}" for i in range(300)]
    episodes = synthetic.record(env, tasks, "random", seed=0)
    assert episodes == synthetic.record(env, tasks, "random", seed=0)
    assert episodes != synthetic.record(env, tasks, "random", seed=1)
    for ep in episodes:
        for step in ep.steps:
            assert project_action(scripted_reply(step.action)) == (step.action, True)
        assert ep.steps[-1].action.startswith("<answer>")  # every episode answers
    won = sum(ep.won for ep in episodes) / len(episodes)
    assert 0.0 < won < 0.15
    kinds = {ep.steps[1].action.split(">")[0] for ep in episodes if len(ep.steps) > 1}
    assert kinds == {"<search", "<answer"}
    # after a passage is shown, the choice is among the top passage's entities only
    picked = fields = 0
    for ep in episodes:
        for step in ep.steps[1:]:
            shown = synthetic.first_doc_fields(step.observation)
            if shown:
                content = step.action.split(">", 1)[1].rsplit("<", 1)[0]
                assert content in shown.values()
                picked += 1
                fields += content == shown.get("city")
    assert picked > 100 and 0.2 < fields / picked < 0.5  # about one pick in three is the city


def test_record_episodes_through_the_registry_and_the_built_models_corpus():
    from hgpo_jax.config import EnvConfig
    from hgpo_jax.envs.registry import get_env

    spec = get_env("search")
    assert spec.episode_kinds == ("expert", "random", "expert_other", "random_other")
    assert spec.built_model.memory_len == 4
    cfg = EnvConfig(name="search", max_steps=4)
    cfg.search.dataset = "synthetic"
    n = len(split_questions(SYNTHETIC, "train")) + 5  # more than the questions: they cycle
    episodes = spec.record_episodes(cfg, "train", n, "expert")
    assert len(episodes) == n and all(ep.won for ep in episodes)
    assert episodes[-1].task == episodes[4].task
    with pytest.raises(ValueError, match="synthetic"):
        spec.record_episodes(EnvConfig(name="search"), "train", 2, "random")
    # the other worlds' episodes: none of the world's own questions, the expert still wins
    own = {r.question for r in synthetic.world().train + synthetic.world().test}
    other = spec.record_episodes(cfg, "train", 20, "expert_other")
    assert len(other) == 20 and all(ep.won for ep in other)
    assert len({ep.task for ep in other}) == 20 and not {ep.task for ep in other} & own


def test_every_stage_of_the_study_runs_in_process_with_tiny_settings(tmp_path):
    from experiments import laptop, search_laptop

    out, runs = tmp_path / "out", tmp_path / "runs"
    tiny = ["--in-process", "--devices", "1", "--seeds", "0", "--estimators", "gigpo",
            "--set-sft", "model.path=tiny", "sft.steps=2", "sft.batch_size=4",
            "train.micro_batch_size=2", "sft.episodes=4", "sft.heldout=0.5", "sft.eval_every=2",
            # every round's data small (the study's third round names its counts)
            "sft.data=random_other:3+expert_other:1",
            "sft.save_every=0", "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=512",
            "--set-rl", "train.iterations=3", "rollout.num_groups=1", "rollout.group_size=2",
            "train.mini_batch_size=4", "train.micro_batch_size=2", "eval.games=2",
            "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=512",
            "--set-eval", "eval.games=2", "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=512"]
    args = ["--out", str(out), "--runs", str(runs), *tiny]
    assert search_laptop.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    for arm in ("gigpo",):
        assert results[arm]["seeds"] == [0]
        assert len(results[arm]["heldout_change"]) == 1
        assert all(len(s) == 3 for s in results[arm]["heldout_em"])
    assert results["command"].startswith("python -m experiments.search_laptop --out")
    experts = json.loads((out / search_laptop.EXPERTS).read_text())
    assert experts["expert"]["test"]["all"] == 1.0 and experts["random"]["test"]["all"] < 0.15
    table = (out / "results.md").read_text()
    assert "| gigpo | [0] |" in table
    assert (out / "heldout_em.png").stat().st_size > 0
    assert laptop.is_model_folder(str(out / laptop.WARM_START))
    assert all(laptop.has_log(str(out), name) for name in ("sft", "sft_more", "sft_mix"))


def test_arms_are_paired_by_seed():
    from experiments import search_laptop

    arms = {"gigpo": {"seeds": [0, 1, 2], "heldout_change": [0.2, 0.1, 0.3],
                      "heldout_last_third": [0.5, 0.4, 0.6]},
            "grpo": {"seeds": [0, 2], "heldout_change": [0.1, 0.1],
                     "heldout_last_third": [0.4, 0.7]}}
    paired = search_laptop.paired_arms(arms)
    assert list(paired) == ["gigpo - grpo"]
    e = paired["gigpo - grpo"]
    assert e["seeds"] == [0, 2]
    assert e["heldout_change"]["per_seed"] == pytest.approx([0.1, 0.2])
    assert e["heldout_change"]["ahead"] == 2 and e["heldout_last_third"]["ahead"] == 1
    low, high = e["heldout_change"]["ci95"]
    assert low < 0.15 < high  # mean 0.15, t interval with one degree of freedom
    assert search_laptop.thirds([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == pytest.approx((0.15, 0.55, 0.4))


def test_a_built_models_tokenizer_cuts_every_name_the_same_wherever_it_stands():
    """`build:search-<size>`'s tokenizer (names kept whole pieces, trained on other worlds' text):
    every held-out person and city is the same tokens in the question, a query, a passage (after a
    quote, at a line's start, after "born in") and an answer, so copying a name is copying its
    tokens; and a held-out city is a few syllable pieces, not letters."""
    from hgpo_jax.build import env_corpus, model_path_folder
    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.envs.search import NAME_PIECE
    from hgpo_jax.models.local import train_tokenizer

    built = get_env("search").built_model
    assert built.isolate == NAME_PIECE
    assert model_path_folder("build:search-small").endswith("search-small-v1.3")
    hf = train_tokenizer(env_corpus("search"), built.vocab, isolate=built.isolate).hf

    def pieces(text: str) -> list[str]:
        return [hf.decode([i]) for i in hf(text, add_special_tokens=False)["input_ids"]]

    def contains(outer: list[str], inner: list[str]) -> bool:
        return any(outer[i:i + len(inner)] == inner for i in range(len(outer) - len(inner) + 1))

    world = synthetic.world()
    cities = []
    for row in world.test:
        p = row.person
        name, city = pieces(p.name), pieces(p.city)
        passage = json.dumps({"result": f'Doc 1: "{p.name}"\n{synthetic.person_text(p)}\n'})
        for text in (row.question, f"<search>{p.name}</search>", passage):
            assert contains(pieces(text), name), (p.name, text)
        for text in (passage, f"<answer>{p.city}</answer>", f"<search>{p.city}</search>"):
            assert contains(pieces(text), city), (p.city, text)
        cities.append(len(city))
    assert sum(cities) / len(cities) < 3.0
