"""A generated closed world for search QA at laptop scale (`env.search.dataset: synthetic`).

    files = world_files()                # {"corpus", "train", "test"} in the cache, written once
    world = make_world(seed=0)           # the same world in memory: people, cities, questions

A tiny model trained here cannot read Wikipedia (the project's small set); this world keeps the
small set's structure (passages `{id, title, text}`, question rows `{id, question, golden_answers,
data_source}`, one-hop and two-hop questions) and asks for the skills the env exists for, and
nothing else:
- issue a query that finds the passage: the question names a person; only the full name (first
  and last) ranks that person's passage first, since first and last names are drawn from two
  small pools and recur in other people (BM25's distractors);
- copy the answer span out of <information>: the passage says "<name> is a <profession> born in
  <city>."; the answer is its city or its profession;
- hop twice: "In which country was <name> born?" needs the person's city, then a second search
  for that city, whose passage "<city> is a city in <country>." holds the answer.
The names are made up from syllables (no prior knowledge helps). Train and test questions are
about disjoint people born in disjoint cities, so held-out questions are about people and cities
never trained on: the city -> country hop cannot be memorised, only looked up. The countries (12)
are shared: a country is an answer, never a key.

Data sources: `onehop` (where born -> city), `profession` (one hop too, but its answer is one of 12
common words: a policy that answers the profession to every question wins all of them without
telling the questions apart, and a small model learns that shortcut first; the laptop study leaves
them out with `env.search.data_sources=[onehop, twohop]`, docs/results.md section 10), `twohop`
(country).
What it does not show: reading real text, paraphrased questions, answers not stated verbatim,
deciding when enough has been found from text that only partly answers (docs/envs.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import uuid

import numpy as np

from hgpo_jax.envs.data import cache_root, is_complete, publish_folder

VERSION = "synthetic-v2"  # bump when the world's generation changes: the cache is keyed by it
SEED = 0
# syllable pools: one per kind of name, so a first name is never a last name, a city or a country
FIRST_SYLLABLES = ("ka", "lo", "mi", "ren", "sa", "to", "vel", "yo", "zan", "bo", "da", "fen")
LAST_SYLLABLES = ("brand", "dorf", "gum", "hask", "mont", "pell", "rusk", "stov", "trem", "wick",
                  "orb", "ulm")
CITY_SYLLABLES = ("ar", "bel", "cor", "dun", "es", "fal", "gar", "hol", "ir", "jas", "kel", "lin",
                  "mor", "nor", "ost", "pra")
COUNTRY_SYLLABLES = ("ta", "ve", "qui", "xa", "ro", "su", "ne", "po")
PROFESSIONS = ("baker", "painter", "farmer", "doctor", "teacher", "sailor", "singer", "lawyer",
               "pilot", "writer", "tailor", "miner")
ONEHOP, PROFESSION, TWOHOP = "onehop", "profession", "twohop"
FILES = ("corpus.jsonl", "train.jsonl", "test.jsonl")


@dataclasses.dataclass(frozen=True)
class Person:
    name: str
    profession: str
    city: str


@dataclasses.dataclass(frozen=True)
class Row:
    """A question row (the project's format) and what the expert needs: the person asked about."""

    id: str
    question: str
    answer: str
    data_source: str
    person: Person

    def as_json(self) -> dict:
        return {"id": self.id, "question": self.question, "golden_answers": [self.answer],
                "data_source": self.data_source}


@dataclasses.dataclass(frozen=True)
class World:
    seed: int
    country_of: dict  # city -> country
    people: tuple  # Person, train people then test people
    passages: tuple  # {id, title, text}, in corpus order
    train: tuple  # Row
    test: tuple  # Row

    def person(self, name: str) -> Person | None:
        return next((p for p in self.people if p.name == name), None)


def _names(rng, syllables, count, lengths, taken: set, suffix=""):
    """`count` capitalised names of `lengths` syllables each (+ suffix), each one search term
    (BM25's analysis) that no other name of the world (`taken`, updated) has: "Ircor" and
    "Ircores" stem alike, so a search for one would find the other."""
    from hgpo_jax.envs.lucene import analyze

    out: list[str] = []
    while len(out) < count:
        n = int(rng.choice(lengths))
        name = ("".join(rng.choice(syllables) for _ in range(n)) + suffix).capitalize()
        terms = analyze(name)
        if len(terms) == 1 and terms[0] not in taken and terms[0] not in PROFESSIONS:
            taken.add(terms[0])
            out.append(name)
    return out


def person_text(p: Person) -> str:
    return f"{p.name} is a {p.profession} born in {p.city}."


def city_text(city: str, country: str) -> str:
    return f"{city} is a city in {country}."


def questions_of(p: Person, country: str) -> list[tuple[str, str, str]]:
    """(question, answer, data source) of one person: where born, profession, country of birth."""
    return [(f"Where was {p.name} born?", p.city, ONEHOP),
            (f"What is the profession of {p.name}?", p.profession, PROFESSION),
            (f"In which country was {p.name} born?", country, TWOHOP)]


def make_world(seed: int = SEED, people: int = 600, cities: int = 60, countries: int = 12,
               test_cities: int = 15, first_names: int = 40, last_names: int = 40) -> World:
    """The world of `seed` (deterministic): `countries` countries, `cities` cities (each in one
    country; the last `test_cities` are the test split's), `people` people with a unique full
    name, a profession and a birth city; a person is in the split of their city. Questions: three
    per person (`questions_of`), each split's shuffled."""
    rng = np.random.default_rng([seed, 20250])
    taken: set = set()
    country_names = _names(rng, COUNTRY_SYLLABLES, countries, (2,), taken, suffix="ria")
    city_names = _names(rng, CITY_SYLLABLES, cities, (2, 3), taken)
    firsts = _names(rng, FIRST_SYLLABLES, first_names, (2,), taken)
    lasts = _names(rng, LAST_SYLLABLES, last_names, (2,), taken)
    # every country has cities in both splits: cities go round the countries in each split
    train_c, test_c = city_names[:cities - test_cities], city_names[cities - test_cities:]
    country_of = {}
    for part in (train_c, test_c):
        order = rng.permutation(countries)
        for i, city in enumerate(part):
            country_of[city] = country_names[int(order[i % countries])]
    pairs = rng.permutation(len(firsts) * len(lasts))[:people]
    persons = []
    for i, pair in enumerate(pairs):
        # test people: the share of the test cities; each city gets people in turn
        in_test = i < people * test_cities // cities
        pool = test_c if in_test else train_c
        city = pool[int(rng.integers(len(pool)))]
        persons.append(Person(f"{firsts[pair // len(lasts)]} {lasts[pair % len(lasts)]}",
                              PROFESSIONS[int(rng.integers(len(PROFESSIONS)))], city))
    test_p = [p for p in persons if p.city in set(test_c)]
    train_p = [p for p in persons if p.city not in set(test_c)]
    passages = [{"title": p.name, "text": person_text(p)} for p in persons]
    passages += [{"title": c, "text": city_text(c, country_of[c])} for c in city_names]
    passages = [passages[int(i)] for i in rng.permutation(len(passages))]
    passages = [{"id": str(i), **p} for i, p in enumerate(passages)]

    def rows(split, group):
        out = [(q, a, s, p) for p in group for q, a, s in questions_of(p, country_of[p.city])]
        out = [out[int(i)] for i in rng.permutation(len(out))]
        return tuple(Row(f"{split}-{i}", q, a, s, p) for i, (q, a, s, p) in enumerate(out))

    return World(seed, country_of, tuple(train_p + test_p), tuple(passages),
                 rows("train", train_p), rows("test", test_p))


def world_folder(seed: int = SEED) -> str:
    return os.path.join(cache_root(), "search", VERSION + (f"-seed{seed}" if seed != SEED else ""))


def write_world(world: World, folder: str) -> str:
    """The world's corpus.jsonl, train.jsonl and test.jsonl in `folder`, written once,
    atomically (a temporary sibling folder, marked complete and renamed into place)."""
    if is_complete(folder):
        return folder
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(folder)}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        contents = {"corpus.jsonl": world.passages, "train.jsonl": [r.as_json() for r in world.train],
                    "test.jsonl": [r.as_json() for r in world.test]}
        for name, rows in contents.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        publish_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


