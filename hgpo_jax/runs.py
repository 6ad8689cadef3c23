"""What every training run (RL or supervised) shares: the run folder, the model, the optimizer,
checkpoints and metrics; and loading a policy from any `model.path` (and the model a run's
algorithm trains besides it: a PPO or HiPER run's critic).
A run folder's record of its config is kept here too: the config as recorded (`recorded_config`,
paths made absolute), what a resume may change without changing what the run is
(`RUN_SETTINGS`, `is_run_setting`) and the changes it made (`config_changes`,
`record_config_changes`; `hgpo_jax.config.load_config` reads them back).

    model, tokenizer, base = load_model(path, dtype="float32", mesh=mesh)

`path` is a Hugging Face folder, `tiny`, `build:<env>-<size>` (hgpo_jax.build) or an
hgpo-jax run folder: its config's own `model.path` gives the architecture and tokenizer (followed
recursively, so an RL run started from a supervised run works), and the weights are those of its
latest checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
from flax import nnx

from hgpo_jax import distributed as dist
from hgpo_jax.build import resolve_model_path
from hgpo_jax.checkpoint import Checkpointer
from hgpo_jax.config import (RUN_CHANGES_FILE, SECTIONS, Config, apply_mapping, config_from_dict,
                             config_to_dict, is_run_folder, load_config, save_config, unflatten)
from hgpo_jax.config_checks import marked_env_options, section_values
from hgpo_jax.metrics import write_atomically
from hgpo_jax.models import load_pretrained, load_tokenizer, make_mesh
from hgpo_jax.models.decoder import add_adapters, relayout_layers
from hgpo_jax.models.lora import merge_params, split_params, trainable, with_trainable
from hgpo_jax.models.peft_io import lora_spec
from hgpo_jax.rl.update import init_opt_state, make_optimizer, param_shardings, shard_params

RUN_CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
MODEL_SOURCE = "model_source.json"  # the folder model.path resolved to when the run started


def is_run_dir(path: str) -> bool:
    """A folder written by an hgpo-jax run (its config.yaml and checkpoints/)."""
    return os.path.isfile(os.path.join(path, RUN_CONFIG)) and os.path.isdir(os.path.join(path, CHECKPOINTS))


RUN_KINDS = {"rl": "an RL run", "sft": "a supervised (hgpo-jax sft) run"}


def latest_checkpoint(run_dir: str) -> tuple[str, int] | None:
    """(kind, step) of a run folder's newest checkpoint: kind "rl" or "sft" (what wrote it), step
    its iteration or SFT step; None without checkpoints. Reads the checkpoint's meta alone."""
    if not os.path.isdir(os.path.join(run_dir, CHECKPOINTS)):
        return None
    ckpt = Checkpointer(os.path.join(run_dir, CHECKPOINTS), read_only=True)
    try:
        steps, meta = ckpt.steps(), ckpt.latest_meta()
    finally:
        ckpt.close()
    if meta is None:
        return None
    return ("rl" if "iteration" in meta else "sft"), steps[-1]


def newest_meta(run_dir: str) -> dict:
    """The meta of a run folder's newest checkpoint ({} without one); no array is read."""
    if not os.path.isdir(os.path.join(run_dir, CHECKPOINTS)):
        return {}
    ckpt = Checkpointer(os.path.join(run_dir, CHECKPOINTS), read_only=True)
    try:
        return ckpt.latest_meta() or {}
    finally:
        ckpt.close()


EXPORT_RECORD = "hgpo_jax_export.json"  # what `hgpo-jax export` wrote into a folder, and from where


