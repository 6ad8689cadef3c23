"""WebShop's product search: BM25 that reproduces pyserini 0.21 / Anserini / Lucene 9.4.2 exactly.

The original env indexes one Lucene document per product (field `contents`, see `document_text`)
and searches it with `LuceneSearcher.search(query, k=50)`. `BM25Index` redoes that in Python and
gives the same hits, in the same order, with the same float32 scores, bit for bit, on all 2,405
golden queries of the small set (`lucene_top50.jsonl`). What is reproduced:

Analyzer: Anserini's `DefaultEnglishAnalyzer` (Porter; the same chain for documents and queries),
`hgpo_jax.envs.lucene.analyze`, shared with the search-QA env; that module says what it
reproduces and how.

Query: Anserini's bag of words: each distinct analyzed term is a SHOULD clause whose boost is
its count in the query.

Scoring (Lucene 9 `BM25Similarity(k1=0.9, b=0.4)`, float32 wherever Lucene uses float):
`idf = (float) ln(1 + (N - df + 0.5) / (df + 0.5))` computed in double, N = the number of
documents with at least one token; `avgdl = (float) (sumTotalTermFreq / N)`; a document's length
(its number of tokens after stop-word removal) is stored in one byte, `SmallFloat.intToByte4`,
and read back with `byte4ToInt` (exact up to 39, then 4 significant bits); per length byte,
`normInverse = 1 / (k1 * ((1 - b) + b * dl / avgdl))`; per term,
`score = w - w / (1 + tf * normInverse)` with `w = boost * idf`. Lucene's disjunction scorers add
the clause scores in double and cast the sum to float (float32 values within a factor 2^29 of
one another add exactly in double, so the clause order does not matter).

Order and returned scores: by raw float32 score, descending; equal scores by id, ascending
(Anserini sorts the top hits by score, then by the `id` field). The returned scores are those of
Anserini's `ScoreTiesAdjusterReranker`: rounded to 4 decimals (`round4`), and a hit within 1e-4
of the previous (adjusted) one gets `1e-6 * dup` subtracted in float32, `dup` counting the run
of such near ties.

Why it is hand-written: Lucene's float32 BM25 arithmetic, lossy norms and tie adjustment exist
nowhere outside Lucene (nor does its tokenizer: see `hgpo_jax.envs.lucene`).

`PyseriniSearcher` is the optional original backend, for a user with pyserini and a Lucene index
(for example of the full 1.18M-product catalogue).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from hgpo_jax.envs.lucene import analyze

K1 = 0.9
B = 0.4


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------

def document_text(product) -> str:
    """The indexed `contents` of a Product (upstream `convert_product_file_format.py`).

    ' '.join([title, description, first bullet point, options]).lower(), the options written as
    'name: v1, v2, and name2: w1' from the loaded (lower-cased, '/' -> ' | ') values.
    """
    option_text = ", and ".join(f"{name}: {', '.join(values)}"
                                for name, values in product.options.items())
    bullets = product.bullet_points
    first_bullet = bullets[0] if bullets and bullets[0] is not None else ""
    return " ".join([product.title, product.description, first_bullet, option_text]).lower()


# ---------------------------------------------------------------------------------------------
# Lucene numerics
# ---------------------------------------------------------------------------------------------

_NUM_FREE_VALUES = 24  # 255 - longToInt4(Integer.MAX_VALUE)


def _long_to_int4(value: int) -> int:
    """SmallFloat.longToInt4: a float-like byte with 4 significant bits."""
    bits = value.bit_length()
    if bits < 4:
        return value
    shift = bits - 4
    return ((value >> shift) & 0x07) | ((shift + 1) << 3)


def _int4_to_long(code: int) -> int:
    """SmallFloat.int4ToLong, the inverse of _long_to_int4 (lossy)."""
    bits, shift = code & 0x07, (code >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


def int_to_byte4(value: int) -> int:
    """SmallFloat.intToByte4 as an unsigned byte: exact below 24, then 4 significant bits."""
    if value < _NUM_FREE_VALUES:
        return value
    return _NUM_FREE_VALUES + _long_to_int4(value - _NUM_FREE_VALUES)


def byte4_to_int(code: int) -> int:
    """SmallFloat.byte4ToInt: the length a norm byte stands for."""
    if code < _NUM_FREE_VALUES:
        return code
    return _NUM_FREE_VALUES + _int4_to_long(code - _NUM_FREE_VALUES)


LENGTH_TABLE = np.array([byte4_to_int(i) for i in range(256)], dtype=np.float32)


def bm25_idf(doc_freq: int, doc_count: int) -> np.float32:
    """BM25Similarity.idf: (float) log(1 + (N - df + 0.5) / (df + 0.5)), computed in double."""
    return np.float32(math.log(1 + (doc_count - doc_freq + 0.5) / (doc_freq + 0.5)))


def norm_inverse_table(k1: float, b: float, avgdl: np.float32) -> np.ndarray:
    """float32[256]: 1 / (k1 * ((1 - b) + b * dl / avgdl)) per norm byte, in float32 like Lucene."""
    k1, b = np.float32(k1), np.float32(b)
    return np.float32(1) / (k1 * ((np.float32(1) - b) + b * LENGTH_TABLE / np.float32(avgdl)))


def round4(score: np.float32) -> np.float32:
    """A raw float32 score rounded to 4 decimals, as Anserini returns it.

    `Math.round(s * 1e4) / 1e4` stored as float32, with the product taken exactly (in double) and
    halves rounded up. The product is not rounded to float32 first: the golden file rounds the
    hundreds of scores whose float32 product is exactly x.5 as their exact product says
    (14.39694977f * 1e4 = 143969.4977: 14.3969, where the float32 product 143969.5 gives 14.397).
    """
    return np.float32(math.floor(float(score) * 1e4 + 0.5) / 1e4)


def adjust_ties(scores: np.ndarray) -> list[float]:
    """Anserini ScoreTiesAdjusterReranker on ranked float32 scores -> returned scores.

    Round to 4 decimals (`round4`), then, in float32, subtract 1e-6 * dup from a score within
    1e-4 of the previous adjusted one (dup counts the run of such near ties).
    """
    out, dup = [], 0
    eps, tie = np.float32(1e-6), np.float32(1e-4)
    for raw in scores:
        s = round4(raw)
        if not out or out[-1] - s > tie:
            dup = 0
        else:
            dup += 1
            s = s - eps * np.float32(dup)
        out.append(s)
    return [float(s) for s in out]


# ---------------------------------------------------------------------------------------------
# Index and search
# ---------------------------------------------------------------------------------------------

class BM25Index:
    """In-memory BM25 index equal to Anserini's Lucene index of `texts` (field `contents`).

    ids: document ids (asins); texts: the raw `contents` strings, analyzed here. The postings of
    term t are entries offsets[t]:offsets[t+1] of `post_docs` (document numbers, int32) and
    `post_denominators` (float32 `1 + tf * normInverse(doc length)`, the per-document part of
    Lucene's BM25 score), sorted by document; `idf[t]` is its float32 idf.
    """

    def __init__(self, ids: list[str], texts: list[str], k1: float = K1, b: float = B):
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        if len(set(ids)) != len(ids):
            raise ValueError("document ids must be unique")
        self.ids = list(ids)
        self.k1, self.b = k1, b
        self.term_ids: dict[str, int] = {}
        doc_terms = [[self.term_ids.setdefault(t, len(self.term_ids)) for t in analyze(text)]
                     for text in texts]
        lengths = np.array([len(terms) for terms in doc_terms], dtype=np.int64)
        self.doc_count = int(np.count_nonzero(lengths))  # documents with the field
        self.avgdl = np.float32(lengths.sum() / self.doc_count if self.doc_count else 0.0)
        # One entry per (term, document) with its term frequency, sorted by term then document.
        n_docs = max(len(self.ids), 1)
        flat_terms = np.array([t for terms in doc_terms for t in terms], dtype=np.int64)
        keys, tfs = np.unique(flat_terms * n_docs + np.repeat(np.arange(len(self.ids)), lengths),
                              return_counts=True)
        terms, self.post_docs = keys // n_docs, (keys % n_docs).astype(np.int32)
        doc_freq = np.bincount(terms, minlength=len(self.term_ids))
        self.offsets = np.concatenate([[0], np.cumsum(doc_freq)])
        norm_bytes = np.array([int_to_byte4(int(n)) for n in lengths], dtype=np.intp)
        norm_inverse = norm_inverse_table(k1, b, self.avgdl if self.doc_count else np.float32(1))
        self.post_denominators = (np.float32(1) + tfs.astype(np.float32)
                                  * norm_inverse[norm_bytes][self.post_docs])
        idf_of = {df: bm25_idf(df, self.doc_count) for df in set(doc_freq.tolist())}
        self.idf = np.array([idf_of[df] for df in doc_freq.tolist()], dtype=np.float32)
        # Rank of each id in ascending order, the tie-break of equal scores.
        self._id_rank = np.argsort(np.argsort(np.array(self.ids, dtype=object), kind="stable"))

    @classmethod
    def from_products(cls, products, k1: float = K1, b: float = B) -> "BM25Index":
        """Index of loaded `Product`s (asin -> document_text)."""
        return cls([p.asin for p in products], [document_text(p) for p in products], k1, b)

    def __len__(self) -> int:
        return len(self.ids)

    def raw_scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(matching document numbers, their float32 Lucene scores) for `query`, by doc number."""
        total = np.zeros(len(self.ids), dtype=np.float64)
        hit = np.zeros(len(self.ids), dtype=bool)
        for term, count in sorted(Counter(analyze(query)).items()):
            t = self.term_ids.get(term)
            if t is None:
                continue
            docs = self.post_docs[self.offsets[t]:self.offsets[t + 1]]
            weight = np.float32(count) * self.idf[t]  # boost * idf
            denominators = self.post_denominators[self.offsets[t]:self.offsets[t + 1]]
            total[docs] += weight - weight / denominators  # float32 per clause, summed in double
            hit[docs] = True
        docs = np.flatnonzero(hit)
        return docs, total[docs].astype(np.float32)

    def search(self, query: str, k: int = 50) -> list[tuple[str, float]]:
        """Top-k (asin, score) as pyserini returns them: Lucene's order, tie-adjusted scores."""
        docs, scores = self.raw_scores(query)
        if k <= 0 or len(docs) == 0:
            return []
        order = np.lexsort((self._id_rank[docs], -scores))[:k]
        return list(zip([self.ids[d] for d in docs[order]], adjust_ties(scores[order])))


class PyseriniSearcher:
    """The original backend: pyserini's LuceneSearcher (BM25 k1=0.9, b=0.4) over a Lucene index.

    For a user with the full catalogue's index (upstream `search_engine/indexes`); needs pyserini
    and a Java 11+ JDK. `search` returns the same (asin, score) list as `BM25Index.search`.
    """

    def __init__(self, index_dir: str, k1: float = K1, b: float = B):
        try:
            from pyserini.search.lucene import LuceneSearcher
        except ImportError as e:
            raise ImportError(
                "PyseriniSearcher needs pyserini: `pip install pyserini==0.21.0` (the version "
                "WebShop used; it needs a Java 11+ JDK, e.g. `apt-get install openjdk-11-jdk`). "
                "Without it, use BM25Index, which gives the same results for the small set."
            ) from e
        self._searcher = LuceneSearcher(index_dir)
        self._searcher.set_bm25(k1, b)

    def search(self, query: str, k: int = 50) -> list[tuple[str, float]]:
        """Top-k (docid, score) of the Lucene index."""
        return [(hit.docid, float(hit.score)) for hit in self._searcher.search(query, k=k)]
