"""Checks that run before a command loads any weights: what the config names exists and fits.

    check_inputs(cfg, kind="rl", run_dir=cfg.run_path())   # train; "sft", "eval" likewise
    check_start(cfg, kind="rl", run_dir=cfg.run_path())    # check_inputs + the backend's checks
    check_output_file(args.episodes, "--episodes")          # eval --episodes PATH

Each raises ValueError or FileNotFoundError with a one-line message that names the option and the
fix. They read only (config.json, folder listings, the env's task lists, a JSONL's line count):
nothing is built, loaded or written, so a mistyped option fails in a second instead of after the
model has loaded or the episodes have been recorded. (An env's task listing may unpack its data
archive into the cache once, as the run itself would.) `check_inputs` never starts a JAX backend,
so the commands run it first, before the memory plan of `commands.fit` (a mistyped model folder
fails before a minute of planning); `check_start` adds what needs the backend (`check_attention`),
so it runs after `hgpo_jax.distributed.init_distributed`.

What `check_start` checks (all but the attention: `check_inputs`):
- the model folder (`model.path`: a Hugging Face folder, a run folder's base model): config.json
  of a supported family (`hgpo_jax.models.families`; others are refused by name) and a tokenizer
  file, `rollout.max_prompt_tokens + rollout.max_new_tokens` within the model's
  `max_position_embeddings`, and a `mesh.tensor` that splits the model's heads; a model built on
  first use (`tiny`, `build:...`) that is not built yet is skipped;
- `model.attention` against the backend (cudnn: a GPU and 16-bit activations; splash: not a GPU);
- the env's tasks of every split the command plays (rl: env.split, and eval.splits when
  eval.every > 0; eval: env.split and the evaluated splits; sft: env.split for recorded episodes);
- sft: the data (a JSONL file, or episode kinds the env records) and a held-out part that is not
  empty unless sft.heldout=0;
- the run folder: creatable and writable (`check_writable_folder`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jax

from hgpo_jax.build import is_built_on_use, model_path_folder
from hgpo_jax.models.config import DecoderConfig
from hgpo_jax.models.sharding import tensor_axis_problem
from hgpo_jax.models.tokenizer import TOKENIZER_FILES, has_tokenizer_files
from hgpo_jax.runs import is_run_dir, run_source
from hgpo_jax.sft import data as sft_data

KINDS = ("rl", "sft", "eval")
DEFAULT_NAME_MAX = 255  # where the filesystem does not say (os.pathconf)


def check_start(cfg, *, kind: str, run_dir: str | None, eval_splits: Sequence[str] | None = None
                ) -> None:
    """Everything a command of `kind` ("rl": train, "sft", "eval") needs of `cfg` that can be
    checked before weights load (see the module docstring). run_dir: the folder the command
    writes (None: not checked). eval_splits: the splits `eval` plays (default eval.splits; `eval
    --split S`: [S])."""
    check_backend(cfg, jax.default_backend())
    check_inputs(cfg, kind=kind, run_dir=run_dir, eval_splits=eval_splits)


def check_inputs(cfg, *, kind: str, run_dir: str | None, eval_splits: Sequence[str] | None = None
                 ) -> None:
    """`check_start` without what needs JAX's backend: the run folder, the model folder, sft's
    data and the env's tasks of every split played. Starts no backend (runs before the memory
    plan sets JAX's share of a GPU)."""
    if kind not in KINDS:
        raise ValueError(f"check_start(kind={kind!r}): use one of {', '.join(KINDS)}")
    if run_dir is not None:
        check_writable_folder(run_dir)
    check_model_folder(cfg)
    if kind == "sft":
        check_sft_data(cfg)
    for split in splits_played(cfg, kind, eval_splits):
        check_env_split(cfg.env, split)


def splits_played(cfg, kind: str, eval_splits: Sequence[str] | None = None) -> list[str]:
    """The env splits whose tasks a command of `kind` lists, in order, each once: rl: env.split,
    plus eval.splits when eval.every > 0; eval: env.split (the trainer lists it) and the evaluated
    splits; sft: env.split when it records episodes (a JSONL file needs no env data)."""
    if kind == "sft":
        return [cfg.env.split] if cfg.sft.sources() else []
    if kind == "eval":
        wanted = [cfg.env.split, *(cfg.eval.splits if eval_splits is None else eval_splits)]
    else:
        wanted = [cfg.env.split, *(cfg.eval.splits if cfg.eval.every > 0 else [])]
    return list(dict.fromkeys(wanted))


def one_line(text: str) -> str:
    """`text` with its line breaks and runs of spaces made single spaces."""
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------------- the model
def base_model_folder(path: str, _seen: tuple[str, ...] = ()) -> str | None:
    """The folder whose config.json and tokenizer `model.path` stands for, found without building
    anything (what `hgpo_jax.runs.model_folder` gives): a run folder's recorded base model,
    followed; None for a model built on first use ('tiny', 'build:...') that is not built yet."""
    if is_run_dir(path):
        if os.path.abspath(path) in _seen:
            raise ValueError(f"model.path={_seen[0]}: its run folders start from each other in a "
                             f"cycle ({' -> '.join(_seen)} -> {os.path.abspath(path)}); point "
                             "model.path at a model folder")
        return base_model_folder(run_source(path), (*_seen, os.path.abspath(path)))
    folder = model_path_folder(path)
    if is_built_on_use(path) and not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    return folder


