"""HiPER's Hierarchical Advantage Estimation (HAE): three advantages per turn of a plan-execute
agent, as the authors' `compute_hae_advantage` computes them (JonP07/HiPER-agent at 9d3c118,
`hiper_hae/core_hae.py`; the specification is the design notes, shared/design/hiper.md section 2).

Each row is one turn t of a trajectory (an episode), with the env reward r_t, the parsed switch
(`new_segment`: True = SWITCH, a new sub-goal) and three critic values read at that turn: VL_t
(low head, the state before the action), VH_t (high head, the state before the sub-goal; used on
segment starts only) and VT_t (termination head, the state before the switch). A turn is a
boundary when t == 0 or it says SWITCH; a segment is a maximal run [s, e] of turns that starts at
a boundary. With nd_t = 1 - done_t:

- Reward shaping (host, NumPy, float64 then float32), in this order:
  keep penalty p_k: mode "fixed" adds p_k on every KEEP row (new_segment False, turn 0
  included); mode "normalized" adds p_k / n on every KEEP row of a trajectory of n >= 2 rows
  (the authors' p_k * (n_keep / n) / n_keep) and nothing in a 1-row trajectory;
  invalid penalty c: r_t -= c on rows with valid False;
  consistency penalty p_c: r_t += p_c on KEEP rows of turn >= 1 whose sub-goal differs from
  the previous turn's (`subgoal_changed`), both turns having a sub-goal span.
- Low level: GAE inside each segment. V_next is VL_{t+1} inside the segment; at the segment's
  end it is VH of the next segment's start, else (last segment, `bootstrap_truncated`) the
  row's own VL_t, else 0; delta_t = r_t + gamma nd_t V_next - VL_t, A_t = delta_t +
  gamma lam nd_t A_{t+1} (A after the segment's end = 0); return = A + VL.
- High level: SMDP GAE over the segments k of a trajectory, stored on the start row s_k:
  R_k = sum_j gamma^j r_{s_k+j} over the segment's d_k turns, nd = nd at the segment's end,
  boot = VH of the next segment's start, else (`bootstrap_truncated`) VH of the segment's own
  start, else 0 (and 0 when done); delta_k = R_k + gamma^d_k nd boot - VH_{s_k};
  A_k = delta_k + gamma^d_k lam_seg nd A_{k+1}; return = A_k + VH_{s_k}.
- Termination level: G = boot (as for the high level) at the segment's end, then backwards
  G <- r_t + gamma G; the return is G and the advantage G - VT_t, on every row.
- Normalization (`norm_adv`): each level separately,
  (x - mean) / (population std + 1e-8) over the rows that carry that level's tokens: low =
  every row (the action mask always has tokens: the whole reply when there are no action
  tags); high = segment starts with a sub-goal span (`has_subgoal`); term = rows with a switch
  span (`has_switch`). The statistics' rows are as the authors'; the normalized value is also
  given on the level's other rows (segment starts without a sub-goal span, rows without a
  switch span: their tokens get nothing, so it is never used); `high` stays 0 off segment
  starts. A level with no such row keeps its raw values. Returns are never normalized.

Shapes: the entry point `hae_advantages` takes [N] rows in any order, linked into episodes and
checked once by `hgpo_jax.rl.turns.LinkedTurns` (`hae_of_turns` takes turns linked already, as
HiPER's unit has them); they are put into padded [E, T] tensors (E trajectories, T turns, each
bucketed to a power of two, padding inert: it never enters a trajectory, a sum or a statistic)
and the three levels and the normalization run as one jitted float32 function built on a
reverse `jax.lax.scan` over the turns (`hae_scan`).

Quirks of the authors' code, reproduced: turn 0 is a boundary even when it says KEEP (and a
KEEP turn 0 gets the keep penalty); `bootstrap_truncated` bootstraps a truncated last segment
from the row's own VL at the low level but from VH of the segment's own start at the high and
termination levels; the normalized keep penalty is p_k / n on KEEP rows and absent in 1-row
trajectories; the termination advantage is the Monte Carlo return minus VT, not the paper's
(q - beta)(V_high - V_low); dones are read per row at the low level (nd_t) and at the segment's
end only at the high and termination levels.

Quirk fixed: the authors' trainer pads its batch with duplicates of random rows before HAE; a
duplicate keeps its trajectory and turn, so it becomes an extra turn (its reward counted twice,
the keep penalty's n grown, the statistics skewed). Here a duplicated (trajectory, turn) is an
error: the caller computes HAE on the real rows and pads with inert rows after HAE.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hgpo_jax.algo_specs import KEEP_PENALTY_MODES, hiper_option_defaults
from hgpo_jax.rl.batching import bucket
from hgpo_jax.rl.turns import LinkedTurns, flags, floats

_HIPER = hiper_option_defaults()  # HiPER's options at their defaults: the keywords' defaults below
NORM_EPS = 1e-8
MIN_EPISODES = 8  # smallest E bucket
MIN_TURNS = 8  # smallest T bucket


@dataclasses.dataclass(frozen=True)
class HAEResult:
    """HAE's per-row outputs, all [N] in the input rows' order.

    low, high, term: float32 advantages (normalized per level when `norm_adv`; `high` is 0 off
      segment starts).
    low_raw, high_raw, term_raw: float32 advantages before normalization.
    low_return, high_return, term_return: float32 critic targets (raw; `high_return` is 0 off
      segment starts).
    rewards: float32 shaped rewards (env reward + keep, invalid and consistency penalties).
    has_high: bool, the row starts a segment (turn 0 or SWITCH): the high level's rows.
    segment_end: bool, the row ends a segment (last turn, or the next turn starts one).
    high_mask, low_mask, term_mask: bool, the rows whose tokens carry that level and that enter
      its normalization (`has_high & has_subgoal`, every row, `has_switch`).
    """

    low: np.ndarray
    high: np.ndarray
    term: np.ndarray
    low_return: np.ndarray
    high_return: np.ndarray
    term_return: np.ndarray
    low_raw: np.ndarray
    high_raw: np.ndarray
    term_raw: np.ndarray
    rewards: np.ndarray
    has_high: np.ndarray
    segment_end: np.ndarray
    low_mask: np.ndarray
    high_mask: np.ndarray
    term_mask: np.ndarray


# ----------------------------------------------------------------------------------------------
# Device functions (pure; run under jax.jit)


def hae_scan(rewards, dones, boundary, real, v_low, v_high, v_term, gamma, lam_turn, lam_seg,
             bootstrap_truncated):
    """The three levels' raw advantages and returns by one reverse scan over the turns.

    Args:
      rewards, v_low, v_high, v_term: float32 [E, T] (shaped reward and the three values; v_high
        is read on boundaries only).
      dones, boundary, real: bool [E, T]. real: the turn exists (trajectory e has turns
        0..n_e-1, padding after); boundary: the turn starts a segment (real turns only).
      gamma, lam_turn, lam_seg: float32 scalars; bootstrap_truncated: bool scalar.
    Returns:
      dict of [E, T]: low, low_return, high, high_return (0 off boundaries), term, term_return
      (float32; 0 on padding) and segment_end (bool).

    The scan runs from the last turn to the first; its carry, [E] each, describes turn t + 1 and
    what follows it: next_starts (turn t + 1 starts a segment or does not exist, so turn t ends
    one), has_next / vh_next (a later segment exists / VH of the nearest later start), a_low /
    vl_next (turn t + 1's low advantage and VL), boot / nd_end (the current segment's bootstrap
    value, 0 when done, and 1 - done at its end), seg_ret / disc (sum_j gamma^j r over turns
    t + 1 .. end, and gamma^(end - t)), g (turn t + 1's termination return), a_high_next (the
    high advantage of the nearest later segment). Padded turns leave the carry as it is. VH of
    each turn's own segment start (the truncated bootstrap of the high and termination levels,
    unknown when the scan reaches the segment's end) comes from a running maximum of the start
    turns before the scan.
    """
    f32 = jnp.float32
    num_episodes, _ = rewards.shape
    t_idx = jnp.broadcast_to(jnp.arange(rewards.shape[1])[None, :], rewards.shape)
    start_idx = jax.lax.cummax(jnp.where(boundary, t_idx, 0), axis=1)
    vh_own = jnp.take_along_axis(v_high, start_idx, axis=1)

    def step(carry, xs):
        r, done, b, ok, vl, vh, vt, vho = xs
        nd = 1.0 - done.astype(f32)
        end = ok & carry["next_starts"]  # the next turn starts a segment or does not exist
        # bootstrap value after the segment's end (already 0 when done)
        later = jnp.where(carry["has_next"], carry["vh_next"],
                          jnp.where(bootstrap_truncated, vho, 0.0))
        boot = jnp.where(end, nd * later, carry["boot"])
        nd_end = jnp.where(end, nd, carry["nd_end"])
        # low level: GAE inside the segment
        low_later = jnp.where(carry["has_next"], carry["vh_next"],
                              jnp.where(bootstrap_truncated, vl, 0.0))
        v_next = jnp.where(end, low_later, carry["vl_next"])
        a_next = jnp.where(end, 0.0, carry["a_low"])
        a_low = r + gamma * nd * v_next - vl + gamma * lam_turn * nd * a_next
        # segment sums from this turn to the segment's end, and gamma^(turns to the end)
        seg_ret = r + gamma * jnp.where(end, 0.0, carry["seg_ret"])
        disc = gamma * jnp.where(end, 1.0, carry["disc"])
        g = r + gamma * jnp.where(end, boot, carry["g"])
        # high level at the segment's start
        a_high = (seg_ret + disc * boot - vh
                  + disc * lam_seg * nd_end * carry["a_high_next"])
        a_high = jnp.where(b, a_high, 0.0)
        new = {
            "has_next": carry["has_next"] | b,
            "vh_next": jnp.where(b, vh, carry["vh_next"]),
            "boot": boot, "nd_end": nd_end, "vl_next": vl, "a_low": a_low,
            "seg_ret": seg_ret, "disc": disc, "g": g,
            "a_high_next": jnp.where(b, a_high, carry["a_high_next"]),
        }
        new = {k: jnp.where(ok, v, carry[k]) for k, v in new.items()}
        new["next_starts"] = b | ~ok
        out = (jnp.where(ok, a_low, 0.0), jnp.where(ok, a_low + vl, 0.0),
               jnp.where(ok, a_high, 0.0), jnp.where(b, a_high + vh, 0.0),
               jnp.where(ok, g - vt, 0.0), jnp.where(ok, g, 0.0), end)
        return new, out

    zeros = jnp.zeros((num_episodes,), f32)
    init = {"next_starts": jnp.ones((num_episodes,), bool),
            "has_next": jnp.zeros((num_episodes,), bool),
            "vh_next": zeros, "boot": zeros, "nd_end": zeros, "vl_next": zeros, "a_low": zeros,
            "seg_ret": zeros, "disc": jnp.ones((num_episodes,), f32), "g": zeros,
            "a_high_next": zeros}
    xs = tuple(x.T for x in (rewards.astype(f32), dones, boundary & real, real,
                             v_low.astype(f32), v_high.astype(f32), v_term.astype(f32),
                             vh_own.astype(f32)))
    _, out = jax.lax.scan(step, init, xs, reverse=True)
    names = ("low", "low_return", "high", "high_return", "term", "term_return", "segment_end")
    return {name: x.T for name, x in zip(names, out)}


def normalize_level(x, mask, eps: float = NORM_EPS):
    """(x - mean) / (population std + eps) with the statistics over the entries where `mask` is
    True; x unchanged when the mask is empty. x float32 [E, T], mask bool [E, T]."""
    m = mask.astype(jnp.float32)
    n = jnp.sum(m)
    safe_n = jnp.maximum(n, 1.0)
    mean = jnp.sum(x * m) / safe_n
    var = jnp.sum(jnp.square((x - mean) * m)) / safe_n
    return jnp.where(n > 0, (x - mean) / (jnp.sqrt(var) + eps), x)


@jax.jit
def hae_device(rewards, dones, boundary, real, v_low, v_high, v_term, low_mask, high_mask,
               term_mask, gamma, lam_turn, lam_seg, bootstrap_truncated, normalize):
    """`hae_scan` and, when `normalize` (bool scalar), each level's `normalize_level` over its
    mask (bool [E, T]); the high level stays 0 off boundaries, every level 0 on padding.
    Returns `hae_scan`'s dict plus low_norm, high_norm, term_norm (float32 [E, T])."""
    out = hae_scan(rewards, dones, boundary, real, v_low, v_high, v_term, gamma, lam_turn,
                   lam_seg, bootstrap_truncated)
    has_high = boundary & real
    for name, mask, keep in (("low", low_mask, real), ("high", high_mask, has_high),
                             ("term", term_mask, real)):
        normed = normalize_level(out[name], mask & real)
        out[name + "_norm"] = jnp.where(keep, jnp.where(normalize, normed, out[name]), 0.0)
    return out


