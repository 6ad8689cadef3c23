"""GRPO, RLOO, GiGPO and HGPO: one advantage per step row from the groups of rollouts of a task
(`hgpo_jax.rl.advantages.compute_step_advantages`, docs/advantages.md); no critic."""

from __future__ import annotations

import numpy as np

from hgpo_jax.algo_specs import GroupOptions
from hgpo_jax.rl.advantages import compute_step_advantages
from hgpo_jax.rl.algorithms.base import Advantages, Algorithm, StepRows
from hgpo_jax.rl.grouping import hierarchy_stats

DIAGNOSED = ("grpo", "gigpo", "hgpo")  # the estimators `diagnostic_metrics` compares to the oracle


def diagnostic_metrics(columns, valid, options: GroupOptions, prefix_anchors=None
                       ) -> dict[str, float]:
    """diag/<estimator>/{bias, abs_dev, rmse} of grpo, gigpo and hgpo against the oracle
    (hgpo_jax.rl.diagnostics) under the run's options, and diag/coverage. An estimator the options
    cannot serve (stats=paper with a penalty on single rows) is left out."""
    from hgpo_jax.rl.diagnostics import oracle_deviation

    out = {}
    for estimator in DIAGNOSED:
        try:
            stats = oracle_deviation(*columns, valid=valid, estimators=(estimator,),
                                     options=options, prefix_anchors=prefix_anchors)[estimator]
        except ValueError:
            continue
        out.update({f"diag/{estimator}/{k}": v for k, v in stats.items() if k != "coverage"})
        out["diag/coverage"] = stats["coverage"]
    return out


class GroupAlgorithm(Algorithm):
    """The group estimators, with their options checked once (`GroupOptions.of(cfg.algo)`); with
    `train.diagnostics`, each estimator's bias against the oracle; always, the fraction of rows
    grouped at each HGPO context level (of the similarity clusters under `similarity_thresh`)."""

    def __init__(self, cfg, spec, mesh=None, num_micro: int = 1, tokenizer=None):
        super().__init__(cfg, spec, mesh, num_micro, tokenizer)
        self.options = GroupOptions.of(cfg.algo)
        self.diagnostics = cfg.train.diagnostics

    def advantages(self, rows: StepRows, state, rows_pass) -> Advantages:
        b, n = rows.batch, rows.num_rows
        out = np.zeros(rows.tokens.input_ids.shape[0], np.float32)
        if n == 0:  # a process whose envs all failed still takes part, with inert rows only
            return Advantages(out, np.zeros(0, np.float32))
        columns = (b.task_id, b.traj_id, b.step_id, b.anchor, b.reward)
        prefix = b.prefix_anchors()  # a guided batch's replayed anchors by trajectory, or None
        adv = compute_step_advantages(self.spec.name, *columns, valid=b.valid, options=self.options,
                                      prefix_anchors=prefix)
        out[:n] = adv
        row_means = diagnostic_metrics(columns, b.valid, self.options, prefix) \
            if self.diagnostics else {}
        thresh = self.options.similarity_thresh if self.spec.name in ("gigpo", "hgpo") else None
        levels = hierarchy_stats(b.task_id, b.traj_id, b.step_id, b.anchor, K=self.options.K,
                                 prefix_anchors=prefix, similarity_thresh=thresh)
        for k, frac in enumerate(levels):
            row_means[f"hierarchy/level{k}_grouped_fraction"] = float(frac)
        return Advantages(out, adv, row_means)
