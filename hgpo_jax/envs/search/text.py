"""The texts of search-augmented QA as verl-agent's search env makes them, and its EM score.

verl-agent (GiGPO's code, commit 20bd331) runs its vendored SkyRL-gym search env over an HTTP retriever.
What the policy sees and how an episode is scored are plain string functions of the retrieved
passages and of the episode's projected actions; this module holds them, with no I/O, so that any
retriever (the project's local one or a user's wiki-18 server) gives the observations and rewards
the authors' env gives. `tests/data/search_env_reference.json` records their code on random cases
(`tests/data/search_env_reference.py`); `tests/test_search_text.py` checks every case.

The facts reproduced (design notes: shared/design/search-qa.md sections 1.4-1.6):

- A search observation is `<information>{"result": "..."}</information>`: the retrieval result is
  serialised with `json.dumps` (ASCII-escaped: quotes, backslashes, newlines and every non-ASCII
  character appear as JSON escapes in the text the model reads). The result is one line
  `Doc i: <contents stripped>` per passage, each ending in a newline, in rank order; a passage's
  contents is wiki-18's `"Title"` line, a newline, then the text.
- A search that retrieves nothing (their server answers `{"result": [[]]}`) shows an empty result,
  `<information>{"result": ""}</information>`; the client's "No search results found." text is
  only given for a response without any result list, which their server never sends.
- An HTTP failure shows `<information>{"result": "Search error: <message>"}</information>`.
- The reward is exact match (EM) of the last `<answer>...</answer>` in the episode's history against
  any golden answer, after SQuAD-style normalisation; 1.0 or 0.0, no format score.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable, Sequence

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLE = re.compile(r"\b(?:a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ------------------------------------------------------------------------------ observations
def wiki_contents(title: str, text: str) -> str:
    """wiki-18's `contents` of a passage: the title in double quotes, a newline, the text (the
    string their retriever returns as `document.contents`)."""
    return f'"{title}"\n{text}'


def _information(result: str) -> str:
    """The observation for a tool result: the `{"result": ...}` JSON (json.dumps' defaults, so
    ASCII-escaped, `": "` separator) inside <information> tags. Their env wraps the tool output
    in a newline before and after and the batch env strips the message, leaving this."""
    return "<information>" + json.dumps({"result": result}) + "</information>"


def contents_text(contents_list: Iterable[str]) -> str:
    """The observation after a search that retrieved these `contents` strings, in rank order.

    Each becomes `Doc {rank}: {contents.strip()}` plus a newline (ranks from 1), the lines
    concatenated; no passage gives an empty result (`{"result": ""}`), which is what their client
    makes of their server's answer to a search without hits (`[[]]`: one empty list).
    """
    result = "".join(f"Doc {rank}: {contents.strip()}\n"
                     for rank, contents in enumerate(contents_list, start=1))
    return _information(result)


def information_text(passages: Iterable[tuple[str, str]]) -> str:
    """The observation after a search that retrieved these (title, text) passages, in rank order:
    `contents_text` of their wiki-18 contents (see `wiki_contents`)."""
    return contents_text(wiki_contents(title, text) for title, text in passages)


def search_error_text(message: str) -> str:
    """The observation when the search request fails: `Search error: {message}` as the result.

    Their client's messages read `[Search Request ID: <uuid4>] <kind>: <detail>` (kinds:
    `Connection Error`, `Timeout Error`, `API Request Error`, `API Response JSON Decode Error`,
    `Unexpected Error`, or `API Request Error: Server Error (<code>) on attempt 10/10` after ten
    5xx answers); pass whatever message the caller's backend has.
    """
    return _information(f"Search error: {message}")


# --------------------------------------------------------------------------------- scoring
def normalized_answer(s: str) -> str:
    """SQuAD's answer normalisation as Search-R1 and verl-agent apply it: lowercase, drop every
    ASCII punctuation character (`string.punctuation`), replace the words a/an/the by a space,
    collapse whitespace runs (any Unicode whitespace) to single spaces and trim. The order
    matters: punctuation goes before articles are matched, so "the-end" loses no article."""
    s = s.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLE.sub(" ", s).split())


def extract_answer(history_text: str) -> str | None:
    """The stripped text of the last `<answer>...</answer>` (lowercase tags, shortest match,
    across newlines) in the text; None when there is none.

    verl-agent counts every match (>= 1), unlike Search-R1, which needs >= 2 because its scored
    text includes the prompt's own `<answer> Beijing </answer>` example; verl-agent scores the
    agent's history only."""
    last = None
    for last in _ANSWER.finditer(history_text):
        pass
    return None if last is None else last.group(1).strip()


def exact_match(history_text: str, golden_answers: str | Iterable[str]) -> float:
    """The episode reward: 1.0 when the extracted answer (`extract_answer`) normalises to the same
    string as any golden answer (a single string counts as one answer), else 0.0 (also when there
    is no answer). A golden answer that normalises to "" (NQ has aliases like "*") is matched by
    an empty answer; that is their rule too."""
    answer = extract_answer(history_text)
    if answer is None:
        return 0.0
    if isinstance(golden_answers, str):
        golden_answers = (golden_answers,)
    predicted = normalized_answer(answer)
    return 1.0 if any(normalized_answer(g) == predicted for g in golden_answers) else 0.0


def history_text(actions: Sequence[str], observations: Sequence[str]) -> str:
    """The text verl-agent scores at the end of an episode, built from the episode's projected
    actions and the (stripped) observations the env returned after them.

    Their env's chat history holds, in order, every action passed to `step` (the projected
    action, "" included) and, after each step that did not end the episode and whose search gave
    a non-empty tool output, the observation message as their env made it before the batch env
    stripped it: a newline, `<information>...</information>`, a newline. It does not hold the
    question or any prompt. The score is computed on the concatenation of all of it, with no
    separator, so an `<answer>` tag may pair with a closing tag in a later part.

    observations[i] is the observation returned after actions[i] ("" for none: an action without
    a search, or the final step); missing trailing entries count as "". Observations are assumed
    to be tool outputs (`<information>` texts); their env's other source of observation, an
    exception's message, never arises with the search tool, which turns errors into results.
    """
    if len(observations) > len(actions):
        raise ValueError(f"{len(observations)} observations for {len(actions)} actions: "
                         "observations[i] must follow actions[i]")
    parts = []
    for i, action in enumerate(actions):
        parts.append(action)
        if i < len(observations) and observations[i]:
            parts.append("\n" + observations[i] + "\n")
    return "".join(parts)


# -------------------------------------------------------------------------------- questions
def prepare_question(question: str) -> str:
    """Search-R1's question preparation (scripts/data_process/*.py): strip surrounding whitespace
    and append "?" unless the question already ends with one. The parquet verl-agent trains on
    comes from Search-R1's scripts (verl-agent's own preprocess script copies the question as the
    file has it), so questions from raw sources need this to read as in their runs. Idempotent.
    An empty question is refused (Search-R1's scripts fail on one too)."""
    question = question.strip()
    if not question:
        raise ValueError("empty question")
    return question if question.endswith("?") else question + "?"
