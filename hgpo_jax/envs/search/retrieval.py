"""Passage retrieval for search QA: an embedded BM25 index, an HTTP client, a loopback server.

Every backend answers `search(query, k) -> list[Hit]`, the hits best first. The env turns hits into
the observation text elsewhere; this module only finds passages.

Backends
- `BM25Index`: BM25 over a corpus held in memory, built with the `bm25s` library and cached on
  disk. Lucene-like, the way pyserini's BM25 (Search-R1's `bm25` retriever) scores, but not
  bit-exact with Lucene (see "Scoring").
- `HttpRetriever`: a client of verl-agent's retrieval-server protocol, so a user's own server
  (for example Search-R1's e5 index of wiki-18) can stand in for the embedded index.

The protocol (verl-agent's retrieval server and the search tool's client): `POST <url>`
(by convention `http://127.0.0.1:8000/retrieve`) with the JSON object
`{"query": str, "topk": int, "return_scores": true}`, answered with
`{"result": [[{"document": {"id": str, "contents": "\\"Title\\"\\ntext"}, "score": float}, ...]]}`:
one inner list for the one query, best first. `serve` answers that protocol from any backend, and
`python -m hgpo_jax.envs.search.retrieval serve --corpus PATH --port 8000` serves a BM25 index of
a corpus file to other processes.

Analysis (the same chain for passages and queries): `analyze`, the project's reproduction of
Anserini's DefaultEnglishAnalyzer (Lucene StandardTokenizer, possessive filter, lower case,
Lucene's 33 English stop words, Lucene's Porter stemmer): pyserini's default analyzer. It lives
in `hgpo_jax.envs.lucene`, shared with WebShop's search. bm25s's own tokenizer would drop
one-character tokens ("World War 2") and has no stemmer without PyStemmer (not a dependency),
whose Snowball stems differ from Lucene's Porter stems.

Scoring (bm25s `method="lucene"`, k1 = 0.9, b = 0.4, pyserini's defaults; bm25s's own defaults,
k1 = 1.5 and b = 0.75, are rank_bm25's and would rank differently from the pyserini BM25 index
that Search-R1's bm25 server uses): for each query term occurrence t (a term repeated in the
query counts again, like Anserini's bag-of-words query),
`idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))` with `idf(t) = ln(1 + (N - df + 0.5) /
(df + 0.5))`, N the number of passages, dl a passage's number of analyzed terms and avgdl their
mean; float32 like Lucene. Differences from Lucene: dl is exact (Lucene stores it lossily in one
byte, so its scores of long passages differ slightly), and N and avgdl count passages with no
term at all (Lucene counts only passages with one).

Ranking: score descending, equal scores by corpus order; only passages sharing a term with the
query (score > 0), so fewer than k hits, or none, can come back. A query with no indexed term
(empty, only spaces or punctuation, only stop words, or only unknown words) gets `[]`, as from
pyserini; the env shows its no-result text for it.

bm25s is imported without JAX (it runs a JAX op when imported; `_import_bm25s` says why that
matters), so env worker processes stay free of JAX.
"""

from __future__ import annotations

import argparse
import builtins
import hashlib
import http.client
import importlib.util
import ipaddress
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import numpy as np

from hgpo_jax.envs.data import cache_root, is_complete, publish_folder

logger = logging.getLogger(__name__)

INDEX_VERSION = 1  # bump when the analysis or the files of a cached index change
K1 = 0.9  # pyserini / Anserini BM25 defaults
B = 0.4
DEFAULT_TOPK = 3  # env.search.topk in verl-agent's ppo_trainer.yaml
DEFAULT_URL = "http://127.0.0.1:8000/retrieve"  # env.search.search_url
DEFAULT_TIMEOUT = 60.0  # env.search.timeout (seconds)
DEFAULT_RETRIES = 10  # attempts in all, as verl-agent's search client
DEFAULT_BACKOFF = 1.0  # seconds; the wait before attempt i + 1 is backoff * i
RETRY_STATUS = frozenset({500, 502, 503, 504})
ANALYZER = "anserini-default-english-porter"  # named in the cache key
MAX_REQUEST_BYTES = 1 << 20
_MANIFEST = "manifest.json"
_SERVER_HINT = ("is the retrieval server running? start one with `python -m hgpo_jax.envs."
                "search.retrieval serve --corpus PATH --port 8000` or set env.search.url")


