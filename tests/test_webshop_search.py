"""WebShop search: the pure-Python BM25 against the golden Lucene results, and the analyzer's
(hgpo_jax.envs.lucene) Lucene behaviours one by one (StandardTokenizer, possessives, stop words,
Porter stems)."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest
import regex

from hgpo_jax.envs import lucene
from hgpo_jax.envs.lucene import analyze, tokenize
from hgpo_jax.envs.webshop import search
from hgpo_jax.envs.webshop.data import read_lucene_top50, resolve_data_dir
from hgpo_jax.envs.webshop.products import read_products
from hgpo_jax.envs.webshop.search import (BM25Index, PyseriniSearcher, byte4_to_int, document_text,
                                          int_to_byte4)


@pytest.fixture(scope="module")
def products():
    return read_products(resolve_data_dir())


@pytest.fixture(scope="module")
def index(products):
    return BM25Index.from_products(products)


@pytest.fixture(scope="module")
def golden():
    return read_lucene_top50(resolve_data_dir())


def test_all_golden_queries_match_lucene_exactly(index, golden):
    assert len(golden) == 2405
    wrong_order, wrong_scores = [], []
    for record in golden:
        hits = index.search(record["query"], 50)
        if [asin for asin, _ in hits] != record["asins"]:
            wrong_order.append(record["query"])
        elif [score for _, score in hits] != record["scores"]:  # float32 values, bit for bit
            wrong_scores.append(record["query"])
    assert wrong_order == [] and wrong_scores == []


def test_search_shapes_and_limits(index, golden):
    query = golden[0]["query"]
    hits = index.search(query, 5)
    assert hits == index.search(query)[:5]
    assert all(isinstance(a, str) and isinstance(s, float) for a, s in hits)
    assert index.search(query, 0) == []
    assert index.search("the and of", 50) == []  # stop words only: no clause, no hit
    assert index.search("", 50) == [] and index.search("zzzqqqxxx", 50) == []


def test_repeated_query_term_counts_twice(index):
    once, twice = index.raw_scores("shampoo"), index.raw_scores("shampoo shampoo")
    assert np.array_equal(once[0], twice[0]) and np.all(twice[1] > once[1])


def test_ties_are_broken_by_asin_and_adjusted():
    index = BM25Index(["B2", "B1", "B3"], ["red shoe", "red shoe", "red red shoe"])
    hits = index.search("red", 10)
    assert [a for a, _ in hits] == ["B3", "B1", "B2"]
    docs, raw = index.raw_scores("red")
    assert raw[0] == raw[1] and hits[1][1] == float(search.round4(raw[0]))
    assert hits[2][1] == float(np.float32(hits[1][1]) - np.float32(1e-6))
    assert hits[0][1] == float(search.round4(raw[2]))


def test_document_text_follows_upstream(products):
    product = next(p for p in products if len(p.options) >= 2)
    text = document_text(product)
    assert text == text.lower() and text.startswith(product.title.lower() + " ")
    name, values = next(iter(product.options.items()))
    assert f"{name}: {', '.join(values)}, and " in text


def test_norm_encoding_is_lucene_smallfloat():
    # exact up to 39 (the bytes Lucene's explain calls exact), then 4 significant bits of n - 24
    assert [byte4_to_int(int_to_byte4(n)) for n in range(40)] == list(range(40))
    assert [byte4_to_int(int_to_byte4(n)) for n in (40, 41, 42, 100, 107, 1000)] == \
        [40, 40, 42, 96, 104, 984]
    assert int_to_byte4(2**31 - 1) == 255


@pytest.mark.parametrize("text, terms", [
    # EnglishPossessiveFilter, then LowerCaseFilter: 's, ’s and 'S go
    ("Men's Dog’s JIM'S", ["men", "dog", "jim"]),
    # StopFilter with Lucene's 33 English stop words
    ("the cat is in the hat and it was not there", ["cat", "hat"]),
    # UAX#29: numbers with . or , inside stay whole; letters joined by . ' : stay whole
    ("3.5 oz 1,000 pcs 36w j.crew don't", ["3.5", "oz", "1,000", "pc", "36w", "j.crew", "don't"]),
    # ... but - / & and spaces split, and lone punctuation goes
    ("t-shirt black/white R&B -- !!", ["t", "shirt", "black", "white", "r", "b"]),
    # '_' joins (ExtendNumLet); a '.' between a letter and a digit does not
    ("a_b v.2 2.x", ["a_b", "v", "2", "2", "x"]),
    # Lucene's classic Porter stemmer (with the bli->ble and logi->log departures)
    ("running batteries happiness relational possibly geology archaeology",
     ["run", "batteri", "happi", "relat", "possibl", "geologi", "archaeolog"]),
    # words of one or two letters are not stemmed
    ("as is us", ["us"]),
])
def test_analyzer(text, terms):
    assert analyze(text) == terms


def test_tokenizer_unicode_cases():
    assert tokenize("café naïve") == ["café", "naïve"]
    assert tokenize("don’t stop") == ["don’t", "stop"]  # U+2019 is MidNumLet
    assert tokenize("moͤchte") == ["moͤchte"]  # a combining mark stays in its word
    assert tokenize("中文abc") == ["中", "文", "abc"]  # one token per ideograph
    assert tokenize("love ❤️ it★🌸🌸") == ["love", "❤️", "it", "★", "🌸", "🌸"]
    assert tokenize("👩\u200d❤️\u200d👩 👍🏽") == ["👩\u200d❤️\u200d👩", "👍🏽"]  # ZWJ, modifier
    assert tokenize("1\ufe0f\u20e3 # 12") == ["1\ufe0f\u20e3", "12"]  # keycap; lone '#' dropped
    assert tokenize("a" * 300) == ["a" * 255, "a" * 45]  # cut at the 255-char buffer
    assert analyze("İSTANBUL ΟΔΟΣ") == ["istanbul", "οδοσ"]  # Java per-character lower case


def _literal_jflex_tokens():
    """Lucene's JFlex rules transcribed literally (ambiguous, so POSIX longest match; slow)."""
    e, k, h, n, letter = (lucene._CONNECTOR, lucene._KATAKANA, lucene._HEBREW, lucene._DIGIT,
                          lucene._LETTER)
    sq, dq, mid_num, mid_letter = (lucene._SINGLE_QUOTE, lucene._DOUBLE_QUOTE, lucene._MID_NUM,
                                   lucene._MID_LETTER)
    unit = (f"(?:{k}(?:{e}*{k})*|(?:{h}(?:{sq}|{dq}{h})|{n}(?:(?:{e}*|{mid_num}){n})*"
            f"|{letter}(?:(?:{e}*|{mid_letter}){letter})*)+)")
    word = f"{e}*{unit}(?:{e}+{unit})*{e}*"
    rules = [lucene._EMOJI, word, lucene._SOUTHEAST_ASIAN, lucene._HAN, lucene._HIRAGANA]
    return regex.compile("|".join(rules), regex.V1 | regex.POSIX)


