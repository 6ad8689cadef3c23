"""Host-side grouping: validate a batch of steps, compute returns, build group-index tensors.

Everything here is NumPy on the host and never runs under `jax.jit`. The device side
(`hgpo_jax.rl.advantages`) only sees dense integer tensors built here.

A batch is N steps given as flat arrays in any order (docs/advantages.md):
`task_ids` [N], `traj_ids` [N], `step_ids` [N] (0..n-1 within each trajectory), `anchors` [N]
(hashable; usually the observation text), `rewards` [N] (the env's rewards) and optionally
`valid` [N] (whether the step's reply held a valid action).

The rows are linked into trajectories and checked once by `hgpo_jax.rl.turns.LinkedTurns` (the
type HAE and the algorithms read too), which puts them in *canonical order*: sorted by
(trajectory, step). `StepBatch.order` maps canonical rows back to input rows, so
`out[batch.order] = canonical_values` restores the input order.

Group keys are built without any Python loop over rows: every distinct anchor (and task and
trajectory id) is interned once into a dense integer code, and the key of hierarchy level k
(task, a_t, a_{t-1}, ..., a_{t-k}) is built from the level k-1 id and the code of a_{t-k} by an
exact pair -> dense-id step (`np.unique(return_inverse=True)` on int64 pairs). Because the
pairing is exact, two different anchor histories can never share a group (no hash collisions).
`full_history_ids` builds the full-history groups (task, a_0, ..., a_t) of the bias diagnostic
(`hgpo_jax.rl.diagnostics`) forwards with the same pairing.

With a similarity threshold (`similarity_thresh`, GiGPO's `enable_similarity`), the anchors are
first replaced by their similarity clusters (`cluster_anchors`, `hgpo_jax.rl.similarity`), built
per task in the authors' order; every level then groups by clusters instead of exact anchors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hgpo_jax.rl.similarity import Similarity, greedy_clusters
from hgpo_jax.rl.turns import LinkedTurns, as_1d, intern


@dataclass(frozen=True)
class GroupIndex:
    """Padded group-index tensor for segment operations.

    Attributes:
      ids: int32 [M, L]. Row i's group at level l, or -1 where row i has no level-l group. Ids of
        different levels are disjoint (level l's ids follow all ids of levels < l), so a single
        segment op over `ids.reshape(-1)` covers every level at once.
      sizes: int32 [G]. Number of rows in each group (>= 1).
      num_groups: G, the number of distinct ids (ids lie in [0, G)).

    For step-level (hgpo/gigpo) grouping M = N steps in canonical order and L = K+1 levels; for
    trajectory-level (grpo/rloo) grouping M = number of trajectories, L = 1, and the group is the
    trajectory's task.
    """

    ids: np.ndarray
    sizes: np.ndarray
    num_groups: int

    @property
    def num_levels(self) -> int:
        return int(self.ids.shape[1])


@dataclass(frozen=True)
class StepBatch:
    """A validated batch of N steps from T trajectories of P tasks: the rows linked into
    trajectories (`turns`), in canonical order (sorted by trajectory, step), with each
    trajectory's task and each step's anchor.

    Attributes:
      turns: `hgpo_jax.rl.turns.LinkedTurns` of the N rows (input order; its episodes are the
        trajectories), where the rows were linked and checked.
      traj: int32 [N]. Dense trajectory index (0..T-1) of each canonical row.
      step: int64 [N]. Step index t of each canonical row.
      anchor: int64 [N]. Dense anchor code of each canonical row (equal anchors <=> equal codes).
      task_of_traj: int32 [T]. Dense task index (0..P-1) of each trajectory.
      rewards: float64 [N] or None. Rewards in canonical order (None when not given).
      valid: bool [N]. Validity of each step's action in canonical order (all True when not given).
      num_tasks: P.
      num_anchors: number of distinct anchors.
      prefix: int64 [T, M] or None. Each trajectory's context before its step 0, the anchor codes
        of the M steps replayed there last (an expert-guided rollout's prefix, `rl.guides`),
        right-aligned: prefix[tau, M - 1] is the step just before step 0; -1 where a trajectory
        had fewer. None: no trajectory had one.
      anchor_values: [num_anchors] the distinct anchors by code (`prepare_batch(...,
        keep_anchor_values=True)`; the similarity clusters read their text), or None.
    And the linked turns' canonical layout: order int64 [N] (input row of each canonical row),
    traj_start int64 [T] (canonical row of each trajectory's step 0), traj_len int64 [T].
    """

    turns: LinkedTurns
    traj: np.ndarray
    step: np.ndarray
    anchor: np.ndarray
    task_of_traj: np.ndarray
    rewards: np.ndarray | None
    valid: np.ndarray
    num_tasks: int
    num_anchors: int
    prefix: np.ndarray | None = None
    anchor_values: list | None = None

    @property
    def order(self) -> np.ndarray:
        return self.turns.order

    @property
    def traj_start(self) -> np.ndarray:
        return self.turns.start

    @property
    def traj_len(self) -> np.ndarray:
        return self.turns.length

    @property
    def num_steps(self) -> int:
        return self.turns.num_rows

    @property
    def num_trajectories(self) -> int:
        return self.turns.num_episodes


# ----------------------------------------------------------------------------------------------
# Validation and canonical order


def prepare_batch(task_ids, traj_ids, step_ids, anchors, rewards=None, valid=None,
                  prefix_anchors=None, keep_anchor_values: bool = False) -> StepBatch:
    """Validate the flat per-step arrays and put them in canonical (trajectory, step) order.

    Args:
      task_ids, traj_ids, anchors: [N] hashables. step_ids: [N] ints. rewards: [N] floats or None.
      valid: [N] bools (or 0/1 numbers) or None (= every step valid).
      prefix_anchors: {traj_id: [anchors]} or None: the anchors of the steps an expert-guided
        rollout replayed before the trajectory's step 0, in order (`StepBatch.prefix`); they are
        history only (no rows), which `step_level_ids` reads for steps t < k.
      keep_anchor_values: also keep the distinct anchors by code (`StepBatch.anchor_values`).
    Returns:
      StepBatch.
    Raises:
      ValueError naming the problem: mismatched lengths, a trajectory under two task ids,
      unhashable ids or anchors, and the linking's (`LinkedTurns.link`): non-integer or
      negative step ids, duplicate (trajectory, step) pairs, gaps in a trajectory's steps (they
      must be exactly 0..n-1), non-finite rewards, non-boolean valid.
    """
    task_ids = as_1d(task_ids, "task_ids")
    traj_ids = as_1d(traj_ids, "traj_ids")
    anchors = as_1d(anchors, "anchors")
    steps = np.asarray(step_ids)
    rewards, valid = (None if x is None else np.asarray(x) for x in (rewards, valid))
    lengths = {"task_ids": len(task_ids), "traj_ids": len(traj_ids), "step_ids": _length(steps),
               "anchors": len(anchors)}
    lengths.update({k: _length(v) for k, v in (("rewards", rewards), ("valid", valid)) if v is not None})
    if len(set(lengths.values())) != 1 or steps.ndim != 1:
        raise ValueError(f"all per-step inputs must be 1-D with the same length N; got lengths {lengths}")
    turns = LinkedTurns.link(traj_ids, steps, reward=rewards, valid=valid,
                             names=("traj_ids", "step_ids"))
    task_code, num_tasks = intern(task_ids, "task_ids")
    anchor_code, num_anchors = intern(anchors, "anchors")
    all_anchors, all_codes = anchors, anchor_code  # with the prefix anchors, when there are some
    order, traj_start = turns.order, turns.start
    traj_s, task_s = turns.episode[order], task_code[order]
    first_task = task_s[traj_start[traj_s]]
    mixed = task_s != first_task
    if mixed.any():
        j = int(np.flatnonzero(mixed)[0])
        raise ValueError(f"trajectory {_show(traj_ids, order[j])} appears under two task ids "
                         f"({_show(task_ids, order[traj_start[traj_s[j]]])} and {_show(task_ids, order[j])}); "
                         f"a trajectory belongs to exactly one task")
    prefix = None
    if prefix_anchors:  # anchors and prefix anchors share one code space
        first_rows = order[traj_start]                    # input row of each trajectory's step 0
        lists = [list(prefix_anchors.get(traj_ids[int(r)], ())) for r in first_rows]
        width = max(map(len, lists), default=0)
        if width:
            all_anchors = [*anchors, *(a for x in lists for a in x)]
            all_codes, num_anchors = intern(all_anchors, "anchors")
            anchor_code, extra = all_codes[:len(anchors)], iter(all_codes[len(anchors):])
            prefix = np.full((len(lists), width), -1, np.int64)
            for tau, x in enumerate(lists):
                prefix[tau, width - len(x):] = [next(extra) for _ in x]
    return StepBatch(
        turns=turns,
        traj=traj_s.astype(np.int32),
        step=turns.turn[order],
        anchor=anchor_code[order],
        task_of_traj=task_s[traj_start].astype(np.int32),
        rewards=None if turns.reward is None else turns.reward[order],
        valid=turns.valid[order],
        num_tasks=num_tasks,
        num_anchors=num_anchors,
        prefix=prefix,
        anchor_values=distinct_values(all_anchors, all_codes, num_anchors) if keep_anchor_values
        else None,
    )


def distinct_values(values, codes: np.ndarray, num: int) -> list:
    """The distinct values by code: [num], element c is the first value of code c.

    Args:
      values: [N] the interned values (list or array); codes: int64 [N] their codes in [0, num).
    """
    _, first = np.unique(codes, return_index=True)  # every code in [0, num) occurs
    assert first.shape[0] == num
    return [values[int(i)] for i in first]


def _length(a: np.ndarray) -> int:
    """A per-step column's length (-1 for a scalar)."""
    return a.shape[0] if a.ndim else -1


def _show(values, row) -> str:
    return repr(values[int(row)])


# ----------------------------------------------------------------------------------------------
# Returns


def _rewards_of(batch: StepBatch, rewards: np.ndarray | None, what: str) -> np.ndarray:
    if rewards is not None:
        return rewards
    if batch.rewards is None:
        raise ValueError(f"{what} needs rewards; pass rewards to prepare_batch")
    return batch.rewards


def _rows_by_step(batch: StepBatch) -> list[np.ndarray]:
    """Canonical rows grouped by step index: element t holds the rows at step t (ascending), for
    t = 0..max step; empty for an empty batch. The per-step loops below run over this list."""
    if batch.num_steps == 0:
        return []
    rows_by_step = np.argsort(batch.step, kind="stable")
    bounds = np.searchsorted(batch.step[rows_by_step], np.arange(int(batch.step.max()) + 2))
    return [rows_by_step[bounds[t]:bounds[t + 1]] for t in range(int(batch.step.max()) + 1)]


def discounted_returns(batch: StepBatch, gamma: float, rewards: np.ndarray | None = None) -> np.ndarray:
    """R_t = sum_{j >= t} gamma^(j-t) r_j within each trajectory, float64 [N] canonical order.

    `rewards` [N] (canonical order) replaces the batch's rewards when given. Computed with the
    recurrence R_t = r_t + gamma * R_{t+1} (R past the end = 0) in float64, one vectorized update
    per step index t (a loop over max trajectory length, never over rows).
    """
    r = _rewards_of(batch, rewards, "discounted_returns")
    n = batch.num_steps
    out = np.zeros(n, np.float64)
    if n == 0:
        return out
    is_last = np.zeros(n, bool)
    is_last[batch.traj_start + batch.traj_len - 1] = True
    nxt = np.append(out, 0.0)  # out[n] stays 0 and serves as "after the end"
    for rows in reversed(_rows_by_step(batch)):
        following = np.where(is_last[rows], n, rows + 1)
        nxt[rows] = r[rows] + gamma * nxt[following]
    return nxt[:n].copy()


def episode_returns(batch: StepBatch, rewards: np.ndarray | None = None) -> np.ndarray:
    """Plain (undiscounted) sum of each trajectory's rewards, float64 [T], summed in step order.
    `rewards` [N] (canonical order) replaces the batch's rewards when given."""
    r = _rewards_of(batch, rewards, "episode_returns")
    if batch.num_trajectories == 0:
        return np.zeros(0, np.float64)
    return np.add.reduceat(r, batch.traj_start)


# ----------------------------------------------------------------------------------------------
# Group indices


def _densify(keys: np.ndarray) -> tuple[np.ndarray, int]:
    uniq, inverse = np.unique(keys, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), int(uniq.shape[0])


def _pair_ids(left: np.ndarray, right: np.ndarray, num_right: int) -> tuple[np.ndarray, int]:
    """Exact pair -> dense id: rows share an id iff they share (left, right). `left` holds
    non-negative ints, `right` codes in [0, num_right); the pair is packed into one int64 (no
    hashing) and densified. Returns (ids int64 [M] in [0, G), G)."""
    if left.shape[0] == 0:
        return np.zeros(0, np.int64), 0
    return _densify(left.astype(np.int64) * max(num_right, 1) + right)


def step_level_ids(batch: StepBatch, K: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """Per-level dense group ids, before offsetting.

    Returns a list over k = 0..K of (rows int64 [N_k], ids int64 [N_k], G_k): the canonical rows
    that have level k (step >= k, or a step t < k whose trajectory replayed at least k - t steps
    before its step 0: `StepBatch.prefix`), their level-k group (0..G_k-1) and the number of
    level-k groups. Level k's group is (task, a_t, a_{t-1}, ..., a_{t-k}), the anchors before step
    0 taken from the prefix.
    """
    n = batch.num_steps
    task = batch.task_of_traj[batch.traj]
    rows = np.arange(n, dtype=np.int64)
    ids, g = _pair_ids(task, batch.anchor, batch.num_anchors)
    levels = [(rows, ids, g)]
    full_prev = ids  # level k-1 id per row in `rows` (rows shrink with k)
    width = 0 if batch.prefix is None else batch.prefix.shape[1]
    for k in range(1, K + 1):
        step = batch.step[rows]
        before = np.full(rows.shape[0], -1, np.int64)  # the anchor t-k steps back, from the prefix
        early = step < k
        if width and early.any():
            back = width - (k - step[early])           # column of step t-k in the prefix
            ok = back >= 0
            picked = np.full(back.shape[0], -1, np.int64)
            picked[ok] = batch.prefix[batch.traj[rows[early][ok]], back[ok]]
            before[early] = picked
        keep = ~early | (before >= 0)
        rows, prev, step, before = rows[keep], full_prev[keep], step[keep], before[keep]
        # Canonical rows are sorted by (trajectory, step), so row - k is step t-k of the same one.
        past = np.where(step >= k, batch.anchor[np.maximum(rows - k, 0)], before)
        ids, g = _pair_ids(prev, past, batch.num_anchors)
        levels.append((rows, ids, g))
        full_prev = ids
    return levels


def full_history_ids(batch: StepBatch) -> np.ndarray:
    """Full-history group of every canonical row: int64 [N], dense ids in [0, G).

    Two rows share an id iff they have the same task and the same anchors a_0, a_1, ..., a_t
    (so the same step index t). Built forwards with the exact pairing of `step_level_ids`:
    id(t=0) = pair(task, a_0), id(t) = pair(id(t-1) of the same trajectory, a_t), one vectorized
    update per step index (a loop over the longest trajectory, never over rows); each step index
    gets its own id range. The grouping equals hgpo's level-t group of a step t (the same key
    (task, a_t, ..., a_0)), but `step_level_ids` would need K = the longest trajectory and
    O(N * length) work to reach it; this forward pass touches each row once.
    """
    out = np.zeros(batch.num_steps, np.int64)
    offset = 0
    start = history_starts(batch)  # [T]: the task, then the anchors replayed before step 0
    for t, rows in enumerate(_rows_by_step(batch)):
        # Canonical rows are sorted by (trajectory, step): row - 1 is step t-1 of the same one.
        prev = start[batch.traj[rows]] if t == 0 else out[rows - 1]
        ids, g = _pair_ids(prev, batch.anchor[rows], batch.num_anchors)
        out[rows] = ids + offset
        offset += g
    return out


def history_starts(batch: StepBatch) -> np.ndarray:
    """int64 [T]: each trajectory's history before its step 0 as one id: its task, paired with
    the anchors of its replayed prefix (`StepBatch.prefix`; a missing column is a symbol of its
    own, so prefixes of different lengths differ). Without prefixes: the task."""
    ids = batch.task_of_traj.astype(np.int64)
    if batch.prefix is None:
        return ids
    for column in batch.prefix.T:  # oldest replayed step first
        code = np.where(column >= 0, column, batch.num_anchors)
        ids, _ = _pair_ids(ids, code, batch.num_anchors + 1)
    return ids


def index_step_groups(batch: StepBatch, K: int, similarity_thresh: float | None = None) -> GroupIndex:
    """The hgpo hierarchy as a GroupIndex over canonical rows: ids int32 [N, K+1].

    Level k of step t groups steps with the same task and the same anchors at t, t-1, ..., t-k;
    ids[i, k] = -1 when step t < k. Level k's ids are offset by the number of groups of levels
    < k so all levels are disjoint. Level 0 is gigpo's step-level group (same task, same anchor).
    With `similarity_thresh` (in (0, 1); the batch prepared with `keep_anchor_values=True`),
    "the same anchor" is "the same similarity cluster" (`cluster_anchors`) at every level.
    """
    _check_K(K)
    if similarity_thresh is not None:
        batch = cluster_anchors(batch, similarity_thresh)
    n = batch.num_steps
    ids = np.full((n, K + 1), -1, np.int64)
    sizes = []
    offset = 0
    for k, (rows, level_ids, g) in enumerate(step_level_ids(batch, K)):
        ids[rows, k] = level_ids + offset
        sizes.append(np.bincount(level_ids, minlength=g))
        offset += g
    if offset >= np.iinfo(np.int32).max:
        raise ValueError(f"{offset} groups do not fit int32 group ids; split the batch")
    sizes_arr = np.concatenate(sizes).astype(np.int32) if sizes else np.zeros(0, np.int32)
    return GroupIndex(ids=ids.astype(np.int32), sizes=sizes_arr, num_groups=int(offset))


# ----------------------------------------------------------------------------------------------
# Similarity clusters


def check_similarity_thresh(t) -> None:
    """A ValueError unless `t` is a number in (0, 1) (the authors' range)."""
    ok = isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, (bool, np.bool_))
    if not (ok and 0.0 < t < 1.0):
        raise ValueError(f"similarity_thresh must be a number in (0, 1) (difflib's ratio), got {t!r}; "
                         f"None groups equal anchors only")


def trajectories_by_appearance(batch: StepBatch) -> np.ndarray:
    """int64 [T]: the trajectories in the order they first appear in the input rows."""
    if batch.num_steps == 0:
        return np.zeros(0, np.int64)
    first_row = np.minimum.reduceat(batch.order, batch.traj_start)   # [T] first input row
    return np.argsort(first_row, kind="stable").astype(np.int64)


def authors_order(batch: StepBatch) -> np.ndarray:
    """int64 [N]: the canonical rows in the order GiGPO's greedy clustering visits them: the
    trajectories in the order they first appear in the input rows, each one's steps in order.

    That is verl-agent's batch order (`gather_rollout_data`: env by env, each env's steps in
    order) when the rows are given in it, whatever the trajectory ids are (uuids included).
    """
    trajs = trajectories_by_appearance(batch)
    if trajs.shape[0] == 0:
        return trajs
    return np.concatenate([np.arange(batch.traj_start[tau], batch.traj_start[tau] + batch.traj_len[tau])
                           for tau in trajs]).astype(np.int64)


def _anchor_texts(batch: StepBatch) -> list[str]:
    values = batch.anchor_values
    if values is None:
        raise ValueError("similarity clusters need the anchors' text: prepare the batch with "
                         "prepare_batch(..., keep_anchor_values=True)")
    bad = next((v for v in values if not isinstance(v, str)), None)
    if bad is not None:
        raise ValueError(f"similarity_thresh compares anchors as text: every anchor must be a str "
                         f"(the observation), got {bad!r} ({type(bad).__name__}); use "
                         f"similarity_thresh=None for other anchors")
    return [str(v) for v in values]


def cluster_ids(batch: StepBatch, t: float) -> tuple[np.ndarray, np.ndarray | None, int, Similarity]:
    """GiGPO's similarity clusters of every anchor of the batch.

    Per task, the rows are visited in `authors_order`, then the anchors replayed before step 0
    (`StepBatch.prefix`: trajectories in the same order, oldest first), so prefixes never change
    the rows' clusters; each joins the first cluster of its task whose representative it is
    similar to (`hgpo_jax.rl.similarity`), or starts one.

    Returns:
      (cluster int64 [N] of each canonical row, cluster int64 [T, M] of each prefix anchor (-1
      where none) or None, C: the number of clusters (ids 0..C-1, task by task), the
      `Similarity` used (its `stats`)).
    """
    check_similarity_thresh(t)
    similar = Similarity(_anchor_texts(batch), float(t))
    trajs = trajectories_by_appearance(batch)
    rows = authors_order(batch)
    task_of_row = batch.task_of_traj[batch.traj].astype(np.int64)
    kinds = [(rows, task_of_row[rows], batch.anchor[rows])]  # (position, task, anchor code)
    prefix_cells = None
    if batch.prefix is not None:
        cells = np.argwhere(batch.prefix[trajs] >= 0)  # trajectories in order, oldest step first
        prefix_cells = (trajs[cells[:, 0]], cells[:, 1])
        kinds.append((np.arange(cells.shape[0]), batch.task_of_traj[prefix_cells[0]].astype(np.int64),
                      batch.prefix[prefix_cells]))
    kind = np.concatenate([np.full(k[0].shape[0], i) for i, k in enumerate(kinds)])
    where = np.concatenate([k[0] for k in kinds])
    task = np.concatenate([k[1] for k in kinds])
    code = np.concatenate([k[2] for k in kinds])
    visit = np.argsort(task, kind="stable")  # task by task, the order kept within a task
    cluster = np.empty(code.shape[0], np.int64)
    offset = 0
    for part in np.split(visit, np.flatnonzero(np.diff(task[visit])) + 1):
        ids, reps = greedy_clusters(code[part].tolist(), similar)
        cluster[part] = np.asarray(ids, np.int64) + offset
        offset += len(reps)
    row_cluster = np.empty(batch.num_steps, np.int64)
    row_cluster[where[kind == 0]] = cluster[kind == 0]
    prefix_cluster = None
    if prefix_cells is not None:
        prefix_cluster = np.full(batch.prefix.shape, -1, np.int64)
        prefix_cluster[prefix_cells] = cluster[kind == 1]
    return row_cluster, prefix_cluster, offset, similar


def cluster_anchors(batch: StepBatch, t: float) -> StepBatch:
    """The batch with each anchor code replaced by its similarity cluster (`cluster_ids`), so the
    exact grouping of the result groups by cluster: level k of step t by (task, c_t, ...,
    c_{t-k}). Needs `prepare_batch(..., keep_anchor_values=True)` and str anchors."""
    rows, prefix, num, _ = cluster_ids(batch, t)
    return dataclasses.replace(batch, anchor=rows, prefix=prefix, num_anchors=num, anchor_values=None)


def build_trajectory_groups(batch: StepBatch) -> GroupIndex:
    """Episode-level grouping with one value per trajectory (the paper's equations): trajectories
    grouped by task. ids int32 [T, 1]."""
    ids = batch.task_of_traj.astype(np.int32).reshape(-1, 1)
    sizes = np.bincount(batch.task_of_traj, minlength=batch.num_tasks).astype(np.int32)
    return GroupIndex(ids=ids, sizes=sizes, num_groups=int(batch.num_tasks))


def build_row_task_groups(batch: StepBatch) -> GroupIndex:
    """Episode-level grouping over step rows (the authors' code): every canonical row grouped by
    its task, so a trajectory counts once per step it took. ids int32 [N, 1]."""
    task = batch.task_of_traj[batch.traj]
    sizes = np.bincount(task, minlength=batch.num_tasks).astype(np.int32)
    return GroupIndex(ids=task.astype(np.int32).reshape(-1, 1), sizes=sizes,
                      num_groups=int(batch.num_tasks))


def _check_K(K) -> None:
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 0:
        raise ValueError(f"K (the highest hierarchy level) must be an int >= 0, got {K!r}")


# ----------------------------------------------------------------------------------------------
# Statistics


def level_coverage(index: GroupIndex) -> np.ndarray:
    """Per level, the fraction of all M rows that sit in a group of size >= 2. float64 [L].

    The denominator is every row, including rows with t < k that have no level-k group at all,
    so the fractions of a hierarchy are non-increasing in k.
    """
    m, num_levels = index.ids.shape
    if m == 0:
        return np.zeros(num_levels, np.float64)
    valid = index.ids >= 0
    size = np.where(valid, index.sizes[np.where(valid, index.ids, 0)], 0)  # m > 0 implies G > 0
    return (size >= 2).sum(axis=0) / m


def hierarchy_stats(task_ids, traj_ids, step_ids, anchors, K: int = 2,
                    prefix_anchors=None, similarity_thresh: float | None = None) -> np.ndarray:
    """The paper's Table 5: per level k = 0..K, the fraction of steps in a level-k group of size >= 2.

    Args:
      task_ids, traj_ids, step_ids, anchors: [N] as for `compute_step_advantages`.
      K: highest level. prefix_anchors, similarity_thresh: as for `compute_step_advantages`
        (with a threshold the levels group similarity clusters).
    Returns:
      float64 [K+1]. Denominator: all N steps (a step with t < k counts as not grouped at level k).
      An empty batch gives zeros.
    """
    _check_K(K)
    batch = prepare_batch(task_ids, traj_ids, step_ids, anchors, prefix_anchors=prefix_anchors,
                          keep_anchor_values=similarity_thresh is not None)
    return level_coverage(index_step_groups(batch, K, similarity_thresh))