class RetrievalError(RuntimeError):
    """A retrieval backend could not answer: server down, timed out, or an unexpected answer."""


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its corpus id, its wiki-18-style `contents` ('"Title"\\ntext'), and
    the backend's score (higher is better; BM25 here, inner products for an e5 server)."""
    id: str
    contents: str
    score: float


class Retriever(Protocol):
    """What the env needs from a backend."""

    def search(self, query: str, k: int = DEFAULT_TOPK) -> list[Hit]: ...


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------

def as_pairs(corpus: Iterable[Any]) -> list[tuple[str, str]]:
    """The corpus as `(id, contents)` pairs, in order.

    Accepts `(id, contents)` pairs or objects with `.id` and `.contents` (such as a Passage);
    ids become strings. Raises ValueError on anything else and on repeated ids (a hit must name
    one passage).
    """
    pairs = []
    for i, doc in enumerate(corpus):
        if hasattr(doc, "id") and hasattr(doc, "contents"):
            doc_id, contents = doc.id, doc.contents
        elif isinstance(doc, (tuple, list)) and len(doc) == 2:
            doc_id, contents = doc
        else:
            raise ValueError(f"corpus entry {i} is neither an (id, contents) pair nor an object "
                             f"with .id and .contents: {doc!r:.80}")
        if not isinstance(contents, str):
            raise ValueError(f"corpus entry {i} ({doc_id!r}): contents must be a string")
        pairs.append((str(doc_id), contents))
    counts = Counter(doc_id for doc_id, _ in pairs)
    if len(counts) != len(pairs):
        repeated = next(doc_id for doc_id, n in counts.items() if n > 1)
        raise ValueError(f"corpus ids must be unique; {repeated!r} appears more than once")
    return pairs


# ---------------------------------------------------------------------------------------------
# BM25 index
# ---------------------------------------------------------------------------------------------

_BM25S_LOCK = threading.Lock()


def _import_bm25s():
    """The bm25s package, imported so that it never touches JAX.

    bm25s 0.3.16's `selection` module calls `jax.lax.top_k` when it is imported, whenever JAX is
    installed, and that starts JAX's default backend: in an env worker process (spawned without
    JAX) it would claim the accelerator (a CUDA context and preallocated GPU memory, or the TPU
    outright), and in the trainer it would start the backend before the trainer configures it
    (jax.distributed.initialize must come first). So that one module is executed here from its
    own file with `import jax...` failing inside it only, and takes its no-JAX path; nothing else
    in the process sees a difference. This module never uses that module's top-k (`top_k_order`
    ranks). bm25s also sets its logger to DEBUG; it is put back to WARNING.
    """
    with _BM25S_LOCK:
        if "bm25s" not in sys.modules and "bm25s.selection" not in sys.modules:
            package = importlib.util.find_spec("bm25s")
            if package is None or not package.submodule_search_locations:
                raise ImportError("bm25s is not installed: pip install bm25s==0.3.16 "
                                  "(requirements.txt)")
            path = os.path.join(list(package.submodule_search_locations)[0], "selection.py")
            spec = importlib.util.spec_from_file_location("bm25s.selection", path)
            selection = importlib.util.module_from_spec(spec)

            def no_jax_import(name, *args, **kwargs):
                if name == "jax" or name.startswith("jax."):
                    raise ImportError("bm25s.selection runs without JAX here")
                return builtins.__import__(name, *args, **kwargs)

            selection.__dict__["__builtins__"] = dict(vars(builtins), __import__=no_jax_import)
            sys.modules["bm25s.selection"] = selection
            try:
                spec.loader.exec_module(selection)
            except BaseException:
                del sys.modules["bm25s.selection"]
                raise
        import bm25s
        if not hasattr(bm25s, "selection"):
            bm25s.selection = sys.modules["bm25s.selection"]
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        return bm25s


