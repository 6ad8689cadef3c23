"""Hugging Face checkpoint port (`load_pretrained`) and export (`save_pretrained`), torch-free.

Names: a Flax parameter path `model.layers.0.self_attn.q_proj.kernel` is the HF tensor
`model.layers.0.self_attn.q_proj.weight`, transposed (HF Linear stores [out, in], Flax [in, out]).
Embeddings (`embedding`) and RMSNorm scales (`scale`) map to `.weight` unchanged, biases to `.bias`.
A model with scanned layers stores `model.layers.mlp.up_proj.kernel` as one [L, D, I] array: it
is the L HF tensors `model.layers.{0..L-1}.mlp.up_proj.weight`, each transposed, stacked.
"""

from __future__ import annotations

import json
import os
import warnings

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from hgpo_jax.models.config import DecoderConfig, resolve_dtype
from hgpo_jax.models.critic import CriticModel, check_num_heads, new_value_head
from hgpo_jax.models.decoder import CausalLM
from hgpo_jax.models.lora import LEAVES, LoraSpec, is_adapter_path, new_adapter_value
from hgpo_jax.models import peft_io
from hgpo_jax.models.safetensors_io import (CheckpointReader, output_folder, staged_folder,
                                            write_safetensors)
from hgpo_jax.models.sharding import is_stacked_path, place_param

# HF tensors that carry no weights of ours and may appear in older checkpoints.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
VALUE_HEAD = "score.weight"  # a critic's value heads, [H, D] (the family's ...ForTokenClassification)
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30


class CheckpointError(ValueError):
    """A checkpoint whose tensors do not fit its config.json."""


def flax_path_to_hf(path: tuple) -> tuple[str, bool]:
    """Flax param path tuple -> (HF tensor name, whether the array is transposed between them)."""
    base = ".".join(str(p) for p in path[:-1])
    leaf = path[-1]
    if leaf == "kernel":
        return f"{base}.weight", True
    if leaf in ("embedding", "scale"):
        return f"{base}.weight", False
    if leaf == "bias":
        return f"{base}.bias", False
    raise KeyError(f"no HF name for Flax parameter {'.'.join(map(str, path))}")


def is_stacked(path: tuple) -> bool:
    """A scanned model's stacked layer weight: `('model', 'layers', 'mlp', ...)`, no layer index."""
    return is_stacked_path(_dotted(path))


def hf_tensor_names(path: tuple, num_layers: int) -> tuple[list[str], bool]:
    """Flax param path -> (the HF tensor names it holds, transposed?): one name, or one per layer
    (in layer order) for a stacked weight."""
    if not is_stacked(path):
        name, transpose = flax_path_to_hf(path)
        return [name], transpose
    names = [flax_path_to_hf(("model", "layers", i) + tuple(path[2:])) for i in range(num_layers)]
    return [n for n, _ in names], names[0][1]


def adapter_tensor_names(path: tuple, num_layers: int) -> list[str]:
    """An adapter's Flax path -> its PEFT tensor names (one per layer for a stacked one), each
    stored transposed (`peft_io`)."""
    if not is_stacked(path):
        return [peft_io.peft_name(_dotted(path))[0]]
    return [peft_io.peft_name(_dotted(("model", "layers", i) + tuple(path[2:])))[0]
            for i in range(num_layers)]


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def abstract_model(config: DecoderConfig, *, dtype="float32", compute_dtype=None, critic: bool = False,
                   num_heads: int = 1, **options):
    """(graphdef, flat abstract state) of a model with that config; allocates no weights.
    options: CausalLM's keyword options (scan_layers, attention, remat); critic: a
    CriticModel (`num_heads` value heads, no LM head)."""
    compute_dtype = compute_dtype or dtype
    if critic:
        options["num_heads"] = num_heads
    cls = CriticModel if critic else CausalLM
    model = nnx.eval_shape(lambda: cls(config, dtype=compute_dtype, param_dtype=dtype,
                                       rngs=nnx.Rngs(0), **options))
    graphdef, state = nnx.split(model)
    return graphdef, nnx.to_flat_state(state)


def label_count(config: DecoderConfig) -> int | None:
    """The labels config.json declares (`num_labels`, else the length of `id2label`; transformers
    keeps only the latter); None when it declares none."""
    if "num_labels" in config.extra:
        return int(config.extra["num_labels"])
    labels = config.extra.get("id2label")
    return len(labels) if labels else None