_WORLDS: dict[int, World] = {}


def world(seed: int = SEED) -> World:
    """The world of `seed`, made once per process."""
    if seed not in _WORLDS:
        _WORLDS[seed] = make_world(seed)
    return _WORLDS[seed]


def world_files(seed: int = SEED) -> dict[str, str]:
    """{"corpus", "train", "test"}: the paths of the world's files in the cache (written on
    first use)."""
    folder = world_folder(seed)
    if not is_complete(folder):
        write_world(world(seed), folder)
    return {name[:-len(".jsonl")]: os.path.join(folder, name) for name in FILES}


# ------------------------------------------------------------------------------ observations
_PERSON = re.compile(r"^(?P<name>.+) is an? (?P<profession>\w+) born in (?P<city>.+)\.$")
_CITY = re.compile(r"^(?P<city>.+) is a city in (?P<country>.+)\.$")


def information_docs(observation: str) -> list[str]:
    """The passage texts (without their title lines) an <information> observation shows, in rank
    order; [] for an empty or non-information observation."""
    if not observation.startswith("<information>") or not observation.endswith("</information>"):
        return []
    try:
        result = json.loads(observation[len("<information>"):-len("</information>")])["result"]
    except (ValueError, KeyError, TypeError):
        return []
    docs = []
    for block in re.split(r"(?m)^Doc \d+: ", result)[1:]:
        _, _, text = block.partition("\n")
        docs.append(text.strip())
    return docs


