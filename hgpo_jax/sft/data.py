"""Supervised samples for the warm start: episodes -> (prompt, response) turns -> token ids.

    episodes = get_env("toy").record_episodes(env_cfg, "train", 100, "expert")  # hgpo_jax.envs.episodes
    texts = samples_from_episodes(episodes, 2, get_agent("verl-agent", "toy"))  # [(prompt, response)]
    samples = tokenize_samples(texts, tokenizer, max_prompt_tokens=512)    # [SftSample]

A sample is exactly what the RL rollout shows the model at that step: the same agent's prompt
(`hgpo_jax.agents.Agent.prompt`) with the same memory of past turns (what `agent.remember` keeps
of the parsed scripted reply), the same chat template and left truncation
(`hgpo_jax.rl.policy.encode_prompt`). The response is the agent's reply for the scripted action
(`agent.scripted_reply`; verl-agent: a short reasoning line in <think> </think> and the action in
<action> </action>), followed by the end-of-turn token, so the model learns to stop. The loss
covers the response tokens only.

Sources: the episodes each env records with its scripted policies (`EnvSpec.record_episodes`,
`hgpo_jax.envs.episodes`; ALFWorld: each game's walkthrough or its hand-coded searching expert
played through the real engine, so every step has its real observation and admissible actions;
toy env: its scripted solution or random actions; WebShop: its shoppers), and any JSONL file of
{"prompt": ..., "response": ...} chat turns.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from hgpo_jax.agents import Agent, Turn
from hgpo_jax.envs.episodes import Episode


@dataclasses.dataclass(frozen=True)
class SftSample:
    """Token ids of one turn: the prompt (chat template included) and the response (end-of-turn
    token included). The loss covers `response_ids` only."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


# ---------------------------------------------------------------------------------- samples
def samples_from_episodes(episodes: Iterable[Episode], memory_len: int,
                          agent: Agent) -> list[tuple[str, str]]:
    """[(prompt text, response text)], one per step, exactly as the rollout builds the prompt:
    `agent.prompt` over the memory of the parsed scripted replies (`agent.remember`); the
    response is `agent.scripted_reply(step.action)`."""
    out = []
    for ep in episodes:
        history: list[Turn] = []
        for step in ep.steps:
            text = agent.prompt(ep.task, step.observation, step.admissible, history, memory_len)
            reply = agent.scripted_reply(step.action)
            out.append((text, reply))
            history.append(agent.remember(step.observation, agent.parse(reply)))
    return out


def read_jsonl_turns(path: str) -> list[tuple[str, str]]:
    """A user's data: one {"prompt": str, "response": str} object per line (the prompt is the
    user message; the chat template and the end-of-turn token are added here)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
            if not isinstance(d, dict) or not isinstance(d.get("prompt"), str) \
                    or not isinstance(d.get("response"), str):
                raise ValueError(f"{path}:{n}: each line must be an object with string fields "
                                 f"'prompt' and 'response', got {line.strip()[:120]!r}")
            out.append((d["prompt"], d["response"]))
    return out


def count_jsonl_turns(path: str) -> int:
    """The turns a JSONL file of `read_jsonl_turns` holds (its non-blank lines), without parsing."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


MORE_EPISODES = "record more episodes (a larger sft.episodes, or KIND:N counts in sft.data)"
MORE_TURNS = "add turns to the JSONL file"


def heldout_count(heldout: float, total: int) -> int:
    """How many of `total` episodes (or turns) `sft.heldout` holds out: round(heldout x total)."""
    return int(round(heldout * total))


def heldout_problem(heldout: float, total: int, what: str, more: str) -> str | None:
    """Why `sft.heldout` cannot split `total` `what` ("episodes", "turns") into a held-out and a
    training part (one line with the fix; `more`: how to get more of them, MORE_EPISODES or
    MORE_TURNS), or None when it can.
    sft.heldout=0 (no held-out loss) always can, given one item to train on."""
    if total <= 0:
        return f"there are no {what} to train on: {more}"
    held = heldout_count(heldout, total)
    if heldout > 0 and held == 0:
        larger = f", a larger sft.heldout (above {0.5 / total:.3g})" if total >= 2 else ""
        return (f"sft.heldout={heldout:g} of {total} {what} holds out none (round({heldout:g} x "
                f"{total}) = 0), so there would be no held-out loss: {more}{larger}, or "
                "sft.heldout=0 to train without a held-out loss")
    if held >= total:
        return (f"sft.heldout={heldout:g} of {total} {what} holds out all of them and leaves none "
                f"to train on: {more} or lower sft.heldout")
    return None


def tokenize_samples(texts: Iterable[tuple[str, str]], tokenizer, max_prompt_tokens: int,
                     max_response_tokens: int | None = None) -> list[SftSample]:
    """Token ids of each (prompt, response): the rollout's prompt encoding; the response's
    tokens plus the end-of-turn token (a response longer than `max_response_tokens` is cut)."""
    from hgpo_jax.rl.policy import encode_prompt

    end = tokenizer.end_of_turn_id
    out = []
    for prompt, response in texts:
        resp = tokenizer.encode(response) + [end]
        if max_response_tokens is not None:
            resp = resp[:max_response_tokens]
        out.append(SftSample(tuple(encode_prompt(tokenizer, prompt, max_prompt_tokens)), tuple(resp)))
    return out


def chat_texts(texts: Iterable[tuple[str, str]], chat_template: str) -> list[str]:
    """Whole rendered turns (chat template, prompt, response, end of turn): a tokenizer corpus."""
    from transformers.utils.chat_template_utils import render_jinja_template

    conversations = [[{"role": "user", "content": p}, {"role": "assistant", "content": r}]
                     for p, r in texts]
    if not conversations:
        return []
    rendered, _ = render_jinja_template(conversations, chat_template=chat_template)
    return list(rendered)
