"""LoRA adapters in and out as PEFT folders (`adapter_config.json` + `adapter_model.safetensors`),
torch-free: what `peft.PeftModel.from_pretrained(base, folder)` loads and what TRL, PEFT or verl
write.

Names: the adapter of `model.layers.3.self_attn.q_proj` is PEFT's
`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` [r, in] and `...lora_B.weight`
[out, r] (the adapter's own name, "default", is not in the saved keys); ours are `lora_a` [in, r]
and `lora_b` [r, out], the same arrays transposed. A scanned model's stacked [L, in, r] is the L
per-layer tensors. The scale is lora_alpha / r (PEFT's default), or lora_alpha / sqrt(r) with
`use_rslora`. Variants this decoder does not compute (DoRA, per-layer rank or alpha patterns,
fan-in-fan-out weights, trained biases, extra trained modules, a subset of layers) are refused with
what to change, before any weight is read.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
from safetensors.numpy import save_file

from hgpo_jax.models.lora import ALL_LINEAR, TARGETS, LoraSpec, from_options
from hgpo_jax.models.safetensors_io import (SafetensorsError, SafetensorsFile, output_folder,
                                            staged_folder)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_LEAF = {"lora_a": "lora_A", "lora_b": "lora_B"}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.(lora_A|lora_B)\.weight$")


class AdapterError(ValueError):
    """A PEFT adapter folder that cannot serve this model."""


def _is_adapter_folder(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, ADAPTER_CONFIG))


def read_adapter_config(folder: str | os.PathLike) -> tuple[LoraSpec, dict]:
    """(the adapter's LoraSpec, its adapter_config.json) from a PEFT folder; AdapterError on a
    folder that is not one or a LoRA variant the decoder does not compute."""
    folder = os.fspath(folder)
    path = os.path.join(folder, ADAPTER_CONFIG)
    if not os.path.isdir(folder):
        raise AdapterError(f"adapter folder {folder!r} does not exist or is not a directory")
    if not os.path.isfile(path):
        raise AdapterError(f"{folder} is not a PEFT adapter folder: it has no {ADAPTER_CONFIG} "
                           "(a full model folder goes in model.path, an adapter in model.adapter)")
    if not os.path.isfile(os.path.join(folder, ADAPTER_WEIGHTS)):
        raise AdapterError(f"{folder} has no {ADAPTER_WEIGHTS} (PyTorch adapter_model.bin files "
                           "are not read: save the adapter with safe_serialization=True)")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as err:
        raise AdapterError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"{path}: expected a JSON object")

    def refuse(what: str, fix: str):
        raise AdapterError(f"{path}: {what}; {fix}")

    if cfg.get("peft_type", "LORA") != "LORA":
        refuse(f"peft_type {cfg.get('peft_type')!r} is not a LoRA adapter", "only LORA adapters load")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha", 8)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        refuse(f"r = {rank!r}", "the rank must be a positive integer")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        refuse(f"lora_alpha = {alpha!r}", "lora_alpha must be a number")
    for key, fix in (("use_dora", "DoRA adapters are not computed here"),
                     ("lora_bias", "adapters with a bias of their own are not computed here"),
                     ("fan_in_fan_out", "fan-in-fan-out (Conv1D) weights are GPT-2's, not this model's")):
        if cfg.get(key):
            refuse(f"{key} is true", fix)
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            refuse(f"{key} gives some layers another rank or alpha", "one rank and alpha for all "
                   "layers only")
    if cfg.get("bias", "none") != "none":
        refuse(f"bias = {cfg.get('bias')!r} (trained biases)", "only bias 'none' loads")
    for key in ("modules_to_save", "layers_to_transform", "layers_pattern", "layer_replication",
                "exclude_modules", "trainable_token_indices"):
        if cfg.get(key):
            refuse(f"{key} = {cfg[key]!r}", f"adapters on every layer's {', '.join(TARGETS)} "
                   "only, nothing else trained")
    targets = cfg.get("target_modules")
    if isinstance(targets, str) and targets != ALL_LINEAR:
        refuse(f"target_modules is the pattern {targets!r}", f"name the layers as a list among "
               f"{', '.join(TARGETS)} (or {ALL_LINEAR!r})")
    if not targets:
        refuse("no target_modules", f"name the layers among {', '.join(TARGETS)}")
    # PEFT matches a target by the module path's last part; it also saves full paths
    # ("model.layers.1.self_attn.k_proj", as `all-linear` resolves): a layer missing from the
    # list is then a tensor missing from the file (open_adapter_tensors)
    names = [targets] if isinstance(targets, str) else [str(t).rpartition(".")[2] for t in targets]
    unknown = [t for t in names if t != ALL_LINEAR and t not in TARGETS]
    if unknown:
        refuse(f"target_modules names {unknown[0]!r}, which this decoder does not have as a "
               "linear layer", f"use names among {', '.join(TARGETS)}")
    spec = LoraSpec(rank, float(alpha), ALL_LINEAR if ALL_LINEAR in names else tuple(set(names)),
                    rslora=bool(cfg.get("use_rslora", False)))
    return spec, cfg


def peft_name(dotted: str) -> tuple[str, bool]:
    """Our adapter path (`model.layers.3.self_attn.q_proj.lora_a`) -> (PEFT's tensor name,
    transposed: always)."""
    head, _, leaf = dotted.rpartition(".")
    return f"{PREFIX}{head}.{_LEAF[leaf]}.weight", True


def open_adapter_tensors(folder: str, expected: dict[str, tuple[int, ...]]) -> SafetensorsFile:
    """The folder's adapter_model.safetensors, opened once (memory-mapped; read a tensor with
    `.get(name)`), after checking from its header alone that every PEFT tensor the model needs is
    there with its shape, and nothing else (`expected`: PEFT name -> shape)."""
    path = os.path.join(folder, ADAPTER_WEIGHTS)
    try:
        file = SafetensorsFile(path)
    except SafetensorsError as err:
        raise AdapterError(f"{path}: not a readable safetensors file ({err})") from None
    shapes = {k: file.shape(k) for k in file.keys()}
    for name, shape in expected.items():
        if name not in shapes:
            raise AdapterError(f"{path}: tensor {name!r} is missing (adapter_config.json targets "
                               "it): the adapter was made for another model or another target set")
        if shapes[name] != tuple(shape):
            raise AdapterError(f"{path}: tensor {name!r} has shape {shapes[name]}, this model "
                               f"needs {tuple(shape)}: the adapter was made for another base model")
    extra = sorted(set(shapes) - set(expected))
    if extra:
        m = _KEY.match(extra[0])
        why = ("a layer this model does not have" if m else "a module this decoder does not adapt")
        raise AdapterError(f"{path}: tensor {extra[0]!r} is for {why} "
                           f"({len(extra)} such): the adapter was made for another base model")
    return file


def adapter_config_dict(spec: LoraSpec, base: str, *, dropout: float = 0.0) -> dict:
    """The adapter_config.json of `spec` (PEFT's LoraConfig fields for a causal LM)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
            "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": dropout,
            "target_modules": list(spec.targets), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": spec.rslora, "use_dora": False, "init_lora_weights": True,
            "inference_mode": True, "modules_to_save": None, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "revision": None}