# ----------------------------------------------------------------------------------------------
# Host: reward shaping, padding


def shape_rewards(rewards: np.ndarray, new_segment: np.ndarray, turns: np.ndarray,
                  lengths: np.ndarray, valid: np.ndarray, changed: np.ndarray, *,
                  keep_penalty: float, keep_penalty_mode: str, invalid_penalty: float,
                  keep_consistency_penalty: float) -> np.ndarray:
    """The per-row shaped rewards, float64 [N] (section 2.2 of the design).

    rewards: float64 [N]; new_segment, valid: bool [N]; turns: int64 [N]; lengths: int64 [N]
    (each row's trajectory's number of rows); changed: bool [N], the consistency penalty's rows
    (KEEP is checked here). A KEEP row is `~new_segment`, turn 0 included."""
    r = rewards.astype(np.float64).copy()
    keep = ~new_segment
    if keep_penalty != 0.0:
        if keep_penalty_mode == "fixed":
            r += np.where(keep, keep_penalty, 0.0)
        else:
            per_row = keep_penalty / np.maximum(lengths, 1)
            r += np.where(keep & (lengths >= 2), per_row, 0.0)
    if invalid_penalty != 0.0:
        r -= invalid_penalty * (~valid)
    if keep_consistency_penalty != 0.0:
        r += np.where(keep & (turns >= 1) & changed, keep_consistency_penalty, 0.0)
    return r


