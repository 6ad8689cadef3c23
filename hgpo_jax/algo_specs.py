"""What each algorithm is, in the words the config checks and the RL core acts on (no JAX).

    spec = algorithm_spec("ppo")      # AlgorithmSpec(name="ppo", family="critic", critic_heads=1, ...)
    spec.has_critic, spec.token_advantages, spec.singleton_groups, spec.sections
    GroupOptions(K=4)                 # the group estimators' options, checked when built

An algorithm has two halves: its declaration here (its name, what it needs of the run, its
options with their checks), which `hgpo_jax.config` validates configs against, and its family's
unit in `hgpo_jax.rl.algorithms` (its advantage stage and loss pieces), which the trainer and
`plan` run. The config sits below the RL core and may not import it, so the declarations live in
this module below both; nothing here imports JAX or the rest of the package but `problems`.

Options are declared once, as dataclass fields beside the method that checks them
(`_own_problems`): `LossOptions` (the PPO-KL loss of the policy, every family), `ReturnOptions`
(discount and invalid-action penalty, shared), `GroupOptions` (GRPO, RLOO, GiGPO, HGPO),
`GAEOptions` (PPO's critic). The config's `algo` section is all of them together
(`hgpo_jax.config.AlgoConfig`), so YAML keys stay flat (`algo.K`, `algo.lam`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from hgpo_jax.problems import Problems, is_int, is_number, suggest

# The option names the RL core acts on
MODES = ("mean_std_norm", "mean_norm")  # the groups' normalization
PENALTY_PLACEMENTS = ("row", "reward")  # where the invalid-action penalty goes
STATS = ("verl-agent", "paper")  # which steps' returns make the group statistics
LEVEL_WEIGHTS = ("verl-agent", "paper")  # HGPO's weights of the levels
KL_TYPES = ("low_var_kl", "kl", "mse")  # rl.loss
AGGS = ("token-mean", "seq-mean")  # the loss aggregation (rl.loss)
INVALID_PENALTY = 0.1  # the paper's and the authors' invalid-action penalty
ONE_SCORE_CONFLICT = ("stats='paper' gives each trajectory one score, which a penalty on single "
                      "rows (penalty_placement='row') cannot keep")


# ------------------------------------------------------------------------------------- options
class Options:
    """Options checked beside their fields: each class in the MRO that defines `_own_problems`
    checks the fields it declares, once."""

    def problems(self, prefix: str = "", code: bool = False) -> list[str]:
        """Every problem of these options ("<prefix><key>=<value>: ..."), in declaration order
        (`code`: worded for options built in code, `Problems`)."""
        p = Problems(prefix, code)
        for cls in reversed(type(self).__mro__):
            own = cls.__dict__.get("_own_problems")
            if own is not None:
                own(self, p)
        return p.items

    def check(self) -> None:
        """Raise a ValueError naming every problem (for options built in code)."""
        items = self.problems(code=True)
        if items:
            raise ValueError("; ".join(items))


@dataclass
class ReturnOptions(Options):
    """The step returns every family uses."""

    gamma: float = 0.95  # discount of the step returns R_t; ppo: GAE's gamma (verl-agent's algorithm.gamma, 1.0 in its PPO runs)
    invalid_penalty: float = INVALID_PENALTY  # subtracted for a step whose reply holds no valid action

    def _own_problems(self, p: Problems) -> None:
        p.in_range("gamma", self.gamma, 0, 1, "in [0, 1]")
        p.non_negative("invalid_penalty", self.invalid_penalty,
                       "it is subtracted for invalid steps; the paper's is 0.1")


@dataclass
class GroupOptions(ReturnOptions):
    """GRPO, RLOO, GiGPO and HGPO (docs/advantages.md); the defaults reproduce the authors' code
    (verl-agent). Built in code (`rl.advantages.AdvantageOptions` is this class) it is checked at
    once and raises a ValueError naming the option."""

    K: int = 2  # hgpo: highest context depth (groups of steps sharing the last k+1 observations)
    alpha: float = 1.0  # hgpo: level weight exponent (see level_weights)
    mode: str = "mean_std_norm"  # group normalization: mean_std_norm | mean_norm
    omega: float = 1.0  # gigpo: weight of the step-level term
    eps: float = 1e-6  # added to the group std
    penalty_placement: str = "row"  # row: the invalid row's return and score | reward: in r_t
    stats: str = "verl-agent"  # episode statistics: verl-agent (step rows, unbiased std) | paper
    level_weights: str = "verl-agent"  # hgpo: verl-agent ((d+2)^alpha) | paper ((d+1)^alpha)
    base_group: bool = False  # hgpo: add the episode-level value as an item of weight 1
    similarity_thresh: float | None = None  # gigpo, hgpo: null = steps group by equal anchors; in (0, 1): by similar anchors (difflib ratio >= this; verl-agent's algorithm.gigpo.similarity_thresh)

    def __post_init__(self) -> None:
        if type(self) is GroupOptions:  # a config section is checked as a whole instead
            self.check()

    def _own_problems(self, p: Problems) -> None:
        p.check(is_int(self.K) and self.K >= 0, "K", self.K, ">= 0 (an int)")
        p.finite("alpha", self.alpha)
        p.one_of("mode", self.mode, MODES)
        p.finite("omega", self.omega)
        p.non_negative("eps", self.eps)
        p.one_of("penalty_placement", self.penalty_placement, PENALTY_PLACEMENTS)
        p.one_of("stats", self.stats, STATS)
        p.one_of("level_weights", self.level_weights, LEVEL_WEIGHTS)
        p.check(isinstance(self.base_group, bool) or type(self.base_group).__name__ == "bool_",
                "base_group", self.base_group, "true or false")
        t = self.similarity_thresh
        p.check(t is None or is_number(t) and 0 < t < 1, "similarity_thresh", t,
                "null (equal anchors) or a number in (0, 1) (the difflib ratio two anchors need to "
                "share a step group)")

    @classmethod
    def of(cls, options) -> GroupOptions:
        """The group options of any object holding these fields (a config's `algo` section)."""
        return cls(**{f.name: getattr(options, f.name) for f in dataclasses.fields(cls)})


@dataclass
class GAEOptions(ReturnOptions):
    """PPO's critic: GAE over each row's response tokens."""

    lam: float = 1.0  # ppo: GAE's lambda (verl's algorithm.lam)

    def _own_problems(self, p: Problems) -> None:
        p.in_range("lam", self.lam, 0, 1, "in [0, 1]")


KEEP_PENALTY_MODES = ("normalized", "fixed")  # HiPER's keep penalty per KEEP turn: p / turns | p
# HiPER's discount and turn-level lambda: verl's algorithm.gamma / lam, which the authors' release
# scripts leave at 1.0 (the other options' defaults are their trainer's: keep and consistency
# penalties 0, set per env by the presets: -0.3 / -0.3 on ALFWorld)
HIPER_DEFAULTS = (("gamma", 1.0), ("lam", 1.0))


@dataclass
class HAEOptions(ReturnOptions):
    """HiPER's hierarchical advantage estimation (docs/hiper.md; the authors' `algorithm.hae.*`,
    with their trainer's defaults). Its turn-level lambda is `lam` (GAEOptions), its discount
    `gamma`, its invalid-reply penalty `invalid_penalty`; as HiPER's options their defaults are
    `HIPER_DEFAULTS` (gamma = lam = 1). `rl.hae.hae_advantages` takes its keyword defaults from
    `hiper_option_defaults()`."""

    lam_seg: float = 0.95  # hiper: GAE lambda over sub-goal segments (the SMDP level)
    keep_penalty: float = 0.0  # hiper: reward added on KEEP turns (the authors' runs: -0.3 ALFWorld, -3.5 WebShop)
    keep_penalty_mode: str = "normalized"  # hiper: normalized (keep_penalty / turns of the episode) | fixed
    keep_consistency_penalty: float = 0.0  # hiper: reward added on a KEEP turn whose sub-goal changed (the runs: -0.3)
    bootstrap_truncated: bool = False  # hiper: bootstrap an episode cut by the step limit from its values
    norm_adv: bool = True  # hiper: normalize each level's advantages over the turns that carry it

    def _own_problems(self, p: Problems) -> None:
        p.in_range("lam_seg", self.lam_seg, 0, 1, "in [0, 1]")
        for name in ("keep_penalty", "keep_consistency_penalty"):  # added to the reward: <= 0
            p.check(is_number(getattr(self, name)) and -math.inf < getattr(self, name) <= 0, name,
                    getattr(self, name), "<= 0 (a penalty, added to the reward; the authors' "
                    "runs: -0.3 ALFWorld, -3.5 WebShop)")
        p.one_of("keep_penalty_mode", self.keep_penalty_mode, KEEP_PENALTY_MODES)


@dataclass
class LossOptions(Options):
    """The policy's PPO-KL loss (every family)."""

    clip_low: float = 0.2  # ratio clip 1 - clip_low
    clip_high: float = 0.2  # ratio clip 1 + clip_high
    dual_clip: float = 3.0  # dual-clip bound for negative advantages (> 1)
    kl_coef: float = 0.01  # weight of the KL penalty to the reference policy
    entropy_coef: float = 0.001  # weight of the entropy bonus (verl's entropy_coeff; 0 = off)
    kl_type: str = "low_var_kl"  # low_var_kl | kl | mse
    loss_agg: str = "token-mean"  # token-mean | seq-mean

    def _own_problems(self, p: Problems) -> None:
        p.one_of("kl_type", self.kl_type, KL_TYPES)
        p.one_of("loss_agg", self.loss_agg, AGGS)
        p.check(is_number(self.clip_low) and 0 <= self.clip_low < 1, "clip_low", self.clip_low,
                "in [0, 1)")
        p.non_negative("clip_high", self.clip_high)
        p.check(is_number(self.dual_clip) and 1 < self.dual_clip < float("inf"), "dual_clip",
                self.dual_clip, "a finite number > 1")
        p.non_negative("kl_coef", self.kl_coef, "0 = no KL")
        p.non_negative("entropy_coef", self.entropy_coef, "0 = no entropy bonus")


@dataclass
class AdamWOptions(Options):
    """An AdamW with gradient clipping and a linear warm-up, checked once: the policy's
    (`hgpo_jax.config.OptimConfig`, which adds its schedule) and a critic's (`CriticOptions`)."""

    lr: float = 1e-6  # peak learning rate
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    max_grad_norm: float = 1.0  # global gradient-norm clip
    warmup_steps: int = 0  # linear warm-up, in optimizer steps
    b1: float = 0.9  # Adam beta1
    b2: float = 0.999  # Adam beta2

    def _own_problems(self, p: Problems) -> None:
        p.positive("lr", self.lr)
        p.non_negative("weight_decay", self.weight_decay)
        p.positive("max_grad_norm", self.max_grad_norm)
        p.at_least("warmup_steps", self.warmup_steps, 0)
        p.check(0 <= self.b1 < 1, "b1", self.b1, "in [0, 1)")
        p.check(0 <= self.b2 < 1, "b2", self.b2, "in [0, 1)")


@dataclass
class CriticOptions(AdamWOptions):
    """The `critic` section: the value model of an algorithm with a critic (`ppo`;
    docs/training.md): the policy's decoder with value heads, started from its weights, with its own
    AdamW (verl-agent's PPO baseline values; warm-up steps are critic optimizer steps).
    `hgpo_jax.config.CriticConfig` is this class."""

    lr: float = 1e-5  # critic learning rate (the paper's PPO runs)
    cliprange_value: float = 0.5  # value clip around the pre-update values
    warmup_iterations: int = 0  # the actor is updated from iteration max(1, this) on (verl's trainer.critic_warmup)

    def _own_problems(self, p: Problems) -> None:
        p.positive("cliprange_value", self.cliprange_value)
        p.at_least("warmup_iterations", self.warmup_iterations, 0)


# ------------------------------------------------------------------------------------- algorithms
@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm as the rest of the system sees it (`algo.estimator` = `name`).

    family: the unit of `hgpo_jax.rl.algorithms` that runs it ("group": advantages from groups
    of rollouts; "critic": a value model and GAE); critic_heads: value heads of its critic (0:
    no critic); token_advantages: one advantage per response token ([S, L]) instead of one per
    row ([S]); singleton_groups: a group of one rollout (rollout.group_size=1) makes sense;
    agent: the reply format it needs (`agent.name`; None: any); sections: config sections it
    reads besides `algo` (shown by `format_config` only for it); summary: one line for docs
    and errors.

    Its options: `options`, the option classes whose fields it reads (besides the policy loss's,
    `LossOptions`, which every algorithm reads), less `ignores`, the fields of those classes it
    does not read; `defaults`, its own defaults where they differ from the classes' (its
    authors' runs). `reads()` and `option_defaults()` give them; the config refuses an `algo`
    key given for an algorithm that does not read it, and a config that switches algorithms
    starts from the new one's defaults (`hgpo_jax.config`).
    """

    name: str
    family: str
    summary: str
    critic_heads: int = 0
    token_advantages: bool = False
    singleton_groups: bool = False
    agent: str | None = None
    sections: tuple[str, ...] = ()
    options: tuple[type, ...] = ()
    ignores: tuple[str, ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def has_critic(self) -> bool:
        return self.critic_heads > 0

    def reads(self) -> tuple[str, ...]:
        """The `algo` keys of its own options (not the loss's, not `estimator`), in declaration
        order."""
        names = dict.fromkeys(f.name for cls in self.options for f in dataclasses.fields(cls))
        return tuple(n for n in names if n not in self.ignores)

    def option_defaults(self) -> dict[str, Any]:
        """Every `algo` option but the loss's at this algorithm's default: the option classes'
        defaults (`ALGO_OPTIONS`), then its own `defaults`."""
        out = {}
        for cls in ALGO_OPTIONS:
            if cls is not LossOptions:
                out.update({f.name: f.default for f in dataclasses.fields(cls)
                            if f.name not in out})
        return {**out, **dict(self.defaults)}


HGPO_ONLY = ("K", "alpha", "level_weights", "base_group")  # the hierarchy's options
STEP_GROUPS_ONLY = ("similarity_thresh",)  # how steps are grouped: gigpo's and hgpo's
ALGORITHMS: dict[str, AlgorithmSpec] = {s.name: s for s in (
    AlgorithmSpec("grpo", "group", "each step gets its trajectory's normalized return",
                  options=(GroupOptions,), ignores=HGPO_ONLY + STEP_GROUPS_ONLY + ("omega",)),
    AlgorithmSpec("rloo", "group", "each step gets its trajectory's leave-one-out return",
                  options=(GroupOptions,),
                  ignores=HGPO_ONLY + STEP_GROUPS_ONLY + ("omega", "mode", "eps")),
    AlgorithmSpec("gigpo", "group", "grpo plus a step term over steps sharing the observation",
                  options=(GroupOptions,), ignores=HGPO_ONLY),
    AlgorithmSpec("hgpo", "group", "normalized returns in K+1 nested context groups, weighted",
                  options=(GroupOptions,), ignores=("omega",)),
    AlgorithmSpec("ppo", "critic", "a value model and GAE (verl-agent's PPO baseline)",
                  critic_heads=1, token_advantages=True, singleton_groups=True,
                  sections=("critic",), options=(GAEOptions,),
                  defaults=(("gamma", 1.0),)),  # verl-agent's PPO runs: algorithm.gamma 1.0
    AlgorithmSpec("hiper", "hiper", "plan-execute replies trained with hierarchical advantage "
                  "estimation and a three-head critic (HiPER)", critic_heads=3,
                  token_advantages=True, singleton_groups=True, agent="plan-execute",
                  sections=("critic",), options=(GAEOptions, HAEOptions),
                  defaults=HIPER_DEFAULTS),
)}
GROUP_ESTIMATORS = tuple(n for n, s in ALGORITHMS.items() if s.family == "group")


def algorithm_names() -> tuple[str, ...]:
    """Every `algo.estimator` value."""
    return tuple(ALGORITHMS)


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The declaration of algorithm `name`; a ValueError naming the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; use one of {', '.join(ALGORITHMS)}"
                         + suggest(name, tuple(ALGORITHMS)))
    return ALGORITHMS[name]


# The options of the config's `algo` section, every family's (`hgpo_jax.config.AlgoConfig` takes
# them all as bases, so each is a flat `algo.<key>`); a new family's options class goes here.
ALGO_OPTIONS = (LossOptions, HAEOptions, GroupOptions, GAEOptions)
LOSS_KEYS = tuple(f.name for f in dataclasses.fields(LossOptions))  # read by every algorithm


def one_score_conflict(estimator: str, stats: str, penalty_placement: str, invalid_penalty: float,
                       base_group: bool) -> bool:
    """Whether the options cannot hold together once a step is invalid (ONE_SCORE_CONFLICT): the
    paper's statistics (one score per trajectory) with a penalty on the invalid rows alone, for an
    estimator that uses episode scores (all but HGPO without its base group)."""
    return (stats == "paper" and penalty_placement == "row" and invalid_penalty > 0
            and (estimator != "hgpo" or bool(base_group)))


def hiper_option_defaults() -> dict[str, Any]:
    """HiPER's options at their defaults (`ALGORITHMS["hiper"].option_defaults()`): the one
    source of the keyword defaults of `rl.hae.hae_advantages`."""
    spec = ALGORITHMS["hiper"]
    return {k: v for k, v in spec.option_defaults().items() if k in spec.reads()}


def readers_of(key: str) -> tuple[str, ...]:
    """The algorithms that read `algo` option `key` (every one for the loss's options)."""
    if key in LOSS_KEYS:
        return algorithm_names()
    return tuple(n for n, s in ALGORITHMS.items() if key in s.reads())
