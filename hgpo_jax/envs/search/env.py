"""One search-augmented QA episode at a time, as verl-agent's search env plays it.

    env = SearchQAEnv(questions, retriever, max_turns=4)
    obs, info = env.reset("train:17")                  # obs: the question
    obs, reward, done, info = env.step("<search>who founded acme</search>")
    obs, reward, done, info = env.step("<answer>Jane Doe</answer>")   # reward: EM, 1.0 or 0.0

The env takes the agent's projected action (hgpo_jax.agents.verl_agent.search: "<search>q</search>",
"<answer>a</answer>" or "" for an invalid reply) and behaves as the search env verl-agent vendors from SkyRL-gym, under
verl-agent's batch env (20bd331; shared/design/search-qa.md section 1.4):
- every step uses a turn; the episode ends when the action holds "<answer>" and "</answer>" or on
  turn `max_turns` (verl-agent's env.max_steps, 4 in run_search.sh): at most three searches then
  an answer, and a search on the last turn ends the episode unanswered (reward 0);
- on a step that does not end it, the first "<search>...</search>" of the action is the query
  (stripped); its top-k passages become the observation (`text.contents_text`); an action
  without a search (invalid, "") shows "" and only costs the turn;
- the reward is 0 until the end, then the exact match of the last <answer> in the episode's
  history (its actions and observations joined as their env joins them, `text.history_text`)
  against the golden answers; `won` is reward >= 1;
- the anchor is the observation: the question at reset, then each observation (so the first
  steps of a group share one anchor, and "" observations one of their own).
A search that fails (a retrieval server down after its retries) shows their client's error text
(`text.search_error_text`), is counted in `info["search_errors"]` and warned about once per env:
the episode goes on as theirs does. The trainer refuses to start when the server does not answer
(hgpo_jax.envs.search.check_ready).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping

from hgpo_jax.envs.search import text
from hgpo_jax.envs.search.data import Question
from hgpo_jax.envs.search.retrieval import RetrievalError

_QUERY = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def query_of(action: str) -> str | None:
    """The query of a projected action: the stripped text of its first <search>...</search>, or
    None when it has no search (their env asks the tool nothing then)."""
    if "<search>" not in action or "</search>" not in action:
        return None
    match = _QUERY.search(action)
    return None if match is None else match.group(1).strip()


def ends_episode(action: str, turns: int, max_turns: int) -> bool:
    """Whether the step that used turn `turns` (from 1) with `action` ends the episode."""
    return turns >= max_turns or ("<answer>" in action and "</answer>" in action)


class SearchQAEnv:
    """Search-augmented QA over a question table and a retriever.

    questions: task id -> Question (ids as `list_tasks` gives them, e.g. "train:17");
    retriever: anything with `search(query, k) -> hits` in rank order, each hit with `.contents`
    (hgpo_jax.envs.search.retrieval: the embedded BM25 index or an HTTP server's client);
    max_turns: turns per episode; topk: passages per search.
    """

    def __init__(self, questions: Mapping[str, Question], retriever, max_turns: int = 4,
                 topk: int = 3):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.questions = questions
        self.retriever = retriever
        self.max_turns = int(max_turns)
        self.topk = int(topk)
        self.question: Question | None = None
        self.search_errors = 0
        self._warned = False

    # ------------------------------------------------------------------ protocol
    def reset(self, task) -> tuple[str, dict]:
        """Start the episode of question `task`; the observation is the question."""
        if task not in self.questions:
            raise KeyError(f"no search-QA task {task!r} (task ids look like 'train:0')")
        self.question = self.questions[task]
        self.turns, self.done = 0, False
        self.actions: list[str] = []
        self.observations: list[str] = []
        return self.question.question, self._info(self.question.question, won=False,
                                                  tool_calling=False)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply one projected action; returns (observation, reward, done, info)."""
        if self.question is None:
            raise RuntimeError("call reset(task) before step()")
        action = action if isinstance(action, str) else ""
        self.turns += 1
        self.actions.append(action)
        done = self.done or ends_episode(action, self.turns, self.max_turns)
        self.done = done
        if done:
            self.observations.append("")
            reward = text.exact_match(text.history_text(self.actions, self.observations),
                                      self.question.golden_answers)
            return "", reward, True, self._info("", won=reward >= 1.0, tool_calling=False)
        query = query_of(action)
        obs = "" if query is None else self._information_for(query)
        self.observations.append(obs)
        return obs, 0.0, False, self._info(obs, won=False, tool_calling=True)

    def close(self) -> None:
        close = getattr(self.retriever, "close", None)
        if close is not None:
            close()

    # ------------------------------------------------------------------ internals
    def _information_for(self, query: str) -> str:
        try:
            hits = self.retriever.search(query, self.topk)
        except RetrievalError as e:
            self.search_errors += 1
            if not self._warned:
                warnings.warn(f"search failed, the agent sees the error text (as verl-agent's "
                              f"env shows it): {e}", RuntimeWarning, stacklevel=2)
                self._warned = True
            return text.search_error_text(str(e))
        return text.contents_text(hit.contents for hit in hits)

    def _info(self, obs: str, won: bool, tool_calling: bool) -> dict:
        q = self.question
        return {"admissible_actions": [], "won": bool(won), "task_type": q.data_source,
                "anchor": obs, "task": q.question, "data_source": q.data_source,
                "tool_calling": tool_calling, "search_errors": self.search_errors}
