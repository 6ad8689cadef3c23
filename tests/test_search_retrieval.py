"""Search-QA retrieval: the BM25 index against a brute-force Lucene BM25, its disk cache, and the
HTTP protocol (client, loopback server, a dead server, misbehaving servers)."""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from hgpo_jax.envs.search.data import Passage
from hgpo_jax.envs.search.retrieval import (
    B, K1, BM25Index, Hit, HttpRetriever, RetrievalError, analyze, as_pairs, check_server,
    corpus_index, parse_request, parse_response, request_body, response_payload, serve,
    top_k_order)

HANDWRITTEN = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("France", "France is a country in Western Europe. Its capital is Paris."),
    ("Lyon", "Lyon is the third-largest city of France, on the Rhone."),
    ("Running", "Running is a method of terrestrial locomotion. A runner runs fast."),
    ("Marathon", "The marathon is a long-distance foot race; runners run 42 km."),
    ("Python (programming language)", "Python is a programming language created by Guido van Rossum."),
    ("Python (genus)", "Python is a genus of constricting snakes in Africa and Asia."),
    ("Guido van Rossum", "Guido van Rossum is a Dutch programmer, the author of Python."),
    ("World War 2", "World War 2 lasted from 1939 to 1945."),
    ("World War I", "World War I lasted from 1914 to 1918. It was a global war."),
    ("Europe", "Europe is a continent. France, Germany and Italy are in Europe."),
    ("Stop words", "The and of to in is it that was for on are as with."),
    ("Einstein", "Albert Einstein's theory of relativity changed physics."),
    ("Relativity", "The theory of relativity: special and general relativity, by Einstein."),
    ("Snake", "A snake is a legless reptile; pythons and boas are snakes."),
    ("Paris (mythology)", "Paris, son of Priam, took Helen to Troy."),
]
HANDWRITTEN_QUERIES = [
    "What is the capital of France?", "Paris", "paris paris france", "runner running runs",
    "Who created the Python programming language?", "python snake", "World War 2",
    "when did world war I end", "Einstein's relativity", "Guido", "Troy Helen Priam",
    "continent Europe Germany", "the of and", "xylophone", "1939", "2", "legless reptiles",
    "Dutch programmer author", "capital city", "  France  ", "FRANCE!!!",
]


def passage_contents(title: str, text: str) -> str:
    """wiki-18's contents: '"Title"\ntext'."""
    return f'"{title}"\n{text}'


# ---------------------------------------------------------------------------------------------
# Brute force: Lucene's BM25 written out, in float64, over the same analyzed terms
# ---------------------------------------------------------------------------------------------

def brute_force_scores(doc_terms: list[list[str]], query_terms: list[str],
                       k1: float = K1, b: float = B) -> list[float]:
    """Every document's score: the sum over query term occurrences (repeats count again) of
    ln(1 + (N - df + 0.5) / (df + 0.5)) * tf / (tf + k1 * (1 - b + b * dl / avgdl)), N the
    number of documents, dl a document's term count, avgdl their mean."""
    n = len(doc_terms)
    avgdl = sum(len(d) for d in doc_terms) / n
    df = Counter(t for d in doc_terms for t in set(d))
    scores = []
    for terms in doc_terms:
        tf, total = Counter(terms), 0.0
        for t in query_terms:
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                total += idf * tf[t] / (tf[t] + k1 * (1 - b + b * len(terms) / avgdl))
        scores.append(total)
    return scores


def brute_force_ranking(scores: list[float], k: int) -> list[int]:
    """Documents with a positive score, best first, ties by corpus order, at most k."""
    ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
    return ranked[:k]


def assert_matches_brute_force(index: BM25Index, pairs, queries, k: int) -> None:
    doc_terms = [analyze(contents) for _, contents in pairs]
    positions = {doc_id: i for i, (doc_id, _) in enumerate(pairs)}
    for query in queries:
        expected_scores = brute_force_scores(doc_terms, analyze(query))
        expected = brute_force_ranking(expected_scores, k)
        hits = index.search(query, k)
        assert len(hits) == len(expected), query
        for rank, (hit, want) in enumerate(zip(hits, expected)):
            got = positions[hit.id]
            assert hit.contents == pairs[got][1]
            # the hit's own score, and the score at this rank, agree with float64 Lucene BM25
            assert hit.score == pytest.approx(expected_scores[got], rel=1e-4), (query, rank)
            assert hit.score == pytest.approx(expected_scores[want], rel=1e-4), (query, rank)
            near_tie = math.isclose(expected_scores[got], expected_scores[want], rel_tol=1e-4)
            if not near_tie:
                pytest.fail(f"{query!r} rank {rank}: {hit.id} instead of {pairs[want][0]}")
            if expected_scores[got] == expected_scores[want]:
                assert got == want, (query, rank)  # exact ties go by corpus order


