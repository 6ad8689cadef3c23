"""experiments/search_copy_probe.py: the spans it probes and its measures, against an oracle that
always predicts the right next token and one that copies the first token of a name over and
over."""

import numpy as np
import pytest

from experiments.search_copy_probe import (SPAN_KINDS, expert_turns, measure, probe_rows, span_kind,
                                           span_of)


class CharTokenizer:
    """One token per character (ids from 3): spans always start at a token boundary."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 3 for c in text]

    def chat_prompt(self, messages) -> list[int]:
        return self.encode(messages[-1]["content"])


@pytest.fixture(scope="module")
def rows():
    from hgpo_jax.config import load_config

    return probe_rows(CharTokenizer(), expert_turns(load_config("search_laptop_sft", []), 12), 100_000)


def test_spans_and_their_kinds():
    reply = "<think>I will act.</think><search>Vello Tremstov</search>"
    start, end, tag = span_of(reply)
    assert reply[start:end] == "Vello Tremstov" and tag == "search"
    assert span_of("<think>x</think><answer>Garkel</answer>")[2] == "answer"
    assert span_of("no action") is None
    assert span_kind("search", 0, "twohop") == "query_name"
    assert span_kind("search", 1, "twohop") == "query_city"
    assert span_kind("answer", 1, "onehop") == "answer_city"
    assert span_kind("answer", 2, "twohop") == "answer_country"


def test_the_rows_are_the_experts_replies_on_held_out_questions(rows):
    from hgpo_jax.envs.search import synthetic

    world = synthetic.world()
    test_cities = {row.person.city for row in world.test}
    kinds = {r["kind"] for r in rows}
    assert kinds == set(SPAN_KINDS)
    for r in rows:
        span = "".join(chr(i - 3) for i in r["ids"][r["start"]:r["end"]])
        if r["kind"] in ("query_city", "answer_city"):
            assert span in test_cities  # held out: never a city of the train questions
        elif r["kind"] == "answer_country":
            assert span in set(world.country_of.values())
        else:
            assert " " in span and world.person(span) is not None
    # one-hop: a search then an answer; two-hop: two searches then an answer
    assert sum(r["kind"] == "query_name" for r in rows) == 12


def test_an_oracle_copies_everything_and_a_stutter_copies_nothing(rows):
    truth = np.zeros((len(rows), max(r["end"] for r in rows) + 64), np.int64)
    for i, r in enumerate(rows):
        truth[i, :r["end"]] = r["ids"]
    index = {tuple(r["ids"][:r["start"] + 1]): i for i, r in enumerate(rows)}

    def row_of(ids_row) -> int:
        for prefix, i in index.items():
            if tuple(ids_row[:len(prefix)]) == prefix:
                return i
        raise AssertionError("unknown row")

    def oracle(ids):
        out = np.zeros_like(ids)
        for b, row in enumerate(ids):
            if row.any():
                i = row_of(row)
                out[b, :-1] = truth[i, 1:ids.shape[1]]
        return out

    def stutter(ids):  # always repeats the token it was given
        return ids.copy()

    good = measure(oracle, rows, batch=8)
    assert good["all"]["replies"] == len(rows)
    for kind in ("all", *SPAN_KINDS):
        assert good[kind]["first_token"] == 1.0 and good[kind]["copy"] == 1.0
        assert good[kind]["copy_tokens"] == 1.0
    bad = measure(stutter, rows, batch=8)
    assert bad["all"]["copy"] == 0.0 and bad["all"]["first_token"] == 0.0
    assert bad["all"]["copy_tokens"] < 0.1  # a doubled letter is "copied"


def test_another_world_is_probed_on_its_own_test_questions():
    """`--world 100`: the expert's replies on that world's test split (its people and cities),
    none of the study's held-out names."""
    from hgpo_jax.config import load_config
    from hgpo_jax.envs.search import synthetic

    other, ours = synthetic.world(seed=100), synthetic.world()
    turns = expert_turns(load_config("search_laptop_sft", []), 6, world=100)
    names = [reply[span_of(reply)[0]:span_of(reply)[1]] for _, reply, _ in turns]
    people = {row.person.name for row in other.test[:6]}
    assert {n for n, (_, _, k) in zip(names, turns) if k == "query_name"} == people
    assert not people & {row.person.name for row in ours.test}
    cities = {n for n, (_, _, k) in zip(names, turns) if k in ("query_city", "answer_city")}
    assert cities and cities <= {row.person.city for row in other.test}
