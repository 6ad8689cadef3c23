"""WebShop's product catalogue as the original text env loads it (small or full set).

`read_products(folder)` follows the original loader's rules, so that pages, search documents,
goals and rewards see the same values:
- products in file order; one is skipped if its asin is 'nan', longer than 10 characters, or seen
  before;
- price: an empty pricing string is $100.0; otherwise the numbers after each '$' (every character
  but digits and '.' removed); one number is the price, two or more give a range [low, high]
  (tag "$low to $high", Python float repr: "$59.5");
- options: option names lower-cased (an option whose value list is null is left out); values
  stripped, '/' -> ' | ', lower-cased;
- attributes from the instruction file (['DUMMY_ATTR'] when a product has no entry); reviews are
  not loaded and every rating is "N.A." (as verl-agent runs it).
"""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal

from hgpo_jax.envs.webshop.data import ATTRIBUTES_FILE, NOUNS_FILE, PRODUCTS_FILE, read_data_json

DEFAULT_PRICE = 100.0
_NOT_NUMBER = re.compile(r"[^\d.]")


@dataclasses.dataclass(frozen=True)
class Product:
    """One product. `pricing`: [price] or [low, high]; `options`: {name: [values]} in page order."""

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    price_tag: str
    pricing: tuple[float, ...]
    options: dict
    attributes: tuple[str, ...]
    instruction_text: str | None
    instruction_attributes: tuple[str, ...] | None
    query: str
    category: str
    product_category: str
    nouns: tuple[str, ...]  # noun tokens of the title (spaCy en_core_web_sm), for the reward


def parse_pricing(pricing: str | None) -> tuple[tuple[float, ...], str]:
    """'$19.99 - $27.99' -> ((19.99, 27.99), '$19.99 to $27.99'); '' -> ((100.0,), '$100.0')."""
    if not pricing:
        return (DEFAULT_PRICE,), f"${DEFAULT_PRICE}"
    values = [float(Decimal(_NOT_NUMBER.sub("", piece))) for piece in pricing.split("$")[1:]]
    if not values:
        raise ValueError(f"pricing {pricing!r} holds no '$' amount")
    if len(values) == 1:
        return (values[0],), f"${values[0]}"
    return (values[0], values[1]), f"${values[0]} to ${values[1]}"


def parse_options(customization) -> dict:
    """{name: [{'value': ...}, ...]} -> {name lower-cased: [value normalized, ...]}."""
    options = {}
    for name, entries in (customization or {}).items():
        if entries is None:
            continue
        options[name.lower()] = [e["value"].strip().replace("/", " | ").lower() for e in entries]
    return options


def read_products(folder: str) -> list[Product]:
    """The catalogue of a WebShop data folder, in file order (see the module docstring)."""
    raw = read_data_json(folder, PRODUCTS_FILE)
    extra = read_data_json(folder, ATTRIBUTES_FILE)
    nouns = read_data_json(folder, NOUNS_FILE)["nouns_by_asin"]
    products, seen = [], set()
    for item in raw:
        asin = item["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, tag = parse_pricing(item.get("pricing"))
        bullets = item.get("small_description")
        bullets = bullets if isinstance(bullets, list) else [bullets]
        info = extra.get(asin, {})
        ins_attrs = info.get("instruction_attributes")
        products.append(Product(
            asin=asin, title=item["name"], description=item["full_description"],
            bullet_points=tuple(bullets), price_tag=tag, pricing=pricing,
            options=parse_options(item.get("customization_options")),
            attributes=tuple(info["attributes"]) if "attributes" in info else ("DUMMY_ATTR",),
            instruction_text=info.get("instruction"),
            instruction_attributes=tuple(ins_attrs) if ins_attrs is not None else None,
            query=item["query"].lower().strip(), category=item["category"],
            product_category=item["product_category"], nouns=tuple(nouns.get(asin, ()))))
    return products