def analyze(text: str) -> list[str]:
    """Index and query terms of `text`: Anserini's DefaultEnglishAnalyzer (see the module doc).

    '"Paris"\\nThe capital of France\\'s ...' -> ['pari', 'capit', 'franc', ...].
    """
    # imported when first used: compiling its tokenizer patterns takes ~40 ms, which a process
    # that only talks to a retrieval server (HttpRetriever) never needs
    from hgpo_jax.envs.lucene import analyze as lucene_analyze
    return lucene_analyze(text)


def corpus_key(pairs: Sequence[tuple[str, str]], k1: float, b: float) -> str:
    """sha256 (hex) of everything a cached index depends on: the passages (ids and contents, in
    order), k1, b, the analyzer, INDEX_VERSION and the bm25s version."""
    bm25s = _import_bm25s()
    digest = hashlib.sha256()
    header = [INDEX_VERSION, ANALYZER, repr(float(k1)), repr(float(b)), bm25s.__version__,
              len(pairs)]
    digest.update(json.dumps(header).encode())
    for doc_id, contents in pairs:
        for part in (doc_id.encode("utf-8"), contents.encode("utf-8", "surrogatepass")):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
    return digest.hexdigest()


def default_cache_dir() -> str:
    """Where cached BM25 indexes live: `<cache_root()>/search/bm25`."""
    return os.path.join(cache_root(), "search", "bm25")