def _inside(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies under it (both real absolute paths)."""
    return os.path.commonpath([path, folder]) == folder


def _run_under(folder: str, limit: int = 10_000) -> str | None:
    """A run folder at or under `folder` (the first found, looking at `limit` folders at most)."""
    for n, (here, dirs, _) in enumerate(os.walk(folder)):
        if is_run_dir(here):
            return here
        if n >= limit:
            return None
    return None


def check_export_folder(run_dir: str, out_dir: str, overwrite: bool) -> None:
    """Whether `hgpo-jax export RUN_DIR OUT_DIR` may write OUT_DIR, before anything loads: a new or
    empty folder, or with `overwrite` a folder that an earlier export wrote and nothing else
    (its EXPORT_RECORD lists every file in it). Never a folder that is, holds or lies inside a
    run. Raises FileExistsError / ValueError saying what to choose instead."""
    out, run = os.path.realpath(out_dir), os.path.realpath(run_dir)
    if _inside(out, run):
        raise ValueError(f"{out_dir} {'is' if out == run else 'lies inside'} the run folder {run_dir}; "
                         "export to a folder outside any run")
    for folder in (out, *_ancestors(out)):
        if is_run_dir(folder):
            raise ValueError(f"{out_dir} {'is' if folder == out else 'lies inside'} the run folder "
                             f"{folder}; export to a folder outside any run")
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise FileExistsError(f"{out_dir} is a file; give a new or empty folder")
    if not os.listdir(out):
        return
    held = _run_under(out)
    if held:
        raise ValueError(f"{out_dir} holds the run folder {held}; export to a folder outside any run")
    if not overwrite:
        raise FileExistsError(f"{out_dir} already exists and is not empty; pass --overwrite to "
                              "replace an earlier export there, or choose another folder")
    unknown = sorted(set(_files_under(out)) - set(_export_files(out)) - {EXPORT_RECORD})
    if unknown:
        why = ("it holds no " + EXPORT_RECORD if not os.path.isfile(os.path.join(out, EXPORT_RECORD))
               else "it holds files no export wrote: " + ", ".join(unknown[:3]))
        raise FileExistsError(f"{out_dir} is not an earlier export ({why}); --overwrite replaces "
                              "only what hgpo-jax export wrote: choose a new or empty folder")


def _ancestors(path: str) -> list[str]:
    """The folders above an absolute path, nearest first."""
    out = []
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        out.append(path)
    return out


def _files_under(folder: str) -> list[str]:
    """Every file under `folder`, as paths relative to it."""
    return [os.path.relpath(os.path.join(here, f), folder)
            for here, _, files in os.walk(folder) for f in files]


def _export_files(folder: str) -> list[str]:
    """The files an earlier export recorded in `folder` ([] without a readable record)."""
    try:
        with open(os.path.join(folder, EXPORT_RECORD), encoding="utf-8") as f:
            return list(json.load(f)["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def write_export_record(out_dir: str, run_dir: str, what: str) -> None:
    """Record in OUT_DIR what `hgpo-jax export` wrote there (every file), from which run and
    checkpoint, so a later `export --overwrite` knows the folder for an export."""
    found = latest_checkpoint(run_dir)
    record = {"run": os.path.abspath(run_dir), "step": found[1] if found else None, "what": what,
              "files": sorted(_files_under(out_dir))}
    write_atomically(os.path.join(out_dir, EXPORT_RECORD),
                     (json.dumps(record, indent=1) + "\n").encode("utf-8"))


# ------------------------------------------------------------------ the run's record of its config
# Keys that say how a run executes, where it writes or how long it goes on, not what it learns: a
# resume may change them (the change is recorded beside the run's config). A change of any other
# key (the estimator and its options, the optimizer, the model, the env, the rollouts, the data)
# changes what the run is, and a resume refuses it unless asked (`--allow-change`).
RUN_SETTINGS = ("name", "train.run_dir", "train.iterations", "train.save_every",
                "train.keep_checkpoints", "train.remat", "train.micro_batch_size",
                "train.max_tokens_per_micro_batch", "train.pad_multiple", "train.diagnostics",
                "model.attention", "env.num_workers", "env.step_timeout", "env.reset_timeout",
                "rollout.prefill_chunk", "rollout.decode_attention", "sft.steps", "sft.eval_every", "sft.save_every",
                "eval.*", "mesh.*", "dist.*")
PATH_KEYS = ("model.path", "sft.data", "env.data_dir")  # recorded as absolute paths when they exist


def path_keys() -> tuple[str, ...]:
    """PATH_KEYS and the env options an env marks as paths (field metadata "path")."""
    return PATH_KEYS + marked_env_options("path")


def flat_config(cfg: Config) -> dict[str, Any]:
    """{"section.key": value} of every option ("name" at the top), each env's own options as
    "env.<env>.key" (every env's, so that two configs have the same keys)."""
    out: dict[str, Any] = {"name": cfg.name}
    for section in SECTIONS:
        for key, value in section_values(getattr(cfg, section), every=True).items():
            if isinstance(value, dict):  # an option group nested in the section
                out.update({f"{section}.{key}.{k}": v for k, v in value.items()})
            else:
                out[f"{section}.{key}"] = value
    return out


def _same_path_value(key: str, value: Any) -> Any:
    """A path option as the absolute path of what it names, where that exists (so that the
    relative and absolute spellings of one folder compare equal)."""
    if key in path_keys() and isinstance(value, str) and os.path.exists(value):
        return os.path.abspath(value)
    return value


def recorded_config(cfg: Config) -> Config:
    """The config as a run records it: each of PATH_KEYS that names an existing file or folder as
    an absolute path, so that the run resumes, evaluates and exports from any working folder."""
    flat = flat_config(cfg)
    paths = {k: _same_path_value(k, flat[k]) for k in path_keys()}
    return apply_mapping(config_from_dict(config_to_dict(cfg)), unflatten(paths))


def config_changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """{"section.key": (old value, new value)} of every option that differs (paths compared by
    what they name; train.run_dir left out: a run is where its folder is)."""
    a, b = flat_config(old), flat_config(new)
    return {k: (a[k], b[k]) for k in a if k != "train.run_dir"
            and _same_path_value(k, a[k]) != _same_path_value(k, b[k])}


def is_run_setting(key: str) -> bool:
    """Whether a resume may change `key` without changing what the run is (RUN_SETTINGS)."""
    return (key in RUN_SETTINGS or f"{key.partition('.')[0]}.*" in RUN_SETTINGS
            or key in marked_env_options("run_setting"))


def record_config_changes(run_dir: str, step: int, changes: Mapping[str, tuple[Any, Any]]) -> None:
    """Append one resume's changes, in effect from `step` on, to RUN_DIR/config_changes.jsonl
    (the file is rewritten atomically: a crash leaves the old record or the new one)."""
    path = os.path.join(run_dir, RUN_CHANGES_FILE)
    old = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
    line = json.dumps({"step": int(step), "time": time.time(),
                       "changes": {k: list(v) for k, v in changes.items()}})
    write_atomically(path, (old + line + "\n").encode("utf-8"))



def check_run_folder(cfg, run_dir: str, kind: str, *, resume: bool, record: bool,
                     allow_change: bool) -> dict:
    """Whether a run of `kind` may start (or, `resume`, go on) in `run_dir`, before anything loads
    or is written; raises ValueError / FileExistsError saying what to do instead. Returns the
    changes a resume makes to the run's recorded config ({"section.key": (old, new)}; {} for a
    new run): a change of what the run is (not `is_run_setting`) is refused unless
    `allow_change`, and an RL run's checkpoint must hold the state its algorithm keeps
    (`check_resumed_state`). `record` False (an evaluation reads the folder) checks nothing."""
    if not record:
        return {}
    if os.path.abspath(run_dir) == os.path.abspath(cfg.model.path):
        raise ValueError(f"model.path {cfg.model.path!r} is this run's own folder; start from "
                         "another run or model")
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise FileExistsError(f"train.run_dir={run_dir} is a file; choose a folder")
    if not resume:
        ckpt_dir = os.path.join(run_dir, CHECKPOINTS)
        if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
            raise FileExistsError(f"{run_dir} already has checkpoints; pass --resume to "
                                  "continue it, or choose another name=/train.run_dir=")
        held = set(os.listdir(run_dir)) - {"eval"} if os.path.isdir(run_dir) else set()
        if held and not is_run_folder(run_dir):  # eval/: evaluations of the config's model
            found = ", ".join(sorted(held)[:3])
            raise FileExistsError(f"train.run_dir={run_dir} holds files no hgpo-jax run wrote "
                                  f"({found}, ...); choose a new or empty folder")
        return {}
    if not is_run_folder(run_dir):
        raise ValueError(f"--resume: {run_dir} holds no run to resume (no config.yaml); start it "
                         "without --resume, or name the run folder")
    found = latest_checkpoint(run_dir)  # None: stopped before its first checkpoint (starts over)
    if found and found[0] != kind:
        raise ValueError(f"{run_dir} holds {RUN_KINDS[found[0]]}, not {RUN_KINDS[kind]}; start a "
                         f"new run from it with model.path={run_dir}")
    recorded = load_config(run_dir)
    changes = config_changes(recorded, cfg)
    what = {k: v for k, v in changes.items() if not is_run_setting(k)}
    if what and not allow_change:
        listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in what.items())
        raise ValueError(f"--resume would change what the run {run_dir} is ({listed}); resume it "
                         "as it was (hgpo-jax COMMAND RUN_DIR --resume, without those keys), or "
                         "pass --allow-change to record the change from the restored step on")
    if found and kind == "rl":
        check_resumed_state(cfg, recorded.algo.estimator, run_dir)
    if found:
        if "model.path" in changes:
            check_resumed_model(cfg.model.path, run_dir)
        check_resumed_base(cfg, run_dir)
    return changes


ARCHITECTURE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "vocab_size", "head_dim")


