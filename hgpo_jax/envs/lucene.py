"""Anserini's `DefaultEnglishAnalyzer` (Lucene 9.4.2, pyserini 0.21's default), exactly, in Python.

`analyze(text)` gives the terms Anserini indexes for a document and searches for a query (the same
chain for both). It is shared by the envs that reproduce pyserini's BM25: WebShop's product search
(`hgpo_jax.envs.webshop.search`, bit-exact with Lucene) and the search-QA env's passage index
(`hgpo_jax.envs.search.retrieval`). The chain (Porter stemming, Anserini's default):

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
   all 15,339 distinct terms of WebShop's small set's documents and golden queries
   (snowballstemmer's, PyStemmer's and nltk's other modes differ on 33 to 192 of them). Lucene
   stems UTF-16 units, so characters outside the BMP reach nltk as surrogate pairs. nltk is
   imported when the first term is stemmed.

Why it is hand-written: no Python package reproduces Lucene's `StandardTokenizer` (ICU
segmenters follow newer UAX#29 rules and neither drop punctuation-only segments nor build emoji
tokens the same way), so its grammar is re-expressed as a pattern of the `regex` module, whose
Unicode properties (Word_Break, Script, Line_Break) supply the character classes and whose POSIX
mode gives JFlex's longest match; a test checks it against a literal transcription of the JFlex
rules. The emoji classes are Unicode 14 code point tables, as Lucene's ICU 70 data, because the
`regex` module's Extended_Pictographic lacks many of them (U+2605 BLACK STAR...).

Known gaps (none occurs in WebShop's small set's documents or golden queries): the `regex`
module's Unicode is newer than Lucene's Unicode 9 tables, so characters assigned or given another
Word_Break value after Unicode 9 can tokenize differently; Java 11 lower-cases with Unicode 10;
the 255-unit cut is modelled on JFlex's buffer, not checked against Lucene (no token there is
longer than 170 characters); URLs and e-mail addresses are split as StandardTokenizer does.
"""

from __future__ import annotations

from functools import lru_cache

import regex

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
