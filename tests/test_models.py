"""Qwen2 in Flax NNX against transformers' torch implementation, and the HF port/export."""

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hf_models import TINY_SHAPES, build_hf_model, hf_logits, load_hf
from jax.sharding import PartitionSpec as P

from hgpo_jax.models import (CheckpointError, ConfigError, KVCache, DecoderConfig, SafetensorsError,
                             load_pretrained, make_mesh, save_pretrained)
from hgpo_jax.models.hf_io import flax_path_to_hf
from hgpo_jax.models.safetensors_io import SafetensorsFile, write_safetensors
from hgpo_jax.models.sharding import fit_spec, param_partition_spec


def random_ids(vocab, shape, seed=1):
    return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


@nnx.jit
def _forward(model, ids, attention_mask, positions):
    return model(ids, attention_mask=attention_mask, positions=positions).astype(jnp.float32)


def flax_logits(model, ids, attention_mask=None, positions=None):
    """Jitted forward (one compile per shape, much faster than eager op-by-op dispatch)."""
    return np.asarray(_forward(model, jnp.asarray(ids), attention_mask, positions))


# ------------------------------------------------------------------------------------- parity
def test_fp32_logits_match_transformers(hf_model_dir):
    name, folder = hf_model_dir
    ids = random_ids(TINY_SHAPES[name]["vocab_size"], (3, 37))
    ref = hf_logits(load_hf(folder), ids)
    out = flax_logits(load_pretrained(folder), ids)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_bf16_logits_within_stated_tolerance(hf_model_dir):
    """Stated bf16 tolerance: against fp32 torch logits, Flax in bf16 (weights and compute) is off
    by at most 1.5x what torch's own bf16 forward is off, and by at most 3% of the logit scale."""
    name, folder = hf_model_dir
    ids = random_ids(TINY_SHAPES[name]["vocab_size"], (3, 37))
    ref = hf_logits(load_hf(folder), ids)
    torch_bf16_err = np.abs(hf_logits(load_hf(folder, torch.bfloat16), ids) - ref).max()
    for kw in (dict(dtype="bfloat16"), dict(dtype="float32", compute_dtype="bfloat16")):
        model = load_pretrained(folder, **kw)
        assert model.dtype == jnp.bfloat16
        out = model(jnp.asarray(ids))
        assert out.dtype == jnp.bfloat16
        err = np.abs(np.asarray(out.astype(jnp.float32)) - ref).max()
        assert err <= 1.5 * torch_bf16_err + 1e-3, (kw, err, torch_bf16_err)
        assert err <= 0.03 * np.abs(ref).max(), (kw, err)


def left_pad(rows, pad_id=0):
    """list of 1-D int arrays -> (ids [B, T], mask [B, T]) left-padded to the longest row."""
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), pad_id, np.int32)
    mask = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return ids, mask


def test_left_padded_batch_equals_unpadded_rows(hf_model_dir):
    name, folder = hf_model_dir
    vocab = TINY_SHAPES[name]["vocab_size"]
    model = load_pretrained(folder)
    rows = [random_ids(vocab, (n,), seed=n) for n in (5, 17, 1, 11)]
    ids, mask = left_pad(rows, pad_id=7)
    batched = flax_logits(model, ids, attention_mask=jnp.asarray(mask))
    assert np.isfinite(batched).all()  # padded query rows attend to nothing, yet stay finite
    for i, r in enumerate(rows):
        alone = flax_logits(model, r[None])[0]
        np.testing.assert_allclose(batched[i, -len(r):], alone, atol=1e-5, rtol=0)
    # and against transformers' own masked forward
    ref = hf_logits(load_hf(folder), ids, mask)
    np.testing.assert_allclose(batched[mask == 1], ref[mask == 1], atol=1e-4, rtol=0)