def top_k_order(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the (at most) k highest positive scores: score descending, ties by index.

    scores: float[N]. Exact and deterministic: every index tied with the k-th score competes,
    and ties go to the lower index (corpus order). O(N) plus a sort of the candidates.
    """
    positive = int(np.count_nonzero(scores > 0))
    k = min(k, positive)
    if k <= 0:
        return []
    kth = np.partition(scores, len(scores) - k)[len(scores) - k]
    candidates = np.flatnonzero(scores >= kth)
    order = candidates[np.lexsort((candidates, -scores[candidates]))]
    return order[:k].tolist()


def _fit_bm25(pairs: Sequence[tuple[str, str]], k1: float, b: float):
    """A bm25s.BM25 (Lucene variant, float32) over the analyzed passages."""
    bm25s = _import_bm25s()
    terms = [analyze(contents) for _, contents in pairs]
    if not any(terms):
        raise ValueError("the corpus has no term to index: every passage is empty, punctuation "
                         "or stop words")
    model = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numpy", csc_backend="numpy")
    model.index(terms, show_progress=False)
    return model


def _load_model(folder: str):
    bm25s = _import_bm25s()
    return bm25s.BM25.load(folder, show_progress=False)


def _save_atomically(model, folder: str, manifest: dict) -> None:
    """Write the index to a temporary sibling, mark it complete, rename it to `folder`.

    An interrupted write leaves only a `.build-*` folder (removed here on error), never a folder
    that looks complete; when another process renamed its copy first, that copy is kept.
    """
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".build-{uuid.uuid4().hex[:8]}")
    try:
        model.save(tmp, show_progress=False)
        with open(os.path.join(tmp, _MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
        publish_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BM25Index:
    """BM25 over an in-memory corpus (Lucene-like; see the module doc). Thread-safe for search.

    Build with `BM25Index.build(corpus)`. Attributes: `ids`, `contents` (lists in corpus order),
    `key` (corpus_key), `folder` (the cache folder, None without a cache), `loaded_from_cache`
    (True when the index was read from disk rather than built), `build_seconds`.
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], model, key: str, folder: str | None,
                 loaded_from_cache: bool, build_seconds: float):
        self.ids = [doc_id for doc_id, _ in pairs]
        self.contents = [contents for _, contents in pairs]
        self.key = key
        self.folder = folder
        self.loaded_from_cache = loaded_from_cache
        self.build_seconds = build_seconds
        self._model = model
        self._vocab: dict[str, int] = model.vocab_dict

    @classmethod
    def build(cls, corpus: Iterable[Any], *, k1: float = K1, b: float = B,
              cache_dir: str | None = None, cache: bool = True) -> BM25Index:
        """Index `corpus` ((id, contents) pairs or Passage-like objects; see `as_pairs`).

        With `cache` (the default) the index is looked up in `cache_dir` (default
        `default_cache_dir()`) under the first 24 hex digits of `corpus_key`: a complete folder
        whose manifest names the same key and passage count is loaded (fast: well under a
        second for the 23,694-passage set), anything else is rebuilt and written atomically.
        An unreadable cached folder is rebuilt with a warning. `cache=False` never touches disk.
        """
        start = time.perf_counter()
        pairs = as_pairs(corpus)
        if not pairs:
            raise ValueError("cannot build a BM25 index of an empty corpus")
        key = corpus_key(pairs, k1, b)
        if not cache:
            model = _fit_bm25(pairs, k1, b)
            return cls(pairs, model, key, None, False, time.perf_counter() - start)
        folder = os.path.join(cache_dir or default_cache_dir(), key[:24])
        if is_complete(folder):
            try:
                model = _load_cached(folder, key, len(pairs))
                return cls(pairs, model, key, folder, True, time.perf_counter() - start)
            except (OSError, ValueError, KeyError) as e:
                logger.warning("rebuilding the BM25 index at %s: the cached copy is unusable (%s)",
                               folder, e)
                shutil.rmtree(folder, ignore_errors=True)
        model = _fit_bm25(pairs, k1, b)
        manifest = {"key": key, "num_docs": len(pairs), "k1": k1, "b": b, "analyzer": ANALYZER,
                    "index_version": INDEX_VERSION}
        _save_atomically(model, folder, manifest)
        return cls(pairs, model, key, folder, False, time.perf_counter() - start)

    def __len__(self) -> int:
        return len(self.ids)

    def term_ids(self, query: str) -> list[int]:
        """Vocabulary ids of the query's analyzed terms found in the corpus (repeats kept)."""
        return [self._vocab[t] for t in analyze(query) if t in self._vocab]

    def scores(self, query: str) -> np.ndarray:
        """float32[N]: every passage's BM25 score for `query`, in corpus order (0 when no term
        is shared)."""
        term_ids = self.term_ids(query)
        if not term_ids:
            return np.zeros(len(self.ids), dtype=np.float32)
        return self._model.get_scores_from_ids(term_ids)

    def search(self, query: str, k: int = DEFAULT_TOPK) -> list[Hit]:
        """The top `k` passages for `query`, best first (ties by corpus order); `[]` for a query
        with no indexed term, fewer than k when fewer passages share a term with it."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, not {type(query).__name__}")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        scores = self.scores(query)
        return [Hit(self.ids[i], self.contents[i], float(scores[i]))
                for i in top_k_order(scores, k)]


def _load_cached(folder: str, key: str, num_docs: int):
    """The bm25s model cached in `folder`; ValueError when its manifest does not match."""
    with open(os.path.join(folder, _MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("key") != key or manifest.get("num_docs") != num_docs:
        raise ValueError(f"its manifest is for another corpus ({manifest.get('key', '?')[:12]}, "
                         f"{manifest.get('num_docs')} passages)")
    model = _load_model(folder)
    if model.scores["num_docs"] != num_docs:
        raise ValueError(f"it holds {model.scores['num_docs']} passages, not {num_docs}")
    return model


_INDEXES: dict[tuple, BM25Index] = {}
_INDEXES_LOCK = threading.Lock()


def corpus_index(path: str, cache_dir: str | None = None) -> BM25Index:
    """The BM25 index of a corpus file (or of `corpus.jsonl` in a folder), one per process.

    The file is read with `hgpo_jax.envs.search.data.read_corpus` (its one-line ValueErrors for
    a bad line) and indexed with `BM25Index.build` (disk cache). The index is kept per file path,
    size and modification time, so every env of a process shares one index instead of holding
    a copy each; parallel first calls build it once.
    """
    from hgpo_jax.envs.search.data import CORPUS_FILE, read_corpus

    if os.path.isdir(path):
        path = os.path.join(path, CORPUS_FILE)
    stat = os.stat(path)
    memo_key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, cache_dir)
    with _INDEXES_LOCK:
        if memo_key not in _INDEXES:
            _INDEXES[memo_key] = BM25Index.build(read_corpus(path), cache_dir=cache_dir)
        return _INDEXES[memo_key]


# ---------------------------------------------------------------------------------------------
# Protocol: request and response bodies (pure)
# ---------------------------------------------------------------------------------------------

def request_body(query: str, topk: int) -> bytes:
    """The JSON body verl-agent's client posts: {"query", "topk", "return_scores": true}."""
    return json.dumps({"query": query, "topk": topk, "return_scores": True}).encode("utf-8")


