"""HiPER (`algo.estimator: hiper`, docs/hiper.md): plan-execute replies (the `plan-execute` agent,
`<switch>`, `<subgoal>`, `<action>` blocks) trained with hierarchical advantage estimation
(`rl.hae.hae_advantages`) and a critic of three value heads (low, high, termination).

Per iteration, on this process's rows (whole episodes: groups never span processes):
1. each reply's tokens are decoded one at a time and parsed into its blocks
   (`agents.plan_execute.reply_spans`: the tag-inclusive token masks, the switch decision, the
   low head's read position);
2. the critic's values before the update, [S, W, 3]; per turn VL = the low head at its read
   position, VH and VT = the high and termination heads at the reply's first position (the value
   of the token before it: the prompt's last);
3. HAE over the rows linked into episodes (`LinkedTurns`: each turn's own env reward, done,
   validity), with the sub-goal consistency test on the token ids of the sub-goal block;
4. token advantages A_low on the action block + A_high on the sub-goal block of a segment's
   first turn + A_term on the switch block, summed; the policy's loss covers those tokens only
   (`Advantages.loss_mask`: the end-of-turn token and text outside the blocks get no gradient);
5. the critic's targets: one per turn per head, at the position its value was read
   (`Advantages.value_mask`, carried to `CriticRows.value_mask`), the sum of the three clipped
   value losses; the critic family's update (`CriticAlgorithm.update_state`).

Metrics (docs/hiper.md): row means `hiper/switch_rate`, `hiper/segments_per_turn`,
`hiper/consistency_violation_rate`, `hiper/loss_tokens_per_row`; over every process's rows
`hiper/mean_segment_length` (turns per segment: all turns / all segment starts) and the critic
family's `critic/explained_var` (every head's targets together) and
`critic/explained_var/head{h}` (h = 0 low, 1 high, 2 termination).

Padding rows are inert and added after HAE (never duplicated real rows, as the authors' batch
padding does). In a multi-process run each process normalizes the levels over its own rows.
"""

from __future__ import annotations

import numpy as np

from hgpo_jax.agents.plan_execute import ReplySpans, reply_spans
from hgpo_jax.rl.algorithms.base import Advantages, StepRows
from hgpo_jax.rl.algorithms.critic import CriticAlgorithm, explained_variance_parts
from hgpo_jax.rl.hae import hae_of_turns


def block_masks(spans: list[ReplySpans], width: int) -> tuple[np.ndarray, ...]:
    """(action, subgoal, switch) bool [n, width]: each reply's block masks in its response window."""
    out = tuple(np.zeros((len(spans), width), bool) for _ in range(3))
    for i, s in enumerate(spans):
        for mask, part in zip(out, (s.action, s.subgoal, s.switch)):
            part = np.asarray(part, bool)[:width]
            mask[i, :len(part)] = part
    return out


def subgoal_changed(traj_id, turn, response_ids, subgoal: np.ndarray) -> tuple[np.ndarray, ...]:
    """(changed, has_subgoal) bool [n]: whether a row's sub-goal block (its token ids, tags
    included) differs from the previous turn's of its episode, both present (the authors'
    `keep_consistency_requires_both`), and whether it has one."""
    blocks = [tuple(np.asarray(ids)[:subgoal.shape[1]][subgoal[i, :len(ids)]])
              for i, ids in enumerate(response_ids)]
    has = np.asarray([len(b) > 0 for b in blocks], bool)
    at = {(int(t), int(k)): i for i, (t, k) in enumerate(zip(traj_id, turn))}
    changed = np.zeros(len(blocks), bool)
    for i, (t, k) in enumerate(zip(traj_id, turn)):
        prev = at.get((int(t), int(k) - 1))
        changed[i] = prev is not None and has[prev] and has[i] and blocks[prev] != blocks[i]
    return changed, has


def turns_per_segment(parts) -> float:
    """Every process's [turns, segments] -> turns per segment (the mean segment length)."""
    turns, segments = np.sum(np.asarray(parts, np.int64), axis=0)
    return float(turns / max(segments, 1))