def check_model_folder(cfg) -> None:
    """model.path's folder holds config.json of a supported family and a tokenizer file, the
    longest row (prompt + response) fits the model's max_position_embeddings, and mesh.tensor
    splits its heads. Skipped for a model not built yet."""
    path, r = cfg.model.path, cfg.rollout
    folder = base_model_folder(path)
    if folder is None:
        return
    where = f"model.path={path}" + ("" if folder == path else
                                    f" (its base model {folder})" if is_run_dir(path) else
                                    f" (the folder {folder})")
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"{where}: {folder} is not a folder; give model.path a Hugging Face model folder "
            "(e.g. `huggingface-cli download Qwen/Qwen2.5-1.5B-Instruct --local-dir DIR`), an "
            "hgpo-jax run folder, tiny or build:<env>-<size>")
    config_json = os.path.join(folder, "config.json")
    if not os.path.isfile(config_json):
        raise FileNotFoundError(f"{where}: {folder} has no config.json; point model.path at a "
                                "Hugging Face model folder (config.json, weights, tokenizer files)")
    if not has_tokenizer_files(folder):
        raise FileNotFoundError(f"{where}: {folder} has none of the tokenizer files "
                                f"{', '.join(TOKENIZER_FILES)}; copy them from the Hugging Face "
                                "model folder")
    limit = _max_positions(config_json)
    longest = r.max_prompt_tokens + r.max_new_tokens
    if limit is not None and longest > limit:
        raise ValueError(
            f"rollout.max_prompt_tokens + rollout.max_new_tokens = {r.max_prompt_tokens} + "
            f"{r.max_new_tokens} = {longest} is beyond the model's max_position_embeddings={limit} "
            f"({config_json}); lower them so that their sum is at most {limit}")
    model_cfg = DecoderConfig.from_json_file(config_json)  # an unsupported family: ConfigError
    problem = tensor_axis_problem(model_cfg.num_attention_heads, model_cfg.num_key_value_heads,
                                  cfg.mesh.tensor)
    if problem:
        raise ValueError(f"{where}: {problem}")


def _max_positions(config_json: str) -> int | None:
    """max_position_embeddings of a model's config.json (None when it does not say)."""
    try:
        with open(config_json, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{config_json} cannot be read as JSON ({one_line(e)}); restore the "
                         "model's config.json") from None
    value = data.get("max_position_embeddings") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_attention(attention: str, compute_dtype: str, backend: str) -> None:
    """`model.attention` can run on `backend` (jax.default_backend()): cudnn needs a GPU and 16-bit
    activations, splash does not run on a GPU (`hgpo_jax.models.attention.resolve_attention`)."""
    fix = "use model.attention=auto (it picks what runs here) or model.attention=einsum"
    if attention == "cudnn" and backend != "gpu":
        raise ValueError(f"model.attention=cudnn is cuDNN flash attention, which runs on a GPU only, "
                         f"and JAX's backend here is {backend}; {fix}")
    if attention == "cudnn" and compute_dtype != "bfloat16":
        raise ValueError(f"model.attention=cudnn needs 16-bit activations, not "
                         f"model.compute_dtype={compute_dtype}; set model.compute_dtype=bfloat16, "
                         f"or {fix}")
    if attention == "splash" and backend not in ("tpu", "cpu"):
        raise ValueError(f"model.attention=splash is a Pallas TPU kernel and cannot run on "
                         f"{backend}; {fix}")


def check_backend(cfg, backend: str) -> None:
    """What the config's attention paths need of JAX's `backend` (`check_attention`,
    `check_decode_attention`)."""
    check_attention(cfg.model.attention, cfg.model.compute_dtype, backend)
    check_decode_attention(cfg.rollout.decode_attention, cfg.model.attention,
                           cfg.model.compute_dtype, backend)


def check_decode_attention(decode: str, attention: str, compute_dtype: str, backend: str) -> None:
    """`rollout.decode_attention=ragged` can run here: the Pallas GPU kernel on a GPU, after a
    fused prefill (right-padded prompts: `model.attention` resolving to a fused path). Off a GPU
    the kernel runs only through Pallas's interpreter (the tests'), so a run is refused."""
    if decode != "ragged":
        return
    fix = "use rollout.decode_attention=auto (the kernel where it runs) or einsum"
    if backend != "gpu":
        raise ValueError(f"rollout.decode_attention=ragged is a Pallas GPU kernel and JAX's "
                         f"backend here is {backend} (off a GPU it runs only interpreted, in "
                         f"tests); {fix}")
    from hgpo_jax.models.attention import resolve_attention

    if resolve_attention(attention, compute_dtype, 128, backend) == "einsum":
        raise ValueError(f"rollout.decode_attention=ragged needs a fused prefill (right-padded "
                         f"prompts), and model.attention={attention} with model.compute_dtype="
                         f"{compute_dtype} prefills with einsum; set model.attention=auto with "
                         f"bfloat16 activations, or {fix}")


