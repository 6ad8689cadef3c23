"""Agents: the reply formats of a policy and their prompts, between the envs and the rollout.

    from hgpo_jax.agents import get_agent
    agent = get_agent("verl-agent", "alfworld")          # cfg.agent.name, cfg.env.name
    text = agent.prompt(task, obs, info["admissible_actions"], history, memory_len)
    reply = agent.parse(model_text)                      # Reply(action, valid, plan)
    history.append(agent.remember(obs, reply))           # Turn(observation, action, plan)

An env keeps observations, admissible actions, rewards and its scripted policies; an agent owns
the prompt template, the reply parsing (what is sent to the env, what is carried to the next
prompt, whether the reply is valid), the memory of past turns and the reply an SFT sample teaches
(`base.py`). Agents by name: `registry.py`; the authors' think/action format: `verl_agent/`;
HiPER's switch/sub-goal/action format: `plan_execute/`.
docs/agents.md tells how to add one.
"""

from hgpo_jax.agents.base import Agent, Reply, Turn
from hgpo_jax.agents.registry import DEFAULT_AGENT, agent_names, get_agent, projection_names

__all__ = ["Agent", "Reply", "Turn", "DEFAULT_AGENT", "agent_names", "get_agent",
           "projection_names"]
