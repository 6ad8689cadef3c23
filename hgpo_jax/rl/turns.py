"""Rows linked into episodes, once: `LinkedTurns`, the one validated layout of a batch's turns
that grouping (`rl.grouping.StepBatch`), HAE (`rl.hae`) and the algorithms (`rl.algorithms`:
the critic family's episode rewards, HiPER's HAE) read; and the column parsers they share.

    turns = LinkedTurns.link(traj_ids, turn_ids, done=..., reward=..., valid=...)  # [N], any order
    turns = LinkedTurns.of(rollout_batch, rows=S)  # a rollout's n rows, then S - n inert rows

An episode (a trajectory) is the rows of one id; its turns must be exactly 0..k-1, each once.
`LinkedTurns.link` checks that and the columns' types once and raises a ValueError naming the
problem: mismatched lengths, non-integer or negative turn ids, a duplicated (episode, turn) pair,
a gap in an episode's turns, non-boolean dones or validity, non-finite rewards. A done before an
episode's last turn is not an error (HAE's formulas read a done wherever it is).

Ids are interned (`intern`) into dense codes without a Python loop over rows: equal ids <=>
equal codes, numbered in sorted order for a NumPy array of ids and in order of first appearance
otherwise. Host NumPy only, no JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# ----------------------------------------------------------------------------------------------
# Columns


def intern(values, what: str) -> tuple[np.ndarray, int]:
    """Dense codes for arbitrary hashable values: equal values <=> equal codes.

    Args:
      values: sequence [N] of hashables (str, int, bytes, tuples, ...) or a NumPy array.
      what: name used in error messages ("anchors", "task_ids", ...).
    Returns:
      (codes int64 [N], number of distinct values).

    A non-object NumPy array goes through `np.unique`; anything else through one dict that
    stores each distinct value once (`dict.fromkeys` / `map` iterate in C, there is no Python
    loop over rows).
    """
    if isinstance(values, np.ndarray) and values.dtype != object:
        if values.ndim != 1:
            raise ValueError(f"{what} must be 1-D, got shape {values.shape}")
        uniq, inverse = np.unique(values, return_inverse=True)
        return inverse.astype(np.int64).reshape(-1), int(uniq.shape[0])
    seq = values.tolist() if isinstance(values, np.ndarray) else values
    try:
        table = dict.fromkeys(seq)
    except TypeError as e:
        raise ValueError(f"{what} must be hashable (str, int, bytes, tuple, ...): {e}") from None
    for code, key in enumerate(table):
        table[key] = code
    codes = np.fromiter(map(table.__getitem__, seq), dtype=np.int64, count=len(seq))
    return codes, len(table)


def as_1d(values, what: str) -> np.ndarray | list:
    """A column of hashables [N]: a 1-D NumPy array as it is, any other sequence as a list."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"{what} must be 1-D, got shape {values.shape}")
        return values
    try:
        return list(values)
    except TypeError:
        raise ValueError(f"{what} must be a sequence, got {type(values).__name__}") from None


def numeric(x, n: int, what: str) -> np.ndarray:
    """x as a 1-D array of length n; an object array (as verl's non-tensor batches hold) is
    converted to numbers when it can be."""
    a = np.asarray(x)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(f"{what} must be 1-D of length N={n}, got shape {a.shape}")
    if a.dtype == object:
        try:
            a = np.array(a.tolist())
        except (TypeError, ValueError):
            pass
    return a


def flags(x, n: int, what: str, default: bool) -> np.ndarray:
    """bool [n] from booleans or 0/1 numbers; `default` everywhere when x is None."""
    if x is None:
        return np.full(n, default, bool)
    a = numeric(x, n, what)
    if a.dtype == bool:
        return a
    if n and not (np.issubdtype(a.dtype, np.number) and np.all((a == 0) | (a == 1))):
        raise ValueError(f"{what} must be booleans (or 0/1 numbers), got dtype {a.dtype}")
    return a.astype(bool)


def floats(x, n: int, what: str, rows: np.ndarray | None = None) -> np.ndarray:
    """float64 [n], checked finite (only on `rows` when given; the other rows become 0)."""
    a = numeric(x, n, what)
    if n and not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise ValueError(f"{what} must be numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    checked = a if rows is None else np.where(rows, a, 0.0)
    bad = ~np.isfinite(checked)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what} must be finite: {int(bad.sum())} NaN/inf value(s), first at "
                         f"row {i} (value {a[i]})")
    return checked


