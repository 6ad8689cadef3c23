"""Agent-G²'s guidance (`guidance.kind=g2`, issue 50): which expert steps each training rollout
replays first, the replay, the schedule's update from the rollouts and prefix SFT's rows (host
code, NumPy).

    unit = AgentG2(cfg, AgentG2.prepare(cfg, drawn_tasks=..., progress=..., saved=...),
                   tokenizer=tokenizer, agent=agent)          # the run's (`rl.guides`)
    guide = Guide(experts, tokenizer.encode, cfg.guidance, max_steps=cfg.env.max_steps)
    plans = guide.plan(tasks, group_size)              # one draw per task, in task order
    pool = ReplayingPool(env_pool, guide.prefixes(plans), max_steps)   # rl.guides.replay
    batch = collect_rollouts(..., pool, ...)
    metrics = guide.update(plans, batch.episode_traj, batch.episode_won)  # before the advantages
    meta["guidance"] = guide.state_dict()              # with the run's checkpoints

`experts` maps each training task that has an expert (`EnvSpec.expert_trajectories`: recorded
by `prepare` before the weights load, of the split or of the tasks the run draws,
`guidance.expert_tasks`) to the expert's actions; a task without one is unmatched: no prefix, not
in the schedule. The experts' lengths give the difficulty clusters (`rl.guidance.
difficulty_thresholds`), a task's cluster its expert's length class. Per task the schedule
draws a ratio r (`GaussianSchedule.sample`), which becomes a number of expert steps through the
expert's "Step k: action" text counted in the policy's tokens (`step_end_offsets`,
`prefix_steps`: rounded up to a step's end, capped so that the policy plays at least the
expert's last step and keeps a step of `max_steps`).

One draw per task, shared by its group's rollouts (`share_prefix_within_group`, the authors'
scripts), drawn on every process from the same schedule state in the same task order, so a
multi-process run agrees on every plan; `share_prefix_within_group=false` draws per rollout.
The update takes one value per kept rollout of a matched task (a rollout the prefix finished has
no policy turn and is not kept), in batch order: its success (`RolloutBatch.episode_won`: the
episode's env reward, prefix included, was a win), the controls flagged
(`GaussianSchedule.update`). With `guidance.sft_coef` > 0 the replayed steps are also
supervised rows of the update (`rl.prefix_sft.prefix_sft_rows`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hgpo_jax.envs.registry import get_env
from hgpo_jax.guidance_specs import ScheduleOptions
from hgpo_jax.rl.guidance import (GaussianSchedule, difficulty_group, difficulty_thresholds,
                                  prefix_steps, step_end_offsets)
from hgpo_jax.rl.guides.base import Guidance
from hgpo_jax.rl.guides.replay import ReplayingPool
from hgpo_jax.rl.prefix_sft import PrefixSft, prefix_sft_rows


def clusters_of(experts: Mapping, options) -> list[int]:
    """The difficulty clusters' thresholds of `experts` ({task: actions}) under the `guidance`
    options (`difficulty_thresholds` of their lengths)."""
    return difficulty_thresholds([len(a) for a in experts.values()],
                                 options.num_difficulty_groups, options.difficulty_group_mode)


@dataclasses.dataclass(frozen=True)
class Plan:
    """One task's (or rollout's) prefix: matched (the task has an expert), its cluster (0:
    unmatched), the drawn and clipped ratio, control (a no-prefix control of the schedule), the
    expert actions to replay, the expert's length and whether the prefix was rounded up to a
    step's end."""

    matched: bool
    cluster: int = 0
    sampled: float = 0.0
    ratio: float = 0.0
    control: bool = False
    actions: tuple[str, ...] = ()
    expert_steps: int = 0
    extended: bool = False


UNMATCHED = Plan(False)