def check_resumed_model(model_path: str, run_dir: str) -> None:
    """A resumed run whose model.path changed (--allow-change) must keep its architecture: the
    family and the shapes of the config.json its weights were trained on (`run_source`), or its
    checkpoint cannot restore. ValueError naming both, before any weight loads."""
    def architecture(folder: str) -> dict:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            data = json.load(f)
        return {k: data.get(k) for k in ARCHITECTURE_KEYS}

    was_folder, now_folder = model_folder(run_source(run_dir)), model_folder(model_path)
    was, now = architecture(was_folder), architecture(now_folder)
    if was != now:
        diff = ", ".join(f"{k} {was[k]} -> {now[k]}" for k in ARCHITECTURE_KEYS if was[k] != now[k])
        raise ValueError(f"--resume: {run_dir} trained a {was['model_type']} model ({was_folder}) "
                         f"and model.path={model_path} is a {now['model_type']} of another shape "
                         f"({diff}); its checkpoint cannot restore there: resume with its own "
                         "model.path, or start a new run from it (model.path=<the run folder>)")


def base_identity(model_path: str) -> dict:
    """What a LoRA run's adapters were trained on, cheap to compute (no weight is read whole):
    the base folder and a fingerprint of it (`models.lora.folder_fingerprint`); a run folder as the
    base: the folder and its newest checkpoint's step."""
    from hgpo_jax.models.lora import folder_fingerprint

    if is_run_dir(model_path):
        found = latest_checkpoint(model_path)
        return {"folder": os.path.abspath(model_path), "step": found[1] if found else None}
    folder = resolve_model_path(model_path)
    return {"folder": os.path.abspath(folder), "fingerprint": folder_fingerprint(folder)}