def parse_request(body: bytes, default_topk: int = DEFAULT_TOPK) -> tuple[str, int, bool]:
    """(query, topk, return_scores) of a request body; ValueError naming what is wrong.

    As verl-agent's server: `topk` missing, null or 0 means `default_topk`; `return_scores`
    defaults to false. Search-R1's batch form (`"queries": [...]`) is refused with a hint.
    """
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"the request body is not JSON ({e})") from None
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object {\"query\": str, \"topk\": int, "
                         "\"return_scores\": bool}")
    if "query" not in request and "queries" in request:
        raise ValueError("this server takes one 'query' per request (verl-agent's protocol), "
                         "not Search-R1's batch 'queries'")
    query = request.get("query")
    if not isinstance(query, str):
        raise ValueError("'query' must be a string")
    topk = request.get("topk")
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 0):
        raise ValueError(f"'topk' must be a positive integer, got {topk!r}")
    topk = topk or default_topk
    return_scores = request.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise ValueError(f"'return_scores' must be true or false, got {return_scores!r}")
    return query, topk, return_scores


def response_payload(hits: Sequence[Hit], return_scores: bool) -> dict:
    """The server's answer for one query: {"result": [[{"document": doc, "score": s}, ...]]}, or
    {"result": [[doc, ...]]} without scores, where doc = {"id", "contents"}."""
    docs = [{"id": hit.id, "contents": hit.contents} for hit in hits]
    if return_scores:
        return {"result": [[{"document": doc, "score": hit.score} for doc, hit in zip(docs, hits)]]}
    return {"result": [docs]}


def parse_response(payload: Any, url: str = "the retrieval server") -> list[Hit]:
    """Hits of a server's answer to one scored query; RetrievalError naming what is wrong.

    `{"result": []}` (no inner list) and `{"result": [[]]}` are no hits. A document without an
    `id` (verl-agent's pyserini path sends title/text/contents only) gets id "". All returned
    hits are kept (the server applies topk), in the server's order.
    """
    def wrong(what: str) -> RetrievalError:
        return RetrievalError(
            f"retrieval server {url} answered an unexpected shape: {what}; expected "
            '{"result": [[{"document": {"id": ..., "contents": ...}, "score": ...}, ...]]}')

    if not isinstance(payload, dict) or "result" not in payload:
        raise wrong(f"no 'result' key in {_excerpt(payload)}")
    result = payload["result"]
    if not isinstance(result, list):
        raise wrong(f"'result' is {type(result).__name__}, not a list")
    if not result:
        return []
    if len(result) != 1 or not isinstance(result[0], list):
        raise wrong(f"'result' should hold one list for the one query, got {_excerpt(result)}")
    hits = []
    for rank, item in enumerate(result[0]):
        if not isinstance(item, dict) or not isinstance(item.get("document"), dict):
            raise wrong(f"hit {rank} has no 'document' object: {_excerpt(item)}")
        doc, score = item["document"], item.get("score")
        if not isinstance(doc.get("contents"), str):
            raise wrong(f"hit {rank}'s document has no 'contents' string: {_excerpt(doc)}")
        numeric = isinstance(score, (int, float)) and not isinstance(score, bool)
        if not numeric or not math.isfinite(score):
            raise wrong(f"hit {rank} has no finite numeric 'score': {_excerpt(item)}")
        hits.append(Hit(str(doc.get("id", "")), doc["contents"], float(score)))
    return hits


