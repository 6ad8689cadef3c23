"""Similarity-based step groups (GiGPO's `enable_similarity`): greedy clusters of anchor texts.

Two anchors are *similar* at threshold t when `difflib.SequenceMatcher(None, a, rep).ratio() >= t`,
with `a` the anchor being placed and `rep` a cluster's representative, in that order: the ratio is
not symmetric (difflib's autojunk heuristic looks at the second string only), so the order is part
of the semantics. Within one task the anchors are visited in order; each joins the first existing
cluster whose representative (the cluster's first anchor) it is similar to, or starts a new one.

`Similarity` decides `ratio() >= t` exactly, usually without computing the ratio:

* equal strings are similar (ratio(s, s) = 1.0 for every s, isjunk None: the longest match that
  difflib finds lies on the diagonal and its extension covers the whole string; tested);
* a pair is decided once (cache keyed by the ordered pair of anchor codes), and the matcher of a
  representative (difflib's index of the second string) is built once;
* `real_quick_ratio()` and `quick_ratio()` (the same integers: the shorter length, the common
  character multiset) are upper bounds of `ratio()`; below t the pair is dissimilar;
* otherwise difflib's own `find_longest_match` is driven over the same ranges as
  `get_matching_blocks`, which ratio() sums, stopping as soon as the matches found reach t
  (similar) or the matches found plus the most the open ranges could still add stay below t
  (dissimilar). The blocks found do not depend on the order the ranges are visited in.

Every bound is an integer count of matches turned into a ratio by difflib's own formula
(2.0 * matches / (len(a) + len(rep))), so each decision equals `ratio() >= t`. Decisions are
also kept in a bounded process-wide memo keyed by (a, rep, t) (`MEMO_SIZE` pairs, oldest dropped
first), so a batch clustered twice (the advantages, then the trainer's level statistics) pays
once. Host Python only.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from difflib import SequenceMatcher


MEMO_SIZE = 1 << 14  # pair decisions kept across calls (they hold their two strings)
_memo: dict[tuple[str, str, float], bool] = {}


def remember(key: tuple[str, str, float], value: bool) -> bool:
    """Store a decision in the process-wide memo (dropping the oldest beyond MEMO_SIZE)."""
    if len(_memo) >= MEMO_SIZE:
        del _memo[next(iter(_memo))]
    _memo[key] = value
    return value


def forget() -> None:
    """Empty the process-wide memo (benchmarks, tests)."""
    _memo.clear()


def difflib_ratio(matches: int, length: int) -> float:
    """difflib's ratio of `matches` matched elements over two sequences of total `length`."""
    return 2.0 * matches / length if length else 1.0


def char_overlap(a: Counter, b: Counter) -> int:
    """The size of the common character multiset of two strings (from their Counters): the matches
    of `quick_ratio()`."""
    if len(a) > len(b):
        a, b = b, a
    return sum(min(n, b[c]) for c, n in a.items() if c in b)


def blocks_reach(matcher: SequenceMatcher, t: float) -> bool:
    """Whether `matcher.ratio() >= t`, computed from difflib's matching blocks with early exits.

    Args:
      matcher: a SequenceMatcher with both strings set (a = the anchor placed, b = the
        representative); its `find_longest_match` gives the same blocks as `ratio()` uses.
      t: the threshold.
    Returns:
      bool, equal to `matcher.ratio() >= t`.
    """
    la, lb = len(matcher.a), len(matcher.b)
    total = la + lb
    found = 0
    open_bound = min(la, lb)  # the most matches the ranges still queued can hold
    queue = [(-min(la, lb), 0, la, 0, lb)]  # widest range first: decides soonest
    while queue:
        if difflib_ratio(found, total) >= t:
            return True
        if difflib_ratio(found + open_bound, total) < t:
            return False
        width, alo, ahi, blo, bhi = heapq.heappop(queue)
        open_bound += width
        i, j, k = matcher.find_longest_match(alo, ahi, blo, bhi)
        if not k:
            continue
        found += k
        for lo_a, hi_a, lo_b, hi_b in ((alo, i, blo, j), (i + k, ahi, j + k, bhi)):
            if lo_a < hi_a and lo_b < hi_b:
                w = min(hi_a - lo_a, hi_b - lo_b)
                open_bound += w
                heapq.heappush(queue, (-w, lo_a, hi_a, lo_b, hi_b))
    return difflib_ratio(found, total) >= t


class Similarity:
    """`similar(a, rep)`: whether anchor code `a` is similar to representative code `rep` at
    threshold t, i.e. `SequenceMatcher(None, texts[a], texts[rep]).ratio() >= t`, decided exactly
    with the shortcuts of the module docstring. `stats` counts how pairs were decided."""

    def __init__(self, texts: Sequence[str], t: float):
        self.texts, self.t = texts, t
        self.pairs: dict[tuple[int, int], bool] = {}
        self.matchers: dict[int, SequenceMatcher] = {}
        self.counts: dict[int, Counter] = {}
        self.stats = Counter()

    def __call__(self, a: int, rep: int) -> bool:
        if a == rep:
            return True
        key = (a, rep)
        hit = self.pairs.get(key)
        if hit is None:
            hit = self.pairs[key] = self.decide(a, rep)
        return hit

    def decide(self, a: int, rep: int) -> bool:
        """The decision for two different anchor codes (the process-wide memo, or computed)."""
        key = (self.texts[a], self.texts[rep], self.t)
        hit = _memo.get(key)
        if hit is not None:
            self.stats["memo"] += 1
            return hit
        return remember(key, self.compute(a, rep))

    def compute(self, a: int, rep: int) -> bool:
        x, y = self.texts[a], self.texts[rep]
        total = len(x) + len(y)
        if difflib_ratio(min(len(x), len(y)), total) < self.t:
            self.stats["lengths"] += 1
            return False
        if difflib_ratio(char_overlap(self.counter(a), self.counter(rep)), total) < self.t:
            self.stats["characters"] += 1
            return False
        self.stats["blocks"] += 1
        matcher = self.matchers.get(rep)
        if matcher is None:
            matcher = self.matchers[rep] = SequenceMatcher(None, "", y)
        matcher.set_seq1(x)
        return blocks_reach(matcher, self.t)

    def counter(self, code: int) -> Counter:
        c = self.counts.get(code)
        if c is None:
            c = self.counts[code] = Counter(self.texts[code])
        return c


def greedy_clusters(codes: Sequence[int], similar) -> tuple[list[int], list[int]]:
    """GiGPO's greedy clusters of one task's anchors, visited in order.

    Args:
      codes: [n] anchor codes, in visiting order.
      similar: similar(code, rep_code) -> bool (a `Similarity`).
    Returns:
      (cluster index [n] of each item, 0..C-1 in order of creation; representatives [C], the
      anchor code that started each cluster).

    An anchor seen before joins the cluster it joined then (the clusters before that one were
    dissimilar and representatives never change); only the clusters created since need checking
    when it was not similar to its own earlier cluster, which the equal-strings rule excludes.
    """
    reps: list[int] = []
    resume: dict[int, int] = {}  # code -> the first cluster not known to be dissimilar
    out = []
    for c in codes:
        j = resume.get(c, 0)
        while j < len(reps) and not similar(c, reps[j]):
            j += 1
        if j == len(reps):
            reps.append(c)
        resume[c] = j
        out.append(j)
    return out, reps
