"""Agent-G²'s Gaussian guidance schedule: how many steps of an expert trajectory to replay before
a rollout, drawn per task, with the schedule's online update from the rollouts' successes.

The behaviour is the authors' code (ZJU-REAL/Agent-G2 at 1df588f, `gmsv/alfworld.py` and
`gmsv/webshop.py`); the specification is the design notes, shared/design/agent-g2.md sections 2,
4, 5 and 8. Everything here is pure host code (NumPy, no JAX, no tokenizer of its own):

    thresholds = difficulty_thresholds([len(a) for a in experts], 5)       # e.g. [4, 6, 7, 8, 15]
    group = difficulty_group(len(actions), thresholds)                     # 1-based cluster
    offsets = step_end_offsets(encode, actions)    # tokens of "Step 1: a\\nStep 2: b..." per step
    schedule = GaussianSchedule(len(thresholds), sigma_mode="dynamic_sigma",
                                batch_acc_low=0.5, batch_acc_high=0.5)
    sampled, ratio, control = schedule.sample(group)                       # one draw per task
    steps, extended = prefix_steps(offsets, offsets[-1], ratio, len(actions), max_steps)
    ...                                                                    # replay, roll out
    metrics = schedule.update(groups, successes, controls)                 # one entry per rollout
    state = schedule.state_dict()                                          # with the checkpoint

- Clusters: the experts' lengths are cut into `num_groups` classes (`difficulty_thresholds`, the
  authors' balanced search over cut points; or the fixed `short_medium_long` / `webshop_3`
  cuts); a task's cluster is its expert's length class (`difficulty_group`).
- Depth: a ratio r in [0, max_length] of the expert's "Step k: action" text, counted in the
  policy's tokens, rounded up to the end of a step and capped so that the policy plays at least
  the expert's last step (`prefix_steps`).
- The schedule (`GaussianSchedule`): per cluster k an EMA of the success rate A_k and of its
  variance V_k, and one global centre mu_global. r ~ N(mu_k, sigma_k) clipped, with
  mu_k = clip(mu_global + lambda (0.5 - A_k), 0, max_length) and sigma_k the variance EMA (not a
  standard deviation) floored at sigma_min, or a fixed sigma. After each training batch the
  clusters' EMAs take the batch's float32 mean and variance of the per-rollout 0/1 successes, and
  mu_global moves by one delta against the batch's success (more guidance when it is low).
- Controls: a fraction of the training tasks (`train_no_prefix_ratio`), or all of them in the
  frozen no-prefix baseline, play without a prefix and are left out of the schedule's update.

The options are taken by the authors' key names (`ScheduleOptions` holds them under ours where
those would collide with `algo.*`: `guidance_specs.AUTHORS_NAMES`); their defaults are the
authors' yaml (`verl/trainer/config/ppo_trainer.yaml`, block `gmsv:`), not the fallbacks in their
code (those differ for mu_global_init, mu_global_max, lambda_value and max_length). The ALFWorld
and WebShop scripts set sigma_mode="dynamic_sigma", batch_acc_low = batch_acc_high = 0.5.
`ScheduleOptions` and `SCHEDULE_DEFAULTS` need nothing but NumPy; the config's `guidance`
section is built from the same declaration (`hgpo_jax.guidance_specs`).

Reproduced as the authors have them (the design notes' section 8): the successes are per rollout
(the 8 rollouts of a task are 8 values); the statistics are float32 (3/5 is above 0.6); a batch
with no value counts as success 0 and raises mu_global; the frozen baseline changes nothing;
no_prefix_when_mu_zero skips the prefix but does not make a control; the random generator's draws
come in the authors' order and it is not part of the saved state (a resumed schedule draws from
its seed again); loading a state adds the clusters it names.

Stricter than the authors (their code would accept or fail later): an unknown option name is a
TypeError; an unknown sigma_mode (theirs: any name but fixed_sigma is dynamic), prefix_sample_mode
or difficulty mode (theirs: auto), a negative uniform_half_width (theirs: at the first uniform
draw) and num_groups < 1 are ValueErrors when built; a loaded state whose scoreboard is not a
mapping (theirs: ignored) or names a cluster below 1 is a ValueError.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hgpo_jax.guidance_specs import (AUTHORS_NAMES, GROUP_MODES, SAMPLE_MODES, SIGMA_MODES,
                                     ScheduleOptions)

DIFFICULTY_MODES = GROUP_MODES
MIN_SCALE = 1e-8  # the Gaussian's smallest scale (sigma 0 would make NumPy return mu itself)


def _convert(name: str, value: Any, kind: str) -> Any:
    """`value` as option `name` of type `kind` ("str", "float", "int", "bool"), or ValueError."""
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{name}={value!r}: expected a string")
        return value
    if kind == "bool":
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral)
                                                   and value in (0, 1)):
            return bool(value)
        raise ValueError(f"{name}={value!r}: expected true or false")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}={value!r}: expected a number")
    if kind == "int":
        if int(value) != value:
            raise ValueError(f"{name}={value!r}: expected an integer")
        return int(value)
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}={value!r}: expected a finite number")
    return float(value)


def _clip(value: float, low: float, high: float) -> float:
    """max(low, min(high, value)): low wins when low > high, as in the authors' clip."""
    return max(low, min(high, value))