def check_resumed_base(cfg, run_dir: str) -> None:
    """A resumed LoRA run's checkpoint holds adapters only: its base must be the one they were
    trained on (the `base` its newest checkpoint's meta recorded). ValueError otherwise, before
    any weight loads."""
    saved = newest_meta(run_dir).get("base")
    if not saved:
        return
    now = base_identity(cfg.model.path)
    if {k: v for k, v in now.items() if k != "folder"} != {k: v for k, v in saved.items()
                                                           if k != "folder"}:
        raise ValueError(f"--resume: {run_dir}'s adapters were trained on the base in "
                         f"{saved['folder']}, and model.path={cfg.model.path!r} is another model "
                         f"({now['folder']}, {'its weights differ' if 'fingerprint' in now else 'another checkpoint'}); "
                         "resume with the base they were trained on")


def check_resumed_state(cfg, recorded: str, run_dir: str) -> None:
    """A resumed RL run's newest checkpoint must hold the state `cfg.algo.estimator` keeps (its
    `rl.algorithms.state_signature`: e.g. a critic of as many value heads; none for the group
    estimators), or its arrays would not restore. Reads the checkpoint's metadata alone; raises
    ValueError naming both and what to do instead (recorded: the run's own algo.estimator, named
    when its state fits)."""
    from hgpo_jax.algo_specs import ALGORITHMS
    from hgpo_jax.rl.algorithms import describe_state, saved_state_signature, state_signature

    ckpt = Checkpointer(os.path.join(run_dir, CHECKPOINTS), read_only=True)
    try:
        have = saved_state_signature(ckpt.items(), ckpt.item_shapes)
    finally:
        ckpt.close()
    want = state_signature(cfg.algo.spec)
    if have == want:
        return
    fits = [n for n, spec in ALGORITHMS.items() if state_signature(spec) == have]
    was = recorded if recorded in fits else " or ".join(fits) or "the algorithm that wrote it"
    raise ValueError(f"--resume: the checkpoint of {run_dir} holds {describe_state(have, want)}, "
                     f"but algo.estimator={cfg.algo.estimator} trains "
                     f"{describe_state(want, have)}; resume it with algo.estimator={was}, or start "
                     f"a new {cfg.algo.estimator} run from its policy with model.path={run_dir}")


