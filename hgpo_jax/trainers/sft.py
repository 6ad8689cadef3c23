"""The supervised warm start: next-token loss on the responses of rollout-identical samples.

    with SftTrainer(load_config("toy_format")) as trainer:   # or: hgpo-jax sft toy_format
        trainer.train()

Same machinery as the RL trainer (`hgpo_jax.runs.Run`): the run folder, the mesh and shardings,
the jitted accumulating update (`hgpo_jax.rl.update.make_update_step`), Orbax checkpoints with exact
resume, metrics to JSONL/TensorBoard, progress bars. Only the loss (the mean negative
log-likelihood of the response tokens) and the data (hgpo_jax.sft.data) differ. An RL run starts
from the result with `model.path=RUN_DIR` (or its export, `hgpo-jax export RUN_DIR OUT`).
"""

from __future__ import annotations

import functools
import os
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from hgpo_jax import distributed as dist
from hgpo_jax.micro_batches import sft_micro_batch_size
from hgpo_jax.rl.batching import TokenRows, pack_rows
from hgpo_jax.rl.loss import mean_over
from hgpo_jax.rl.update import make_logprob_fn, make_update_step, on_mesh, token_logprobs
from hgpo_jax.runs import Run
from hgpo_jax.sft import data as sft_data



def nll_micro_loss(model, micro: TokenRows, window: int | None = None):
    """Mean negative log-likelihood of the response tokens (token-mean over the micro-batch);
    `window`: see `hgpo_jax.rl.update.token_logprobs`."""
    logp = token_logprobs(model, micro.input_ids, micro.attention_mask,
                          response_mask=micro.response_mask, window=window)
    nll = -mean_over(logp, micro.response_mask)
    return nll, {"nll": jax.lax.stop_gradient(nll)}


def progress_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """One line per reported step when no progress bar is drawn (a log file, CI)."""
    parts = [f"step {step:>5}/{total}"]
    parts += [f"{label} {metrics[k]:.4f}" for k, label in
              (("train/nll", "nll"), ("heldout/nll", "held-out nll")) if k in metrics]
    return "  ".join(parts + [f"{metrics.get('time/step', float('nan')):.2f}s"])


GROUP_POOL = 64  # batches per pool of sft.group_by_length


