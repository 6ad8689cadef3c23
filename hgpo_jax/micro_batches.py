"""How a batch of rows splits into micro-batches of one size: the largest divisor of a batch at
most a cap (`largest_divisor_at_most`: the config's mini/micro batch hint), and the supervised
warm start's micro-batch (`sft_micro_batch_size`) with the rule the config holds sft.batch_size
to (`sft_batch_fits`, `nearest_sft_batch_sizes`).

Plain integer arithmetic, at the bottom of the package: the config's checks (`config_checks`,
`config`) and the SFT trainer (`trainers.sft`) read it.
"""

from __future__ import annotations


def sft_micro_batch_size(cfg) -> int:
    """Rows per SFT micro-batch: the largest divisor of sft.batch_size <= train.micro_batch_size
    (cfg: a `hgpo_jax.config.Config`).

    The RL paper configs use micro-batches of 32-64 step rows; an SFT step of fewer turns then runs
    as one micro-batch instead of being rejected. Validation refuses an sft.batch_size whose
    micro-batches would hold under half of min(sft.batch_size, train.micro_batch_size) rows
    (`sft_batch_fits`: 7 with 4 would run 1-row micro-batches).
    """
    return largest_divisor_at_most(cfg.sft.batch_size, cfg.train.micro_batch_size)


def sft_batch_fits(batch_size: int, micro_batch_size: int) -> bool:
    """Whether sft.batch_size runs in micro-batches of at least half of min(sft.batch_size,
    train.micro_batch_size) rows (the micro-batch: `sft_micro_batch_size`): 6 with 4 (3-row
    micro-batches) does, 7 with 4 (1-row micro-batches) does not."""
    return 2 * largest_divisor_at_most(batch_size, micro_batch_size) >= min(batch_size, micro_batch_size)


def nearest_sft_batch_sizes(batch_size: int, micro_batch_size: int) -> tuple[int, int]:
    """The nearest sft.batch_size below and above `batch_size` that `sft_batch_fits` (any size up to
    train.micro_batch_size fits, and so does any multiple of it, so both exist for a size that
    does not fit)."""
    below = next(n for n in range(batch_size - 1, 0, -1) if sft_batch_fits(n, micro_batch_size))
    above = next(n for n in range(batch_size + 1, batch_size + micro_batch_size + 1)
                 if sft_batch_fits(n, micro_batch_size))
    return below, above


def largest_divisor_at_most(n: int, cap: int) -> int:
    """Largest d <= cap dividing n (for the mini/micro batch hint)."""
    return next(d for d in range(min(n, cap), 0, -1) if n % d == 0)
