"""verl-agent's search-QA prompt, memory and reply projection (the text GiGPO's search-augmented
QA numbers were produced with; templates quoted byte for byte).

- The prompt shows the question and, after the first step, the number of steps taken and the
  last `memory_len` (4 in the authors' script) steps as "Step k:{action} {observation}\\n"
  lines joined by "\\n" (so a blank line between two steps), numbered from the episode's start.
  Each step pairs the projected action ("<search>q</search>", "<answer>a</answer>" or "") with
  the observation the env returned **for** it (the `<information>...</information>` text, or
  ""), unlike the other verl-agent envs, whose memory pairs an action with the observation it
  was chosen on. The current observation is never shown on its own: it is the last memory line.
  No admissible actions (the actions are free text). Step 0, or every step when memory_len is
  0, uses the template without history.
- The reply is asked to reason in <think> </think>, then either search in
  <search> </search> or answer in <answer> </answer>. The projection (`project_action`) never
  reads <think>; the rules are in its docstring.
- Only the authors' rules exist for this format: `rules="strict"` is refused (ValueError), and
  the package's `make_agent` refuses it before an agent is built.
- SFT reply (`scripted_reply`): a reasoning line in <think> </think>, then the action text as
  is (the action already carries its tag).

Checked against the authors' own code (verl-agent 20bd331: their reply projection, templates
and history memory, driven by their env manager) on random cases:
tests/data/search_agent_reference.py writes tests/data/search_agent_reference.json, which
tests/test_search_agent.py replays.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hgpo_jax.agents.base import Turn, check_memory_len
from hgpo_jax.agents.verl_agent.formats import VerlFormat

MEMORY_LEN = 4  # the authors' env.history_length for search (run_search.sh)
TAGS = ("search", "answer")  # the action tags, in the order the projection tries them
RULES = ("verl-agent",)  # the projection rule sets this format has

_TASK = (
    "\nYou are an expert agent tasked with answering the given question step-by-step.\n"
    "Your question: {task_description}\n\n")
_HISTORY = (
    "Prior to this step, you have already taken {step_count} step(s). Below is the interaction "
    "history where <search> </search> wrapped your past search queries and <information> "
    "</information> wrapped the corresponding search results returned by the external search "
    "engine. History:\n{memory_context}\n\n")
_INSTRUCTIONS = (
    "Now it's your turn to respond for the current step.\n"
    "You should first conduct reasoning process. This process MUST be enclosed within "
    "<think> </think> tags. \n"
    "After completing your reasoning, choose only one of the following actions (do not perform "
    "both):\n"
    "(1) If you find you lack some knowledge, you can call a search engine to get more external "
    "information using format: <search> your query </search>.\n"
    "(2) If you have enough knowledge to answer the question confidently, provide your final "
    "answer within <answer> </answer> tags, without detailed illustrations. For example, "
    "<answer>Beijing</answer>.\n")
TEMPLATE_NO_HISTORY = _TASK + _INSTRUCTIONS
TEMPLATE_WITH_HISTORY = _TASK + _HISTORY + _INSTRUCTIONS

_BLOCK = {tag: re.compile(f"<{tag}>(.*?)</{tag}>", re.IGNORECASE | re.DOTALL) for tag in TAGS}
_OPEN = {tag: re.compile(f"<{tag}>", re.IGNORECASE) for tag in TAGS}
_THOUGHT = {"search": "I need more information.", "answer": "I know the answer now."}


# ------------------------------------------------------------------------------------ replies
def _cut_after_first_close(reply: str) -> str:
    """The reply up to and including its first "</search>" or, when it has none, its first
    "</answer>" (exact case); the reply itself when it has neither. Keeps a later block from
    being read as the action."""
    for tag in TAGS:
        close = f"</{tag}>"
        end = reply.find(close)
        if end != -1:
            return reply[:end + len(close)]
    return reply


def project_action(reply: str) -> tuple[str, bool]:
    """One model reply -> (action, valid) by the authors' rules.

    action: in the reply cut after its first "</search>" (else its first "</answer>"; this cut
    is case-sensitive), the first <search>...</search> block found case-insensitively
    (re.IGNORECASE, so Unicode case folds count: "<ſearch>" is a search tag), else the first
    <answer>...</answer> block, returned as "<search>{text.strip()}</search>" or
    "<answer>{text.strip()}</answer>" (tags lower-cased, inner case kept; an empty block is
    kept); neither: "".
    valid: an action was found, and the whole reply (not the cut one) holds at most one opening
    search tag, at most one opening answer tag, and not both kinds. An invalid reply's action is
    still returned (the env runs it). <think> is never checked. A non-str reply: ("", False).
    """
    if not isinstance(reply, str):
        return "", False
    kept = _cut_after_first_close(reply)
    action = ""
    for tag in TAGS:
        found = _BLOCK[tag].search(kept)
        if found:
            action = f"<{tag}>{found.group(1).strip()}</{tag}>"
            break
    opened = [len(_OPEN[tag].findall(reply)) for tag in TAGS]
    valid = bool(action) and max(opened) <= 1 and min(opened) == 0
    return action, valid


def project(reply: str, rules: str = "verl-agent") -> tuple[str, bool]:
    """`project_action` under the VerlAgent's (reply, rules) signature; the search format has
    the authors' rules only, so any other `rules` is a ValueError."""
    if rules not in RULES:
        raise ValueError(f"the search format has projection rules {', '.join(RULES)} only "
                         f"(the authors'), not {rules!r}")
    return project_action(reply)