def test_tokenizer_equals_the_literal_jflex_grammar_on_random_text():
    literal = _literal_jflex_tokens()
    rng = np.random.default_rng(0)
    mixed = list("ab1_.:,;'\" -/#*") + ["\u2019", "\u05d0", "\u30a2", "\u4e00", "\u3042",
                                        "\u0e01", "\u0301", "\u00ad", "\u200d", "\ufe0f",
                                        "\u20e3", "\u2764", "\U0001F449", "\U0001F3FB",
                                        "\U0001F1FA", "\u00e9", "\u202f", "\uff10", "\t"]
    hebrew = list("\u05d0\u05d1'\"_.1a\u0301")
    for i in range(4000):
        alphabet = hebrew if i % 2 else mixed
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 12))))
        assert tokenize(text) == literal.findall(text), repr(text)


def test_tokenizer_stays_fast_on_long_odd_tokens():
    start = time.perf_counter()
    for text in ["a" * 2000, "é" * 2000, "a_" * 1000, "\u05d0'" * 1000, "ab" * 1000 + "❤",
                 "❤\u200d" * 1000, "1\u20e3a" * 500, ("a" * 50 + "\u0301") * 40]:
        assert all(len(t) <= 255 for t in tokenize(text))
    assert time.perf_counter() - start < 2.0


@pytest.mark.skipif(importlib.util.find_spec("pyserini") is not None, reason="pyserini installed")
def test_pyserini_searcher_says_what_to_install(tmp_path):
    with pytest.raises(ImportError, match=r"pip install pyserini"):
        PyseriniSearcher(str(tmp_path))