def entities(observation: str) -> list[str]:
    """Every entity an observation's passages name (person names, professions, cities,
    countries), distinct, in order of appearance."""
    out: list[str] = []
    for doc in information_docs(observation):
        m = _PERSON.match(doc) or _CITY.match(doc)
        if m:
            out += [v for v in m.groupdict().values() if v not in out]
    return out


def first_doc_fields(observation: str) -> dict[str, str]:
    """The fields of the top passage of an observation ({name, profession, city} or {city,
    country}); {} when there is none."""
    docs = information_docs(observation)
    if not docs:
        return {}
    m = _PERSON.match(docs[0]) or _CITY.match(docs[0])
    return m.groupdict() if m else {}


# ------------------------------------------------------------------------------ policies
def name_in(question: str) -> str:
    """The person a question of this world asks about."""
    for pattern in (r"^Where was (.+) born\?$", r"^What is the profession of (.+)\?$",
                    r"^In which country was (.+) born\?$"):
        m = re.match(pattern, question)
        if m:
            return m.group(1)
    raise ValueError(f"not a question of the synthetic world: {question!r}")


def expert_action(question: str, observation: str, turn: int) -> str:
    """The expert: search the name; for a two-hop question search the top passage's city; then
    answer the asked field of the top passage. Reads only the question and what it was shown."""
    name = name_in(question)
    if turn == 0:
        return f"<search>{name}</search>"
    fields = first_doc_fields(observation)
    if question.startswith("Where was"):
        return f"<answer>{fields.get('city', '')}</answer>"
    if question.startswith("What is the profession"):
        return f"<answer>{fields.get('profession', '')}</answer>"
    if "country" in fields:
        return f"<answer>{fields['country']}</answer>"
    return f"<search>{fields.get('city', name)}</search>"


def random_action(question: str, observation: str, turn: int, max_turns: int, rng) -> str:
    """The format and the mechanics without the choices: the right kinds of actions, each choice
    random. First turn: search the name half the time, else a random run of 1-3 of the
    question's words. Later: one of the top passage's entities (a name, profession, city or
    country), uniformly, answered (always on the last turn, else half the time) or searched;
    with no passage shown, a random run of the question searched (answered on the last turn).
    What it leaves to learn: which words to search, which field answers the question, when a
    second search is needed."""
    words = question.rstrip("?").split()
    k = int(rng.integers(1, 4))
    start = int(rng.integers(0, len(words) - k + 1))
    span = " ".join(words[start:start + k])
    last = turn >= max_turns - 1
    if turn == 0:
        return f"<search>{name_in(question) if rng.random() < 0.5 else span}</search>"
    found = list(first_doc_fields(observation).values())
    if not found:
        return f"<answer>{span}</answer>" if last else f"<search>{span}</search>"
    pick = found[int(rng.integers(len(found)))]
    tag = "answer" if last or rng.random() < 0.5 else "search"
    return f"<{tag}>{pick}</{tag}>"


KINDS = ("expert", "random")


def record(env, task_ids, kind: str, *, seed: int = 0, max_turns: int = 4) -> list:
    """Episodes of `kind` on `task_ids` (in order, repeats allowed) played through `env`
    (a SearchQAEnv over a synthetic world); deterministic per seed."""
    from hgpo_jax.envs.episodes import play_episode

    if kind not in KINDS:
        raise ValueError(f"unknown search episode kind {kind!r}; use one of {', '.join(KINDS)}")
    rng = np.random.default_rng([seed, 31])
    out = []
    for task in task_ids:
        question = env.questions[task].question
        if kind == "expert":
            choose = lambda obs, info, t: expert_action(question, obs, t)  # noqa: E731
        else:
            choose = lambda obs, info, t: random_action(question, obs, t, max_turns, rng)  # noqa: E731
        out.append(play_episode(env, task, choose, max_turns, source=f"search-{kind}:{task}"))
    return out