def save_adapter(tensors: dict[str, np.ndarray], spec: LoraSpec, out_dir: str | os.PathLike, *,
                 base: str, overwrite: bool = False) -> str:
    """Write a PEFT folder: adapter_config.json and adapter_model.safetensors (`tensors`: PEFT
    name -> array in PEFT's layout) into `out_dir`, all or nothing (a temporary sibling renamed
    into place). A non-empty `out_dir` needs overwrite=True."""
    out_dir = output_folder(out_dir, overwrite)
    with staged_folder(out_dir) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
                  os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w", encoding="utf-8") as f:
            json.dump(adapter_config_dict(spec, base), f, indent=2)
    return out_dir


def lora_spec(model_cfg) -> LoraSpec | None:
    """The `LoraSpec` of a config's model section (`model_cfg`: its `adapter`, `lora_rank`,
    `lora_alpha`, `lora_targets`; None: no adapters): model.adapter's own (a PEFT folder), else
    model.lora_rank / lora_alpha / lora_targets'. ValueError (AdapterError) names what does not
    fit, before any weight loads."""
    if model_cfg.adapter and model_cfg.lora_rank:
        raise ValueError(f"model.adapter={model_cfg.adapter!r} brings its own rank: set "
                         f"model.lora_rank=0 (not {model_cfg.lora_rank}) beside it")
    if model_cfg.adapter:
        return read_adapter_config(model_cfg.adapter)[0]
    return from_options(model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.lora_targets)
