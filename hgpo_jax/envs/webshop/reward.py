"""WebShop's purchase reward, as verl-agent's copy of WebShop's goal module computes it, with breakdown.

reward = (attribute matches + option matches + price ok) / (n_attributes + n_options + 1) * r_type

- r_type (the product "type"): 1.0, lowered to 0.5 when the bought product neither has the goal
  product's search query, nor shares at least two '›'-separated category parts with it, nor has a
  title noun score above 0.2; then 0.1 when the noun score is below 0.1, and 0.0 when it is 0.
  The noun score is |set(bought nouns) & set(goal nouns)| / len(goal nouns) (duplicates counted in
  the denominator), 0.2 when the goal title has no nouns. Nouns are the spaCy NOUN/PROPN tokens of
  the titles, precomputed per asin in the data (`Product.nouns`).
- attributes: a goal attribute matches when some attribute of the bought product scores above 85
  with `token_set_ratio`, or else when it is a substring of the bought product's lower-cased
  title, joined bullet points or description.
- options: the bought option values are colour-normalized as strings; the goal options are
  colour-normalized as (name, value) *pairs* (the original passes `dict.items()`), so an
  unmatched goal option is compared as the text of the pair, e.g. "('color', 'navy blue')". Each
  goal option counts once if some bought value scores above 85 against it. No goal options: the
  option part is left out (r_option is None and not in the breakdown).
- price: the price paid for the product under the env seed is at most the goal's `price_upper`.
"""

from __future__ import annotations

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from hgpo_jax.envs.webshop.products import Product

FUZZ_MATCH_ABOVE = 85
CATEGORY_SEPARATOR = "›"  # U+203A, as in the product_category strings

# upstream web_agent_site/engine/normalize.py COLOR_SET (order matters: the first hit wins)
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)

_DROP_LATIN1 = {code: None for code in range(128, 256)}


def _fuzz_process(value) -> str:
    """thefuzz 0.22.1's `full_process(value, force_ascii=True)`: `str()` of the value, code
    points 128-255 deleted (thefuzz's "ascii only" drops only that range), then rapidfuzz's
    default processing (non-alphanumerics to spaces, lower case, trimmed)."""
    return default_process(str(value).translate(_DROP_LATIN1))


def token_set_ratio(s1, s2) -> int:
    """thefuzz 0.22.1 `fuzz.token_set_ratio`: both inputs processed as `_fuzz_process`, scored by
    rapidfuzz's token_set_ratio and rounded to an int (Python `round`); None or an input that is
    empty after processing scores 0. Non-strings (tuples) are compared as their `str()`."""
    if s1 is None or s2 is None:
        return 0
    return int(round(fuzz.token_set_ratio(_fuzz_process(s1), _fuzz_process(s2))))


def canonical_color(value):
    """The first COLOR_SET word found `in` the value, else the value unchanged.

    On a string `in` is a substring test ('light blue' -> 'blue', since 'blue' comes first); on a
    (name, value) tuple it is element equality, so a pair is only replaced when one of its two
    elements is exactly a COLOR_SET word."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _category_parts(product_category: str) -> set[str]:
    return {part.strip() for part in product_category.split(CATEGORY_SEPARATOR)}


def title_score(bought_nouns, goal_nouns) -> float:
    """Shared distinct nouns over the goal title's noun count (duplicates included); 0.2 when
    the goal title has no nouns."""
    if len(goal_nouns) == 0:
        return 0.2
    return len(set(bought_nouns) & set(goal_nouns)) / len(goal_nouns)


def type_reward(query_match: bool, category_match: bool, score: float) -> float:
    """1.0; 0.5 if nothing matches (query, category, noun score > 0.2); then 0.1 if the noun score
    is below 0.1; then 0.0 if it is 0 (later rules override earlier ones)."""
    r_type = 1.0
    if not (query_match or category_match or score > 0.2):
        r_type = 0.5
    if score < 0.1:
        r_type = 0.1
    if score == 0.0:
        r_type = 0.0
    return r_type


def type_match(bought: Product, goal_product: Product) -> dict:
    """{'r_type', 'query_match', 'category_match', 'title_score'} of the bought product against
    the goal's product (the goal's query, category and title are its product's)."""
    query_match = bought.query == goal_product.query
    category_match = len(_category_parts(bought.product_category)
                         & _category_parts(goal_product.product_category)) >= 2
    score = title_score(bought.nouns, goal_product.nouns)
    return {"r_type": type_reward(query_match, category_match, score),
            "query_match": query_match, "category_match": category_match, "title_score": score}


def _attribute_matches(bought: Product, goal_attributes) -> int:
    """Goal attributes matched by a fuzzy product attribute or found in the product's text."""
    title = bought.title.lower()
    bullets = " ".join(bought.bullet_points).lower()
    description = bought.description.lower()
    matches = 0
    for g_attr in goal_attributes:
        if any(token_set_ratio(p_attr, g_attr) > FUZZ_MATCH_ABOVE for p_attr in bought.attributes):
            matches += 1
        elif g_attr in title or g_attr in bullets or g_attr in description:
            matches += 1
    return matches


def _option_matches(bought_options: dict, goal_options: dict) -> int:
    """Goal options (as colour-normalized (name, value) pairs) that some colour-normalized bought
    option value scores above 85 against."""
    bought = [canonical_color(value) for value in bought_options.values()]
    wanted = [canonical_color(pair) for pair in goal_options.items()]
    return sum(1 for g_option in wanted
               if any(token_set_ratio(p_option, g_option) > FUZZ_MATCH_ABOVE
                      for p_option in bought))


def purchase_reward(bought: Product, goal: dict, goal_product: Product, price: float,
                    options: dict) -> tuple[float, dict]:
    """(reward in [0, 1], breakdown) for buying `bought` at `price` with the chosen `options`
    (option name -> value) when the goal is `goal` (whose product is `goal_product`).

    The breakdown has, in order: r_type, r_att, w_att, query_match, category_match, title_score,
    then r_option and w_option only when the goal has options, then r_price (a bool) and
    w_price. Weights are each part's count over n_attributes + n_options + 1."""
    if not goal["price_upper"] > 0:
        raise ValueError(f"goal price_upper must be positive, got {goal['price_upper']!r}")
    type_info = type_match(bought, goal_product)
    goal_attributes = goal["attributes"]
    goal_options = goal["goal_options"]
    n_att, n_opt = len(goal_attributes), len(goal_options)
    denominator = n_att + n_opt + 1
    r_price = price <= goal["price_upper"]
    att_matches = _attribute_matches(bought, goal_attributes)
    opt_matches = _option_matches(options, goal_options)
    reward = (att_matches + opt_matches + r_price) / denominator
    reward *= type_info["r_type"]
    info = {"r_type": type_info["r_type"], "r_att": att_matches / n_att, "w_att": n_att / denominator,
            "query_match": type_info["query_match"],
            "category_match": type_info["category_match"],
            "title_score": type_info["title_score"]}
    if n_opt > 0:
        info["r_option"] = opt_matches / n_opt
        info["w_option"] = n_opt / denominator
    info["r_price"] = r_price
    info["w_price"] = 1 / denominator
    return reward, info