def length_grouped_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of range(len(lengths)) [N] whose consecutive runs of `batch_size` hold turns of
    similar length: shuffled, cut into pools of GROUP_POOL batches, each pool sorted by length
    (stable) and cut into batches, the batches shuffled (a last partial batch stays last)."""
    order = rng.permutation(len(lengths))
    pool = GROUP_POOL * batch_size
    for i in range(0, len(order), pool):
        part = order[i:i + pool]
        order[i:i + pool] = part[np.argsort(lengths[part], kind="stable")]
    full = len(order) // batch_size
    batches = order[:full * batch_size].reshape(full, batch_size)[rng.permutation(full)]
    return np.concatenate([batches.reshape(-1), order[full * batch_size:]])


def build_samples(cfg, tokenizer, progress: bool = False) -> tuple[list, list, dict]:
    """(train samples, held-out samples, info) for `cfg.sft`: recorded episodes of the config's
    env (held out by episode) or a JSONL file of turns (held out by turn)."""
    from hgpo_jax.agents import get_agent
    from hgpo_jax.envs.registry import get_env

    s, e = cfg.sft, cfg.env
    spec = get_env(e.name)
    rng = np.random.default_rng(cfg.train.seed)
    sources = s.sources()
    if sources:
        if spec.record_episodes is None:
            raise ValueError(f"env {e.name!r} records no episodes; give sft.data a JSONL file of "
                             "prompt/response turns")
        by_kind = {kind: spec.record_episodes(e, e.split, n, kind, seed=cfg.train.seed,
                                              progress=progress) for kind, n in sources}
        episodes = [ep for part in by_kind.values() for ep in part]
        problem = sft_data.heldout_problem(s.heldout, len(episodes), "episodes recorded",
                                           sft_data.MORE_EPISODES)
        if problem:
            raise ValueError(problem)
        order = rng.permutation(len(episodes))
        n_held = sft_data.heldout_count(s.heldout, len(episodes))
        held = [episodes[i] for i in order[:n_held]]
        train = [episodes[i] for i in order[n_held:]]
        agent = get_agent(cfg.agent.name, e.name, projection=e.projection)
        texts = [sft_data.samples_from_episodes(part, e.memory_len, agent)
                 for part in (train, held)]
        info = {"episodes": len(train), "heldout_episodes": len(held),
                "won": float(np.mean([ep.won for ep in episodes])) if episodes else 0.0,
                **({f"{kind}_episodes": len(part) for kind, part in by_kind.items()}
                   if len(by_kind) > 1 else {})}
    else:
        if not os.path.isfile(s.data):
            raise FileNotFoundError(f"sft.data={s.data!r} is no existing JSONL file of "
                                    "{\"prompt\", \"response\"} lines")
        turns = sft_data.read_jsonl_turns(s.data)
        problem = sft_data.heldout_problem(s.heldout, len(turns), f"turns in {s.data}",
                                           sft_data.MORE_TURNS)
        if problem:
            raise ValueError(problem)
        order = rng.permutation(len(turns))
        n_held = sft_data.heldout_count(s.heldout, len(turns))
        texts = [[turns[i] for i in order[n_held:]], [turns[i] for i in order[:n_held]]]
        info = {"jsonl": s.data}
    r = cfg.rollout
    train, held = (sft_data.tokenize_samples(t, tokenizer, r.max_prompt_tokens, r.max_new_tokens)
                   for t in texts)
    if not train:
        raise ValueError("the supervised data is empty; record more episodes (sft.episodes) or "
                         "hold out fewer (sft.heldout)")
    if s.heldout > 0 and not held:
        raise ValueError(f"sft.heldout={s.heldout:g}: the held-out part has no turns; "
                         f"{sft_data.MORE_EPISODES if sources else sft_data.MORE_TURNS}, raise "
                         "sft.heldout, or set sft.heldout=0 to train without a held-out loss")
    info.update({"train_turns": len(train), "heldout_turns": len(held)})
    return train, held, info


class SftTrainer(Run):
    """Supervised warm start of the config's model on `cfg.sft`'s data."""

    kind = "sft"

    def __init__(self, cfg, *, resume: bool = False, progress: bool = True, record: bool = True,
                 allow_change: bool = False):
        super().__init__(cfg, resume=resume, progress=progress, total_updates=cfg.sft.steps,
                         record=record, allow_change=allow_change)
        try:  # a failure past this point must still close the checkpointer and logger
            s, t = cfg.sft, cfg.train
            self.micro = sft_micro_batch_size(cfg)
            self.procs = jax.process_count()
            if self.micro % self.procs:
                raise ValueError(f"SFT micro-batches of {self.micro} rows (the largest divisor of "
                                 f"sft.batch_size={s.batch_size} <= train.micro_batch_size) cannot be "
                                 f"split over {self.procs} processes; make both multiples of {self.procs}")
            self.train_samples, self.heldout_samples, self.data_info = build_samples(cfg, self.tokenizer, self.progress)
            if s.group_by_length:  # the held-out NLL is a sum over turns: in length order it pads less
                self.heldout_samples.sort(key=lambda x: len(x.prompt_ids) + len(x.response_ids))
            window = cfg.rollout.max_new_tokens  # responses are cut to it (build_samples)
            self.step_fn = make_update_step(self.graphdef, self.tx,
                                            functools.partial(nll_micro_loss, window=window),
                                            s.batch_size // self.micro, TokenRows.spec(), self.mesh,
                                            self.shardings, self.opt_shardings)
            self.logprob_fn = make_logprob_fn(self.graphdef, self.mesh, self.shardings, window=window)
            self.np_rng = np.random.default_rng(t.seed + 1)
            self.order = self.new_order()
            self.cursor = 0
            self.step = 0
            if resume:
                self.restore()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ state
    def checkpoint_tree(self) -> tuple[dict, dict]:
        """The policy's arrays; the loop state: step, position in the data order, the rng."""
        arrays, meta = super().checkpoint_tree()
        return arrays, {**meta, "step": self.step, "cursor": self.cursor,
                        "order": self.order.tolist(), "np_rng": self.np_rng.bit_generator.state}

    def load_checkpoint_tree(self, arrays: dict, meta: dict) -> None:
        super().load_checkpoint_tree(arrays, meta)
        self.step, self.cursor = int(meta["step"]), int(meta["cursor"])
        self.order = np.asarray(meta["order"], np.int64)
        self.np_rng.bit_generator.state = meta["np_rng"]

    # ------------------------------------------------------------------ data
    def new_order(self) -> np.ndarray:
        """The next pass's order of the training turns (grouped by length with
        sft.group_by_length)."""
        s = self.cfg.sft
        if not s.group_by_length:
            return self.np_rng.permutation(len(self.train_samples))
        lengths = np.array([len(x.prompt_ids) + len(x.response_ids) for x in self.train_samples])
        return length_grouped_order(lengths, s.batch_size, self.np_rng)

    def next_indices(self, n: int) -> list[int]:
        """The next n training turns of the shuffled order (reshuffled after each pass)."""
        out = []
        while len(out) < n:
            if self.cursor >= len(self.order):
                self.order, self.cursor = self.new_order(), 0
            out.append(int(self.order[self.cursor]))
            self.cursor += 1
        return out

    def _pack(self, samples, row_multiple: int) -> TokenRows:
        packed = pack_rows([x.prompt_ids for x in samples], [x.response_ids for x in samples],
                           np.zeros(len(samples), np.float32), pad_id=self.tokenizer.pad_token_id,
                           row_multiple=row_multiple, length_multiple=self.cfg.train.pad_multiple,
                           max_response=self.cfg.rollout.max_new_tokens)
        return TokenRows.of(packed.arrays())

    def _own(self, batch: TokenRows) -> TokenRows:
        """This process's rows of a batch every process built whole (all of it with one process):
        process p feeds rows [p S/P, (p+1) S/P) of each [S, ...] array."""
        if self.procs == 1:
            return batch
        p, n = jax.process_index(), batch.rows // self.procs
        return jax.tree.map(lambda x: x[p * n:(p + 1) * n], batch)

    @property
    def has_heldout(self) -> bool:
        """Whether there is a held-out loss to compute (sft.heldout > 0; with sft.heldout=0 no
        `heldout/nll` is computed or logged)."""
        return bool(self.heldout_samples)

    def heldout_nll(self) -> float:
        """Mean NLL per response token of the held-out turns (NaN when there are none: check
        `has_heldout` first)."""
        if not self.heldout_samples:
            return float("nan")
        mb = self.micro
        total, count = 0.0, 0.0
        for i in range(0, len(self.heldout_samples), mb):
            batch = self._own(self._pack(self.heldout_samples[i:i + mb], mb))
            part = on_mesh(batch, self.mesh)
            logp = dist.local_rows(self.logprob_fn(self.state.params, part.input_ids,
                                                   part.attention_mask, part.response_mask), self.mesh)
            total += float(-(logp * batch.response_mask).sum())
            count += float(batch.response_mask.sum())
        if self.procs > 1:
            total, count = map(sum, zip(*dist.allgather_json([total, count])))
        return total / max(count, 1.0)

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict]:
        """Run the remaining steps; returns the per-step metrics."""
        s = self.cfg.sft
        history = []
        self.begin(self.step, s.steps, "steps", "sft.steps")
        self.rewind_metrics(self.step)  # drop the old records of the steps to come
        with self.stop_on_sigterm(), tqdm(total=s.steps, initial=self.step, desc=f"sft {self.cfg.name}",
                                          unit="step", disable=not self.progress) as bar:
            while self.step < s.steps and not self.stopping:
                t0 = time.perf_counter()
                batch = self._pack([self.train_samples[i] for i in self.next_indices(s.batch_size)],
                                   self.micro)
                params, opt_state, m = self.step_fn(
                    self.state.params, self.state.opt_state,
                    on_mesh(self._own(batch), self.mesh))
                self.state = self.state.replace(params=params, opt_state=opt_state)
                metrics = {k: float(v) for k, v in jax.device_get(m).items()}
                self.step += 1
                self.agree_stop()  # SIGTERM on any process stops (and saves) all of them
                tokens = float(batch.attention_mask.sum())
                metrics.update({"time/step": time.perf_counter() - t0,
                                "perf/tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
                                "sft/epoch": self.step * s.batch_size / len(self.train_samples)})
                if self.has_heldout and (
                        (s.eval_every and self.step % s.eval_every == 0) or self.step == s.steps):
                    metrics["heldout/nll"] = self.heldout_nll()
                self.logger.log(self.step, metrics)
                history.append(metrics)
                bar.update(1)
                bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in
                                 ("train/nll", "heldout/nll") if k in metrics})
                if not self.progress and self.main and (
                        self.step % max(1, s.steps // 20) == 0 or "heldout/nll" in metrics):
                    print(progress_line(self.step, s.steps, metrics), flush=True)
                if self.should_save(self.step, s.save_every, s.steps):
                    self.save(self.step)
        return history