def build_optimizer(cfg, total_steps: int = 1):
    """The config's AdamW (`cfg.optim`); `total_steps` sizes a cosine schedule."""
    o = cfg.optim
    return make_optimizer(o.lr, weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm,
                          warmup_steps=o.warmup_steps, schedule=o.schedule,
                          total_steps=total_steps, b1=o.b1, b2=o.b2)


def fit_adapters(model, spec, path: str, seed: int = 0):
    """The loaded `model` with the adapters the run asks for (`spec`; None: none): new ones
    on a model without (a run folder's full weights as the base), the model itself where its
    adapters are the spec's; ValueError where the model's adapters are not the run's."""
    have = getattr(model, "lora", None)
    if have == spec:
        return model
    if have is None:
        return add_adapters(model, spec, seed)
    want = "no adapters" if spec is None else f"adapters of rank {spec.rank}"
    raise ValueError(f"model.path={path!r} holds a policy with LoRA adapters of rank {have.rank} "
                     f"(alpha {have.alpha:g}), but this run asks for {want}: set model.lora_rank="
                     f"{have.rank} model.lora_alpha={have.alpha:g} model.lora_targets="
                     f"{','.join(have.targets)} to go on training them, or export the run merged "
                     "(`hgpo-jax export RUN OUT`) and start from that folder")


def load_model(path: str, dtype: str | None = None, compute_dtype: str | None = None, mesh=None,
               progress: bool = False, **options):
    """(model, tokenizer, base folder) for a model.path (see the module docstring). dtype None:
    a run folder's own model.dtype, else float32. options: the model's (scan_layers, attention,
    remat); a run folder's weights are read in its own layer layout, then given `scan_layers`."""
    if is_run_dir(path):
        if options.get("adapter"):
            raise ValueError(f"model.adapter={options['adapter']!r} with model.path={path!r}, a run "
                             "folder: a run's weights are its own; start from one or the other")
        options.pop("adapter", None)
        return _load_run_model(path, dtype, compute_dtype, mesh, progress, **options)
    folder = resolve_model_path(path)
    dtype = dtype or "float32"
    model = load_pretrained(folder, dtype=dtype, compute_dtype=compute_dtype, mesh=mesh,
                            progress=progress, **options)
    return model, load_tokenizer(folder), folder


def load_policy(cfg, mesh, progress: bool = False):
    """(model, tokenizer, base folder): the policy a config names, on `mesh`: `model.path`'s
    weights (a run folder's latest checkpoint, its weights only) with the adapters the config
    asks for (`model.lora_rank`, `model.adapter`). With several processes, a model built on first
    use (`tiny`, `build:...`) is built by the main process alone."""
    if jax.process_count() > 1:
        if dist.is_main():
            model_folder(cfg.model.path)
        dist.barrier("hgpo_jax model folder")
    spec = lora_spec(cfg.model)  # an adapter folder that does not fit: refused before loading
    adapters = ({} if is_run_dir(cfg.model.path) else
                {"lora": spec, "adapter": cfg.model.adapter, "lora_seed": cfg.train.seed})
    model, tokenizer, folder = load_model(
        cfg.model.path, cfg.model.dtype, cfg.model.compute_dtype, mesh, progress,
        scan_layers=cfg.model.scan_layers, attention=cfg.model.attention, **adapters)
    return fit_adapters(model, spec, cfg.model.path, cfg.train.seed), tokenizer, folder