def _excerpt(value: Any, limit: int = 120) -> str:
    if isinstance(value, (bytes, bytearray)):
        text = repr(bytes(value[:limit + 1]))
    else:
        text = json.dumps(value, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------
# HTTP client
# ---------------------------------------------------------------------------------------------

def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _describe(error: BaseException, timeout: float) -> str:
    """One short phrase for a failed attempt: 'connection refused', 'no answer within 60 s'."""
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    return f"{type(reason).__name__}: {reason}".rstrip(": ")


class HttpRetriever:
    """Client of a retrieval server speaking verl-agent's protocol (see the module doc).

    url: the full endpoint, e.g. http://127.0.0.1:8000/retrieve. topk: hits asked for when
    `search` gets no k. timeout: seconds per attempt (connect and answer). retries: attempts in
    all. backoff: the wait before attempt i + 1 is `backoff * i` seconds (linear, as verl-agent's
    client; tests pass a small one).

    Connection errors, timeouts and HTTP 500/502/503/504 are retried; after the last attempt,
    or at once for any other HTTP error or a body that is not JSON, `RetrievalError` is raised
    with one line naming the url, what happened and what to do. A JSON answer of the wrong shape
    is a `RetrievalError` too, never an empty result. The query is stripped before it is sent
    (as the authors' tool does) and sent even when empty: the server decides what that returns.
    Loopback urls bypass any http_proxy setting. Thread-safe (one connection per request).
    """

    def __init__(self, url: str = DEFAULT_URL, topk: int = DEFAULT_TOPK,
                 timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 backoff: float = DEFAULT_BACKOFF):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"retrieval url {url!r} is not an http(s) url; set env.search.url "
                             f"to one like {DEFAULT_URL}")
        if retries < 1 or timeout <= 0 or backoff < 0 or topk < 1:
            raise ValueError(f"HttpRetriever needs retries >= 1, timeout > 0, backoff >= 0 and "
                             f"topk >= 1 (got {retries}, {timeout}, {backoff}, {topk})")
        self.url, self.topk, self.timeout = url, topk, timeout
        self.retries, self.backoff = retries, backoff
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(parsed.hostname) else []
        self._opener = urllib.request.build_opener(*handlers)

    def search(self, query: str, k: int | None = None) -> list[Hit]:
        """The server's hits for `query` (k: topk to ask for; None: self.topk), best first."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, not {type(query).__name__}")
        raw = self._post(request_body(query.strip(), self.topk if k is None else k))
        try:
            payload = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RetrievalError(f"retrieval server {self.url} answered something that is not "
                                 f"JSON ({e}): {_excerpt(raw)}; is this url a retrieval "
                                 f"endpoint (POST /retrieve)?") from None
        return parse_response(payload, self.url)

    def _post(self, body: bytes) -> bytes:
        """The body of a 2xx answer to POST `body`, with the retries of the class doc."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        last = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff * attempt)
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as e:
                detail = _error_body(e)
                if e.code not in RETRY_STATUS:
                    raise RetrievalError(f"retrieval server {self.url} answered HTTP {e.code} "
                                         f"{e.reason}{detail}; is this url a retrieval endpoint "
                                         f"(POST /retrieve)?") from None
                last = f"HTTP {e.code} {e.reason}{detail}"
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                last = _describe(e, self.timeout)
            if attempt + 1 < self.retries:  # the last failure is the error raised below
                logger.warning("retrieval attempt %d/%d at %s failed: %s; retrying",
                               attempt + 1, self.retries, self.url, last)
        raise RetrievalError(f"retrieval server {self.url} failed {self.retries} attempt(s), "
                             f"last: {last}; {_SERVER_HINT}")


def _error_body(error: urllib.error.HTTPError) -> str:
    """': <the start of the error body>' (one line), or '' when it has none."""
    try:
        text = error.read(200).decode("utf-8", "replace")
    except OSError:
        return ""
    text = " ".join(text.split())
    return f": {text}" if text else ""