class HiperAlgorithm(CriticAlgorithm):
    """HiPER's unit: the reply parse, HAE, the token assignment, and the critic family's critic
    with three heads, each trained at its own target positions (`value_masks`; its device state
    is a `rl.critic.CriticState`)."""

    value_masks = True

    def __init__(self, cfg, spec, mesh=None, num_micro: int = 1, tokenizer=None):
        super().__init__(cfg, spec, mesh, num_micro, tokenizer)
        # its options, one object: every `algo` key it reads (`AlgorithmSpec.reads`), by name,
        # as `rl.hae.hae_advantages` takes them
        self.options = {k: getattr(cfg.algo, k) for k in spec.reads()}

    def spans(self, rows: StepRows) -> list[ReplySpans]:
        """Each real row's reply parsed from its tokens decoded one at a time."""
        decode = self.tokenizer.decode
        return [reply_spans([decode([t], skip_special_tokens=False) for t in ids])
                for ids in rows.batch.response_ids]

    def advantages(self, rows: StepRows, state, rows_pass) -> Advantages:
        W, n = self.window, rows.num_rows
        S, L = rows.tokens.input_ids.shape
        values = rows_pass(self.critic.value_fn, state.params, width=W)          # [S, W, 3]
        spans = self.spans(rows)
        action, subgoal, switch = block_masks(spans, W)                            # [n, W]
        lengths = rows.tokens.response_mask[:n].sum(1).astype(np.int64)
        low_at = np.minimum([s.low_value_index for s in spans], np.maximum(lengths - 1, 0))
        idx = np.arange(n)
        turns = rows.turns
        changed, has_subgoal = subgoal_changed(turns.traj_id[:n], turns.turn[:n],
                                               rows.batch.response_ids, subgoal)
        new_segment = np.asarray([s.new_segment for s in spans], bool)
        hae = hae_of_turns(
            turns, new_segment, values[idx, low_at, 0], values[:n, 0, 1], values[:n, 0, 2],
            subgoal_changed=changed, has_subgoal=has_subgoal, has_switch=switch.any(1),
            **self.options)
        high = subgoal & hae.has_high[:, None]
        window_adv = (hae.low[:, None] * action + hae.high[:, None] * high
                      + hae.term[:, None] * switch).astype(np.float32)             # [n, W]
        window_loss = action | high | switch
        advantages, loss_mask = np.zeros((S, L), np.float32), np.zeros((S, L), np.float32)
        start = np.argmax(rows.tokens.response_mask[:n] > 0, axis=1)
        for i in range(n):
            k = min(int(lengths[i]), W)
            advantages[i, start[i]:start[i] + k] = window_adv[i, :k]
            loss_mask[i, start[i]:start[i] + k] = window_loss[i, :k]
        returns, value_mask = np.zeros((S, W, 3), np.float32), np.zeros((S, W, 3), np.float32)
        real = lengths > 0
        for head, (pos, target, where) in enumerate((
                (low_at, hae.low_return, real), (np.zeros(n, np.int64), hae.high_return,
                                                 real & hae.has_high),
                (np.zeros(n, np.int64), hae.term_return, real))):
            returns[idx[where], pos[where], head] = target[where]
            value_mask[idx[where], pos[where], head] = 1.0
        tokens = np.maximum(loss_mask[:n].sum(1), 1)
        row_adv = (advantages[:n] * loss_mask[:n]).sum(1) / tokens
        keep_later = (~new_segment) & (turns.turn[:n] > 0)
        row_means = {"hiper/switch_rate": float(new_segment.mean()) if n else 0.0,
                     "hiper/segments_per_turn": float(hae.has_high.mean()) if n else 0.0,
                     "hiper/consistency_violation_rate":
                         float((changed & keep_later).sum() / max(keep_later.sum(), 1)),
                     "hiper/loss_tokens_per_row": float(loss_mask[:n].sum(1).mean()) if n else 0.0}
        gathered = {"hiper/mean_segment_length": ([n, int(hae.has_high.sum())], turns_per_segment),
                    **explained_variance_parts(values, returns, value_mask)}
        return Advantages(advantages, row_adv, row_means, {}, gathered, values=values,
                          returns=returns, loss_mask=loss_mask, value_mask=value_mask)