def _pad(values: np.ndarray, episode: np.ndarray, turn: np.ndarray, shape: tuple[int, int],
         fill: Any = 0) -> np.ndarray:
    """[N] row values scattered into a [E, T] array of `fill` (row i at [episode[i], turn[i]])."""
    out = np.full(shape, fill, dtype=values.dtype)
    out[episode, turn] = values
    return out


def _scalar(x, what: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {x!r}") from None
    if not np.isfinite(v):
        raise ValueError(f"{what} must be finite, got {v}")
    return v


# ----------------------------------------------------------------------------------------------
# Entry point


def hae_advantages(traj_ids, turn_ids, rewards, dones, new_segment, v_low, v_high, v_term, *,
                   valid=None, subgoal_changed=None, has_subgoal=None, has_switch=None,
                   gamma=_HIPER["gamma"], lam=_HIPER["lam"], lam_seg=_HIPER["lam_seg"],
                   keep_penalty=_HIPER["keep_penalty"],
                   keep_penalty_mode=_HIPER["keep_penalty_mode"],
                   invalid_penalty=_HIPER["invalid_penalty"],
                   keep_consistency_penalty=_HIPER["keep_consistency_penalty"],
                   bootstrap_truncated=_HIPER["bootstrap_truncated"],
                   norm_adv=_HIPER["norm_adv"]) -> HAEResult:
    """HiPER's HAE over [N] rows in any order (see the module docstring for what is computed).

    Args:
      traj_ids: [N] hashables, the row's trajectory. turn_ids: [N] ints, its turn (each
        trajectory's turns exactly 0..n-1, each once).
      rewards: [N] env rewards. dones: [N] bools.
      new_segment: [N] bools, the row's parsed switch (True = SWITCH); turn 0 starts a segment
        whatever it says.
      v_low, v_term: [N] critic values. v_high: [N], read (and checked finite) on segment starts
        only.
      valid: [N] bools, the action was valid (None = all).
      subgoal_changed: [N] bools, the row's sub-goal tokens differ from the previous turn's,
        both turns having a sub-goal span (None = never). Read on KEEP rows of turn >= 1 only;
        a row with no span, or whose previous turn has none (`has_subgoal`), is never penalized.
      has_subgoal, has_switch: [N] bools, the row's reply has a sub-goal / switch span (None =
        all): the high level's tokens (on segment starts) and the termination level's.
      The keywords are HiPER's options, named as its `algo` keys, with their defaults
      (`algo_specs.hiper_option_defaults`):
      gamma, lam, lam_seg: discount and the two GAE lambdas (lam: the turn level's).
      keep_penalty, keep_penalty_mode ("normalized" or "fixed"), invalid_penalty,
        keep_consistency_penalty: reward shaping. bootstrap_truncated: bootstrap a trajectory's
        last segment when its last turn is not done.
      norm_adv: normalize each level's advantages.
    Returns:
      HAEResult of [N] arrays in the rows' order.
    Raises:
      ValueError on mismatched lengths, bad turn ids, duplicated (trajectory, turn) rows,
      non-finite values, an unknown keep_penalty_mode.
    """
    turns = LinkedTurns.link(traj_ids, turn_ids, done=dones, reward=rewards, valid=valid)
    return hae_of_turns(turns, new_segment, v_low, v_high, v_term,
                        subgoal_changed=subgoal_changed, has_subgoal=has_subgoal,
                        has_switch=has_switch, gamma=gamma, lam=lam, lam_seg=lam_seg,
                        keep_penalty=keep_penalty, keep_penalty_mode=keep_penalty_mode,
                        invalid_penalty=invalid_penalty,
                        keep_consistency_penalty=keep_consistency_penalty,
                        bootstrap_truncated=bootstrap_truncated, norm_adv=norm_adv)


def hae_of_turns(turns: LinkedTurns, new_segment, v_low, v_high, v_term, *, subgoal_changed=None,
                 has_subgoal=None, has_switch=None, gamma, lam, lam_seg, keep_penalty,
                 keep_penalty_mode, invalid_penalty, keep_consistency_penalty,
                 bootstrap_truncated, norm_adv) -> HAEResult:
    """`hae_advantages` over the real rows of linked turns: rows 0..n-1 of `turns` give each
    turn's episode, turn, env reward, done and validity (its inert rows are left out); the other
    per-row inputs are [n] and the options as `hae_advantages`' (no defaults here). Returns an
    HAEResult of [n] arrays in the rows' order."""
    if keep_penalty_mode not in KEEP_PENALTY_MODES:
        raise ValueError(f"keep_penalty_mode must be one of {KEEP_PENALTY_MODES}, got "
                         f"{keep_penalty_mode!r}")
    gamma, lam_turn, lam_seg = (_scalar(gamma, "gamma"), _scalar(lam, "lam"),
                                _scalar(lam_seg, "lam_seg"))
    keep_penalty = _scalar(keep_penalty, "keep_penalty")
    invalid_penalty = _scalar(invalid_penalty, "invalid_penalty")
    keep_consistency_penalty = _scalar(keep_consistency_penalty, "keep_consistency_penalty")

    if turns.reward is None:
        raise ValueError("HAE needs each turn's env reward: link the turns with reward=")
    n = turns.num_rows
    episode, turn, lengths = turns.episode[:n], turns.turn[:n], turns.length
    dones, valid, env_rewards = turns.done[:n], turns.valid[:n], turns.reward[:n]
    new_segment = flags(new_segment, n, "new_segment", False)
    boundary = new_segment | (turn == 0)
    changed = flags(subgoal_changed, n, "subgoal_changed", False)
    has_subgoal = flags(has_subgoal, n, "has_subgoal", True)
    has_switch = flags(has_switch, n, "has_switch", True)
    v_low = floats(v_low, n, "v_low")
    v_term = floats(v_term, n, "v_term")
    v_high = floats(v_high, n, "v_high (on segment starts)", rows=boundary)

    num_episodes = lengths.shape[0]
    shape = (bucket(num_episodes, MIN_EPISODES), bucket(int(lengths.max(initial=1)), MIN_TURNS))
    # the previous turn's has_subgoal (the consistency penalty needs both spans)
    prev_has = _pad(has_subgoal, episode, turn, shape, False)
    prev_has = np.concatenate([np.zeros((shape[0], 1), bool), prev_has[:, :-1]], axis=1)
    changed = changed & has_subgoal & prev_has[episode, turn]
    shaped = shape_rewards(env_rewards, new_segment, turn, lengths[episode], valid, changed,
                           keep_penalty=keep_penalty, keep_penalty_mode=keep_penalty_mode,
                           invalid_penalty=invalid_penalty,
                           keep_consistency_penalty=keep_consistency_penalty)

    def pad(x, fill=0):
        return _pad(x, episode, turn, shape, fill)

    f32 = np.float32
    out = hae_device(pad(shaped.astype(f32)), pad(dones, False), pad(boundary, False),
                     pad(np.ones(n, bool), False), pad(v_low.astype(f32)),
                     pad(v_high.astype(f32)), pad(v_term.astype(f32)),
                     pad(np.ones(n, bool), False), pad(boundary & has_subgoal, False),
                     pad(has_switch, False), f32(gamma), f32(lam_turn), f32(lam_seg),
                     np.bool_(bootstrap_truncated), np.bool_(norm_adv))
    rows = {k: np.asarray(v)[episode, turn] for k, v in out.items()}
    return HAEResult(
        low=rows["low_norm"], high=rows["high_norm"], term=rows["term_norm"],
        low_return=rows["low_return"], high_return=rows["high_return"],
        term_return=rows["term_return"],
        low_raw=rows["low"], high_raw=rows["high"], term_raw=rows["term"],
        rewards=shaped.astype(f32), has_high=boundary, segment_end=rows["segment_end"],
        low_mask=np.ones(n, bool), high_mask=boundary & has_subgoal, term_mask=has_switch)
