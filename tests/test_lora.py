"""LoRA adapters on the decoder (hgpo_jax/models/lora.py) and PEFT adapter folders
(hgpo_jax/models/peft_io.py): logits against transformers + peft for every family with random
adapters (B not zero; several ranks, alphas and target sets; rsLoRA), scanned = unrolled, zero-B
adapters = the base bit for bit, no adapters = the model as it was, the adapter written back as a
PEFT folder that peft loads, the merged export that transformers loads, and the refusals."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
from flax import nnx
from hf_models import (TINY_SHAPES, build_family_model, build_hf_model, hf_logits, load_hf,
                       real_tokens_error, right_padded_batch)

from hgpo_jax.models import CausalLM, load_pretrained, save_pretrained
from hgpo_jax.models.hf_io import save_adapter
from hgpo_jax.models.lora import BASE, TARGETS, LoraSpec, parse_targets
from hgpo_jax.models.peft_io import AdapterError, read_adapter_config
from hgpo_jax.models.tiny import TINY_CONFIG

LENGTHS = (11, 7, 3)  # a right-padded batch

# (base: a FAMILY_SHAPES name or "qwen2"; peft LoraConfig kwargs)
CASES = {
    "qwen2_r4_qv_down": ("qwen2", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])),
    "qwen2_r2_all_linear": ("qwen2", dict(r=2, lora_alpha=16, target_modules="all-linear")),
    "qwen3_r8_attention": ("qwen3_untied_hd16_gqa6", dict(
        r=8, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
    "llama_r3_mlp_rslora": ("llama_untied_hd24_gqa1_bias", dict(
        r=3, lora_alpha=6, target_modules=["gate_proj", "up_proj", "down_proj"], use_rslora=True)),
    "llama_r1_all_linear": ("llama_tied_llama3rope_gqa4", dict(r=1, lora_alpha=2, target_modules="all-linear")),
}


def right_padded(vocab: int, seed: int = 0):
    return right_padded_batch(vocab, LENGTHS, seed)


def real_error(ours, ref) -> float:
    return real_tokens_error(ours, ref, LENGTHS)


def build_base(name: str, folder: str):
    if name == "qwen2":
        return build_hf_model(TINY_SHAPES["untied_gqa1"], folder)
    return build_family_model(name, folder)


def make_case(name: str, root) -> tuple:
    """(name, base folder, PEFT adapter folder, peft model) of CASES[name], random adapters (B
    not zero), in `root`."""
    base_name, lora_kwargs = CASES[name]
    base_dir, adapter_dir = str(root / "base"), str(root / "adapter")
    build_base(base_name, base_dir)
    torch.manual_seed(1)
    config = peft.LoraConfig(init_lora_weights=False, task_type="CAUSAL_LM", **lora_kwargs)
    model = peft.get_peft_model(load_hf(base_dir), config).eval()
    model.save_pretrained(adapter_dir)
    return name, base_dir, adapter_dir, model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    return make_case(request.param, tmp_path_factory.mktemp(request.param))


def test_logits_match_peft_scanned_and_unrolled(case):
    name, base_dir, adapter_dir, reference = case
    ids, mask = right_padded(reference.config.vocab_size)
    ref = hf_logits(reference, ids, mask)
    base_ref = hf_logits(load_hf(base_dir), ids, mask)
    assert np.abs(ref - base_ref).max() > 1e-3  # the adapters change the logits
    out = {}
    for scan in (False, True):
        model = load_pretrained(base_dir, adapter=adapter_dir, scan_layers=scan)
        assert model.lora is not None and model.lora.rank == CASES[name][1]["r"]
        out[scan] = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
        assert real_error(out[scan], ref) < 2e-4, (name, scan)
    assert real_error(out[True], out[False]) < 1e-5


def test_adapter_and_merged_exports_load_in_peft_and_transformers(case, tmp_path):
    name, base_dir, adapter_dir, reference = case
    ids, mask = right_padded(reference.config.vocab_size, seed=1)
    model = load_pretrained(base_dir, adapter=adapter_dir, scan_layers=True)
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    save_adapter(model, tmp_path / "adapter", base=base_dir)
    save_pretrained(model, tmp_path / "merged")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["base_model_name_or_path"]) == (CASES[name][1]["r"], base_dir)
    again = peft.PeftModel.from_pretrained(load_hf(base_dir), str(tmp_path / "adapter")).eval()
    merged = load_hf(str(tmp_path / "merged"))
    for other in (again, merged):
        assert real_error(ours, hf_logits(other, ids, mask)) < 2e-4
    # the adapter read back is the same spec and the same model
    spec, _ = read_adapter_config(tmp_path / "adapter")
    assert spec == model.lora
    back = load_pretrained(base_dir, adapter=str(tmp_path / "adapter"))
    assert real_error(back(jnp.asarray(ids), attention_mask=jnp.asarray(mask)), ours) < 1e-5


def test_new_adapters_leave_the_base_bit_for_bit_and_scanned_equals_unrolled(tmp_path):
    folder = str(tmp_path / "base")
    build_hf_model(TINY_SHAPES["tied_gqa2"], folder)
    ids, mask = right_padded(128)
    plain = load_pretrained(folder)
    want = np.asarray(plain(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    spec = LoraSpec(4, 8.0)
    models = {scan: load_pretrained(folder, lora=spec, scan_layers=scan, lora_seed=3)
              for scan in (False, True)}
    for model in models.values():
        got = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
        assert np.array_equal(got, want)  # B = 0: the base's logits exactly
        adapters = nnx.state(model, nnx.LoRAParam)
        leaves = nnx.to_flat_state(adapters)
        assert len(leaves) == 2 * len(TARGETS) * (1 if model.scan_layers else 2)
        assert all(v.dtype == jnp.float32 for _, v in leaves)
        # the base weights are the folder's, the same arrays as without adapters
        base = dict(nnx.to_flat_state(nnx.state(model, BASE)))
        ref = dict(nnx.to_flat_state(nnx.state(load_pretrained(folder, scan_layers=model.scan_layers))))
        assert base.keys() == {k for k in ref if k[-1] != "rngs"} & base.keys() and len(base) == len(ref)
        for k, v in base.items():
            assert np.array_equal(np.asarray(v[...]), np.asarray(ref[k][...]))
    # the same A per layer in both layouts (drawn from each layer's own path)
    a_unrolled = np.asarray(models[False].model.layers[1].self_attn.q_proj.lora_a[...])
    a_scanned = np.asarray(models[True].model.layers.self_attn.q_proj.lora_a[...])[1]
    assert np.array_equal(a_unrolled, a_scanned) and np.abs(a_unrolled).max() > 0
    # non-zero B: scanned and unrolled still agree
    for model in models.values():
        for _, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
            if var[...].shape[-2] == 4:  # lora_b [.., r, out]
                var[...] = jnp.full(var[...].shape, 0.01, jnp.float32)
    outs = [np.asarray(m(jnp.asarray(ids), attention_mask=jnp.asarray(mask))) for m in models.values()]
    assert np.abs(outs[0] - want).max() > 1e-3 and real_error(outs[0], outs[1]) < 1e-5


def test_without_lora_the_model_has_no_adapters():
    model = CausalLM(TINY_CONFIG, rngs=nnx.Rngs(0))
    assert model.lora is None and not nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    with_lora = CausalLM(TINY_CONFIG, rngs=nnx.Rngs(0), lora=LoraSpec(2, targets=("q_proj",)))
    base = nnx.to_flat_state(nnx.state(with_lora, BASE))
    plain = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    assert len(base) == len(plain)  # the adapters' own stream: the base draws what it drew
    for k, v in base:
        assert np.array_equal(np.asarray(v[...]), np.asarray(plain[k][...]))


def test_targets_and_spec_refusals():
    assert parse_targets("all-linear") == TARGETS
    assert parse_targets("down_proj, q_proj") == ("q_proj", "down_proj")
    with pytest.raises(ValueError, match="unknown LoRA target 'qkv'"):
        parse_targets("qkv,o_proj")
    with pytest.raises(ValueError, match="rank must be positive"):
        LoraSpec(0)
    with pytest.raises(ValueError, match="no target layers"):
        LoraSpec(4, targets=())
    assert LoraSpec(4, 8.0).scale == 2.0 and LoraSpec(4, 8.0, rslora=True).scale == 4.0


def _edit_config(folder, **changes):
    path = os.path.join(folder, "adapter_config.json")
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))


def test_adapter_folders_that_do_not_fit_are_refused_before_any_weight_loads(tmp_path):
    _, base_dir, adapter_dir, _ = make_case("qwen2_r4_qv_down", tmp_path)
    other = str(tmp_path / "other")  # another base: other hidden size
    build_hf_model(TINY_SHAPES["tied_gqa2"], other)
    with pytest.raises(AdapterError, match="has shape .* made for another base model"):
        load_pretrained(other, adapter=adapter_dir)
    with pytest.raises(AdapterError, match="does not exist"):
        load_pretrained(base_dir, adapter=str(tmp_path / "missing"))
    with pytest.raises(AdapterError, match="not a PEFT adapter folder"):
        load_pretrained(base_dir, adapter=base_dir)
    with pytest.raises(AdapterError, match="asks for rank 8"):
        load_pretrained(base_dir, adapter=adapter_dir, lora=LoraSpec(8, 8.0))
    for changes, message in (({"use_dora": True}, "DoRA"), ({"r": 0}, "r = 0"),
                             ({"target_modules": ["q_proj", "c_attn"]}, "'c_attn'"),
                             ({"target_modules": ".*proj"}, "pattern"),
                             ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
                             ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                             ({"peft_type": "IA3"}, "not a LoRA adapter")):
        bad = str(tmp_path / "bad")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(adapter_dir, bad)
        _edit_config(bad, **changes)
        with pytest.raises(AdapterError, match=message):
            load_pretrained(base_dir, adapter=bad)
    # a target set whose tensors are not all in the file
    bad = str(tmp_path / "bad")
    shutil.rmtree(bad)
    shutil.copytree(adapter_dir, bad)
    _edit_config(bad, target_modules=["q_proj", "v_proj", "down_proj", "up_proj"])
    with pytest.raises(AdapterError, match="up_proj.lora_A.weight' is missing"):
        load_pretrained(base_dir, adapter=bad)