def model_folder(path: str) -> str:
    """The folder whose config.json and tokenizer a model.path stands for (a run folder: the one
    its own model.path resolved to when it started)."""
    if is_run_dir(path):
        return model_folder(run_source(path))
    return resolve_model_path(path)


def run_source(run_dir: str) -> str:
    """The model.path a run folder's weights go on: the folder its model.path resolved to when the
    run started (a build recipe may have changed since: "build:..." could resolve to another
    folder now), else its config's model.path."""
    recorded = os.path.join(run_dir, MODEL_SOURCE)
    if os.path.isfile(recorded):
        with open(recorded, encoding="utf-8") as f:
            folder = json.load(f)["folder"]
        if os.path.isdir(folder):
            return folder
    return load_config(run_dir).model.path


def _load_run_model(run_dir: str, dtype, compute_dtype, mesh, progress, **options):
    cfg = load_config(run_dir)
    want_scan = options.pop("scan_layers", cfg.model.scan_layers)
    options.pop("lora", None)  # a run's weights come with its own adapters (or none)
    spec = lora_spec(cfg.model)
    model, tokenizer, base = load_model(run_source(run_dir), dtype or cfg.model.dtype,
                                        compute_dtype or cfg.model.compute_dtype, mesh, progress,
                                        scan_layers=cfg.model.scan_layers, **options)
    if spec is not None and model.lora is None:  # adapters on a base that has none
        model = add_adapters(model, spec)
    graphdef, params = split_params(model)
    ckpt = Checkpointer(os.path.join(run_dir, CHECKPOINTS), read_only=True)
    try:  # the policy's weights only: its optimizer state is never read (nor made)
        found = ckpt.restore_latest({"params": trainable(params)}, partial=True)
    finally:
        ckpt.close()
    if found is None:
        raise FileNotFoundError(f"model.path {run_dir!r} is a run folder without checkpoints; "
                                "train it first (or point at another run)")
    state, _, step = found
    if progress:
        print(f"loaded the weights of {run_dir} at step {step}", flush=True)
    model = merge_params(graphdef, with_trainable(params, state["params"]))
    if want_scan != cfg.model.scan_layers:
        model = relayout_layers(model, want_scan)
        nnx.update(model, shard_params(nnx.state(model), mesh))
    return model, tokenizer, base


def load_run_state_model(run_dir: str, progress: bool = False):
    """(the model a run folder's algorithm trains besides the policy, restored from its latest
    checkpoint, the tokenizer): a PPO or HiPER run's critic (`Algorithm.state_model`)."""
    from hgpo_jax.algo_specs import ALGORITHMS
    from hgpo_jax.config import load_config
    from hgpo_jax.rl.algorithms import family_of

    cfg = load_config(run_dir)
    family = family_of(cfg.algo.spec)
    if family.state_item is None:
        first, *more = [n for n, spec in ALGORITHMS.items() if family_of(spec).state_item]
        also = f" (and a {', '.join(more)} run)" if more else ""
        raise ValueError(f"{run_dir} is an algo.estimator={cfg.algo.estimator} run; only a "
                         f"{first} run has a {family_of(ALGORITHMS[first]).state_item}{also}")
    policy, tokenizer, _ = load_model(run_dir, progress=progress)
    ckpt = Checkpointer(os.path.join(run_dir, CHECKPOINTS), read_only=True)
    try:
        return family.state_model(cfg, policy, ckpt), tokenizer
    finally:
        ckpt.close()


