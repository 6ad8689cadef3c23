"""What every algorithm unit works on and gives back, and the unit's interface.

One iteration's rows travel as typed host values from collection to update (no string-keyed
dict that stages mutate):

    rows = StepRows(batch, tokens, old_logp, ref_logp, turns)   # the trainer packs them
    adv = algorithm.advantages(rows, state, rows_pass)          # -> Advantages (typed)
    state, metrics = algorithm.update_state(state, rows, adv, order, mesh)
    policy_rows = rows.policy_rows(adv)                          # -> rl.batching.PolicyRows

`Algorithm` is one family's unit (`hgpo_jax.rl.algorithms.group`, `.critic`, `.hiper`): built
from the config and its declaration (`hgpo_jax.algo_specs.AlgorithmSpec`), it provides the
advantage stage, the policy's loss settings and train steps (its loss pieces), and owns its
device state (a critic's params and optimizer state; None for the group estimators): it creates
it (`init_state`), updates it (`update_state`), saves and restores it (`state_item`,
`state_arrays`, `restore_state`), says what a checkpoint must hold to resume it
(`state_signature`, `checkpoint_signature`, `describe_state`), exports the model it trains
(`state_model`) and gives `plan` the program that updates it (`plan_state`). The trainer,
`runs` and `plan` only call these; none of them knows what the state is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from hgpo_jax.algo_specs import AlgorithmSpec
from hgpo_jax.rl.batching import CriticRows, PolicyRows, TokenRows, TrainBatch
from hgpo_jax.rl.ppo import LossConfig, make_budget_train_step, make_train_step
from hgpo_jax.rl.prefix_sft import make_sft_budget_step, make_sft_step
from hgpo_jax.rl.rollout import RolloutBatch
from hgpo_jax.rl.turns import LinkedTurns


@dataclasses.dataclass(frozen=True)
class StepRows:
    """One iteration's training rows on the host: the rollout's n step rows (`batch`) packed into
    S >= n rows (`tokens`: input_ids, attention_mask, response_mask, sample_logp [S, L]; the rows
    after n inert), the rollout policy's and the reference policy's token log-probs old_logp,
    ref_logp float32 [S, L], and the rows linked into episodes (`turns`)."""

    batch: RolloutBatch
    tokens: TrainBatch
    old_logp: np.ndarray
    ref_logp: np.ndarray
    turns: LinkedTurns

    @property
    def num_rows(self) -> int:
        """n: the real rows (the packed arrays' first n rows)."""
        return len(self.batch)

    def token_rows(self) -> TokenRows:
        return TokenRows.of(self.tokens.arrays())

    def policy_rows(self, adv: Advantages) -> PolicyRows:
        """The policy update's rows with the advantages `adv` gives; its loss covers the response
        tokens, or those of `adv.loss_mask` when the algorithm chose some."""
        t = self.tokens
        mask = t.response_mask if adv.loss_mask is None else adv.loss_mask
        return PolicyRows(input_ids=t.input_ids, attention_mask=t.attention_mask,
                          response_mask=mask, advantages=adv.advantages,
                          old_logp=self.old_logp, ref_logp=self.ref_logp)

    def critic_rows(self, adv: Advantages) -> CriticRows:
        """The critic update's rows: the values the advantages were computed with and the returns."""
        t = self.tokens
        return CriticRows(input_ids=t.input_ids, attention_mask=t.attention_mask,
                          response_mask=t.response_mask, values=adv.values, returns=adv.returns,
                          value_mask=adv.value_mask)


@dataclasses.dataclass(frozen=True)
class Advantages:
    """What an advantage stage gives: advantages float32 [S] (one per row) or [S, L] (per token,
    `AlgorithmSpec.token_advantages`), inert rows 0; values, returns: the critic's values before
    the update and its targets ([S, W] or [S, W, H]; None without a critic); row_adv float [n]:
    each real row's advantage (its token mean per token), for the statistics; row_means:
    statistics averaged over the rows (of every process); metrics: metrics global already;
    gathered: {metric: (this process's part, JSON-able; combine(parts) -> the metric from every
    process's part, in process order)}: metrics over every process's rows that a unit leaves to
    the trainer to combine (one gather for them all, `trainers.rl.Trainer.row_statistics`), so
    that the unit itself calls no collective;
    loss_mask: float32 [S, L], the tokens the policy's loss covers, a subset of the response
    tokens (None: all of them); value_mask: where each head's target is ([S, W] or [S, W, H];
    None: the critic's own rule)."""

    advantages: np.ndarray
    row_adv: np.ndarray
    row_means: dict = dataclasses.field(default_factory=dict)
    metrics: dict = dataclasses.field(default_factory=dict)
    gathered: dict = dataclasses.field(default_factory=dict)
    values: np.ndarray | None = None
    returns: np.ndarray | None = None
    loss_mask: np.ndarray | None = None
    value_mask: np.ndarray | None = None

    def gathered_metrics(self, parts: list[dict] | None = None) -> dict[str, float]:
        """The `gathered` metrics, each combined over `parts` (every process's {metric: part},
        in process order); None: over this process's part alone (a one-process run)."""
        if parts is None:
            parts = [{k: part for k, (part, _) in self.gathered.items()}]
        return {k: combine([p[k] for p in parts]) for k, (_, combine) in self.gathered.items()}

    def alone(self) -> dict[str, float]:
        """`metrics` and the `gathered` ones as a one-process run has them."""
        return {**self.metrics, **self.gathered_metrics()}


@dataclasses.dataclass(frozen=True)
class StatePlan:
    """What `hgpo-jax plan` compiles for an algorithm's own trained model, exactly as the run
    builds it: `step` jit(params, opt_state, batch) -> (params, opt_state, metrics) on the run's
    mesh, its abstract `params` (`nnx.Param` state of ShapeDtypeStructs) with their `shardings`,
    its optimizer `tx` with `opt_shardings`, and `batch` the abstract mini-batch
    (`rl.batching.CriticRows.spec`, unsharded). label: the plan's name for it ("critic"); detail:
    what the printed plan says of it ("3 value heads, no LM head"); facts: more of it for the
    plan's JSON, as `{label}_{key}` (e.g. {"heads": 3}). With token-budget micro-batches
    (`train.max_tokens_per_micro_batch`) `step` is the `rl.update.BudgetStep` the run compiles
    and budget_batch(rows, length) the abstract micro-batch of that many (global) rows."""

    label: str
    detail: str
    params: Any
    shardings: Any
    tx: Any
    opt_shardings: Any
    step: Callable
    batch: Any
    facts: dict = dataclasses.field(default_factory=dict)
    budget_batch: Callable[[int, int], Any] | None = None


def scoring_temperature(rollout) -> float:
    """The temperature the trainer scores log-probs at (old, reference and the updated policy's,
    with the entropy and the KL): the rollout's, so the policy trained is the one sampled, as
    verl-agent divides the logits by the rollout temperature in every log-prob pass. Greedy
    rollouts (temperature 0) are scored at 1."""
    return rollout.temperature if rollout.temperature > 0 else 1.0


def loss_config(algo, temperature: float) -> LossConfig:
    """The policy's PPO-KL loss settings of a config's `algo` section (`algo_specs.LossOptions`),
    scored at `temperature`."""
    return LossConfig(clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=algo.dual_clip,
                      kl_coef=algo.kl_coef, kl_type=algo.kl_type, agg=algo.loss_agg,
                      entropy_coef=algo.entropy_coef, temperature=temperature)


class Algorithm:
    """One algorithm family's unit in the trainer's loop (subclasses: `GroupAlgorithm`,
    `CriticAlgorithm`). Built once per run by `hgpo_jax.rl.algorithms.build_algorithm`.

    spec: its declaration; mesh: the run's; num_micro: micro-batches per mini-batch; tokenizer:
    the policy's (for a unit that reads the reply's tokens; None in `plan`).

    Its device state (None here: the group estimators have none) is made by `init_state`, kept
    by the trainer (`TrainState.algo_state`), updated by `update_state` and saved in each
    checkpoint as the item `state_item` (`state_arrays` -> the saved tree -> `restore_state`)."""

    state_item: str | None = None  # the checkpoint item that holds its state (None: no state)

    def __init__(self, cfg, spec: AlgorithmSpec, mesh=None, num_micro: int = 1, tokenizer=None):
        self.cfg, self.spec, self.mesh, self.num_micro = cfg, spec, mesh, num_micro
        self.tokenizer = tokenizer

    # ------------------------------------------------------------------ the policy's loss
    def loss_config(self) -> LossConfig:
        """The policy's PPO-KL loss settings (`cfg.algo`), at the rollout's scoring temperature."""
        return loss_config(self.cfg.algo, scoring_temperature(self.cfg.rollout))

    def policy_step(self, graphdef, tx, mesh=None, shardings=None, opt_shardings=None):
        """jit(params, opt_state, mini-batch `PolicyRows`) -> (params, opt_state, metrics): one
        policy update of `num_micro` micro-batches, with this algorithm's advantages (per row
        or per token) in the PPO-KL loss (`rl.ppo.make_train_step`)."""
        return make_train_step(graphdef, tx, self.loss_config(), self.num_micro, mesh, shardings,
                               opt_shardings, window=self.cfg.rollout.max_new_tokens,
                               token_advantages=self.spec.token_advantages)

    def policy_budget_step(self, graphdef, tx, budget: int, mesh=None, shardings=None,
                           opt_shardings=None):
        """`policy_step` over token-budget micro-batches of `budget` tokens per device
        (`rl.ppo.make_budget_train_step`)."""
        return make_budget_train_step(graphdef, tx, self.loss_config(), budget, mesh, shardings,
                                      opt_shardings, window=self.cfg.rollout.max_new_tokens,
                                      token_advantages=self.spec.token_advantages)

    def sft_step(self, graphdef, tx, coef: float, mesh=None, shardings=None, opt_shardings=None):
        """jit(params, opt_state, mini-batch `SftRows`) -> (params, opt_state, metrics): one
        policy update on supervised rows alone (a guidance's, e.g. prefix SFT:
        `rl.prefix_sft.make_sft_step`, weight `coef`, `num_micro` micro-batches, the response
        window and scoring temperature of `policy_step`); the same for every family."""
        return make_sft_step(graphdef, tx, coef, self.num_micro, mesh,
                             shardings, opt_shardings, window=self.cfg.rollout.max_new_tokens,
                             temperature=self.loss_config().temperature)

    def sft_budget_step(self, graphdef, tx, coef: float, budget: int, mesh=None, shardings=None,
                        opt_shardings=None):
        """`sft_step` over token-budget micro-batches of `budget` tokens per device
        (`rl.prefix_sft.make_sft_budget_step`)."""
        return make_sft_budget_step(graphdef, tx, coef, budget, mesh,
                                    shardings, opt_shardings,
                                    window=self.cfg.rollout.max_new_tokens,
                                    temperature=self.loss_config().temperature)

    # ------------------------------------------------------------------ its own state
    def init_state(self, policy, seed: int) -> Any:
        """The unit's device state at the start of a run (None: it has none)."""
        return None

    def state_arrays(self, state: Any) -> Any:
        """The tree of arrays a checkpoint saves under `state_item` (None without a state); also
        the target a restore reads into."""
        return None

    def restore_state(self, arrays: Any) -> Any:
        """The state back from the tree `state_arrays` gave, restored from a checkpoint."""
        return None

    def update_state(self, state: Any, rows: StepRows, adv: Advantages,
                     order: list[np.ndarray], mesh) -> tuple[Any, list[dict]]:
        """Update the unit's own model on the mini-batches `order` (row indices, -1 inert) before
        the policy's updates -> (state, one metrics dict per update); none without a state.
        Every process calls it at once with its own rows (the only unit method that may gather
        over processes: a token-budget update weighs each micro-batch by every process's counts)."""
        return state, []

    def plan_state(self, model_cfg, attention: str) -> StatePlan | None:
        """The program that updates the unit's state, for `plan` (None: it has none)."""
        return None

    @classmethod
    def state_signature(cls, spec: AlgorithmSpec) -> Hashable | None:
        """What a checkpoint's `state_item` must hold for algorithm `spec` to resume from it
        (compared with `checkpoint_signature`'s); None: no state."""
        return None

    @classmethod
    def checkpoint_signature(cls, item_shapes: Any) -> Hashable:
        """The signature of a saved state from its arrays' shapes alone (the item's tree of shape
        tuples, `checkpoint.Checkpointer.item_shapes`)."""
        raise NotImplementedError

    @classmethod
    def describe_state(cls, signature: Hashable) -> str:
        """A signature in words, for messages ("a critic of 3 value heads")."""
        raise NotImplementedError

    @classmethod
    def state_model(cls, cfg, policy, ckpt) -> Any:
        """The model its state trains, restored from the newest checkpoint of `ckpt` (a read-only
        `checkpoint.Checkpointer`) of a run of `cfg` whose policy is `policy` (`hgpo-jax export
        --critic`). Raises ValueError when the algorithm trains no model of its own."""
        raise ValueError(f"algo.estimator={cfg.algo.estimator} trains no model besides the policy")

    # ------------------------------------------------------------------ its stages

    def advantages(self, rows: StepRows, state: Any, rows_pass) -> Advantages:
        """Each row's advantage. rows_pass(fn, params, width=None) runs a jitted
        fn(params, input_ids, attention_mask, response_mask) over every row in the trainer's
        micro-batches -> [S, L] (or [S, width])."""
        raise NotImplementedError

    def updates_policy(self, iteration: int) -> bool:
        """Whether the policy is updated at 0-based `iteration` (always, unless a family waits)."""
        return True
