"""Training checkpoints with Orbax: params, optimizer state and a JSON record of the loop state.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(iteration, {"params": params, "opt_state": opt_state}, meta)   # atomic
    state, meta, step = ckpt.restore_latest({"params": params, "opt_state": opt_state})

Keys of the state other than `params` and `opt_state` (a PPO run's `critic`) are stored as items
of their own, so a reader that asks for the policy alone (`hgpo-jax eval` on a PPO run) restores it
without them. `meta` is a JSON dict for everything else a resumed run needs to continue exactly: the iteration,
the JAX key data, the data cursor and NumPy RNG state of the task sampler. Orbax writes each step
into a temporary folder and renames it when complete, so an interrupted save leaves no checkpoint
that looks valid. A checkpoint that fails to restore (corrupt or partial files) is refused with
a warning naming it, and the next older one is tried.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """No usable checkpoint could be restored."""


def _first_line(error: Exception, limit: int = 160) -> str:
    """An exception's message cut to its first line and `limit` characters."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text if len(text) <= limit else text[:limit] + "..."


@contextlib.contextmanager
def _quiet_absl():
    """absl's WARNING lines silenced inside (Orbax announces a read-only manager with two)."""
    import logging

    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _abstract(tree):
    """Shapes, dtypes and shardings of `tree` (restore places arrays straight into them)."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _partial_restore(tree):
    abstract = _abstract(tree)
    return ocp.args.PyTreeRestore(abstract, partial_restore=True,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))


MAIN = ("params", "opt_state")  # the item "state"; any other top-level key is an item of its own


def _items(state: dict, make) -> dict:
    main = {k: v for k, v in state.items() if k in MAIN}
    items = {"state": make(main)} if main else {}
    items.update({k: make(v) for k, v in state.items() if k not in MAIN})
    return items


class Checkpointer:
    """Keep the last `keep` checkpoints of a run under `directory`. `read_only`: a reader that
    creates, writes and deletes nothing (the folder need not exist: then there are no steps)."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3, read_only: bool = False):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.read_only = read_only
        with _quiet_absl():  # a reader is announced by two absl warnings
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                                     read_only=read_only,
                                                     enable_async_checkpointing=False))

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: dict, meta: dict) -> None:
        """Write checkpoint `step` (blocking; atomic)."""
        if self.read_only:
            raise RuntimeError(f"{self.directory}: a read-only Checkpointer cannot save")
        self._manager.save(step, args=ocp.args.Composite(
            **_items(state, ocp.args.StandardSave), meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()

    def restore(self, step: int, like: dict, partial: bool = False) -> tuple[dict, dict]:
        """Checkpoint `step` into the structure, dtypes and shardings of `like`. partial: `like`
        may leave out parts of the checkpoint's items (e.g. only "params", no "opt_state"), which
        are then not read at all (Orbax's partial restore; on a reader that restores only so)."""
        make = _partial_restore if partial else (lambda t: ocp.args.StandardRestore(_abstract(t)))
        out = self._manager.restore(step, args=ocp.args.Composite(
            **_items(like, make), meta=ocp.args.JsonRestore()))
        state = dict(out["state"]) if "state" in out else {}
        state.update({k: out[k] for k in like if k not in MAIN})
        return state, out["meta"]

    def latest_meta(self) -> dict | None:
        """The newest checkpoint's meta alone (no arrays are read); None without checkpoints."""
        steps = self.steps()
        if not steps:
            return None
        out = self._manager.restore(steps[-1], args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return out["meta"]

    def items(self, step: int | None = None) -> list[str]:
        """The items of checkpoint `step` (default: the newest) besides its meta: "state" (params
        and opt_state) and any other top-level key of the saved state (a PPO run's "critic");
        [] when there is no such checkpoint. No array is read."""
        steps = self.steps()
        step = steps[-1] if step is None and steps else step
        if step not in steps:
            return []
        with _quiet_absl():  # items without a handler here are announced by absl warnings
            found = self._manager.item_metadata(step)
        return sorted(k for k in found.keys() if k != "meta")

    def item_shapes(self, item: str, step: int | None = None):
        """The array shapes of item `item` of checkpoint `step` (default: the newest): a tree like
        the saved one with a shape tuple per array; no array is read. item: "state" (params and
        opt_state) or another top-level key of the saved state (a PPO run's "critic"). Raises
        CheckpointError when there is no such checkpoint or item, or its metadata does not read."""
        steps = self.steps()
        step = steps[-1] if step is None and steps else step
        if step not in steps:
            raise CheckpointError(f"no checkpoint {'' if step is None else step} under "
                                  f"{self.directory} (steps {steps})")
        try:
            with _quiet_absl():
                reader = ocp.CheckpointManager(
                    self.directory, item_handlers={item: ocp.StandardCheckpointHandler()},
                    options=ocp.CheckpointManagerOptions(read_only=True, create=False,
                                                         enable_async_checkpointing=False))
                try:
                    meta = reader.item_metadata(step)[item]
                finally:
                    reader.close()
        except Exception as e:  # orbax raises many types for missing or damaged files
            raise CheckpointError(f"checkpoint {self.directory}/{step}: the shapes of item {item!r} "
                                  f"do not read ({type(e).__name__}: {_first_line(e)})") from None
        if meta is None:
            raise CheckpointError(f"checkpoint {self.directory}/{step} has no item {item!r}")
        return jax.tree.map(lambda a: tuple(a.shape), getattr(meta, "tree", meta),
                            is_leaf=lambda a: hasattr(a, "shape"))

    def restore_latest(self, like: dict, partial: bool = False) -> tuple[dict, dict, int] | None:
        """The newest checkpoint that restores cleanly, as (state, meta, step); None if there are
        no checkpoints. Raises CheckpointError if checkpoints exist but none restores.
        partial: as `restore`'s."""
        steps = self.steps()
        if not steps:
            return None
        errors = []
        for step in reversed(steps):
            try:
                state, meta = self.restore(step, like, partial)
                return state, meta, step
            except Exception as e:  # orbax raises many types for damaged files
                # the failed read leaves callbacks aimed at its (now closed) event loop; collect
                # them here rather than at some later garbage collection ("Event loop is closed")
                e.__traceback__ = None
                gc.collect()
                errors.append(f"step {step}: {type(e).__name__}: {_first_line(e)}")
                if step != steps[0]:
                    warnings.warn(f"checkpoint {self.directory}/{step} is corrupt or partial, or does "
                                  f"not fit this run ({type(e).__name__}: {_first_line(e)}); trying "
                                  "an older one", stacklevel=2)
        raise CheckpointError(f"no checkpoint under {self.directory} restores ({'; '.join(errors)}): "
                              "its files are damaged, or were written for another model or algorithm "
                              "than the run's config says")

    def close(self) -> None:
        self._manager.close()