def critic_heads(config: DecoderConfig, head_shape: tuple[int, ...] | None, num_heads: int | None,
                 folder: str = "model folder") -> int:
    """The value heads of a critic loaded from a folder.

    head_shape: the folder's `score.weight` shape [H, D], None when it has none (a causal LM's
      folder: the heads are new, `num_heads` of them, default 1).
    A folder with a head has H of them: config.json's labels (`label_count`) and `num_heads`,
    when given, must say H too. Raises CheckpointError saying which disagrees."""
    if head_shape is None:
        return check_num_heads(1 if num_heads is None else num_heads)
    heads = int(head_shape[0])
    labels = label_count(config)
    if labels is not None and labels != heads:
        raise CheckpointError(f"{folder}: config.json declares {labels} labels but {VALUE_HEAD} "
                              f"holds {heads} value heads {tuple(head_shape)}; fix num_labels / "
                              "id2label in config.json")
    if num_heads is not None and check_num_heads(num_heads) != heads:
        raise CheckpointError(f"{folder}: the critic has {heads} value heads, not the "
                              f"{num_heads} asked for; load it with num_heads={heads} (or None), "
                              "or start new heads from the policy's folder")
    return heads


def load_pretrained(path: str | os.PathLike, dtype: str = "float32", *, compute_dtype: str | None = None,
                    mesh: jax.sharding.Mesh | None = None, progress: bool = False,
                    scan_layers: bool = False, attention: str = "auto",
                    remat: bool = False, critic: bool = False, seed: int = 0,
                    num_heads: int | None = None, lora: LoraSpec | None = None,
                    adapter: str | os.PathLike | None = None, lora_seed: int = 0) -> CausalLM:
    """Load an HF folder of any registered family (config.json + model.safetensors or a sharded
    index; `families`: qwen2, qwen3, llama). Its config.json is checked before any tensor is read.

    critic: load it as a `CriticModel` (as transformers' `...ForTokenClassification` does):
      the backbone's tensors, and the value heads `score.*` when the folder has them (an exported
      critic: as many heads as it has, config.json's num_labels); otherwise (a causal LM's folder,
      verl's critic start) `num_heads` new heads (default 1), N(0, 0.02) weights from `seed` and a
      zero bias. The LM head is never read. num_heads: the heads expected (`critic_heads`); None
      takes the folder's.
    scan_layers, attention, remat: the model's options (CausalLM); with scan_layers the
      per-layer tensors are stacked on the host, one weight at a time.
    dtype: storage dtype of the weights ('float32' or 'bfloat16'); the checkpoint's own dtype is
      converted tensor by tensor. compute_dtype: activations' dtype (default: `dtype`).
    mesh: when given, each tensor goes straight into its `NamedSharding` from the partition rules
      (no device ever holds a full copy of a sharded tensor). Reads one tensor at a time.
    lora: low-rank adapters on the layers it targets (`lora.py`), new: A from `lora_seed`, B
      zero (the model equals the folder's). adapter: a PEFT adapter folder (`peft_io.py`) whose
      adapters are loaded instead, its rank, alpha and targets the spec (a `lora` given too must
      be the same); it is checked against config.json (targets, shapes, layers) before any
      weight is read. Adapters are stored in float32 whatever `dtype` is.
    """
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"model folder {folder!r} does not exist or is not a directory")
    config = DecoderConfig.from_json_file(os.path.join(folder, "config.json"))
    if adapter is not None:
        adapter = os.fspath(adapter)
        spec, _ = peft_io.read_adapter_config(adapter)
        if lora is not None and lora != spec:
            raise peft_io.AdapterError(
                f"{adapter}: the adapter has rank {spec.rank}, alpha {spec.alpha:g}, targets "
                f"{','.join(spec.targets)}, but the run asks for rank {lora.rank}, alpha "
                f"{lora.alpha:g}, targets {','.join(lora.targets)}: drop model.lora_* (an adapter "
                "brings its own) or make them the adapter's")
        lora = spec
    reader = CheckpointReader(folder)
    np_dtype = np.dtype(resolve_dtype(dtype))
    available = set(reader.keys())
    heads = (critic_heads(config, reader.shape(VALUE_HEAD) if VALUE_HEAD in available else None,
                          num_heads, folder) if critic else 1)
    graphdef, flat = abstract_model(config, dtype=dtype, compute_dtype=compute_dtype, critic=critic,
                                    num_heads=heads, scan_layers=scan_layers, attention=attention,
                                    remat=remat, lora=lora)
    if adapter is not None:
        expected = {}
        for fpath, var in flat:
            if is_adapter_path(fpath):
                one = var.shape[1:] if is_stacked(fpath) else var.shape
                for name in adapter_tensor_names(fpath, config.num_hidden_layers):
                    expected[name] = tuple(one[::-1])
        adapter_file = peft_io.open_adapter_tensors(adapter, expected)

    loaded, used = [], set()
    for fpath, var in tqdm(list(flat), desc="load weights", unit="tensor", disable=not progress):
        if is_adapter_path(fpath):
            if adapter is None:
                host = new_adapter_value(_dotted(fpath), var.shape, np.float32, lora_seed)
            else:
                parts = [np.ascontiguousarray(adapter_file.get(n).T.astype(np.float32))
                         for n in adapter_tensor_names(fpath, config.num_hidden_layers)]
                host = np.stack(parts) if is_stacked(fpath) else parts[0]
            value = place_param(host, mesh, _dotted(fpath))
            loaded.append((fpath, var.replace(value=value)))
            continue
        names, transpose = hf_tensor_names(fpath, config.num_hidden_layers)
        one_shape = var.shape[1:] if is_stacked(fpath) else var.shape
        if critic and fpath[0] == "score" and names[0] not in available:  # a new value head
            host = new_value_head(fpath[-1], var.shape, np_dtype, seed)
            value = place_param(host, mesh, _dotted(fpath))
            loaded.append((fpath, var.replace(value=value)))
            continue
        parts = []
        for name in names:
            if name not in available:
                raise CheckpointError(f"{folder}: tensor {name!r} is missing from the checkpoint "
                                      f"(needed for {_dotted(fpath)} by config.json)")
            src = reader.get(name)
            want = tuple(one_shape[::-1] if transpose else one_shape)
            if tuple(src.shape) != want:
                raise CheckpointError(f"{reader.file_of(name)}: tensor {name!r} has shape "
                                      f"{tuple(src.shape)}, but config.json implies {want}")
            parts.append(np.ascontiguousarray((src.T if transpose else src).astype(np_dtype, copy=False)))
            used.add(name)
            del src
        host = np.stack(parts) if is_stacked(fpath) else parts[0]
        del parts
        value = place_param(host, mesh, _dotted(fpath))
        del host
        loaded.append((fpath, var.replace(value=value)))

    unused = sorted(n for n in available - used
                    if not n.endswith(_IGNORED_SUFFIXES)
                    and not ((config.tie_word_embeddings or critic) and n == "lm_head.weight"))
    if unused:
        warnings.warn(f"{folder}: {len(unused)} checkpoint tensors are not used by {config.model_type}: "
                      f"{unused[:5]}{' ...' if len(unused) > 5 else ''}", stacklevel=2)
    model = nnx.merge(graphdef, nnx.from_flat_state(loaded))
    model.batch_mesh = mesh  # activations split over the batch axes like the inputs
    return model


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}
    s = size.strip().upper()
    for unit in sorted(units, key=len, reverse=True):
        if s.endswith(unit):
            return int(float(s[: -len(unit)]) * units[unit])
    return int(s)