def check_server(url: str, timeout: float = 5.0) -> None:
    """Refuse early when the server at `url` cannot answer: one query, one attempt, a short
    timeout; raises RetrievalError (one line) if it is down, slow or speaks another protocol."""
    try:
        HttpRetriever(url, topk=1, timeout=timeout, retries=1, backoff=0.0).search(
            "retrieval server check")
    except RetrievalError as e:
        raise RetrievalError(f"retrieval server check failed: {e}") from None


# ---------------------------------------------------------------------------------------------
# Loopback server
# ---------------------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    """POST /retrieve per the protocol; bad requests get 400 and a JSON {"error": ...}."""

    server_version = "hgpo-jax-retrieval"

    def do_POST(self) -> None:
        if urllib.parse.urlsplit(self.path).path != "/retrieve":
            return self._send(404, {"error": f"no endpoint {self.path}; use POST /retrieve"})
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send(411, {"error": "the request needs a Content-Length"})
        if length < 0 or length > MAX_REQUEST_BYTES:
            return self._send(413, {"error": f"the request body must be at most "
                                             f"{MAX_REQUEST_BYTES} bytes"})
        try:
            query, topk, return_scores = parse_request(self.rfile.read(length),
                                                       self.server.default_topk)
        except ValueError as e:
            return self._send(400, {"error": str(e)})
        try:
            hits = self.server.retriever.search(query, topk)
        except Exception as e:  # the backend's failure is the server's 500, not a dead thread
            logger.exception("retrieval backend failed on %r", query)
            return self._send(500, {"error": f"{type(e).__name__}: {e}"})
        self._send(200, response_payload(hits, return_scores))

    def do_GET(self) -> None:
        self._send(405, {"error": "use POST /retrieve with {\"query\": str, \"topk\": int, "
                                  "\"return_scores\": bool}"})

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), format % args)


class _ThreadingServer(ThreadingHTTPServer):
    """One daemon thread per request and a deep listen backlog: with the socketserver default
    of 5, a burst of parallel env clients gets connections reset or 1 s SYN retransmits."""
    daemon_threads = True
    request_queue_size = 1024


class RetrievalServer:
    """A running loopback server (see `serve`); `.url` is its endpoint; `close()` stops it."""

    def __init__(self, retriever: Retriever, host: str, port: int, default_topk: int):
        self._httpd = _ThreadingServer((host, port), _Handler)
        self._httpd.retriever = retriever
        self._httpd.default_topk = default_topk
        self.host, self.port = self._httpd.server_address[:2]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}/retrieve"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="retrieval-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> RetrievalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 0,
          default_topk: int = DEFAULT_TOPK) -> RetrievalServer:
    """Serve `retriever` at http://host:port/retrieve from a daemon thread, until `close()`.

    port 0 picks a free port (read it from `.url`). One thread per request, so slow clients do
    not block others; the backend must be thread-safe (BM25Index and HttpRetriever are).
    """
    return RetrievalServer(retriever, host, port, default_topk)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """`serve --corpus PATH [--host H] [--port P] [--topk K]`: the BM25 index of a corpus file
    (see corpus_index), served until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m hgpo_jax.envs.search.retrieval",
                                     description="Serve a BM25 index over verl-agent's "
                                                 "retrieval protocol (POST /retrieve).")
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("serve", help="serve a corpus until interrupted")
    server.add_argument("--corpus", required=True,
                        help="corpus.jsonl ({id, title, text} or {id, contents} rows) or "
                             "its folder")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--topk", type=int, default=DEFAULT_TOPK,
                        help="hits for a request without topk")
    server.add_argument("--cache-dir", default=None, help=f"default: {default_cache_dir()}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    index = corpus_index(args.corpus, cache_dir=args.cache_dir)
    how = "loaded from" if index.loaded_from_cache else "built into"
    print(f"BM25 index of {len(index)} passages {how} {index.folder} in "
          f"{index.build_seconds:.1f} s", flush=True)
    with serve(index, args.host, args.port, args.topk) as running:
        print(f"serving {running.url} (Ctrl-C to stop)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