class Guide:
    """The guidance of one run over its training tasks (see the module docstring).

    experts: {task: actions} of the tasks that have an expert; encode(text) -> token ids (the
    policy's tokenizer, no special tokens); options: the `guidance` section (a `GuidanceOptions`);
    max_steps: the env's step limit (`env.max_steps`)."""

    def __init__(self, experts: Mapping, encode: Callable[[str], Sequence[int]], options,
                 max_steps: int):
        if not experts:
            raise ValueError("guidance.kind=g2, but no training task has an expert trajectory "
                             "to replay; check the env's data, or set guidance.kind=none")
        self.experts = {task: tuple(actions) for task, actions in experts.items()}
        self.encode = encode
        self.options = options
        self.max_steps = int(max_steps)
        self.thresholds = clusters_of(self.experts, options)
        self.schedule = GaussianSchedule(len(self.thresholds),
                                         **ScheduleOptions.of(options).authors_options())
        self._offsets: dict = {}  # task -> its expert's step-end token offsets (on first use)

    def cluster(self, task) -> int:
        """The task's difficulty cluster (1..K), 0 for a task without an expert."""
        actions = self.experts.get(task)
        return 0 if actions is None else difficulty_group(len(actions), self.thresholds)

    def offsets(self, task) -> list[int]:
        """The token offsets of the ends of the task's expert steps (`step_end_offsets`)."""
        if task not in self._offsets:
            self._offsets[task] = step_end_offsets(self.encode, self.experts[task])
        return self._offsets[task]

    def draw(self, task) -> Plan:
        """One plan for `task`: a ratio from its cluster's Gaussian, made expert steps."""
        actions = self.experts.get(task)
        if actions is None:
            return UNMATCHED
        cluster = self.cluster(task)
        offsets = self.offsets(task)
        total = offsets[-1] if offsets else 0
        sampled, ratio, control = self.schedule.sample(cluster, is_train=True,
                                                       empty=total == 0)
        steps, extended = prefix_steps(offsets, total, ratio, len(actions), self.max_steps,
                                       self.options.allow_full_prefix)
        return Plan(True, cluster, sampled, ratio, control, actions[:steps], len(actions),
                    extended)

    def plan(self, tasks: Sequence, group_size: int = 1) -> list[Plan]:
        """One plan per rollout, task by task (rollout i of task j: index j * group_size + i):
        one draw per task shared by its group, or one per rollout when
        share_prefix_within_group is false. Every process must call it on the whole list of the
        iteration's tasks (then take its own part), so that the draws agree."""
        if self.options.share_prefix_within_group:
            return [p for task in tasks for p in [self.draw(task)] * group_size]
        return [self.draw(task) for task in tasks for _ in range(group_size)]

    @staticmethod
    def prefixes(plans: Sequence[Plan]) -> list[list[str]]:
        """The actions each env replays (`ReplayingPool(env_pool, prefixes, max_steps)`)."""
        return [list(p.actions) for p in plans]

    def update(self, plans: Sequence[Plan], episode_traj, episode_won) -> dict[str, float]:
        """The schedule's update from the kept rollouts (`RolloutBatch.episode_traj`, indices into
        `plans`, and `episode_won`, each [E], every process's together in batch order); returns
        its metrics and the prefix statistics of `plans`."""
        picked = [(plans[int(i)], bool(w)) for i, w in zip(episode_traj, episode_won)
                  if plans[int(i)].matched]
        metrics = self.schedule.update([p.cluster for p, _ in picked],
                                       [1.0 if w else 0.0 for _, w in picked],
                                       [p.control for p, _ in picked])
        matched = [p for p in plans if p.matched]
        metrics["guidance/matched_rate"] = len(matched) / max(len(plans), 1)
        metrics["guidance/prefix_steps"] = float(np.mean([len(p.actions) for p in matched])) \
            if matched else 0.0
        metrics["guidance/prefix_share"] = float(np.mean(
            [len(p.actions) / p.expert_steps for p in matched if p.expert_steps])) \
            if matched else 0.0
        return metrics

    def state_dict(self) -> dict:
        """The schedule's state (`GaussianSchedule.state_dict`) and the clusters' thresholds."""
        return {**self.schedule.state_dict(), "thresholds": list(self.thresholds)}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume the schedule; a state made over other clusters (other experts, or another
        guidance.num_difficulty_groups / difficulty_group_mode) is refused."""
        saved = state.get("thresholds")
        if saved is not None and list(saved) != list(self.thresholds):
            raise ValueError(f"the checkpoint's guidance schedule has the difficulty clusters "
                             f"{list(saved)} (expert lengths up to each), this run's experts "
                             f"make {list(self.thresholds)}; resume with the run's own "
                             "guidance.num_difficulty_groups, difficulty_group_mode and env data")
        self.schedule.load_state_dict({k: v for k, v in state.items() if k != "thresholds"})


# --------------------------------------------------------------------------- the unit
class AgentG2(Guidance):
    """The `g2` kind (`rl.guides`): a `Guide` over the experts `prepare` recorded; rollouts play
    in a `ReplayingPool` of the plans' prefixes; redraws `guidance.empty_policy_rollout_retry_limit`
    times a batch whose prefixes left the policy no turn; prefix SFT rows with `sft_coef` > 0."""

    name = "g2"

    def __init__(self, cfg, prepared: Mapping, *, tokenizer, agent):
        super().__init__(cfg)
        g = cfg.guidance
        self.guide = Guide(prepared, tokenizer.encode, g, cfg.env.max_steps)
        self.retries = g.empty_policy_rollout_retry_limit
        self.sft_coef = g.sft_coef
        self.tokenizer, self.agent = tokenizer, agent

    @classmethod
    def prepare(cls, cfg, *, drawn_tasks: Callable[[], list], progress: bool,
                saved: Mapping | None) -> dict:
        """The experts (`EnvSpec.expert_trajectories`: played through the env once, then read
        from the cache) of the training split's tasks, or with guidance.expert_tasks=drawn of
        `drawn_tasks()`; a resumed schedule (`saved`) must have been made over the same difficulty
        clusters (`clusters_of`), or a ValueError says what differs."""
        spec = get_env(cfg.env.name)
        tasks = drawn_tasks() if cfg.guidance.expert_tasks == "drawn" else None
        experts = spec.expert_trajectories(cfg.env, cfg.env.split, progress=progress, tasks=tasks)
        kept = (saved or {}).get("thresholds")
        mine = clusters_of(experts, cfg.guidance)
        if kept is not None and list(kept) != mine:
            raise ValueError(f"--resume: the checkpoint's guidance schedule has the difficulty "
                             f"clusters {list(kept)} (expert lengths up to each), the run's "
                             f"experts make {mine}; resume with its guidance.num_difficulty_groups"
                             ", guidance.difficulty_group_mode and env data")
        return experts

    def plan(self, tasks: Sequence, group_size: int) -> list[Plan]:
        return self.guide.plan(tasks, group_size)

    def pool(self, env_pool, plans: Sequence[Plan], max_steps: int) -> ReplayingPool:
        return ReplayingPool(env_pool, Guide.prefixes(plans), max_steps)

    def update(self, plans, episode_traj, episode_won) -> dict[str, float]:
        return self.guide.update(plans, episode_traj, episode_won)

    def sft_rows(self, batch) -> PrefixSft | None:
        if not self.sft_coef > 0:
            return None
        r = self.cfg.rollout
        return prefix_sft_rows(batch, self.agent, self.tokenizer, r.max_prompt_tokens,
                               r.max_new_tokens)

    def state_dict(self) -> dict:
        return self.guide.state_dict()

    def load_state_dict(self, state: Mapping) -> None:
        self.guide.load_state_dict(state)