@pytest.fixture(scope="module")
def handwritten_pairs():
    return [(f"doc{i}", passage_contents(title, text))
            for i, (title, text) in enumerate(HANDWRITTEN)]


@pytest.fixture(scope="module")
def handwritten_index(handwritten_pairs):
    return BM25Index.build(handwritten_pairs, cache=False)


def random_corpus(seed: int, n_docs: int = 50):
    """Documents drawn from a small vocabulary (stop words, inflections, numbers and one-letter
    words included), with exact duplicates (tied scores) and a stop-words-only document."""
    rng = random.Random(seed)
    words = ("alpha beta gamma delta epsilon zeta theta kappa lambda omega run runs running "
             "runner city cities x y 7 42 1999 the of and a is to in").split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(n_docs - 3)]
    docs += [docs[3], docs[10], "the of and to is"]
    rng.shuffle(docs)
    pairs = [(str(1000 + i), passage_contents(f"T{rng.randint(0, 9)}", text))
             for i, text in enumerate(docs)]
    queries = [" ".join(rng.choice(words + ["unknownword"]) for _ in range(rng.randint(1, 6)))
               for _ in range(300)]
    return pairs, queries


# ---------------------------------------------------------------------------------------------
# BM25
# ---------------------------------------------------------------------------------------------

def test_top_k_order_ties_by_index_and_positive_only():
    scores = np.array([0.0, 2.0, 5.0, 2.0, 2.0, 0.0, 5.0], dtype=np.float32)
    assert top_k_order(scores, 1) == [2]
    assert top_k_order(scores, 3) == [2, 6, 1]
    assert top_k_order(scores, 4) == [2, 6, 1, 3]
    assert top_k_order(scores, 100) == [2, 6, 1, 3, 4]  # zeros are not hits
    assert top_k_order(scores, 0) == []
    assert top_k_order(np.zeros(4, dtype=np.float32), 3) == []


def test_handwritten_corpus_matches_brute_force(handwritten_index, handwritten_pairs):
    for k in (1, 3, 5, len(handwritten_pairs)):
        assert_matches_brute_force(handwritten_index, handwritten_pairs, HANDWRITTEN_QUERIES, k)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_corpus_matches_brute_force(seed):
    pairs, queries = random_corpus(seed)
    index = BM25Index.build(pairs, cache=False)
    assert_matches_brute_force(index, pairs, queries, 3)
    assert_matches_brute_force(index, pairs, queries[:60], 50)


def test_duplicate_passages_tie_in_corpus_order():
    pairs = [("a", "green apple pie"), ("b", "red car"), ("c", "green apple pie"), ("d", "pie")]
    hits = BM25Index.build(pairs, cache=False).search("green apple", 3)
    assert [h.id for h in hits] == ["a", "c"]  # "d" shares no term: not a hit
    assert hits[0].score == hits[1].score > 0


def test_lucene_analysis_stems_and_drops_stop_words(handwritten_index):
    hits = handwritten_index.search("The RUNNERS ran", 2)
    assert {h.id for h in hits} == {"doc3", "doc4"}  # runner/runners/runs/run share a stem
    assert handwritten_index.search("World War 2", 1)[0].id == "doc8"  # one-character terms count


@pytest.mark.parametrize("query", ["", "   \n\t", "the of and is", "?!...", "xylophone zzz"])
def test_queries_without_indexed_terms_return_nothing(handwritten_index, query):
    assert handwritten_index.search(query) == []
    assert not handwritten_index.scores(query).any()


def test_search_arguments(handwritten_index):
    assert handwritten_index.search("Paris", 0) == []
    assert len(handwritten_index.search("Paris")) == 3  # default k: verl-agent's topk
    with pytest.raises(ValueError, match="k must be"):
        handwritten_index.search("Paris", -1)
    with pytest.raises(TypeError):
        handwritten_index.search(None)