def test_cache_decode_equals_full_forward(hf_model_dir):
    """Prefill a left-padded batch into the cache, then feed tokens one at a time: every step's
    logits equal the full forward over the whole sequence."""
    name, folder = hf_model_dir
    vocab = TINY_SHAPES[name]["vocab_size"]
    model = load_pretrained(folder)
    prompts = [random_ids(vocab, (n,), seed=10 + n) for n in (6, 3, 9)]
    ids, mask = left_pad(prompts)
    steps = 5
    extra = random_ids(vocab, (len(prompts), steps), seed=99)

    full_ids = np.concatenate([ids, extra], axis=1)
    full_mask = np.concatenate([mask, np.ones_like(extra)], axis=1)
    full = flax_logits(model, full_ids, attention_mask=jnp.asarray(full_mask))

    step = nnx.jit(lambda m, x, c, am: m(x, attention_mask=am, cache=c))
    cache = KVCache.init(model.config, len(prompts), ids.shape[1] + steps + 3)
    logits, cache = step(model, jnp.asarray(ids), cache, jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(logits)[mask == 1], full[:, :ids.shape[1]][mask == 1],
                               atol=1e-5, rtol=0)
    for t in range(steps):
        logits, cache = step(model, jnp.asarray(extra[:, t:t + 1]), cache,
                             jnp.ones((len(prompts), 1), jnp.int32))
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, ids.shape[1] + t],
                                   atol=1e-5, rtol=0)
    assert int(cache.index) == ids.shape[1] + steps
    np.testing.assert_array_equal(np.asarray(cache.pos), mask.sum(1) + steps)


def test_last_only_prefill_gives_the_last_slot_and_the_same_cache(hf_model_dir):
    """hidden_states(last_only=True), the sampler's prefill, equals the last slot of the full
    prefill, and writes the same keys and values (the last layer's too) into the cache."""
    name, folder = hf_model_dir
    model = load_pretrained(folder)
    ids, mask = left_pad([random_ids(TINY_SHAPES[name]["vocab_size"], (n,), seed=n)
                          for n in (7, 2, 5)])

    @functools.partial(nnx.jit, static_argnums=3)
    def prefill(m, ids, mask, last_only):
        cache = KVCache.init(m.config, ids.shape[0], ids.shape[1] + 4)
        return m.hidden_states(ids, attention_mask=mask, cache=cache, last_only=last_only)

    full, full_cache = prefill(model, jnp.asarray(ids), jnp.asarray(mask), False)
    last, last_cache = prefill(model, jnp.asarray(ids), jnp.asarray(mask), True)
    assert last.shape == (len(ids), 1, full.shape[-1])
    np.testing.assert_allclose(np.asarray(last), np.asarray(full[:, -1:]), atol=1e-5, rtol=0)
    for a, b in zip(jax.tree.leaves(full_cache), jax.tree.leaves(last_cache)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)


def test_explicit_positions_override_the_default():
    cfg = DecoderConfig(**{k: v for k, v in TINY_SHAPES["tied_gqa2"].items()})
    model = load_or_init(cfg)
    ids = random_ids(cfg.vocab_size, (1, 6))
    default = flax_logits(model, ids)
    same = flax_logits(model, ids, positions=jnp.arange(6)[None])
    uniform = flax_logits(model, ids, positions=jnp.arange(6)[None] + 3)
    gapped = flax_logits(model, ids, positions=jnp.asarray([[0, 1, 2, 10, 11, 12]]))
    np.testing.assert_allclose(default, same, atol=1e-6)
    np.testing.assert_allclose(default, uniform, atol=1e-5)  # RoPE sees relative distances only
    assert np.abs(default[:, 3:] - gapped[:, 3:]).max() > 1e-4  # float noise is ~1e-7
    np.testing.assert_allclose(default[:, :3], gapped[:, :3], atol=1e-6)  # causal: past unchanged


def load_or_init(cfg):
    from hgpo_jax.models import CausalLM
    return CausalLM(cfg, rngs=nnx.Rngs(3))


# ------------------------------------------------------------------------------------- export
def hf_state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_export_round_trip_is_bit_identical(hf_model_dir, tmp_path):
    name, folder = hf_model_dir
    original = load_hf(folder)
    out = save_pretrained(load_pretrained(folder), tmp_path / "export")
    reloaded = load_hf(out)
    a, b = hf_state(original), hf_state(reloaded)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    ids = random_ids(TINY_SHAPES[name]["vocab_size"], (2, 13))
    np.testing.assert_array_equal(hf_logits(original, ids), hf_logits(reloaded, ids))
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["tie_word_embeddings"] == TINY_SHAPES[name]["tie_word_embeddings"]
    # a tied model stores no lm_head tensor, exactly like HF
    names = SafetensorsFile(os.path.join(out, "model.safetensors")).keys()
    assert ("lm_head.weight" in names) != TINY_SHAPES[name]["tie_word_embeddings"]
    assert not [f for f in os.listdir(tmp_path) if f != "export"]  # no temporary folder left