def check_process_mesh(mesh, mesh_cfg) -> None:
    """With several processes the mesh must hold every device (each process feeds its own rows),
    and a row shard may not span processes. Raises ValueError saying which mesh setting to change."""
    if jax.process_count() == 1:
        return
    if mesh.devices.size != jax.device_count():
        raise ValueError(
            f"mesh data={mesh_cfg.data} fsdp={mesh_cfg.fsdp} tensor={mesh_cfg.tensor} uses "
            f"{mesh.devices.size} of the {jax.device_count()} devices of {jax.process_count()} "
            "processes; a multi-process run needs a mesh over all of them (set mesh.data=-1)")
    dist.check_rows_local(mesh)


class NullLogger:
    """The metrics logger of processes other than 0: writes nothing."""

    run_dir = None
    tb_dir = None

    def log(self, step: int, metrics) -> None:
        pass

    def close(self) -> None:
        pass


@flax.struct.dataclass
class PolicyState:
    """The device state of a run that trains the policy alone (the supervised warm start), one
    pytree: params (the policy's `nnx.Param` state) and opt_state (its AdamW state)."""

    params: Any
    opt_state: Any


class Run:
    """A run folder with its model, optimizer, checkpoints and metrics.

    `state`: the run's device state, one pytree (a flax.struct dataclass with at least `params`
    and `opt_state`: `PolicyState` here; the RL trainer's adds the reference policy, the
    algorithm's own state and the rollout key). Subclasses (the RL trainer, the supervised trainer) add their data,
    their step and their host loop state; what a checkpoint holds is said once per kind of run by
    `checkpoint_tree()` -> (arrays, meta) and `load_checkpoint_tree(arrays, meta)`: the arrays
    (Orbax) and the JSON-able loop state a resumed run needs to continue exactly, saved together.
    `kind` (a key of RUN_KINDS): a resume refuses a folder whose checkpoints another kind of run
    wrote, before anything in it is touched.
    """

    kind = "rl"

    def __init__(self, cfg, *, resume: bool = False, progress: bool = True, total_updates: int = 1,
                 record: bool = True, allow_change: bool = False):
        self.cfg = cfg
        self.main = dist.is_main()  # process 0 writes the run folder's files, metrics and progress
        self.progress = progress and self.main
        self.run_dir = cfg.run_path()
        self.resume, self.record = resume, record
        # every check of the folder before anything loads; nothing is written before `begin`
        self.changes = check_run_folder(cfg, self.run_dir, self.kind, resume=resume, record=record,
                                        allow_change=allow_change)

        t = cfg.train
        self.mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
        self.dp = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        check_process_mesh(self.mesh, cfg.mesh)
        if t.micro_batch_size % self.dp:
            raise ValueError(f"train.micro_batch_size={t.micro_batch_size} must be a multiple of "
                             f"the data-parallel size {self.dp} (mesh data x fsdp)")
        model, self.tokenizer, self.model_dir = load_policy(cfg, self.mesh, self.progress)
        self.base = base_identity(cfg.model.path) if lora_spec(cfg.model) is not None else None
        model.remat = t.remat  # only the training forward (no KV cache) is rematerialized
        self.graphdef, params = split_params(model)  # `lora.Adapted` when only adapters train
        self.shardings = param_shardings(self.mesh, params)
        self.tx = build_optimizer(cfg, max(1, math.ceil(total_updates)))
        opt_state, self.opt_shardings = init_opt_state(self.tx, params, self.mesh)
        self.state = PolicyState(params, opt_state)
        # a reader until `begin` (a new run has nothing to read); the logger writes from `begin` on
        self.ckpt = Checkpointer(os.path.join(self.run_dir, CHECKPOINTS), read_only=True)
        self.logger = NullLogger()
        self._stop = False

    def begin(self, step: int, last: int, unit: str, key: str) -> None:
        """Before the loop's first step, after every check and load (`step` of `last` {unit}
        done; `key` the option that sets `last`): refuse a resumed run with nothing left to do
        (known only here: its newest checkpoint may not have restored), then write the run's
        record (a new run its config, `recorded_config`, and model source; a resumed one the
        changes its config made, in `config_changes.jsonl` from `step` on) and open the metrics
        logger and the writing checkpointer."""
        from hgpo_jax.metrics import MetricsLogger

        if not self.record:
            raise RuntimeError("this run was opened to read it (record=False): it cannot train")
        if self.resume and step >= last:
            raise ValueError(f"{self.run_dir} has done all {last} {unit} ({key}={last}): nothing to "
                             f"resume; give a larger {key}= to go on")
        if self.main:
            os.makedirs(self.run_dir, exist_ok=True)
            if not self.resume:
                save_config(recorded_config(self.cfg), os.path.join(self.run_dir, RUN_CONFIG))
                with open(os.path.join(self.run_dir, MODEL_SOURCE), "w", encoding="utf-8") as f:
                    json.dump({"path": self.cfg.model.path, "folder": os.path.abspath(self.model_dir)}, f)
            elif self.changes:
                record_config_changes(self.run_dir, step, self.changes)
            self.logger = MetricsLogger(self.run_dir)
        if jax.process_count() > 1:  # the folder exists before any process opens its checkpoints
            dist.barrier("hgpo_jax run folder")
        self.ckpt.close()
        self.ckpt = Checkpointer(os.path.join(self.run_dir, CHECKPOINTS),
                                 keep=self.cfg.train.keep_checkpoints)

    # ------------------------------------------------------------------ the loop's frame
    @contextlib.contextmanager
    def stop_on_sigterm(self):
        """Inside: SIGTERM asks the loop to finish its current step, save and stop
        (`should_save` turns true, `stopping` too); the previous handler is restored after."""
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum, frame) -> None:
        self._stop = True

    @property
    def stopping(self) -> bool:
        return self._stop

    def agree_stop(self) -> bool:
        """After each step: stop on every process when any of them got SIGTERM (all save
        together); returns `stopping`. One process: no collective."""
        self._stop = dist.any_process(self._stop)
        return self._stop

    def should_save(self, step: int, every: int, last: int) -> bool:
        """A checkpoint every `every` steps (0: none on the way), at the last step, and on stop."""
        return bool(every and step % every == 0) or self._stop or step == last

    # ------------------------------------------------------------------ checkpoints
    @property
    def params(self):
        """The policy's current parameters (`state.params`)."""
        return self.state.params

    def checkpoint_tree(self) -> tuple[dict, dict]:
        """(arrays, meta): what a checkpoint holds. arrays: the policy's params and optimizer
        state as {"params", "opt_state"} (the RL trainer adds its algorithm's state); meta: the
        JSON-able loop state (the trainers add theirs: step or iteration, data order, rngs)."""
        meta = {"name": self.cfg.name}
        if self.base is not None:  # adapters only: the base they go on, for a resume's check
            meta["base"] = self.base
        return {"params": trainable(self.state.params), "opt_state": self.state.opt_state}, meta

    def load_checkpoint_tree(self, arrays: dict, meta: dict) -> None:
        """Take back what `checkpoint_tree()` gave, restored from a checkpoint."""
        self.state = self.state.replace(params=with_trainable(self.state.params, arrays["params"]),
                                        opt_state=arrays["opt_state"])

    def save(self, step: int) -> None:
        self.ckpt.save(step, *self.checkpoint_tree())

    def restore(self) -> int | None:
        """Load the newest usable checkpoint; returns its step (None when there is none)."""
        found = self.ckpt.restore_latest(self.checkpoint_tree()[0])
        if found is None:
            return None
        arrays, meta, step = found
        self.load_checkpoint_tree(arrays, meta)
        return step

    def rewind_metrics(self, step: int) -> int:
        """Drop from metrics.jsonl and TensorBoard the records of steps after `step`, the step the
        training loop starts from (the restored checkpoint's, 0 from scratch), so that a resumed run
        records every step once (hgpo_jax.metrics); returns how many JSONL records went. The loops
        call it before they log; process 0 only (it writes the files). Not done by `restore`:
        `hgpo-jax eval` restores a run too (maybe one still training) and must not cut its files."""
        return self.logger.rewind(step) if self.main else 0

    def model(self):
        """The current policy as an NNX module."""
        return merge_params(self.graphdef, self.state.params)

    def close(self) -> None:
        self.logger.close()
        self.ckpt.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