def test_corpus_inputs_pairs_and_passages_are_the_same_index(tmp_path):
    passages = [Passage(str(i), t, x) for i, (t, x) in enumerate(HANDWRITTEN)]
    pairs = [(p.id, p.contents) for p in passages]
    assert as_pairs(passages) == pairs
    a = BM25Index.build(passages, cache_dir=str(tmp_path))
    b = BM25Index.build(pairs, cache_dir=str(tmp_path))
    assert a.key == b.key and b.loaded_from_cache
    with pytest.raises(ValueError, match="unique"):
        as_pairs([("1", "x"), ("1", "y")])
    with pytest.raises(ValueError, match="neither"):
        as_pairs(["just a string"])
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Index.build([], cache=False)
    with pytest.raises(ValueError, match="no term to index"):
        BM25Index.build([("1", "the of"), ("2", "?!")], cache=False)


def test_corpus_index_reads_a_file_once_per_process(tmp_path):
    rows = [{"id": "1", "title": "Paris", "text": "Capital of France."},
            {"id": 2, "contents": '"Lyon"\nA city of France.'}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    cache = str(tmp_path / "cache")
    index = corpus_index(str(path), cache_dir=cache)
    assert index.ids == ["1", "2"] and index.contents[1] == '"Lyon"\nA city of France.'
    assert corpus_index(str(tmp_path), cache_dir=cache) is index  # a folder holding corpus.jsonl
    assert [h.id for h in index.search("Paris France")] == ["1", "2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "body": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        corpus_index(str(bad), cache_dir=cache)


def test_bm25s_runs_without_starting_jax():
    """bm25s runs a JAX op when imported; the index must not (env workers are JAX-free)."""
    code = ("import sys; before = 'jax' in sys.modules\n"
            "from hgpo_jax.envs.search import retrieval\n"
            "index = retrieval.BM25Index.build([('1', 'paris france'), ('2', 'lyon')], cache=False)\n"
            "assert [h.id for h in index.search('paris')] == ['1']\n"
            "bm25s = sys.modules['bm25s']\n"
            "assert bm25s.selection.JAX_IS_AVAILABLE is False and bm25s.selection_np is bm25s.selection\n"
            "print(before, 'jax' in sys.modules)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()
    assert after == before  # nothing imported JAX on the way


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------

def test_cache_is_reused_and_rebuilt_when_the_corpus_or_settings_change(tmp_path, handwritten_pairs):
    cache = str(tmp_path)
    first = BM25Index.build(handwritten_pairs, cache_dir=cache)
    assert not first.loaded_from_cache and os.path.isdir(first.folder)
    assert os.path.dirname(first.folder) == cache
    stamp = os.stat(os.path.join(first.folder, "manifest.json")).st_mtime_ns
    assert not [n for n in os.listdir(cache) if n.startswith(".")]  # no temporary folder left

    again = BM25Index.build(handwritten_pairs, cache_dir=cache)
    assert again.loaded_from_cache and again.folder == first.folder
    assert os.stat(os.path.join(again.folder, "manifest.json")).st_mtime_ns == stamp
    for query in HANDWRITTEN_QUERIES:
        assert again.search(query, 5) == first.search(query, 5)

    changed = list(handwritten_pairs)
    changed[0] = (changed[0][0], changed[0][1] + " Also the city of light.")
    other = BM25Index.build(changed, cache_dir=cache)
    assert not other.loaded_from_cache and other.folder != first.folder
    renamed = [("x" + doc_id, contents) for doc_id, contents in handwritten_pairs]
    assert BM25Index.build(renamed, cache_dir=cache).folder not in (first.folder, other.folder)
    settings = BM25Index.build(handwritten_pairs, cache_dir=cache, k1=1.2)
    assert not settings.loaded_from_cache and settings.folder != first.folder
    assert len(os.listdir(cache)) == 4


def test_incomplete_or_broken_cache_folders_are_rebuilt(tmp_path, handwritten_pairs):
    cache = str(tmp_path)
    built = BM25Index.build(handwritten_pairs, cache_dir=cache)
    os.remove(os.path.join(built.folder, ".complete"))  # as left by an interrupted write
    redone = BM25Index.build(handwritten_pairs, cache_dir=cache)
    assert not redone.loaded_from_cache and os.path.isfile(os.path.join(redone.folder, ".complete"))

    os.remove(os.path.join(redone.folder, "vocab.index.json"))  # complete but damaged
    repaired = BM25Index.build(handwritten_pairs, cache_dir=cache)
    assert not repaired.loaded_from_cache
    assert repaired.search("Paris", 3) == built.search("Paris", 3)
    assert BM25Index.build(handwritten_pairs, cache_dir=cache).loaded_from_cache


# ---------------------------------------------------------------------------------------------
# Protocol, client and loopback server
# ---------------------------------------------------------------------------------------------

def test_protocol_bodies():
    assert json.loads(request_body("who?", 3)) == {"query": "who?", "topk": 3, "return_scores": True}
    assert parse_request(b'{"query": "q"}', 3) == ("q", 3, False)
    assert parse_request(b'{"query": "q", "topk": 0, "return_scores": true}', 4) == ("q", 4, True)
    assert parse_request(b'{"query": "q", "topk": null}', 5) == ("q", 5, False)
    hits = [Hit("7", '"T"\nx', 1.5), Hit("9", '"U"\ny', 0.5)]
    payload = response_payload(hits, True)
    assert payload == {"result": [[{"document": {"id": "7", "contents": '"T"\nx'}, "score": 1.5},
                                   {"document": {"id": "9", "contents": '"U"\ny'}, "score": 0.5}]]}
    assert parse_response(json.loads(json.dumps(payload))) == hits
    assert response_payload(hits, False) == {"result": [[{"id": "7", "contents": '"T"\nx'},
                                                         {"id": "9", "contents": '"U"\ny'}]]}
    assert parse_response({"result": []}) == [] and parse_response({"result": [[]]}) == []
    no_id = {"result": [[{"document": {"title": "T", "text": "x", "contents": "c"}, "score": 2}]]}
    assert parse_response(no_id) == [Hit("", "c", 2.0)]


@pytest.mark.parametrize("body, message", [
    (b"not json", "not JSON"), (b"[1, 2]", "JSON object"), (b'{"topk": 3}', "'query'"),
    (b'{"queries": ["a", "b"]}', "batch"), (b'{"query": 3}', "'query'"),
    (b'{"query": "q", "topk": -1}', "topk"), (b'{"query": "q", "topk": "3"}', "topk"),
    (b'{"query": "q", "topk": true}', "topk"), (b'{"query": "q", "return_scores": 1}', "return_scores"),
])
def test_parse_request_refuses(body, message):
    with pytest.raises(ValueError, match=message):
        parse_request(body)


@pytest.mark.parametrize("payload, message", [
    ([], "no 'result'"), ({"results": []}, "no 'result'"), ({"result": "x"}, "not a list"),
    ({"result": [[], []]}, "one list"), ({"result": [{"document": {}}]}, "one list"),
    ({"result": [[{"id": "1", "contents": "c"}]]}, "no 'document'"),
    ({"result": [[{"document": {"id": "1"}, "score": 1.0}]]}, "'contents'"),
    ({"result": [[{"document": {"id": "1", "contents": "c"}}]]}, "'score'"),
    ({"result": [[{"document": {"id": "1", "contents": "c"}, "score": "high"}]]}, "'score'"),
])
def test_parse_response_refuses_wrong_shapes(payload, message):
    with pytest.raises(RetrievalError, match=message) as info:
        parse_response(payload, "http://h:1/retrieve")
    assert "http://h:1/retrieve" in str(info.value) and "\n" not in str(info.value)


def test_client_through_loopback_server_equals_the_index(handwritten_index):
    with serve(handwritten_index) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/retrieve")
        client = HttpRetriever(server.url, topk=3, timeout=5, retries=2, backoff=0.01)
        for query in HANDWRITTEN_QUERIES:
            assert client.search(query) == handwritten_index.search(query.strip(), 3)
            assert client.search(query, 5) == handwritten_index.search(query.strip(), 5)
        assert client.search("") == []
        check_server(server.url, timeout=2)
        results = []  # concurrent clients (one thread per request on the server)
        threads = [threading.Thread(target=lambda q=q: results.append((q, client.search(q))))
                   for q in HANDWRITTEN_QUERIES]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(hits == handwritten_index.search(q.strip(), 3) for q, hits in results)


def _post(url: str, body: bytes) -> tuple[int, dict]:
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_answers_bad_requests_with_400_json(handwritten_index):
    with serve(handwritten_index, default_topk=2) as server:
        status, payload = _post(server.url, b'{"query": "Paris"}')  # no topk, no scores
        assert status == 200 and len(payload["result"][0]) == 2
        assert set(payload["result"][0][0]) == {"id", "contents"}
        for body in (b"nonsense", b'{"queries": ["Paris"]}', b'{"query": "Paris", "topk": -2}'):
            status, payload = _post(server.url, body)
            assert status == 400 and isinstance(payload["error"], str), body
        status, payload = _post(server.url.replace("/retrieve", "/search"), b'{"query": "x"}')
        assert status == 404 and "/retrieve" in payload["error"]


def test_server_turns_backend_failures_into_500():
    class Broken:
        def search(self, query, k=3):
            raise KeyError("boom")

    with serve(Broken()) as server:
        status, payload = _post(server.url, b'{"query": "x"}')
        assert status == 500 and "boom" in payload["error"]
        with pytest.raises(RetrievalError, match="HTTP 500"):
            HttpRetriever(server.url, retries=2, backoff=0.0).search("x")


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/retrieve"


def test_server_down_fails_fast_with_a_one_line_hint():
    url = _closed_port_url()
    start = time.perf_counter()
    with pytest.raises(RetrievalError) as info:
        HttpRetriever(url, timeout=1, retries=3, backoff=0.01).search("Paris")
    assert time.perf_counter() - start < 2
    message = str(info.value)
    assert url in message and "3 attempt" in message and "connection refused" in message
    assert "server running" in message and "env.search.url" in message and "\n" not in message
    with pytest.raises(RetrievalError, match="check failed"):
        check_server(url, timeout=0.5)


class _Scripted:
    """A stdlib server answering each POST with the next (status, body, delay) of a script (the
    last one repeats); `.calls` counts requests."""

    def __init__(self, script):
        outer = self
        self.script, self.calls = list(script), 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, body, delay = outer.script[min(outer.calls, len(outer.script) - 1)]
                outer.calls += 1
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that timed out has hung up: expected here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


GOOD = json.dumps({"result": [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": 3.5}]]}).encode()


def test_client_retries_503_then_recovers():
    with _Scripted([(503, b"busy", 0), (502, b"", 0), (200, GOOD, 0)]) as server:
        hits = HttpRetriever(server.url, retries=5, backoff=0.01).search("q")
        assert hits == [Hit("1", '"T"\nx', 3.5)] and server.calls == 3


def test_client_gives_up_after_the_retries():
    with _Scripted([(503, b"overloaded", 0)]) as server:
        with pytest.raises(RetrievalError, match="HTTP 503.*overloaded.*server running"):
            HttpRetriever(server.url, retries=3, backoff=0.01).search("q")
        assert server.calls == 3


def test_client_does_not_retry_other_http_errors():
    with _Scripted([(404, b"Not Found", 0)]) as server:
        with pytest.raises(RetrievalError, match="HTTP 404.*retrieval endpoint"):
            HttpRetriever(server.url, retries=5, backoff=0.01).search("q")
        assert server.calls == 1


@pytest.mark.parametrize("body, message", [
    (b"<html>oops</html>", "not JSON"), (b'{"result": "nope"}', "not a list"),
    (b'{"answer": 42}', "no 'result'"), (b'{"result": [["doc"]]}', "no 'document'"),
])
def test_client_refuses_garbage_answers(body, message):
    with _Scripted([(200, body, 0)]) as server:
        with pytest.raises(RetrievalError, match=message):
            HttpRetriever(server.url, retries=3, backoff=0.01).search("q")
        assert server.calls == 1  # a wrong answer is not retried


def test_client_times_out_and_retries():
    with _Scripted([(200, GOOD, 0.6), (200, GOOD, 0)]) as server:
        assert HttpRetriever(server.url, timeout=0.2, retries=2, backoff=0.0).search("q")
        assert server.calls == 2
    with _Scripted([(200, GOOD, 0.6)]) as server:
        with pytest.raises(RetrievalError, match="no answer within 0.2 s"):
            HttpRetriever(server.url, timeout=0.2, retries=2, backoff=0.0).search("q")


def test_client_arguments():
    with pytest.raises(ValueError, match="env.search.url"):
        HttpRetriever("127.0.0.1:8000/retrieve")
    with pytest.raises(ValueError, match="retries"):
        HttpRetriever("http://127.0.0.1:8000/retrieve", retries=0)