def schedule_options(options: Mapping[str, Any]) -> ScheduleOptions:
    """The schedule's options (`guidance_specs.ScheduleOptions`, declared there once for the
    config's `guidance` section too) from a mapping of the authors' key names: an unknown name is
    a TypeError that names it and the known ones; values are converted the authors' way (float /
    int / str; flags booleans or 0/1) and checked, a bad one a ValueError naming it."""
    unknown = [name for name in options if name not in SCHEDULE_OPTION_NAMES]
    if unknown:
        raise TypeError(f"unknown guidance schedule option(s) {unknown}; known: "
                        f"{list(SCHEDULE_OPTION_NAMES)}")
    by_authors = {AUTHORS_NAMES.get(f.name, f.name): f  # the authors' name -> our field
                  for f in dataclasses.fields(ScheduleOptions)}
    built = ScheduleOptions(**{by_authors[name].name: _convert(name, value, by_authors[name].type)
                               for name, value in options.items()})
    built.check()
    return built


SCHEDULE_DEFAULTS: dict[str, Any] = ScheduleOptions().authors_options()  # the authors' names
SCHEDULE_OPTION_NAMES = tuple(SCHEDULE_DEFAULTS)


# ------------------------------------------------------------------------------------ clusters
def difficulty_thresholds(action_counts: Sequence[int], num_groups: int,
                          mode: str = "auto") -> list[int]:
    """The clusters' upper length bounds, one per cluster, ascending (section 5.1).

    Args:
      action_counts: [T] ints >= 0, the expert trajectories' lengths (steps).
      num_groups: the number of clusters K in mode `auto` (below 1 counts as 1); the fixed modes
        have 3 clusters whatever it says.
      mode: `auto` (balanced clusters), `short_medium_long` ([4, 7, max(8, longest)]) or
        `webshop_3` ([4, 5, max(6, longest)]).

    Returns: K ints >= 1. In `auto`, when the lengths have at least K distinct values, every way
    to cut the sorted distinct lengths into K runs is scored by (largest - smallest run size,
    sum of |size - T/K|) and the first best in lexicographic order of the cuts wins (the search
    is exhaustive, as the authors'); with fewer distinct values, the thresholds are the
    truncated linear quantiles at K-1 evenly spaced levels above 0, duplicates dropped, padded.
    """
    counts = [_length(n) for n in action_counts]
    longest = max(counts) if counts else None
    if mode == "short_medium_long":
        return [4, 7, max(8, longest if longest is not None else 8)]
    if mode == "webshop_3":
        return [4, 5, max(6, longest if longest is not None else 6)]
    if mode != "auto":
        raise ValueError(f"difficulty mode {mode!r}: expected one of {DIFFICULTY_MODES}")
    k = max(1, int(num_groups))
    if not counts:
        return [1] * k
    lengths, sizes = np.unique(np.asarray(counts, dtype=np.int64), return_counts=True)
    if len(lengths) < k:
        return _quantile_thresholds(counts, k)
    return _balanced_thresholds(lengths.tolist(), sizes.tolist(), k)


def _length(n: Any) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"action count {n!r}: expected an integer >= 0")
    return int(n)