# ------------------------------------------------------------------------------------- the data
def check_env_split(env_cfg, split: str) -> None:
    """The env lists the tasks of `split` (its data is found), and there is at least one."""
    from hgpo_jax.envs.registry import get_env

    try:
        tasks = get_env(env_cfg.name).list_tasks(env_cfg, split)
    except Exception as e:  # each env raises its own kinds; say which split, on one line
        error = FileNotFoundError if isinstance(e, FileNotFoundError) else ValueError
        raise error(f"env.name={env_cfg.name} cannot list the tasks of split {split!r}: "
                    f"{one_line(e)}") from e
    if not len(tasks):
        raise ValueError(f"env.name={env_cfg.name}: split {split!r} has no tasks; check "
                         f"env.data_dir={env_cfg.data_dir}")


def check_sft_data(cfg) -> None:
    """sft.data is an existing JSONL file with turns, or episode kinds the env records; and
    sft.heldout leaves both a held-out and a training part (or sft.heldout=0)."""
    from hgpo_jax.envs.registry import get_env

    s, e = cfg.sft, cfg.env
    sources = s.sources()
    if sources:
        spec = get_env(e.name)
        if spec.record_episodes is None:
            raise ValueError(f"sft.data={s.data}: env {e.name!r} records no episodes; give "
                             "sft.data a JSONL file of prompt/response turns")
        unknown = [kind for kind, _ in sources if spec.episode_kinds and kind not in spec.episode_kinds]
        if unknown:
            raise ValueError(f"sft.data={s.data}: env {e.name!r} records no {unknown[0]!r} "
                             f"episodes; use {', '.join(spec.episode_kinds)} (several joined by +, "
                             f"e.g. sft.data={'+'.join(spec.episode_kinds[:2])}), or a JSONL file")
        problem = sft_data.heldout_problem(s.heldout, sum(n for _, n in sources), "episodes",
                                           sft_data.MORE_EPISODES)
    else:
        if not os.path.exists(s.data):
            raise FileNotFoundError(f"sft.data={s.data} is no existing JSONL file; give a JSONL "
                                    "file of {\"prompt\", \"response\"} lines or episode kinds "
                                    "(e.g. sft.data=expert)")
        if not os.path.isfile(s.data):
            raise ValueError(f"sft.data={s.data} is a folder, not a JSONL file; give the path of "
                             "the file")
        problem = sft_data.heldout_problem(s.heldout, sft_data.count_jsonl_turns(s.data),
                                           f"turns in {s.data}", sft_data.MORE_TURNS)
    if problem:
        raise ValueError(problem)


# ------------------------------------------------------------------------------------- outputs
def check_writable_folder(path: str, what: str = "train.run_dir") -> None:
    """`path` can be made a folder (or is one) and written in, checked without making it: each
    of its names within the filesystem's NAME_MAX, no part of it an existing file, its nearest
    existing folder writable. `what` names the option in the messages."""
    _check_path(path, f"{what}={path}", allow_file=False)


def check_output_file(path: str, flag: str) -> None:
    """`path` (a command's output file, e.g. `eval --episodes PATH`) can be written: not a
    folder, its name within NAME_MAX, its folder creatable and writable. `flag` names it in the
    messages."""
    label = f"{flag} {path}"
    if os.path.isdir(path):
        raise ValueError(f"{label} is a folder; give the path of a file to write (e.g. "
                         f"{os.path.join(path, 'episodes.jsonl')})")
    _check_path(path, label, allow_file=True)


def _check_path(path: str, label: str, allow_file: bool) -> None:
    """The rules of `check_writable_folder` for `path`; `allow_file`: `path` itself may be an
    existing file (an output replaced), written from its folder."""
    full = os.path.abspath(path)
    found = _nearest_existing(full, label)
    if allow_file and found == full and os.path.isfile(full):
        found = os.path.dirname(full)
    if not os.path.isdir(found):
        if found == full:
            raise ValueError(f"{label} is a file; choose a folder")
        raise ValueError(f"{label} lies under the file {found}; choose another folder")
    limit = _name_max(found)
    for name in os.path.relpath(full, found).split(os.sep):
        size = len(os.fsencode(name))
        if name not in (".", "") and size > limit:
            raise ValueError(f"{label}: the name {name[:24]!r}... is {size} bytes, beyond the "
                             f"{limit} this filesystem allows ({found}); choose a shorter name")
    if not os.access(found, os.W_OK | os.X_OK):
        raise ValueError(f"{label}: {found} is not writable by this user; choose a folder you can "
                         "write in")


def _nearest_existing(path: str, label: str) -> str:
    """`path` or its nearest ancestor that exists (a broken symbolic link on the way is an error)."""
    while not os.path.exists(path):
        if os.path.lexists(path):
            raise ValueError(f"{label}: {path} is a broken symbolic link; remove it or choose "
                             "another folder")
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _name_max(folder: str) -> int:
    """The longest file name (bytes) the filesystem of `folder` allows."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return DEFAULT_NAME_MAX