def test_export_bf16_rounds_like_torch(tmp_path):
    folder = tmp_path / "hf"
    original = build_hf_model(TINY_SHAPES["untied_gqa1"], folder)
    out = save_pretrained(load_pretrained(folder), tmp_path / "bf16", dtype="bfloat16")
    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "bfloat16"
    reloaded = load_hf(out, dtype=torch.bfloat16)
    for k, v in hf_state(original).items():
        assert torch.equal(v.to(torch.bfloat16), reloaded.state_dict()[k]), k


def test_sharded_export_loads_in_transformers_and_back(tmp_path):
    folder = tmp_path / "hf"
    original = build_hf_model(TINY_SHAPES["tied_gqa2_odd3l"], folder)
    model = load_pretrained(folder)
    out = save_pretrained(model, tmp_path / "sharded", max_shard_size="60KB")
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all(os.path.isfile(os.path.join(out, s)) for s in shards)
    for s in shards:  # no shard exceeds the limit unless it holds a single larger tensor
        f = SafetensorsFile(os.path.join(out, s))
        size = sum(int(np.prod(f.shape(k))) * 4 for k in f.keys())
        assert size <= 60_000 or len(f.keys()) == 1
    ids = random_ids(211, (2, 9))
    np.testing.assert_array_equal(hf_logits(original, ids), hf_logits(load_hf(out), ids))
    np.testing.assert_array_equal(flax_logits(load_pretrained(out), ids), flax_logits(model, ids))


def test_transformers_sharded_and_bf16_checkpoints_load(tmp_path):
    shape = TINY_SHAPES["untied_gqa6_odd"]
    original = build_hf_model(shape, tmp_path / "sharded", max_shard_size="20KB")
    assert os.path.isfile(tmp_path / "sharded" / "model.safetensors.index.json")
    ids = random_ids(shape["vocab_size"], (2, 11))
    np.testing.assert_allclose(flax_logits(load_pretrained(tmp_path / "sharded"), ids),
                               hf_logits(original, ids), atol=1e-4, rtol=0)

    original.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = load_pretrained(tmp_path / "bf16", dtype="float32")
    # weights are the bf16 values, upcast exactly
    emb = np.asarray(model.model.embed_tokens.embedding[...])
    ref = original.model.embed_tokens.weight.float().detach().numpy()
    np.testing.assert_array_equal(emb, ref)
    model16 = load_pretrained(tmp_path / "bf16", dtype="bfloat16")
    assert model16.model.layers[0].mlp.up_proj.kernel[...].dtype == jnp.bfloat16


def test_export_into_an_existing_empty_folder(tmp_path):
    """As transformers' save_pretrained: an existing empty folder (tempfile.mkdtemp()) is used; a
    non-empty one still needs overwrite=True; a file path is refused."""
    import tempfile

    folder = tmp_path / "hf"
    build_hf_model(TINY_SHAPES["tied_gqa2"], folder)
    model = load_pretrained(folder)
    empty = tempfile.mkdtemp(dir=tmp_path)
    assert save_pretrained(model, empty) == empty and "config.json" in os.listdir(empty)
    with pytest.raises(FileExistsError, match="not empty; pass overwrite=True"):
        save_pretrained(model, empty)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        save_pretrained(model, tmp_path / "a_file")