def _quantile_thresholds(counts: list[int], k: int) -> list[int]:
    """Fewer distinct lengths than clusters: truncated quantiles, a value kept when above the
    last kept raw value (stored at least 1), padded with the last stored value (1 if none)."""
    out: list[int] = []
    last_raw: int | None = None
    for level in np.linspace(0.0, 1.0, k)[1:]:
        raw = int(np.quantile(counts, level))
        if last_raw is None or raw > last_raw:
            out.append(max(1, raw))
            last_raw = raw
    while len(out) < k:
        out.append(out[-1] if out else 1)
    return out[:k]


def _balanced_thresholds(lengths: list[int], sizes: list[int], k: int) -> list[int]:
    """Exhaustive search over the K-1 cut points between the sorted distinct `lengths` (with
    `sizes` tasks each); the first strictly best (spread, imbalance) in lexicographic order."""
    ends = np.cumsum(sizes).tolist()  # tasks up to and including distinct length i
    target = sum(sizes) / float(k)
    best_cuts: tuple[int, ...] | None = None
    best: tuple[int, float] | None = None
    for cuts in itertools.combinations(range(1, len(lengths)), k - 1):
        runs = []
        start = 0
        for stop in (*cuts, len(lengths)):
            runs.append(ends[stop - 1] - (ends[start - 1] if start else 0))
            start = stop
        score = (max(runs) - min(runs), float(sum(abs(n - target) for n in runs)))
        if best is None or score < best:
            best, best_cuts = score, cuts
    assert best_cuts is not None  # len(lengths) >= k: there is at least one way to cut
    return [max(1, lengths[i - 1]) for i in best_cuts] + [max(1, lengths[-1])]


def difficulty_group(action_count: int, thresholds: Sequence[int]) -> int:
    """The 1-based cluster of an expert of `action_count` steps: the first threshold >= it, else
    the last cluster."""
    if not thresholds:
        raise ValueError("difficulty_group needs at least one threshold")
    for group, bound in enumerate(thresholds, start=1):
        if action_count <= bound:
            return group
    return len(thresholds)


# --------------------------------------------------------------------------------------- depth
def prefix_text(actions: Sequence[str]) -> str:
    """The expert's actions as the lines "Step 1: a", "Step 2: b", ..., joined by one newline
    (nothing after the last). Only its tokens are counted: the policy never sees it."""
    return "\n".join(f"Step {i}: {action}" for i, action in enumerate(actions, start=1))


def step_end_offsets(encode: Callable[[str], Sequence[int]], actions: Sequence[str]) -> list[int]:
    """[len(actions)] token counts: entry j is the length of `encode(prefix_text(actions[:j+1]))`.

    Each prefix is encoded whole (a BPE merge across a line break counts, so summing per-step
    counts would differ). `encode(text) -> token ids` is the policy's tokenizer without special
    tokens. The last entry is the whole text's length, the `total_tokens` of `prefix_steps`.
    """
    return [len(encode(prefix_text(actions[: j + 1]))) for j in range(len(actions))]


def prefix_steps(step_end_offsets: Sequence[int], total_tokens: int, ratio: float,
                 total_steps: int, max_steps: int,
                 allow_full_prefix: bool = False) -> tuple[int, bool]:
    """How many expert steps to replay for a clipped ratio (section 5.3).

    The target is floor(total_tokens * ratio) tokens (clamped to [0, total_tokens]); the prefix is
    the first steps whose text reaches it, rounded up to the end of a step. The cap is
    min(total_steps - 1, max_steps - 1) (at least 0), so the policy always plays the expert's last
    step and at least one step of its budget; with `allow_full_prefix`, min(total_steps,
    max_steps).

    Args:
      step_end_offsets: [total_steps] ints, from `step_end_offsets`.
      total_tokens: the whole text's token count (the last offset).
      ratio: the clipped ratio of `GaussianSchedule.sample`.
      total_steps: the expert's step count; max_steps: the episode's step budget.

    Returns: (steps, extended): steps to replay, in [0, cap]; extended is True when the target
    fell inside a step and the prefix was rounded up to its end (False at 0, at the whole text and
    at the cap).
    """
    total_steps, total_tokens, max_steps = int(total_steps), int(total_tokens), int(max_steps)
    if total_steps <= 0 or total_tokens <= 0:  # the authors plan no prefix (and draw no ratio)
        return 0, False
    target = min(max(int(math.floor(total_tokens * float(ratio))), 0), total_tokens)
    if target == 0:
        steps, extended = 0, False
    elif target == total_tokens:
        steps, extended = total_steps, False
    else:
        steps = next((j for j, end in enumerate(step_end_offsets, start=1) if end >= target),
                     total_steps)
        if steps > len(step_end_offsets):
            raise ValueError(f"step_end_offsets {list(step_end_offsets)} end below the target "
                             f"{target} of {total_tokens} tokens")
        extended = bool(step_end_offsets[steps - 1] > target)
    if allow_full_prefix:
        cap = max(min(total_steps, max_steps), 0)
    else:
        cap = max(min(total_steps - 1, max_steps - 1), 0)
    if steps > cap:
        return cap, False
    return steps, extended