def scripted_reply(action: str) -> str:
    """The reply SFT teaches for `action` ("<search>q</search>" or "<answer>a</answer>"): a
    reasoning line in <think> </think>, then the action as is. `project_action` reads it back
    as (action, True) when the inner text has no surrounding blanks and no action tags."""
    kind = next((tag for tag in TAGS if action.lower().startswith(f"<{tag}>")), None)
    return f"<think>{_THOUGHT.get(kind, 'I will act.')}</think>{action}"


# ------------------------------------------------------------------------------------ prompts
def format_memory(history: Sequence[tuple[str, str]], memory_len: int) -> str:
    """The last `memory_len` (> 0) steps of `history` ((action, observation that followed)
    pairs, oldest first) as the authors' memory text: "Step k:{action} {observation}\\n" per
    step, k counted from the episode's first step, joined by "\\n"."""
    recent = list(history)[-memory_len:]
    first = len(history) - len(recent) + 1
    return "\n".join(f"Step {first + i}:{action} {observation}\n"
                     for i, (action, observation) in enumerate(recent))


def build_prompt(question: str, history: Sequence[tuple[str, str]] = (),
                 memory_len: int = MEMORY_LEN) -> str:
    """The user message of a step: `question`, and `history`, every past step of the episode as
    (projected action, observation that followed it) pairs, oldest first. No history, or
    memory_len 0, gives TEMPLATE_NO_HISTORY (the authors also take it for a negative
    history_length; here a negative memory_len is a ValueError, as for every agent); otherwise
    TEMPLATE_WITH_HISTORY with the step count (all steps) and the last `memory_len` steps."""
    check_memory_len(memory_len)
    if not history or memory_len == 0:
        return TEMPLATE_NO_HISTORY.format(task_description=question)
    return TEMPLATE_WITH_HISTORY.format(task_description=question, step_count=len(history),
                                  memory_context=format_memory(history, memory_len))


def steps_from_turns(history: Sequence[Turn], observation: str) -> list[tuple[str, str]]:
    """The agent memory's turns (observation shown at a step, action sent) -> the authors'
    steps (action sent, observation that followed it): turn k's follower is turn k+1's
    observation, the last turn's is the current `observation`."""
    following = [t.observation for t in history[1:]] + [observation]
    return [(turn.action, after) for turn, after in zip(history, following)]


def prompt_from_turns(task: str, observation: str, admissible_actions: Sequence[str],
                      history: Sequence[Turn] = (), memory_len: int = MEMORY_LEN) -> str:
    """`build_prompt` under the VerlAgent's prompt signature: `task` is the question (the env's
    reset info "task"), `observation` the current one (the question at step 0, later the last
    step's `<information>...</information>` text or ""), `history` the agent memory's turns;
    the admissible actions are not shown (there are none: the actions are free text)."""
    return build_prompt(task, steps_from_turns(history, observation), memory_len)


FORMATS = {"search": VerlFormat(build_prompt=prompt_from_turns, project=project,
                                script=scripted_reply, projections=RULES)}