def test_export_overwrite_is_atomic(tmp_path, monkeypatch):
    folder = tmp_path / "hf"
    build_hf_model(TINY_SHAPES["tied_gqa2"], folder)
    model = load_pretrained(folder)
    out = tmp_path / "out"
    save_pretrained(model, out)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_pretrained(model, out)
    before = {f: open(out / f, "rb").read() for f in os.listdir(out)}

    import hgpo_jax.models.hf_io as hf_io
    calls = []

    def failing_write(path, specs, produce, metadata=None):
        calls.append(path)
        produce(specs[0][0])
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(hf_io, "write_safetensors", failing_write)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(model, out, overwrite=True)
    assert calls
    assert {f: open(out / f, "rb").read() for f in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["hf", "out"]  # temporary folder cleaned up


# ------------------------------------------------------------------------------------- sharding
def test_load_into_mesh_shards_weights_and_keeps_logits():
    assert len(jax.devices()) == 8, "conftest asks XLA for 8 host devices"
    shape = TINY_SHAPES["untied_gqa1"]  # 4 kv heads: k/v split over tensor=2
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        build_hf_model(shape, d)
        mesh = make_mesh(data=2, fsdp=2, tensor=2)
        sharded = load_pretrained(d, mesh=mesh)
        plain = load_pretrained(d)
    q = sharded.model.layers[0].self_attn.q_proj.kernel[...]
    assert q.sharding.spec == P("fsdp", "tensor")
    assert q.addressable_shards[0].data.shape == (shape["hidden_size"] // 2,
                                                  shape["hidden_size"] // 2)
    assert sharded.model.embed_tokens.embedding[...].sharding.spec == P("tensor", "fsdp")
    assert sharded.model.norm.scale[...].sharding.spec == P()
    for fpath, var in nnx.to_flat_state(nnx.state(sharded, nnx.Param)):
        assert var[...].sharding.mesh.shape == mesh.shape, fpath
    ids = random_ids(shape["vocab_size"], (2, 8))
    np.testing.assert_allclose(flax_logits(sharded, ids), flax_logits(plain, ids), atol=1e-5)


def test_partition_rules_cover_every_parameter_and_fit_the_mesh():
    cfg = DecoderConfig(**TINY_SHAPES["untied_gqa6_odd"])
    from hgpo_jax.models.hf_io import abstract_model
    _, flat = abstract_model(cfg)
    for fpath, _ in flat:
        param_partition_spec(".".join(map(str, fpath)))  # raises if a rule is missing
    mesh = make_mesh(data=1, fsdp=2, tensor=4)
    # 1 kv head * 6 = 6 columns cannot be split 4 ways: replicated on that axis instead
    assert fit_spec(P("fsdp", "tensor"), (36, 6), mesh) == P("fsdp")
    assert fit_spec(P("fsdp", "tensor"), (36, 36), mesh) == P("fsdp", "tensor")
    assert fit_spec(P("tensor", "fsdp"), (8, 36), mesh) == P("tensor", "fsdp")
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(data=2, fsdp=2, tensor=4)
    assert make_mesh(data=-1, tensor=2).shape == {"data": 4, "fsdp": 1, "tensor": 2}


# ------------------------------------------------------------------------------------- config
def test_config_reads_both_hf_layouts():
    old = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
           "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
           "num_attention_heads": 12, "num_key_value_heads": 2, "rope_theta": 1000000.0,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
           "rope_scaling": None, "use_sliding_window": False, "sliding_window": 32768,
           "max_window_layers": 21, "eos_token_id": 151645, "bos_token_id": 151643}
    cfg = DecoderConfig.from_hf_dict(old)
    assert cfg == DecoderConfig(eos_token_id=151645, bos_token_id=151643)  # the 1.5B defaults
    assert cfg.head_size == 128 and cfg.rope_theta == 1e6
    new = cfg.to_hf_dict("bfloat16")
    assert new["rope_parameters"] == {"rope_theta": 1e6, "rope_type": "default"}
    assert new["dtype"] == "bfloat16" and "torch_dtype" not in new
    assert new["max_window_layers"] == 21  # unknown keys survive the round trip
    assert DecoderConfig.from_hf_dict(new) == cfg
    hashed = DecoderConfig.from_hf_dict({**old, "eos_token_id": [1, 2]})
    assert hash(hashed) and hashed.eos_token_ids == [1, 2]


# ------------------------------------------------------------------------------------- bad input
@pytest.fixture()
def good_dir(tmp_path):
    folder = tmp_path / "good"
    build_hf_model(TINY_SHAPES["untied_gqa1"], folder)
    return folder


def edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))


def test_missing_folder_or_files_are_named(tmp_path, good_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path / "empty")
    os.remove(good_dir / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="expected model.safetensors"):
        load_pretrained(good_dir)