# ------------------------------------------------------------------------------------ schedule
class GaussianSchedule:
    """The per-cluster Gaussian over the replay ratio and its online update (section 4).

        schedule = GaussianSchedule(5, sigma_mode="dynamic_sigma")
        sampled, ratio, control = schedule.sample(group, is_train=True)
        metrics = schedule.update(groups, successes, fixed_no_prefix)

    Args:
      num_groups: the number of clusters (>= 1); clusters are 1..num_groups (a loaded state may
        add more, as the authors' loader does).
      **options: `ScheduleOptions`' fields by the authors' names; an unknown name is a TypeError.

    Attributes:
      options: the `ScheduleOptions`.
      mu_global: the global centre, a float in [mu_global_min, mu_global_max].

    The generator is `numpy.random.default_rng(seed)`, owned by the schedule; `sample` draws from
    it in the authors' order, so the sequence of calls (and their groups and flags) decides every
    draw. It is not part of `state_dict`.
    """

    def __init__(self, num_groups: int, **options: Any) -> None:
        if (isinstance(num_groups, (bool, np.bool_))
                or not isinstance(num_groups, numbers.Integral) or num_groups < 1):
            raise ValueError(f"num_groups={num_groups!r}: expected an integer >= 1")
        self.options = schedule_options(options)
        self.num_groups = int(num_groups)
        o = self.options
        self._rng = np.random.default_rng(o.seed)
        # cluster -> [A_k, V_k] (insertion order: 1..K, then clusters added by a loaded state)
        self._stats: dict[int, list[float]] = {
            g: [o.initial_group_accuracy, o.initial_group_variance]
            for g in range(1, self.num_groups + 1)}
        self.mu_global = _clip(o.mu_global_init, o.mu_global_min, o.mu_global_max)

    # ---------------------------------------------------------------------------- per cluster
    @property
    def groups(self) -> tuple[int, ...]:
        """The clusters the schedule knows, in order (1..num_groups, then any a state added)."""
        return tuple(self._stats)

    def _entry(self, group: int) -> list[float]:
        try:
            return self._stats[int(group)]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"cluster {group!r} is not one of this schedule's "
                             f"{list(self._stats)}") from None

    def accuracy(self, group: int) -> float:
        """A_k, the EMA of the cluster's per-rollout success."""
        return self._entry(group)[0]

    def variance(self, group: int) -> float:
        """V_k, the EMA of the cluster's batch variance of the per-rollout success."""
        return self._entry(group)[1]

    def mu(self, group: int) -> float:
        """mu_k = clip(mu_global + lambda_value (0.5 - A_k), 0, max_length)."""
        o = self.options
        return _clip(self.mu_global + o.lambda_value * (0.5 - self.accuracy(group)), 0.0,
                     o.max_length)

    def sigma(self, group: int) -> float:
        """sigma_k: fixed_sigma, or max(sigma_min, gamma V_k) (a variance used as the spread)."""
        o = self.options
        variance = self.variance(group)
        if o.sigma_mode == "fixed_sigma":
            return o.fixed_sigma
        return float(max(o.sigma_min, o.sigma_gamma * variance))

    # --------------------------------------------------------------------------------- draws
    def sample(self, group: int, *, is_train: bool = True,
               empty: bool = False) -> tuple[float, float, bool]:
        """One task's draw (section 4.3): (sampled ratio, clipped ratio, control).

        In this order: the frozen baseline makes every task a control with no prefix; in
        training with train_no_prefix_ratio > 0, one `random()` below the ratio makes the task a
        control with no prefix (drawn in the frozen baseline too, never in validation);
        no_prefix_when_mu_zero with mu_k <= 0 gives no prefix but no control. Without a prefix
        the answer is (0.0, 0.0, control), with no further draw. Otherwise `gaussian` draws one
        `normal(mu_k, max(sigma_k, 1e-8))` and clips it to [0, max_length]; `uniform_fixed` draws
        one `uniform(low, high)` around clip(mu_k, 0, r_max), r_max = min(1, max(0,
        max_length)), half width uniform_half_width, clipped to [0, r_max] (low without a draw
        when the interval is empty), and the sampled ratio is the ratio.

        `empty`: the task's expert has no step (or its text no token): no prefix and no ratio
        draw, but the control's draw above still happens (the authors' order).
        """
        o = self.options
        mu = self.mu(group)
        sigma = self.sigma(group)
        no_prefix = control = o.frozen_no_prefix_baseline
        if is_train and o.train_no_prefix_ratio > 0.0:
            drawn = bool(self._rng.random() < o.train_no_prefix_ratio)
            no_prefix = no_prefix or drawn
            control = control or drawn
        if o.no_prefix_when_mu_zero and mu <= 0.0:
            no_prefix = True
        if no_prefix or empty:
            return 0.0, 0.0, control
        if o.prefix_sample_mode == "gaussian":
            sampled = float(self._rng.normal(loc=mu, scale=max(sigma, MIN_SCALE)))
            return sampled, _clip(sampled, 0.0, o.max_length), control
        r_max = min(1.0, max(0.0, o.max_length))
        centre = _clip(mu, 0.0, r_max)
        low = max(0.0, centre - o.uniform_half_width)
        high = min(r_max, centre + o.uniform_half_width)
        ratio = float(self._rng.uniform(low, high)) if high > low else float(low)
        return ratio, ratio, control

    # -------------------------------------------------------------------------------- update
    def update(self, groups: Sequence[int], successes: Sequence[float],
               fixed_no_prefix: Sequence[bool] | None = None) -> dict[str, float]:
        """The schedule's update after a training batch (section 4.4); returns its metrics.

        Args:
          groups: [R] ints, each rollout's cluster, in batch order. Only expert-matched rollouts
            that played at least one policy turn belong here.
          successes: [R] numbers, success when > 0 in float32 (episode rewards or 0/1).
          fixed_no_prefix: [R] bools, the rollouts that are controls (`sample`'s third value);
            they only count in the metrics. None: no control.

        Per cluster with at least one non-control rollout, in the order the clusters first come:
        m and v, the float32 mean and population variance of its 0/1 values, enter the EMAs
        A_k <- (1 - alpha) A_k + alpha m, V_k likewise with v. The batch success b is the float32
        mean of all non-control values (0.0 when there is none): b < batch_acc_low raises
        mu_global by global_step_delta, else b > batch_acc_high lowers it; then clipped to
        [mu_global_min, mu_global_max]. The frozen baseline changes nothing. An empty call is an
        update too (b = 0: mu_global rises), as when every rollout of a batch was unmatched; the
        authors skip the update only when their batch holds no row at all (not even an
        unmatched rollout's): a caller without any row does not call `update`.

        Metrics (floats): guidance/rollouts, guidance/controls, guidance/success (all rollouts),
        guidance/batch_success (b), guidance/mu_global_before, guidance/mu_global; per updated
        cluster k guidance/group_k/batch_mean and batch_var; per cluster guidance/group_k/A, V,
        mu and sigma after the update.
        """
        groups = [int(self._check_group(g)) for g in groups]
        # the authors compare the float32 reward with 0 (the notes say "> 0": 1e-50 is no success)
        won = np.asarray(successes, dtype=np.float32).reshape(-1) > 0.0
        controls = (np.zeros(len(groups), dtype=bool) if fixed_no_prefix is None
                    else np.asarray(fixed_no_prefix, dtype=bool).reshape(-1))
        if not len(won) == len(controls) == len(groups):
            raise ValueError(f"update: {len(groups)} groups, {len(won)} successes and "
                             f"{len(controls)} control flags; expected one of each per rollout")
        values = [1.0 if w else 0.0 for w in won.tolist()]
        per_group: dict[int, list[float]] = {}
        for group, value, control in zip(groups, values, controls.tolist()):
            if not control:
                per_group.setdefault(group, []).append(value)
        kept = [v for v, c in zip(values, controls.tolist()) if not c]
        o = self.options
        metrics = {"guidance/rollouts": float(len(values)),
                   "guidance/controls": float(controls.sum()),
                   "guidance/success": _mean32(values),
                   "guidance/batch_success": _mean32(kept),
                   "guidance/mu_global_before": float(self.mu_global)}
        if not o.frozen_no_prefix_baseline:
            for group, vals in per_group.items():
                arr = np.asarray(vals, dtype=np.float32)
                mean, var = float(arr.mean()), float(arr.var())
                entry = self._stats[group]
                entry[0] = (1.0 - o.ema_alpha) * entry[0] + o.ema_alpha * mean
                entry[1] = (1.0 - o.ema_alpha) * entry[1] + o.ema_alpha * var
                metrics[f"guidance/group_{group}/batch_mean"] = mean
                metrics[f"guidance/group_{group}/batch_var"] = var
            b = metrics["guidance/batch_success"]
            if b < o.batch_acc_low:
                self.mu_global += o.global_step_delta
            elif b > o.batch_acc_high:
                self.mu_global -= o.global_step_delta
            self.mu_global = _clip(self.mu_global, o.mu_global_min, o.mu_global_max)
        metrics["guidance/mu_global"] = float(self.mu_global)
        for group in self._stats:
            metrics[f"guidance/group_{group}/A"] = self.accuracy(group)
            metrics[f"guidance/group_{group}/V"] = self.variance(group)
            metrics[f"guidance/group_{group}/mu"] = self.mu(group)
            metrics[f"guidance/group_{group}/sigma"] = self.sigma(group)
        return metrics

    def _check_group(self, group: Any) -> int:
        self._entry(group)
        return int(group)

    # --------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The schedule's state in the authors' file format (their gmsv_runtime_state.json):
        {"mu_global": float, "scoreboard": {"1": {"accuracy_ema": A_1, "variance_ema": V_1},
        ...}}. Not the generator (the authors do not save it either)."""
        return {"mu_global": float(self.mu_global),
                "scoreboard": {str(g): {"accuracy_ema": float(a), "variance_ema": float(v)}
                               for g, (a, v) in self._stats.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a `state_dict` or the authors' state file (its other keys, such as
        loaded_global_step and train_batches_completed, are ignored).

        mu_global (if given) is clipped to [mu_global_min, mu_global_max]; each listed cluster's
        fields replace the current ones (a missing field keeps its value; a cluster not known yet
        is added from the initial values first). The frozen baseline loads nothing. The generator
        is not touched: a fresh schedule that loads a state draws from its seed again.
        """
        if not isinstance(state, Mapping):
            raise ValueError(f"a guidance schedule state is a mapping, got {type(state).__name__}")
        if self.options.frozen_no_prefix_baseline:
            return
        o = self.options
        mu_global = _clip(float(state.get("mu_global", self.mu_global)), o.mu_global_min,
                          o.mu_global_max)
        board = state.get("scoreboard", {})
        if not isinstance(board, Mapping):
            raise ValueError(f"scoreboard: expected a mapping of clusters, got {board!r}")
        loaded: dict[int, list[float]] = {}
        for key, fields in board.items():
            group = int(key)
            if group < 1 or not isinstance(fields, Mapping):
                raise ValueError(f"scoreboard[{key!r}] = {fields!r}: expected a cluster >= 1 "
                                 "with accuracy_ema and variance_ema")
            current = self._stats.get(group, [o.initial_group_accuracy,
                                              o.initial_group_variance])
            loaded[group] = [float(fields.get("accuracy_ema", current[0])),
                             float(fields.get("variance_ema", current[1]))]
        self.mu_global = mu_global
        self._stats.update(loaded)


def _mean32(values: list[float]) -> float:
    """The float32 mean of `values` as a Python float, 0.0 when empty (the authors' batch means)."""
    return float(np.asarray(values, dtype=np.float32).mean()) if values else 0.0
