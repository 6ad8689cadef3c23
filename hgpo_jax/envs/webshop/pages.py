"""The text of WebShop's pages as its text env shows them ("simple" observation mode).

The original env renders HTML templates and reduces them to text: every visible text node,
stripped, joined with " [SEP] " (a node that is only a line break is dropped; one that is only
spaces gives an empty segment). Here each page is built directly as its list of text nodes, in
document order, and reduced by the same rule (`page_text`), so no HTML is produced or parsed.

Each page also lists what can be clicked, as the original computes it: the lower-cased text of
every button, then of every product link, then the value of every option radio; a repeated key
keeps its first position and its last target (`Clickables`).
"""

from __future__ import annotations

import json

SEP = " [SEP] "
RESULTS_PER_PAGE = 10
SUB_PAGES = ("description", "features", "reviews", "attributes")
DONE_PAGE_MARKER = "Thank you for shopping with us!"

# Targets of a clickable: ("button", label) | ("product", asin) | ("option", option name)
Clickables = dict


def page_text(nodes: list[str]) -> str:
    """Text nodes -> the observation: '' nodes do not exist, whitespace nodes holding a line break
    are dropped, the others are stripped (a spaces-only node leaves an empty segment)."""
    kept = []
    for node in nodes:
        if node == "" or (node.isspace() and "\n" in node):
            continue
        kept.append(node.strip())
    return SEP.join(kept)


def _clickables(buttons: list[str], products: list[str] = (),
                options: list[tuple[str, str]] = ()) -> Clickables:
    out: Clickables = {}
    for label in buttons:
        out[label.lower()] = ("button", label.lower())
    for asin in products:
        out[asin.lower()] = ("product", asin.upper())
    for name, value in options:
        out[value] = ("option", name)
    return out


def search_page(instruction: str) -> tuple[list[str], Clickables]:
    """The start page: the instruction and a search box."""
    return ["WebShop", "Instruction:", instruction, "Search"], _clickables(["Search"])


def _header(instruction: str) -> list[str]:
    return ["Instruction:", instruction, "Back to Search"]


def results_page(instruction: str, hits: list, page: int, total: int) -> tuple[list[str], Clickables]:
    """A page of search results. hits: this page's products (asin, title, price tag); "Next >"
    is shown on every page, "< Prev" from page 2 on."""
    buttons = ["Back to Search"] + (["< Prev"] if page > 1 else []) + ["Next >"]
    nodes = _header(instruction) + [f"Page {page} (Total results: {total})"] + buttons[1:]
    for p in hits:
        nodes += [p.asin.upper(), p.title, p.price_tag]
    return nodes, _clickables(buttons, [p.asin for p in hits])


def product_page(instruction: str, product) -> tuple[list[str], Clickables]:
    """A product: its options (name, then values), title, price, rating and the sub-page and buy
    buttons. Chosen options are not marked in this mode."""
    nodes = _header(instruction) + ["< Prev"]
    radios = []
    for name, values in product.options.items():
        nodes.append(name)
        nodes += values
        radios += [(name, v) for v in values]
    nodes += [product.title, f"Price: {product.price_tag}", "Rating: N.A.",
              "Description", "Features", "Reviews", "Buy Now"]
    buttons = ["Back to Search", "< Prev", "Description", "Features", "Reviews", "Buy Now"]
    return nodes, _clickables(buttons, options=radios)


def sub_page(instruction: str, product, which: str) -> tuple[list[str], Clickables]:
    """Description, Features (one node per bullet point, written after a space), Reviews (none
    are loaded) or Attributes (one node per attribute)."""
    nodes = _header(instruction) + ["< Prev"]
    if which == "description":
        nodes.append(product.description or "")
    elif which == "features":
        nodes += [f" {b}" for b in product.bullet_points]
    elif which == "attributes":
        nodes += list(product.attributes)
    return nodes, _clickables(["Back to Search", "< Prev"])


def options_json(options: dict) -> str:
    """The chosen options as the done page prints them (Flask's `tojson`: sorted keys, and the
    characters <, >, & and ' escaped for HTML)."""
    text = json.dumps(options, sort_keys=True)
    for ch, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(ch, code)
    return text


def done_page(asin: str, options: dict, reward: float) -> tuple[list[str], Clickables]:
    """The page after "Buy Now": the purchase and the score (the original's fields, typo and
    empty values included)."""
    nodes = [DONE_PAGE_MARKER, "Your code:", "None", "(Paste it in your MTurk interface.)",
             "Purchased", "asin", asin, "options", options_json(options), "attrs", "None",
             "category", "None", "query", "None", "product category", "None",
             "Target", "asin", "options", "attrs", "price upper", "instuction text", "category",
             "product category", "query", "Goal", "None",
             "Reward", "Your score (min 0.0, max 1.0)", str(reward), "Reward Details", "None"]
    return nodes, {}