def test_other_architecture_and_unsupported_options_are_refused(good_dir):
    edit_config(good_dir, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        load_pretrained(good_dir)
    edit_config(good_dir, model_type="qwen2", rope_scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="RoPE of type 'yarn'"):
        load_pretrained(good_dir)
    edit_config(good_dir, rope_scaling=None, num_key_value_heads=3)
    with pytest.raises(ConfigError, match="multiple of num_key_value_heads"):
        load_pretrained(good_dir)
    (good_dir / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_pretrained(good_dir)


def test_wrong_shape_names_tensor_and_file(good_dir):
    edit_config(good_dir, intermediate_size=80)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor "
                                              r"'model\.layers\.0\.mlp\.\w+_proj\.weight' has shape"):
        load_pretrained(good_dir)


def rewrite_without(path, drop):
    f = SafetensorsFile(path)
    arrays = {k: np.array(f.get(k)) for k in f.keys() if k != drop}
    del f
    write_safetensors(path, [(k, a.shape, a.dtype) for k, a in arrays.items()], arrays.__getitem__)


def test_missing_tensor_is_named(good_dir):
    rewrite_without(str(good_dir / "model.safetensors"), "model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.self_attn\.k_proj\.bias' is missing"):
        load_pretrained(good_dir)


def test_truncated_or_corrupt_safetensors_are_refused(good_dir):
    path = good_dir / "model.safetensors"
    named = re.escape(str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SafetensorsError, match=f"{named}: file truncated"):
        load_pretrained(good_dir)
    path.write_bytes(b"\x05\x00")
    with pytest.raises(SafetensorsError, match=f"{named}: file is too short"):
        load_pretrained(good_dir)
    path.write_bytes((10).to_bytes(8, "little") + b"not json!!" + b"\0" * 16)
    with pytest.raises(SafetensorsError, match=f"{named}: header is not valid JSON"):
        load_pretrained(good_dir)


def _st_header(header: dict, data: bytes = b"") -> bytes:
    blob = json.dumps(header).encode()
    return len(blob).to_bytes(8, "little") + blob + data


F32_1 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
BAD_FILES = {  # name -> (file bytes, None for no file, a folder for "dir"), expected message
    "missing": (None, "no such file"),
    "folder": ("dir", "is a folder"),
    "empty": (b"", "file is too short"),
    "too short": (b"\x05\x00\x00", "file is too short"),
    "header length past the end": ((2**40).to_bytes(8, "little") + b"{}", "corrupt header length"),
    "garbage header": ((8).to_bytes(8, "little") + b"\xff\xfe garbage",
                       "header is not valid JSON"),
    "header not an object": (_st_header([1, 2]), "header is not valid JSON"),
    "unknown dtype": (_st_header({"a": dict(F32_1, dtype="F99")}, b"\0" * 4),
                      "unknown dtype.*F99"),
    "entry without offsets": (_st_header({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
                              "lacks a field.*data_offsets"),
    "size disagrees with shape": (_st_header({"a": dict(F32_1, shape=[2])}, b"\0" * 4),
                                  "shape, dtype and byte size disagree"),
    "overlapping tensors": (_st_header({"a": F32_1, "b": F32_1}, b"\0" * 4),
                            "corrupt tensor offsets"),
    "data cut short": (_st_header({"a": dict(F32_1, shape=[2], data_offsets=[0, 8])}, b"\0" * 4),
                       "file truncated"),
    "trailing bytes": (_st_header({"a": F32_1}, b"\0" * 5), "file truncated"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_safetensors_files_raise_naming_the_path(tmp_path, case):
    data, message = BAD_FILES[case]
    path = tmp_path / "model.safetensors"
    if data == "dir":
        path.mkdir()
    elif data is not None:
        path.write_bytes(data)
    with pytest.raises(SafetensorsError, match=re.escape(str(path)) + ".*" + message):
        SafetensorsFile(path)


def test_unreadable_dtype_and_unknown_name(tmp_path):
    path = tmp_path / "fp8.safetensors"  # valid safetensors, but NumPy has no float8 here
    path.write_bytes(_st_header({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}},
                                b"\0\0"))
    f = SafetensorsFile(path)
    assert f.keys() == ["a"] and f.shape("a") == (2,)
    with pytest.raises(SafetensorsError, match=re.escape(str(path)) + r".*'a' \(F8_E4M3\)"):
        f.get("a")
    with pytest.raises(KeyError, match="'b' not in"):
        f.get("b")


def _mixed_tensors() -> dict:
    rng = np.random.default_rng(0)
    return {"model.embed_tokens.weight": rng.normal(size=(7, 5)).astype(jnp.bfloat16),
            "model.norm.weight": rng.normal(size=5).astype(np.float32),
            "steps": np.arange(4, dtype=np.int64), "mask": np.array([True, False, True]),
            "scalar": np.full((), 3.5, np.float16), "empty": np.zeros((0, 3), np.float32),
            "half": rng.normal(size=(2, 2)).astype(np.float16)}


def test_written_files_are_the_library_format(tmp_path):
    """Files written here are what safetensors' own writer makes, byte for byte, and are read
    back exactly by the library (NumPy and torch back ends); the library's files are read here."""
    from safetensors import safe_open
    from safetensors.numpy import save_file
    tensors = _mixed_tensors()
    save_file(tensors, tmp_path / "lib.safetensors", metadata={"format": "pt"})
    lib = SafetensorsFile(tmp_path / "lib.safetensors")
    assert lib.metadata == {"format": "pt"} and sorted(lib.keys()) == sorted(tensors)
    for k, v in tensors.items():
        got = lib.get(k)
        assert got.dtype == v.dtype and got.shape == v.shape and lib.shape(k) == v.shape, k
        np.testing.assert_array_equal(got, v)
    # in the library's tensor order (it sorts by dtype size, then name) the files are identical
    ours = tmp_path / "ours.safetensors"
    nbytes = write_safetensors(ours, [(k, tensors[k].shape, tensors[k].dtype) for k in lib.keys()],
                               tensors.__getitem__)
    assert nbytes == sum(v.nbytes for v in tensors.values())
    assert ours.read_bytes() == (tmp_path / "lib.safetensors").read_bytes()
    # in any other order too, the library reads them exactly (bf16 without and with torch)
    write_safetensors(ours, [(k, v.shape, v.dtype) for k, v in reversed(tensors.items())],
                      tensors.__getitem__, metadata={"format": "pt", "by": "hgpo-jax"})
    with safe_open(ours, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "by": "hgpo-jax"}
        assert f.offset_keys() == list(reversed(tensors))
        for k, v in tensors.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape, k
            np.testing.assert_array_equal(got, v)
    with safe_open(ours, framework="pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
        assert emb.dtype == torch.bfloat16
        assert torch.equal(emb.float(), torch.from_numpy(
            tensors["model.embed_tokens.weight"].astype(np.float32)))


def test_write_produces_one_tensor_at_a_time(tmp_path):
    import weakref
    tensors = {f"t{i}": np.full((16, 8), i, np.float32) for i in range(4)}
    previous = []

    def produce(name):  # the previous tensor is written and released before the next is made
        assert all(ref() is None for ref in previous), name
        arr = tensors[name].copy()
        previous.append(weakref.ref(arr))
        return arr

    write_safetensors(tmp_path / "s.safetensors", [(k, (16, 8), np.float32) for k in tensors],
                      produce)
    f = SafetensorsFile(tmp_path / "s.safetensors")
    assert f.keys() == list(tensors)
    for k, v in tensors.items():
        np.testing.assert_array_equal(f.get(k), v)
    with pytest.raises(ValueError, match="declared"):
        write_safetensors(tmp_path / "w.safetensors", [("a", (2,), np.float32)],
                          lambda _: np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="cannot be stored"):
        write_safetensors(tmp_path / "o.safetensors", [("a", (1,), object)], lambda _: None)


def test_sharded_index_naming_a_missing_shard(tmp_path):
    build_hf_model(TINY_SHAPES["tied_gqa2"], tmp_path, max_shard_size="20KB")
    index = json.load(open(tmp_path / "model.safetensors.index.json"))
    os.remove(tmp_path / sorted(set(index["weight_map"].values()))[-1])
    with pytest.raises(FileNotFoundError, match="names shard"):
        load_pretrained(tmp_path)


def test_unused_tensors_warn(good_dir):
    path = str(good_dir / "model.safetensors")
    f = SafetensorsFile(path)
    arrays = {k: np.array(f.get(k)) for k in f.keys()}
    arrays["model.vision_tower.weight"] = np.zeros((2, 2), np.float32)
    del f
    write_safetensors(path, [(k, a.shape, a.dtype) for k, a in arrays.items()], arrays.__getitem__)
    with pytest.warns(UserWarning, match="vision_tower"):
        load_pretrained(good_dir)


def test_flax_hf_name_mapping():
    assert flax_path_to_hf(("model", "layers", 3, "self_attn", "q_proj", "kernel")) == \
        ("model.layers.3.self_attn.q_proj.weight", True)
    assert flax_path_to_hf(("model", "embed_tokens", "embedding")) == ("model.embed_tokens.weight", False)
    assert flax_path_to_hf(("model", "norm", "scale")) == ("model.norm.weight", False)
    assert flax_path_to_hf(("model", "layers", 0, "self_attn", "v_proj", "bias")) == \
        ("model.layers.0.self_attn.v_proj.bias", False)