def _host_array(value) -> np.ndarray:
    """A (possibly sharded, possibly multi-host) jax array -> full NumPy array on this host."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils
        value = multihost_utils.process_allgather(value, tiled=True)
    return np.asarray(jax.device_get(value))


def save_pretrained(model: CausalLM, out_dir: str | os.PathLike, *, dtype: str | None = None,
                    max_shard_size: int | str = DEFAULT_MAX_SHARD_BYTES, overwrite: bool = False,
                    tokenizer=None) -> str:
    """Write an HF folder of the model's family (config.json's `model_type` and `architectures`
    as the family's) that `transformers.AutoModelForCausalLM.from_pretrained` loads
    (a `CriticModel`: `AutoModelForTokenClassification`, one label per value head:
    `critic_hf_config`).

    Tensors carry HF's names and layouts; files are split past `max_shard_size` bytes (with a
    `model.safetensors.index.json`). Everything is written to a temporary sibling folder and renamed
    into place, so `out_dir` is either the complete export or untouched. An existing empty
    `out_dir` is used (as transformers does); a non-empty one needs `overwrite=True` (it is then
    replaced as a whole once the export is complete). dtype: the stored dtype
    (default: the model's parameter dtype). tokenizer: optional, saved alongside. A model with
    adapters is written merged (each adapted kernel W + scale * A B, in float32 on the host, then
    cast): a plain model of its family (`save_adapter` writes the adapters alone).
    Returns the output folder.
    """
    out_dir = output_folder(out_dir, overwrite)
    np_dtype = np.dtype(resolve_dtype(dtype) if dtype else model.param_dtype)
    limit = _parse_size(max_shard_size)
    if limit <= 0:
        raise ValueError(f"max_shard_size must be positive, got {max_shard_size!r}")

    flat = list(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    adapters = {fpath: var for fpath, var in flat if is_adapter_path(fpath)}
    scale = model.lora.scale if getattr(model, "lora", None) is not None else 0.0
    params = {}  # HF name -> (variable, transposed?, layer index in a stacked variable or None)
    merge_with = {}  # a kernel's variable id -> its adapters' (A, B) variables
    for fpath, var in flat:
        if is_adapter_path(fpath):
            continue
        names, transpose = hf_tensor_names(fpath, model.config.num_hidden_layers)
        for i, name in enumerate(names):
            params[name] = (var, transpose, i if is_stacked(fpath) else None)
        ab = tuple(adapters.get(fpath[:-1] + (leaf,)) for leaf in LEAVES)
        if fpath[-1] == "kernel" and ab[0] is not None:
            merge_with[id(var)] = ab

    def host_of(var):  # a variable on the host, merged with its adapters where it has some
        arr = _host_array(var[...])
        if id(var) in merge_with:
            a, b = (_host_array(v[...]).astype(np.float32) for v in merge_with[id(var)])
            arr = (arr.astype(np.float32) + np.matmul(a, b) * np.float32(scale)).astype(arr.dtype)
        return arr

    def hf_shape(var, transpose, layer):  # one HF tensor's shape (a layer of a stacked weight)
        shape = tuple(var.shape[1:] if layer is not None else var.shape)
        return shape[::-1] if transpose else shape

    specs = [(n, hf_shape(*entry), np_dtype) for n, entry in params.items()]
    specs.sort(key=lambda s: s[0] == "lm_head.weight")  # HF order: lm_head last

    shards: list[list] = [[]]
    size = 0
    for spec in specs:
        nbytes = int(np.prod(spec[1])) * np_dtype.itemsize
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes

    gathered = {}  # the last stacked variable brought to the host, reused for its L tensors

    def produce(name: str) -> np.ndarray:
        var, transpose, layer = params[name]
        if layer is None:
            arr = host_of(var)
        else:
            if gathered.get("var") is not var:
                gathered.clear()
                gathered.update(var=var, arr=host_of(var))
            arr = gathered["arr"][layer]
        return (arr.T if transpose else arr).astype(np_dtype)

    with staged_folder(out_dir) as tmp:
        names = (["model.safetensors"] if len(shards) == 1 else
                 [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
        total = 0
        for fname, shard in zip(names, shards):
            total += write_safetensors(os.path.join(tmp, fname), shard, produce)
        if len(shards) > 1:
            index = {"metadata": {"total_size": total},
                     "weight_map": {s[0]: f for f, shard in zip(names, shards) for s in shard}}
            with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2)
        hf_config = model.config.to_hf_dict(dtype=np_dtype.name)
        if isinstance(model, CriticModel):
            hf_config = critic_hf_config(hf_config, model.num_heads, model.config.family.critic)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return out_dir


def save_adapter(model: CausalLM, out_dir: str | os.PathLike, *, base: str,
                 overwrite: bool = False) -> str:
    """Write the model's adapters as a PEFT folder (`peft_io.save_adapter`) that
    `peft.PeftModel.from_pretrained(<base>, out_dir)` loads; `base` goes in its
    adapter_config.json as base_model_name_or_path. Adapters only: the base is not written."""
    if getattr(model, "lora", None) is None:
        raise ValueError("the model has no adapters (model.lora_rank is 0): export it whole, "
                         "without --adapter")
    tensors = {}
    for fpath, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if not is_adapter_path(fpath):
            continue
        arr = _host_array(var[...]).astype(np.float32)
        names = adapter_tensor_names(fpath, model.config.num_hidden_layers)
        for i, name in enumerate(names):
            one = arr[i] if is_stacked(fpath) else arr
            tensors[name] = np.ascontiguousarray(one.T)
    return peft_io.save_adapter(tensors, model.lora, out_dir, base=base, overwrite=overwrite)


def critic_hf_config(hf_config: dict, num_heads: int, architecture: str) -> dict:
    """An HF config dict as a critic's: `architecture`, the family's transformers class for
    token-level heads (`Qwen2ForTokenClassification`, ...), with `num_heads` labels (`num_labels`
    and the `id2label` / `label2id` maps transformers counts them from)."""
    labels = [f"LABEL_{h}" for h in range(num_heads)]
    return {**hf_config, "architectures": [architecture], "num_labels": num_heads,
            "id2label": {str(h): name for h, name in enumerate(labels)},
            "label2id": {name: h for h, name in enumerate(labels)}}