def turn_column(turn_ids, what: str) -> np.ndarray:
    """int64 [N] turn (step) indices from integers or whole floats, each >= 0; `what` names the
    column ("turn_ids", "step_ids") in the messages."""
    a = np.asarray(turn_ids)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {a.shape}")
    n = a.shape[0]
    a = numeric(a, n, what)
    if n and not np.issubdtype(a.dtype, np.integer):
        if not (np.issubdtype(a.dtype, np.floating) and np.all(np.isfinite(a))
                and np.all(a == np.round(a))):
            raise ValueError(f"{what} must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if n and a.min() < 0:
        i = int(np.argmin(a))
        raise ValueError(f"{what} must be >= 0; row {i} has {_noun(what)} {a[i]}")
    return a


def _noun(what: str) -> str:
    """"turn" of "turn_ids", "step" of "step_ids" / "step_id"."""
    return what.split("_")[0]


def _preview(a: np.ndarray, limit: int = 12) -> str:
    items = ", ".join(str(int(x)) for x in a[:limit])
    return f"[{items}{', ...' if a.shape[0] > limit else ''}]"


# ----------------------------------------------------------------------------------------------
# The linked turns


@dataclasses.dataclass(frozen=True)
class LinkedTurns:
    """S rows linked into E episodes: the first n rows are real turns, in any order; rows
    n..S-1 are inert padding (traj_id -1, episode -1, turn 0, done False, reward 0, valid False).

    Per row [S]:
      traj_id: the row's episode id as given (a NumPy array or a list of hashables).
      turn: int64, its turn 0..k-1 within the episode.
      done: bool, the env ended the episode at this turn (False where not given).
      reward: float64, the turn's own env reward, no penalty (None where not given).
      valid: bool, the reply held a valid action (True where not given).
      episode: int64, the episode's dense index 0..E-1 (`intern` of the ids).
    Per episode [E]:
      length: int64, its number of turns k.
      start: int64, the position in `order` of its turn 0.
    order: int64 [n], the real rows in canonical order, by episode then turn:
      `order[start[e] + t]` is the row of episode e's turn t.
    """

    traj_id: np.ndarray | list
    turn: np.ndarray
    done: np.ndarray
    reward: np.ndarray | None
    valid: np.ndarray
    episode: np.ndarray
    length: np.ndarray
    start: np.ndarray
    order: np.ndarray

    @property
    def num_rows(self) -> int:
        """n: the real rows (the first n)."""
        return int(self.order.shape[0])

    @property
    def num_episodes(self) -> int:
        """E."""
        return int(self.length.shape[0])

    @classmethod
    def link(cls, traj_ids, turn_ids, *, done=None, reward=None, valid=None,
             names: tuple[str, str] = ("traj_ids", "turn_ids")) -> LinkedTurns:
        """Link N rows in any order into episodes, every check done here once.

        Args:
          traj_ids: [N] hashables, each row's episode. turn_ids: [N] ints (or whole floats),
            its turn; each episode's turns exactly 0..k-1, each once.
          done, valid: [N] bools (or 0/1) or None; reward: [N] finite numbers or None.
          names: the two columns' names in the messages ("traj_ids", "step_ids" for grouping).
        Returns:
          LinkedTurns of the N rows (no inert rows).
        Raises:
          ValueError naming the problem (see the module docstring).
        """
        traj_name, turn_name = names
        noun = _noun(turn_name)
        turn = turn_column(turn_ids, turn_name)
        n = turn.shape[0]
        traj_ids = as_1d(traj_ids, traj_name)
        if len(traj_ids) != n:
            raise ValueError(f"{traj_name} has {len(traj_ids)} rows, {turn_name} {n}: all per-row "
                             f"inputs must have one length N")
        episode, num_episodes = intern(traj_ids, traj_name)
        order = np.lexsort((turn, episode)) if n else np.zeros(0, np.int64)
        episode_s, turn_s = episode[order], turn[order]
        dup = (episode_s[1:] == episode_s[:-1]) & (turn_s[1:] == turn_s[:-1])
        if dup.any():
            j = int(np.flatnonzero(dup)[0])
            rows = order[(episode_s == episode_s[j]) & (turn_s == turn_s[j])]
            raise ValueError(f"duplicate (trajectory, {noun}) pair: {noun} {turn_s[j]} of trajectory "
                             f"{traj_ids[int(order[j])]!r} appears {len(rows)} times (input rows "
                             f"{_preview(rows)}); each {noun} of a trajectory must be one row (pad "
                             f"with inert rows after HAE or the advantages, not with duplicates)")
        length = np.bincount(episode_s, minlength=num_episodes).astype(np.int64)
        start = np.zeros(num_episodes, np.int64)
        np.cumsum(length[:-1], out=start[1:])
        gap = turn_s != np.arange(n, dtype=np.int64) - start[episode_s]
        if gap.any():
            j = int(np.flatnonzero(gap)[0])
            e = int(episode_s[j])
            raise ValueError(f"gap in {noun} ids: trajectory {traj_ids[int(order[j])]!r} has {noun}s "
                             f"{_preview(turn_s[start[e]:start[e] + length[e]])}; its {noun}s must "
                             f"be exactly 0..n-1 (here 0..{length[e] - 1})")
        return cls(traj_id=traj_ids, turn=turn, done=flags(done, n, "dones", False),
                   reward=None if reward is None else floats(reward, n, "rewards"),
                   valid=flags(valid, n, "valid", True), episode=episode, length=length,
                   start=start, order=order.astype(np.int64))

    @classmethod
    def of(cls, batch, rows: int) -> LinkedTurns:
        """The turns of a rollout's n rows (an `rl.rollout.RolloutBatch`: traj_id, step_id, done,
        reward, valid, each [n]), linked, then padded to `rows` with inert ones."""
        n = len(batch)
        real = cls.link(np.asarray(batch.traj_id, np.int64)[:n],
                        np.asarray(batch.step_id, np.int64)[:n],
                        done=np.asarray(batch.done, bool)[:n],
                        reward=np.asarray(batch.reward, np.float64)[:n],
                        valid=np.asarray(batch.valid, bool)[:n], names=("traj_id", "step_id"))

        def pad(x, fill):
            out = np.full(rows, fill, x.dtype)
            out[:n] = x
            return out

        return dataclasses.replace(real, traj_id=pad(real.traj_id, -1), turn=pad(real.turn, 0),
                                   done=pad(real.done, False), reward=pad(real.reward, 0.0),
                                   valid=pad(real.valid, False), episode=pad(real.episode, -1))

    def episode_rewards(self) -> np.ndarray:
        """Each row's episode reward (the sum of its episode's turn rewards, in row order) [S];
        0 for inert rows."""
        real = self.episode >= 0
        totals = np.zeros(self.num_episodes, np.float64)
        np.add.at(totals, self.episode[real], self.reward[real])
        out = np.zeros(self.episode.shape, np.float64)
        out[real] = totals[self.episode[real]]
        return out
