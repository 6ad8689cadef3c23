"""Scripted WebShop shoppers whose episodes warm-start a policy (sft.data, docs/sft.md).

Three kinds:
- "expert" (`title_actions`): searches the hidden target's own title, opens it, picks the goal's
  options, looks at the description, goes back and buys. It scores 1 but nothing it types can be
  read off the page: a policy that imitates it has to guess a title it never saw.
- "search" (`InstructionShopper`): acts only on what the page shows. It searches with the
  instruction's words (all of it but "Find me" and the price clause), opens the result on
  page 1 whose title shares most words with what is wanted (the words before the options) among
  those priced within the instruction's limit (the first such on a tie), clicks every option
  value the instruction names that the item page offers, and buys. Each step is a function of
  the observation, so a model can learn it; its score is partial where the best match is not the
  target (mean task score 0.50 and success 0.21 on the test goals, 0.51 and 0.20 on every 13th
  train goal; clicking the target whenever page 1 shows it would score 0.75).
- "first" (`InstructionShopper(pick="first")`): the same, but it opens the first result priced
  within the limit (the search engine's best match for the instruction). Better and simpler:
  mean task score 0.75 and success 0.52 on the test goals, and the id it clicks is always the
  first affordable one listed, which a small model copies more easily than one it must choose.

Expert-guided rollouts (Agent-G²) replay `purchase_actions`, the "expert" kind without its detour
(search, item, options, buy now), and match external expert files by `webshop_target_key`.
"""

from __future__ import annotations

import re

from hgpo_jax.envs.webshop.pages import SEP

_PRICE = re.compile(r"price lower than ([0-9]+(?:\.[0-9]+)?) dollars")
_PRICE_TEXT = re.compile(r"\$([0-9]+(?:\.[0-9]+)?)")
_WORD = re.compile(r"[a-z0-9]+")


def purchase_actions(goal: dict, product) -> list[str]:
    """The direct purchase, in the shape of Agent-G²'s WebShop experts (3 + #options steps):
    search the product's title, open it, click each of the goal's option values, buy."""
    return ([f"search[{product.title.lower()}]", f"click[{product.asin.lower()}]"]
            + [f"click[{v}]" for v in goal["goal_options"].values()] + ["click[buy now]"])


def title_actions(goal: dict, product) -> list[str]:
    """The title shopper's whole episode (the "expert" SFT kind, the golden episodes' pattern):
    the direct purchase with a detour before buying, to the description and back."""
    *choose, buy = purchase_actions(goal, product)
    return choose + ["click[description]", "click[< prev]", buy]


def _normalized(value) -> str:
    """Lower-cased, whitespace collapsed to single spaces."""
    return " ".join(str(value).lower().split())


def webshop_target_key(goal: dict) -> str:
    """The goal's target key, how Agent-G²'s WebShop expert file names a trajectory:
    `ASIN::value#count|value#count`, the product's ASIN upper-case and the multiset of the goal's
    option values (normalized: lower-cased, whitespace collapsed), sorted by (value, count).
    Goals of the same product with the same option values share a key (and an expert)."""
    from collections import Counter

    counts = Counter(_normalized(v) for v in (goal.get("goal_options") or {}).values())
    options = "|".join(f"{value}#{count}" for value, count in sorted(counts.items()))
    return f"{str(goal['asin']).upper()}::{options}"


def _split_instruction(instruction: str) -> tuple[str, str]:
    """(what is wanted, the option clause) of a "Find me ... with a: x, and b: y, and price lower
    than P dollars" instruction, lower-cased; the clause is "" without options."""
    text = instruction.strip().lower()
    if text.startswith("find me "):
        text = text[len("find me "):]
    text = re.sub(r",? and price lower than [0-9.]+ dollars$", "", text)
    m = re.search(r" with [a-z][a-z ]*?: ", text)  # the options start at the first "with name:"
    return (text[:m.start()], text[m.start() + len(" with "):]) if m else (text, "")


def instruction_query(instruction: str) -> str:
    """The search words: the instruction without "Find me" and its price clause (what it asks
    for and the options it names: on the train goals these find better matches than the words
    before the options alone, mean score 0.51 against 0.46)."""
    wanted, options = _split_instruction(instruction)
    return f"{wanted} with {options}".strip() if options else wanted.strip()


def wanted_words(instruction: str) -> str:
    """What the instruction asks for, without its options and price (the words a result's title
    is matched on: matching on the options too picks worse, mean score 0.45 against 0.51)."""
    return _split_instruction(instruction)[0].strip()


def named_options(instruction: str) -> dict[str, str]:
    """{option name: value} the instruction names ("with color: black, and size: 3x" ->
    {'color': 'black', 'size': '3x'})."""
    clause = _split_instruction(instruction)[1]
    out = {}
    for part in re.split(r", and (?=[a-z][a-z ]*?: )", clause) if clause else ():
        name, _, value = part.partition(": ")
        out[name.strip()] = value.strip()
    return out


def price_limit(instruction: str) -> float | None:
    m = _PRICE.search(instruction.lower())
    return float(m.group(1)) if m else None


def results_on_page(observation: str, clickables: list[str]) -> list[tuple[str, str, float]]:
    """[(asin, title, lowest price)] of a results page, in rank order: each clickable product id
    is followed in the observation by its title and its price ("$12.5" or "$3.78 to $11.38")."""
    parts = observation.split(SEP)
    ids = set(clickables)
    out = []
    for i, part in enumerate(parts[:-2]):
        if part.lower() in ids and part.lower() not in ("back to search", "next >", "< prev"):
            prices = [float(p) for p in _PRICE_TEXT.findall(parts[i + 2])]
            out.append((part.lower(), parts[i + 1], min(prices) if prices else float("inf")))
    return out


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def affordable(results: list[tuple[str, str, float]], limit: float | None) -> list:
    """The results priced within `limit`, in rank order (all of them when none is)."""
    return [r for r in results if limit is None or r[2] <= limit] or results


def best_result(results: list[tuple[str, str, float]], query: str, limit: float | None) -> str:
    """The asin whose title shares most words with `query` among the results priced within
    `limit` (all results when none is), the first on a tie."""
    want = _words(query)
    return max(affordable(results, limit), key=lambda r: len(want & _words(r[1])))[0]  # the first tie


PICKS = ("words", "first")  # how the shopper chooses among the results of page 1


class InstructionShopper:
    """The "search" and "first" kinds' policy, one episode: call with (observation, info, step)
    -> action. pick: "words" opens the affordable result whose title matches the wanted words
    best, "first" the first affordable result. It keeps which options it has clicked; it reads
    everything else from the page."""

    def __init__(self, pick: str = "words") -> None:
        if pick not in PICKS:
            raise ValueError(f"InstructionShopper: pick must be one of {PICKS}, got {pick!r}")
        self.pick = pick
        self.clicked: set[str] = set()

    def __call__(self, observation: str, info: dict, step: int) -> str:
        instruction = info["task"]
        available = info["available_actions"]
        clickables = available["clickables"]
        if available["has_search_bar"]:
            return f"search[{instruction_query(instruction)}]"
        if "buy now" in clickables:  # an item page: the named options it offers, then buy
            for value in named_options(instruction).values():
                if value in clickables and value not in self.clicked:
                    self.clicked.add(value)
                    return f"click[{value}]"
            return "click[buy now]"
        results = results_on_page(observation, clickables)
        if results and self.pick == "first":
            return f"click[{affordable(results, price_limit(instruction))[0][0]}]"
        if results:
            return f"click[{best_result(results, wanted_words(instruction), price_limit(instruction))}]"
        return "click[back to search]"
