"""What each kind of guidance is, in the words the config checks and the RL core act on (no JAX).

    spec = guidance_spec("g2")        # GuidanceSpec(name="g2", experts=True, options=(G2Options,))
    spec.reads()                      # the `guidance` keys it reads
    ScheduleOptions(sigma_mode="dynamic_sigma")   # Agent-G²'s schedule (rl.guidance)

Guidance changes how a training rollout is played or trained on, for any algorithm: the config's
`guidance.kind` chooses it (`none` by default). Like an algorithm (`algo_specs`), a kind has two
halves: its declaration here (its name, what it needs of the env, its option classes with their
checks), which the config validates against, and its unit in `hgpo_jax.rl.guides` (plan,
rollout wrapper, update, supervised rows, state), which the trainer runs. The config's `guidance`
section is every kind's options together (`GUIDANCE_OPTIONS`, flat keys) and refuses a key that
the chosen kind does not read.

The first kind, `g2`: Agent-G² (Wang, Miao et al. 2026) replays the first steps of an expert
trajectory before each rollout; how deep is drawn per task from a Gaussian whose centre and
spread are estimated online per difficulty cluster (`hgpo_jax.rl.guidance`, docs/guidance.md).
Its options keep the authors' key names (their `gmsv:` block, ZJU-REAL/Agent-G2 at 1df588f) and
their yaml's defaults, but for two that would read as `algo.gamma` and `algo.alpha` beside them:
the authors' `gamma` (dynamic_sigma's factor) is `sigma_gamma` and their `alpha` (the EMAs'
weight) `ema_alpha` (`AUTHORS_NAMES`; `rl.guidance` takes the authors' names).
`hgpo_jax/configs/g2_*` set their scripts' values.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hgpo_jax.algo_specs import Options
from hgpo_jax.problems import Problems, is_int, is_number

SIGMA_MODES = ("fixed_sigma", "dynamic_sigma")  # the authors': any mode but fixed is dynamic
SAMPLE_MODES = ("gaussian", "uniform_fixed")
GROUP_MODES = ("auto", "short_medium_long", "webshop_3")
EXPERT_TASKS = ("split", "drawn")
# our name of a schedule option -> the authors' (`rl.guidance` takes the authors' names)
AUTHORS_NAMES = {"ema_alpha": "alpha", "sigma_gamma": "gamma"}


@dataclass
class ScheduleOptions(Options):
    """The schedule's options (`rl.guidance.GaussianSchedule`), the authors' names and defaults.

    Centre of cluster k: mu_k = clip(mu_global + lambda_value (0.5 - A_k), 0, max_length); spread:
    fixed_sigma, or max(sigma_min, sigma_gamma V_k) (the variance EMA itself, as the authors');
    A_k and V_k are EMAs of weight ema_alpha; mu_global
    moves by global_step_delta when the batch's success is below batch_acc_low (up) or above
    batch_acc_high (down), within [mu_global_min, mu_global_max]."""

    sigma_mode: str = "fixed_sigma"  # fixed_sigma | dynamic_sigma (max(sigma_min, gamma * V_k))
    mu_global_init: float = 0.8  # the global centre's start (clipped to [min, max])
    mu_global_min: float = 0.0
    mu_global_max: float = 0.8
    global_step_delta: float = 0.1  # mu_global's step after a batch too easy or too hard
    batch_acc_low: float = 0.4  # a batch's success below this: deeper prefixes (mu_global up)
    batch_acc_high: float = 0.6  # above this: shallower (mu_global down)
    ema_alpha: float = 0.2  # the EMAs' weight of a new batch (A_k, V_k; the authors' alpha)
    lambda_value: float = 0.3  # how far a cluster's success moves its centre from mu_global
    max_length: float = 0.8  # the largest prefix ratio (of the expert's tokens)
    sigma_min: float = 0.1  # dynamic_sigma's floor
    sigma_gamma: float = 1.0  # dynamic_sigma's factor of V_k (the authors' gamma)
    fixed_sigma: float = 0.25  # fixed_sigma's spread
    prefix_sample_mode: str = "gaussian"  # gaussian | uniform_fixed (ALFWorld only, as the authors')
    uniform_half_width: float = 0.25  # uniform_fixed's half width (>= 0)
    no_prefix_when_mu_zero: bool = False  # no prefix for a cluster whose centre is 0 (no control)
    frozen_no_prefix_baseline: bool = False  # never a prefix, nothing learned (a control run)
    train_no_prefix_ratio: float = 0.0  # share of training tasks drawn without a prefix (controls)
    initial_group_accuracy: float = 0.0  # A_k's start
    initial_group_variance: float = 0.0  # V_k's start
    seed: int = 1  # the schedule's NumPy generator (not checkpointed, as the authors')

    def _own_problems(self, p: Problems) -> None:
        p.one_of("sigma_mode", self.sigma_mode, SIGMA_MODES)
        for name in ("mu_global_init", "mu_global_min", "mu_global_max", "global_step_delta",
                     "batch_acc_low", "batch_acc_high", "ema_alpha", "lambda_value", "max_length",
                     "sigma_min", "sigma_gamma", "fixed_sigma", "train_no_prefix_ratio",
                     "initial_group_accuracy", "initial_group_variance"):
            p.finite(name, getattr(self, name))  # as the authors' (e.g. max_length < 0: no prefix)
        p.non_negative("uniform_half_width", self.uniform_half_width)
        p.one_of("prefix_sample_mode", self.prefix_sample_mode, SAMPLE_MODES)
        p.check(is_int(self.seed) and self.seed >= 0, "seed", self.seed, ">= 0 (an int)")

    @classmethod
    def of(cls, options) -> ScheduleOptions:
        """The schedule's options of any object holding these fields (the `guidance` section)."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls)})

    def authors_options(self) -> dict[str, Any]:
        """These options by the authors' names (`rl.guidance.GaussianSchedule(**...)`)."""
        return {AUTHORS_NAMES.get(f.name, f.name): getattr(self, f.name) for f in fields(self)}


@dataclass
class G2Options(ScheduleOptions):
    """Agent-G²'s guidance (`guidance.kind=g2`): the schedule's options and how the experts are
    clustered and replayed."""

    difficulty_group_mode: str = "auto"  # auto (balanced clusters) | short_medium_long | webshop_3
    num_difficulty_groups: int = 5  # auto's clusters (the authors' ALFWorld script: 5)
    allow_full_prefix: bool = False  # let a prefix hold the expert's last step (ALFWorld only)
    share_prefix_within_group: bool = True  # one draw per task, shared by its group's rollouts
    empty_policy_rollout_retry_limit: int = 3  # redraws when no env of a batch played a turn
    sft_coef: float = 0.0  # prefix SFT: weight of the replayed steps' supervised term (scripts: 0.5)
    expert_tasks: str = "split"  # split (every training task) | drawn (those the run's iterations draw)

    def _own_problems(self, p: Problems) -> None:
        p.one_of("difficulty_group_mode", self.difficulty_group_mode, GROUP_MODES)
        p.check(is_int(self.num_difficulty_groups) and self.num_difficulty_groups >= 1,
                "num_difficulty_groups", self.num_difficulty_groups, ">= 1 (an int)")
        p.check(is_int(self.empty_policy_rollout_retry_limit)
                and self.empty_policy_rollout_retry_limit >= 0,
                "empty_policy_rollout_retry_limit", self.empty_policy_rollout_retry_limit,
                ">= 0 (an int)")
        p.non_negative("sft_coef", self.sft_coef, "0: no prefix SFT")
        p.one_of("expert_tasks", self.expert_tasks, EXPERT_TASKS)
        # a run's schedule in the ranges where it means something (the schedule itself, as the
        # authors', takes any finite values: `rl.guidance.GaussianSchedule`)
        for name in ("batch_acc_low", "batch_acc_high", "ema_alpha", "train_no_prefix_ratio",
                     "initial_group_accuracy"):  # shares and success rates
            p.in_range(name, getattr(self, name), 0, 1, "in [0, 1]")
        for name in ("fixed_sigma", "sigma_min", "global_step_delta", "initial_group_variance"):
            p.non_negative(name, getattr(self, name))
        for low, high, why in (("mu_global_min", "mu_global_max", ": mu_global moves between them"),
                               ("batch_acc_low", "batch_acc_high", "")):
            a, b = getattr(self, low), getattr(self, high)
            if is_number(a) and is_number(b):
                p.check(a <= b, low, a, f"<= guidance.{high} ({b}){why}")



# ------------------------------------------------------------------------------------- kinds
@dataclass
class GuidanceChoice(Options):
    """Which guidance (first in the guidance section)."""

    kind: str = "none"  # none | g2 (Agent-G²'s expert prefixes); `guidance_kind_names()`

    def _own_problems(self, p: Problems) -> None:
        p.one_of("kind", self.kind, guidance_kind_names())


@dataclass(frozen=True)
class GuidanceSpec:
    """One kind of guidance as the rest of the system sees it (`guidance.kind` = `name`).

    options: the option classes whose fields it reads (the other kinds' keys are refused for it);
    experts: it replays the env's expert trajectories (the env must record them,
    `EnvSpec.expert_trajectories`, and an episode needs a step left for the policy); summary:
    one line for docs and errors."""

    name: str
    summary: str
    options: tuple[type, ...] = ()
    experts: bool = False

    def reads(self) -> tuple[str, ...]:
        """The `guidance` keys of its options, in declaration order."""
        return tuple(dict.fromkeys(f.name for cls in self.options for f in fields(cls)))


# The option classes of every kind: the bases of `config.GuidanceConfig` (flat `guidance.<key>`);
# a new kind's options class goes here, its declaration into GUIDANCE_KINDS.
GUIDANCE_OPTIONS: tuple[type, ...] = (G2Options,)
GUIDANCE_KINDS: dict[str, GuidanceSpec] = {s.name: s for s in (
    GuidanceSpec("none", "no guidance: the policy plays every step"),
    GuidanceSpec("g2", "Agent-G²: an expert prefix replayed before each rollout, its depth drawn "
                 "from a Gaussian schedule per difficulty cluster", options=(G2Options,),
                 experts=True),
)}


def guidance_kind_names() -> tuple[str, ...]:
    return tuple(GUIDANCE_KINDS)


def guidance_spec(name: str) -> GuidanceSpec:
    """The declaration of guidance kind `name` (a ValueError naming the known kinds)."""
    if name not in GUIDANCE_KINDS:
        raise ValueError(f"unknown guidance.kind {name!r}; known: {', '.join(GUIDANCE_KINDS)}")
    return GUIDANCE_KINDS[name]


def kind_of_enable(enable: Any) -> str:
    """The `guidance.kind` of the old key `guidance.enable` (then Agent-G²'s or none)."""
    return "g2" if str(enable).lower() in ("true", "1", "yes") else "none"


def guidance_readers(key: str) -> tuple[str, ...]:
    """The kinds that read `guidance.<key>`."""
    return tuple(n for n, s in GUIDANCE_KINDS.items() if key in s.reads())
