"""Record the authors' search-QA env on random cases: the fixture
tests/data/search_env_reference.json that tests/test_search_text.py checks
`hgpo_jax.envs.search.text` against.

    git --git-dir=<mirror of zzj1111/alfworldauto> archive 20bd331 \
        agent_system/environments/env_package/search | tar -x -C /tmp/verl-agent-20bd331
    python tests/data/search_env_reference.py /tmp/verl-agent-20bd331 \
        tests/data/search_env_reference.json

The first argument is the root of an exported copy of verl-agent's tree at 20bd331 (the fork
zzj1111/alfworldauto holds it), kept outside this repository (the project holds none of their code).
Their search package is imported from that copy with its parent packages stubbed in `sys.modules`
(their `__init__`s pull in the whole training stack), as are `omegaconf` and `gym` (used only for
type checks and a base class). Their HTTP client runs unchanged on a stand-in `requests` session
that answers with a canned retrieval response in their server's shape
(`{"result": [[{"document": {"id", "contents"}, "score"}]]}`) or raises a `requests` error; the
request id (uuid4) is fixed and the retry back-off does not sleep. This script imports nothing of
hgpo_jax: it drives their code and writes inputs and outputs (JSON, compact):

- passages / contents: one search step of their batch env (`SearchMultiProcessEnv`, so the
  observation is stripped as the trainer sees it) whose search retrieves 0-3 passages given as
  [title, text] (contents built wiki-18 style) or as raw contents strings; [input, observation];
- errors: a search step whose request fails ([message their client builds, observation]);
- episodes: whole episodes of their batch env, actions drawn as raw replies and projected by their
  `search_projection` as the trainer does; per step [projected action, observation, reward, done,
  won], plus the golden answers, max_steps and their chat history joined as they join it to score;
- normalize / extract / score: their `normalize_answer`, `extract_solution`, `compute_score`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import types
from types import SimpleNamespace

SEED = 20260602
COMMIT = "20bd331bdbc9026a5668e11362178e10ab7400c8"
PACKAGE = "agent_system.environments.env_package.search"
SKYRL = PACKAGE + ".third_party.skyrl_gym"
URL = "http://127.0.0.1:8000/retrieve"
REQUEST_ID = "00000000-0000-4000-8000-000000000000"
FILES = ["agent_system/environments/env_package/search/envs.py",
         "agent_system/environments/env_package/search/projection.py",
         "agent_system/environments/env_package/search/third_party/skyrl_gym/envs/search/env.py",
         "agent_system/environments/env_package/search/third_party/skyrl_gym/envs/search/utils.py",
         "agent_system/environments/env_package/search/third_party/skyrl_gym/tools/search.py"]


def load_authors(root: str) -> SimpleNamespace:
    """Their modules, imported from the exported tree with the heavy parents stubbed."""
    for name in ("agent_system", "agent_system.environments",
                 "agent_system.environments.env_package", PACKAGE):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = module
    omegaconf = types.ModuleType("omegaconf")
    omegaconf.DictConfig = type("DictConfig", (), {})
    omegaconf.ListConfig = type("ListConfig", (), {})
    sys.modules["omegaconf"] = omegaconf
    gym = types.ModuleType("gym")
    gym.Env = type("Env", (), {"__init__": lambda self: None})
    sys.modules["gym"] = gym
    import importlib

    authors = SimpleNamespace(
        envs=importlib.import_module(PACKAGE + ".envs"),
        projection=importlib.import_module(PACKAGE + ".projection"),
        utils=importlib.import_module(SKYRL + ".envs.search.utils"),
        tool=importlib.import_module(SKYRL + ".tools.search"))
    authors.tool.uuid = SimpleNamespace(uuid4=lambda: REQUEST_ID)
    authors.tool.time = SimpleNamespace(sleep=lambda seconds: None)
    logging.getLogger(authors.tool.__name__).setLevel(logging.CRITICAL + 1)
    return authors


class CannedResponse:
    def __init__(self, payload, status: int = 200):
        self.payload, self.status_code, self.text = payload, status, json.dumps(payload)

    def raise_for_status(self):
        pass

    def json(self):
        return self.payload


class CannedSession:
    """Stands in for their shared requests.Session: `next` is a list of contents strings (one
    retrieval), an exception to raise, or an HTTP status to answer with."""

    def __init__(self):
        self.next = []

    def post(self, url, headers=None, json=None, timeout=None):
        if isinstance(self.next, BaseException):
            raise self.next
        if isinstance(self.next, int):
            return CannedResponse({}, self.next)
        docs = [{"document": {"id": str(i), "contents": c}, "score": 1.0 - i / 10}
                for i, c in enumerate(self.next)]
        return CannedResponse({"result": [docs]})


def batch_env(authors, session: CannedSession, max_steps: int):
    authors.tool.SearchToolGroup._session_pool["http://127.0.0.1:8000"] = session
    config = SimpleNamespace(max_steps=max_steps, search=SimpleNamespace(
        search_url=URL, topk=3, timeout=60, log_requests=False))
    return authors.envs.SearchMultiProcessEnv(seed=0, env_num=1, group_n=1, env_config=config)


# ------------------------------------------------------------------------------ random text
WORDS = ["Paris", "the", "a", "an", "Beatles", "river", "1969", "U.S.", "St.", "don't", "AT&T",
         "Ж", "中文", "é", "😀", "naïve", "<b>", "&amp;", "x"]
ODD = ['"', "\\", "\n", "\t", " ", "  ", "\r", "\u00a0", "\u2028", "\x00", "\x7f", "'", "<", ">",
       "/", "\\n", '\\"', "{", "}", "ß", "İ"]
GOLDS = ["The Beatles", "Paris", "1969", "U.S.", "a spirit", "Jesus Christ", "yes", "no",
         "Mason Alan Dinehart", "St. Louis", "*", "---", "Äpfel", "the end", "AT&T",
         "An American in Paris", "don't stop", "New York City", "Ölüdeniz", "4,000"]


def text(rng: random.Random, most: int = 8) -> str:
    parts = [rng.choice(WORDS) if rng.random() < 0.6 else rng.choice(ODD)
             for _ in range(rng.randint(0, most))]
    return "".join(p + (" " if rng.random() < 0.5 else "") for p in parts)


def variant(rng: random.Random, gold: str) -> str:
    """The gold answer with articles, punctuation, case and whitespace changed (or a near miss)."""
    s = gold
    for _ in range(rng.randint(0, 3)):
        kind = rng.randrange(7)
        if kind == 0:
            s = rng.choice(["the ", "The ", "a ", "An ", "THE "]) + s
        elif kind == 1:
            s = s + rng.choice([".", "!", ",", "'", "?", ")"])
        elif kind == 2:
            s = s.upper() if rng.random() < 0.5 else s.lower()
        elif kind == 3:
            s = rng.choice([" ", "  ", "\n", "\t"]) + s.replace(" ", rng.choice(["  ", "\n", " "]))
        elif kind == 4:
            s = s.replace(".", "").replace("'", "")
        elif kind == 5:
            s = s[:-1] if len(s) > 1 else s + "s"  # a near miss
        else:
            s = s + rng.choice([" ", "\n", ""])
    return s


def passage(rng: random.Random) -> list[str]:
    title = text(rng, 4) if rng.random() < 0.9 else ""
    if rng.random() < 0.05:
        title += "\n" + text(rng, 2)
    body = "" if rng.random() < 0.1 else text(rng, 12)
    if rng.random() < 0.1:
        body = f"{body} <answer>{variant(rng, rng.choice(GOLDS))}</answer> {text(rng, 3)}"
    if rng.random() < 0.15:
        body = rng.choice([" ", "\n", "\n\n", "\t "]) + body + rng.choice([" ", "\n", " \n"])
    return [title, body]


def contents_of(title: str, body: str) -> str:
    return '"' + title + '"\n' + body


def search_step(env, session, next_result) -> str:
    env.reset([{"ground_truth": {"target": ["x"]}, "question": "q?", "data_source": "nq"}])
    session.next = next_result
    observations, _, dones, _ = env.step(["<search>q</search>"])
    assert not dones[0]
    return observations[0]


# ------------------------------------------------------------------------------ the cases
def retrieval_cases(authors, rng):
    session = CannedSession()
    env = batch_env(authors, session, 4)
    passages, contents, errors = [], [], []
    for _ in range(160):
        docs = [passage(rng) for _ in range(rng.randint(0, 3))]
        passages.append([docs, search_step(env, session, [contents_of(*d) for d in docs])])
    for _ in range(50):
        raws = [rng.choice([contents_of(*passage(rng)), text(rng, 10),
                            rng.choice([" ", "\n"]) + contents_of(*passage(rng)) + "\n"])
                for _ in range(rng.randint(0, 3))]
        contents.append([raws, search_step(env, session, raws)])
    import requests

    kinds = [(requests.exceptions.RequestException, "API Request Error"),
             (requests.exceptions.ConnectionError, "Connection Error"),
             (requests.exceptions.Timeout, "Timeout Error"), (ValueError, "Unexpected Error")]
    for i in range(30):
        if i % 10 == 9:
            status = rng.choice([500, 502, 503, 504])
            message = (f"[Search Request ID: {REQUEST_ID}] API Request Error: Server Error "
                       f"({status}) on attempt 10/10")
            errors.append([message, search_step(env, session, status)])
            continue
        cls, kind = kinds[i % len(kinds)]
        detail = text(rng, 6)
        message = f"[Search Request ID: {REQUEST_ID}] {kind}: {detail}"
        errors.append([message, search_step(env, session, cls(detail))])
    env.close()
    return passages, contents, errors


def raw_reply(rng: random.Random, golds: list[str]) -> str:
    """An LLM reply: a search, an answer (the gold varied or a wrong one), both, none, several."""
    think = f"<think>{text(rng, 4)}</think>" if rng.random() < 0.5 else text(rng, 2)
    answer = variant(rng, rng.choice(golds)) if rng.random() < 0.7 else rng.choice(GOLDS)
    kind = rng.randrange(20)
    if kind < 11:
        reply = f"{think}<search> {text(rng, 4)} </search>{text(rng, 2)}"
    elif kind < 16:
        reply = f"{think}<answer>{answer}</answer>{text(rng, 2)}"
    elif kind < 18:
        reply = f"{think}{text(rng, 3)}"  # no action: projected to ""
    elif kind == 18:
        reply = f"{think}<search>who <answer>{answer}</answer> was</search>"
    else:
        reply = f"{think}<ANSWER>{answer}</Answer><answer>{text(rng, 2)}</answer>"
    return reply


def episode_cases(authors, rng):
    session = CannedSession()
    envs = {3: batch_env(authors, session, 3), 4: batch_env(authors, session, 4)}
    cases = []
    for _ in range(220):
        max_steps = 4 if rng.random() < 0.75 else 3
        env = envs[max_steps]
        golds = rng.sample(GOLDS, rng.randint(1, 3))
        if rng.random() < 0.1:
            golds = [variant(rng, g) for g in golds]
        env.reset([{"ground_truth": {"target": golds}, "question": "q?",
                    "data_source": "hotpotqa"}])
        steps, done = [], False
        while not done:
            actions, _ = authors.projection.search_projection([raw_reply(rng, golds)])
            session.next = [contents_of(*passage(rng)) for _ in range(rng.randint(0, 3))]
            observations, rewards, dones, infos = env.step(actions)
            done = bool(dones[0])
            steps.append([actions[0], observations[0], float(rewards[0]), done,
                          bool(infos[0]["won"])])
        history = "".join(m["content"] for m in env.envs[0].chat_history)
        cases.append({"golds": golds, "max_steps": max_steps, "steps": steps, "history": history})
    for env in envs.values():
        env.close()
    return cases


def scoring_cases(authors, rng):
    normalize = []
    for _ in range(200):
        s = variant(rng, rng.choice(GOLDS)) if rng.random() < 0.5 else text(rng, 8)
        normalize.append([s, authors.utils.normalize_answer(s)])
    extract, score = [], []
    for _ in range(200):
        golds = rng.sample(GOLDS, rng.randint(1, 3))
        pieces = [text(rng, 3)]
        for _ in range(rng.randint(0, 3)):
            inner = variant(rng, rng.choice(golds)) if rng.random() < 0.6 else text(rng, 3)
            pieces.append(rng.choice(["<answer>", "<answer> ", "<answer>\n"]) + inner
                          + rng.choice(["</answer>", " </answer>", "</answer"]) + text(rng, 3))
        if rng.random() < 0.1:
            pieces.append("<answer>" + text(rng, 2))  # unclosed
        s = "".join(pieces)
        extract.append([s, authors.utils.extract_solution(s)])
        score.append([s, golds, float(authors.utils.compute_score(s, {"target": golds}))])
    return normalize, extract, score


def main(root: str, out_path: str) -> None:
    authors = load_authors(root)
    rng = random.Random(SEED)
    passages, contents, errors = retrieval_cases(authors, rng)
    episodes = episode_cases(authors, rng)
    normalize, extract, score = scoring_cases(authors, rng)
    fixture = {
        "source": {"repo": "zzj1111/alfworldauto (verl-agent with GiGPO's search env)",
                   "commit": COMMIT, "files": FILES,
                   "script": "tests/data/search_env_reference.py", "seed": SEED},
        "passages": passages, "contents": contents, "errors": errors, "episodes": episodes,
        "normalize": normalize, "extract": extract, "score": score,
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path}: {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
