"""WebShop's product search: BM25 that reproduces pyserini 0.21 / Anserini / Lucene 9.4.2 exactly.

The original env indexes one Lucene document per product (field `contents`, see `document_text`)
and searches it with `LuceneSearcher.search(query, k=50)`. `BM25Index` redoes that in Python and
gives the same hits, in the same order, with the same float32 scores, bit for bit, on all 2,405
golden queries of the small set (`lucene_top50.jsonl`). What is reproduced:

Analyzer (Anserini `DefaultEnglishAnalyzer`, Porter; the same chain for documents and queries):
1. Lucene `StandardTokenizer` (JFlex grammar `StandardTokenizerImpl.jflex`: UAX#29 word breaks
   on Unicode 9 plus UTS#51 emoji sequences). A token is the longest match, at the current
   position, of: a word (letters, digits, `_`; `.`, `'`, `:`, `’`... between two letters and
   `.`, `,`, `;`, `'`... between two digits, so `3.5`, `1,000`, `j.crew`, `don't`, `36w`, `a_b`
   stay whole while `-`, `/` and `&` split), an emoji sequence (`❤️`, `👍🏽`, ZWJ sequences, flags,
   keycaps), a run of South-East-Asian letters, or one Han or Hiragana character. Anything else
   is skipped a character at a time. A token longer than 255 UTF-16 units is cut to the longest
   match within 255 (Lucene's scanner buffer).
2. `EnglishPossessiveFilter`: a trailing `'s`, `’s` or `＇s` (`s` or `S`) is removed.
3. `LowerCaseFilter`: Java's per-code-point `Character.toLowerCase` (no Greek final sigma, `İ` ->
   `i`), unlike Python's `str.lower`.
4. `StopFilter` with Lucene's 33 English stop words (`STOP_WORDS`).
5. `PorterStemFilter`: Lucene's classic Porter stemmer, which is Martin Porter's own version (with
   its `bli -> ble` and `logi -> log` departures from the paper), not Snowball's. nltk's
   `PorterStemmer(mode=MARTIN_EXTENSIONS)` implements that version: it gives Lucene's stem for
   all 15,339 distinct terms of the small set's documents and golden queries (snowballstemmer's,
   PyStemmer's and nltk's other modes differ on 33 to 192 of them). Lucene stems UTF-16 units, so
   characters outside the BMP reach nltk as surrogate pairs.

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

Why parts are hand-written: no Python package reproduces Lucene's `StandardTokenizer` (ICU
segmenters follow newer UAX#29 rules and neither drop punctuation-only segments nor build emoji
tokens the same way), so its grammar is re-expressed as a pattern of the `regex` module, whose
Unicode properties (Word_Break, Script, Line_Break) supply the character classes and whose POSIX
mode gives JFlex's longest match; a test checks it against a literal transcription of the JFlex
rules. The emoji classes are Unicode 14 code point tables, as Lucene's ICU 70 data, because the
`regex` module's Extended_Pictographic lacks many of them (U+2605 BLACK STAR...). Lucene's float32
BM25 arithmetic, lossy norms and tie adjustment exist nowhere outside Lucene either.

Known gaps (none occurs in the small set's documents or golden queries): the `regex` module's
Unicode is newer than Lucene's Unicode 9 tables, so characters assigned or given another
Word_Break value after Unicode 9 can tokenize differently; Java 11 lower-cases with Unicode 10;
the 255-unit cut is modelled on JFlex's buffer, not checked against Lucene (no token there is
longer than 170 characters); URLs and e-mail addresses are split as StandardTokenizer does.

`PyseriniSearcher` is the optional original backend, for a user with pyserini and a Lucene index
(for example of the full 1.18M-product catalogue).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

import numpy as np
import regex

K1 = 0.9
B = 0.4
MAX_TOKEN_LENGTH = 255  # StandardAnalyzer.DEFAULT_MAX_TOKEN_LENGTH, in UTF-16 code units
STOP_WORDS = frozenset((
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with").split())
_APOSTROPHES = "'\u2019\uff07"

# ---------------------------------------------------------------------------------------------
# StandardTokenizer: the JFlex grammar as a regex pattern (`regex` module, V1 set syntax)
# ---------------------------------------------------------------------------------------------

# UAX#29 WB4: Extend, Format and ZWJ attach to the character before them. In Unicode 9 the emoji
# skin-tone modifiers had their own Word_Break value (E_Modifier), not Extend.
_EFZ = r"[[\p{WB=Format}\p{WB=Extend}\p{WB=ZWJ}]--[\U0001F3FB-\U0001F3FF]]"
_EFZ_NO_SELECTOR = (r"[[\p{WB=Format}\p{WB=Extend}\p{WB=ZWJ}]"
                    r"--[\U0001F3FB-\U0001F3FF\uFE0E\uFE0F]]")


def _ext(char_class: str) -> str:
    """`char_class` followed by any Extend/Format/ZWJ characters (WB4)."""
    return f"(?:{char_class}{_EFZ}*)"


_LETTER_CLASS = r"[\p{WB=ALetter}\p{WB=Hebrew_Letter}]"
_DIGIT_CLASS = r"[\p{WB=Numeric}[\p{Block=Halfwidth_And_Fullwidth_Forms}&&\p{Nd}]]"
_LETTER = _ext(_LETTER_CLASS)
_DIGIT = _ext(_DIGIT_CLASS)
_HEBREW = _ext(r"\p{WB=Hebrew_Letter}")
_KATAKANA = _ext(r"\p{WB=Katakana}")
_MID_LETTER = _ext(r"[\p{WB=MidLetter}\p{WB=MidNumLet}\p{WB=Single_Quote}]")
_MID_NUM = _ext(r"[\p{WB=MidNum}\p{WB=MidNumLet}\p{WB=Single_Quote}]")
_CONNECTOR = _ext(r"\p{WB=ExtendNumLet}")
_SINGLE_QUOTE = _ext(r"\p{WB=Single_Quote}")
_DOUBLE_QUOTE = _ext(r"\p{WB=Double_Quote}")

# WB5-WB13b. Lucene's word rule is, with E = connector (ExtendNumLet, e.g. '_'):
#   E* U (E+ U)* E*,
#   U = K (E* K)* | (H (SQ | DQ H) | N ((E* | MidNum) N)* | L ((E* | MidLetter) L)*)+
# (K katakana, H Hebrew letter, N digit, L letter, SQ/DQ single/double quote): letters and digits
# join directly or through connectors, and through one mid character between two letters or two
# digits; katakana joins katakana; the rest joins only through connectors. The same language is
# written here without the rule's run ambiguities, which make a longest-match search exponential
# ("aaa" could be one run or three): connectors only between units, and a letter run never
# directly after a letter (but for the closing H of H DQ H), nor a digit run after a digit.
_NUMBER_RUN = f"{_DIGIT}(?:{_DIGIT}|{_MID_NUM}{_DIGIT})*"
_LETTER_RUN = f"{_LETTER}(?:{_LETTER}|{_MID_LETTER}{_LETTER})*"
_HEBREW_QUOTE = f"{_HEBREW}(?:{_SINGLE_QUOTE}|{_DOUBLE_QUOTE}{_HEBREW})"
_NOT_AFTER_DIGIT = f"(?<!{_DIGIT_CLASS}{_EFZ}*)"
_NOT_AFTER_LETTER = f"(?<!(?<!\\p{{WB=Double_Quote}}{_EFZ}*){_LETTER_CLASS}{_EFZ}*)"
_ALNUM_UNIT = (f"(?:{_HEBREW_QUOTE}|{_NUMBER_RUN}|{_LETTER_RUN})"
               f"(?:{_HEBREW_QUOTE}|{_NOT_AFTER_DIGIT}{_NUMBER_RUN}"
               f"|{_NOT_AFTER_LETTER}{_LETTER_RUN})*")
_UNIT = f"(?:{_KATAKANA}+|{_ALNUM_UNIT})"
_WORD = f"{_CONNECTOR}*{_UNIT}(?:{_CONNECTOR}+{_UNIT})*{_CONNECTOR}*"

# UTS#51 emoji sequences (Lucene's EMOJI rule): presentation/modifier sequences joined by ZWJ or
# followed by a tag sequence, keycaps, and flag pairs. Lucene's emoji properties come from ICU 70
# (Unicode 14 emoji-data.txt); the `regex` module's Extended_Pictographic is much smaller (it
# lacks U+2605 BLACK STAR, U+261E WHITE RIGHT POINTING INDEX...), so Unicode 14's code point
# ranges are written out here (hex, "a-b" = a range). Lucene's emoji character is
# Extended_Pictographic or Emoji other than digits, '#', '*', regional indicators, modifiers and
# (c) (r) TM wavy-dash part-alternation; with Unicode 14 data that is Extended_Pictographic.
_EXTENDED_PICTOGRAPHIC_14 = """
    A9 AE 203C 2049 2122 2139 2194-2199 21A9-21AA 231A-231B 2328 2388 23CF 23E9-23F3 23F8-23FA
    24C2 25AA-25AB 25B6 25C0 25FB-25FE 2600-2605 2607-2612 2614-2685 2690-2705 2708-2712 2714 2716
    271D 2721 2728 2733-2734 2744 2747 274C 274E 2753-2755 2757 2763-2767 2795-2797 27A1 27B0
    27BF 2934-2935 2B05-2B07 2B1B-2B1C 2B50 2B55 3030 303D 3297 3299 1F000-1F0FF 1F10D-1F10F
    1F12F 1F16C-1F171 1F17E-1F17F 1F18E 1F191-1F19A 1F1AD-1F1E5 1F201-1F20F 1F21A 1F22F
    1F232-1F23A 1F23C-1F23F 1F249-1F3FA 1F400-1F53D 1F546-1F64F 1F680-1F6FF 1F774-1F77F
    1F7D5-1F7FF 1F80C-1F80F 1F848-1F84F 1F85A-1F85F 1F888-1F88F 1F8AE-1F8FF 1F90C-1F93A
    1F93C-1F945 1F947-1FAFF 1FC00-1FFFD"""
_EMOJI_MODIFIER_BASE_14 = """
    261D 26F9 270A-270D 1F385 1F3C2-1F3C4 1F3C7 1F3CA-1F3CC 1F442-1F443 1F446-1F450 1F466-1F478
    1F47C 1F481-1F483 1F485-1F487 1F48F 1F491 1F4AA 1F574-1F575 1F57A 1F590 1F595-1F596
    1F645-1F647 1F64B-1F64F 1F6A3 1F6B4-1F6B6 1F6C0 1F6CC 1F90C 1F90F 1F918-1F91F 1F926
    1F930-1F939 1F93C-1F93E 1F977 1F9B5-1F9B6 1F9B8-1F9B9 1F9BB 1F9CD-1F9CF 1F9D1-1F9DD
    1FAC3-1FAC5 1FAF0-1FAF6"""


def _code_point_class(ranges: str) -> str:
    """'A9 2194-2199' -> a regex character class of those code points."""
    items = (r.split("-") for r in ranges.split())
    return "[" + "".join("-".join(f"\\U{int(c, 16):08X}" for c in r) for r in items) + "]"


_EMOJI_CHAR = _code_point_class(_EXTENDED_PICTOGRAPHIC_14)
_EMOJI_MODIFIER_BASE = _code_point_class(_EMOJI_MODIFIER_BASE_14)
_EMOJI_MODIFIER = r"[\U0001F3FB-\U0001F3FF]"
_ZWJ = r"\u200D"
_REGIONAL_INDICATOR = _ext(r"\p{WB=Regional_Indicator}")
_EMOJI_ELEMENT = (f"(?:{_ZWJ}*{_EMOJI_CHAR}{_EFZ_NO_SELECTOR}*\\uFE0F?"
                  f"|(?:{_ZWJ}*{_EMOJI_MODIFIER_BASE}{_EFZ_NO_SELECTOR}*)?"
                  f"{_EMOJI_MODIFIER}{_EFZ_NO_SELECTOR}*)")
_EMOJI = (f"{_EMOJI_ELEMENT}(?:(?:{_ZWJ}{_EMOJI_ELEMENT})*|[\\U000E0020-\\U000E007E]+\\U000E007F)"
          f"|[0-9#*]{_EFZ_NO_SELECTOR}*\\uFE0F?\\u20E3{_EFZ_NO_SELECTOR}*"
          f"|{_REGIONAL_INDICATOR}{{2}}")

_SOUTHEAST_ASIAN = _ext(r"\p{Line_Break=Complex_Context}") + "+"
_HAN = _ext(r"\p{Script=Han}")
_HIRAGANA = _ext(r"\p{Script=Hiragana}")
# Lucene's NUMERIC, HANGUL and KATAKANA rules match subsets of _WORD; only the length matters.
_TOKEN = f"{_EMOJI}|{_WORD}|{_SOUTHEAST_ASIAN}|{_HAN}|{_HIRAGANA}"

# JFlex takes the longest match at each position: the `regex` module's POSIX mode, used on at
# most Lucene's 255-unit buffer from a token's start (the backtracking pattern finds the starts:
# any match there is fine, its length is not used). The rewritten word rule keeps the POSIX
# search fast; the literal one takes ~0.5 s for a 255-letter word.
_TOKEN_START = regex.compile(_TOKEN, regex.V1)
_TOKEN_LONGEST = regex.compile(_TOKEN, regex.V1 | regex.POSIX)
# Pure-ASCII text, where the rules reduce to: [A-Za-z0-9_] join; ':' '.' "'" join two letters;
# ',' ';' '.' "'" join two digits; a token holds at least one letter or digit.
_ASCII_TOKEN = regex.compile(
    r"_*[A-Za-z0-9](?:[A-Za-z0-9_]|(?<=[A-Za-z])[:.'](?=[A-Za-z])|(?<=[0-9])[,;.'](?=[0-9]))*")
_NON_ASCII_RUN = regex.compile(r"[^\x00-\x7f]+")
_SPACE = regex.compile(r"[ \t\n\r\f\v]")
_SPACE_BACKWARD = regex.compile(r"[ \t\n\r\f\v]", regex.REVERSE)


def _buffer_end(text: str, start: int) -> int:
    """End of the longest text[start:end] that fits in MAX_TOKEN_LENGTH UTF-16 code units."""
    end = min(len(text), start + MAX_TOKEN_LENGTH)
    if max(text[start:end], default="\0") <= "\uffff":
        return end
    units, end = 0, start
    while end < len(text) and units + 1 + (text[end] > "\uffff") <= MAX_TOKEN_LENGTH:
        units += 1 + (text[end] > "\uffff")
        end += 1
    return end


def _tokenize_any(text: str) -> list[str]:
    """StandardTokenizer terms of any text (the general, slower path)."""
    tokens, pos = [], 0
    while (found := _TOKEN_START.search(text, pos)) is not None:
        start = found.start()
        pos = _TOKEN_LONGEST.match(text, start, _buffer_end(text, start)).end()
        tokens.append(text[start:pos])
    return tokens


def _tokenize_ascii(text: str, start: int, end: int) -> list[str]:
    """StandardTokenizer terms of the pure-ASCII text[start:end], bounded by whitespace."""
    tokens = _ASCII_TOKEN.findall(text, start, end)
    if any(len(t) > MAX_TOKEN_LENGTH for t in tokens):
        return _tokenize_any(text[start:end])
    return tokens


def _non_ascii_chunks(text: str) -> list[tuple[int, int]]:
    """(start, end) of the whitespace-delimited chunks of `text` that hold non-ASCII characters."""
    chunks, pos = [], 0
    for run in _NON_ASCII_RUN.finditer(text):
        if run.start() < pos:
            continue
        before = _SPACE_BACKWARD.search(text, pos, run.start())
        after = _SPACE.search(text, run.end())
        pos = after.start() if after else len(text)
        chunks.append((before.end() if before else 0, pos))
    return chunks


def tokenize(text: str) -> list[str]:
    """Lucene StandardTokenizer terms of `text` (case kept), in order.

    No token spans an ASCII space, tab or line break, so the pure-ASCII stretches between them
    take the fast ASCII pattern and only the chunks holding other characters the general one.
    """
    if text.isascii():
        return _tokenize_ascii(text, 0, len(text))
    tokens, pos = [], 0
    for start, end in _non_ascii_chunks(text):
        tokens += _tokenize_ascii(text, pos, start)
        tokens += _tokenize_any(text[start:end])
        pos = end
    return tokens + _tokenize_ascii(text, pos, len(text))


# ---------------------------------------------------------------------------------------------
# Token filters
# ---------------------------------------------------------------------------------------------

def strip_possessive(token: str) -> str:
    """EnglishPossessiveFilter: "dog's" -> "dog" (also ’s, ＇s and 'S)."""
    if len(token) >= 2 and token[-1] in "sS" and token[-2] in _APOSTROPHES:
        return token[:-2]
    return token


def java_lower(token: str) -> str:
    """LowerCaseFilter: Java `Character.toLowerCase` per code point (simple case mapping)."""
    if token.isascii():
        return token.lower()
    return "".join(c.lower()[:1] or c for c in token)  # 'İ'.lower() is 'i' + U+0307 in Python


@lru_cache(maxsize=1)
def _porter():
    """nltk's Porter stemmer in Martin Porter's own variant (= Lucene's PorterStemmer)."""
    from nltk.stem.porter import PorterStemmer
    return PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)


def _to_utf16_units(word: str) -> str:
    """Characters outside the BMP as surrogate pairs, so the stemmer sees Java's chars."""
    out = []
    for c in word:
        cp = ord(c)
        if cp > 0xFFFF:
            cp -= 0x10000
            out += [chr(0xD800 + (cp >> 10)), chr(0xDC00 + (cp & 0x3FF))]
        else:
            out.append(c)
    return "".join(out)


@lru_cache(maxsize=1 << 17)
def porter_stem(token: str) -> str:
    """Lucene PorterStemFilter on one lower-cased token: 'running' -> 'run', 'geology' -> 'geologi'.
    """
    if token.isascii() or max(token) <= "\uffff":
        return _porter().stem(token, to_lowercase=False)
    stem = _porter().stem(_to_utf16_units(token), to_lowercase=False)
    return stem.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def analyze(text: str) -> list[str]:
    """Anserini DefaultEnglishAnalyzer terms of `text`, in order (index and query side alike)."""
    terms = []
    for token in tokenize(text):
        term = java_lower(strip_possessive(token))
        if term not in STOP_WORDS:
            terms.append(porter_stem(term))
    return terms


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
