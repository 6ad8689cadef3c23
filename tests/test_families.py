"""Model families beside Qwen2 (Qwen3, Llama): logits of right-padded batches against transformers'
on several shapes (scanned = unrolled, einsum and fused paths), exports bit for bit with the
family's model_type and architectures (sharded folders too), the critic's heads round trip as the
family's ...ForTokenClassification, the sampler's prefill paths against transformers' greedy
decoding, the registry's refusals (unsupported families, sliding windows, RoPE types, a tensor axis
that does not split the heads), the plan's parameter counts of the released sizes, and built
models of each family."""

import json
import math
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from hf_models import (FAMILY_SHAPES, HF_CLASSES, build_family_model, hf_class, hf_logits, load_hf,
                       random_model, right_padded_batch)
from hf_models import real_tokens_error as real_error

from hgpo_jax.models import (CausalLM, ConfigError, DecoderConfig, family_names, get_family,
                             load_pretrained, save_pretrained)
from hgpo_jax.models.sharding import tensor_axis_problem
from hgpo_jax.rl.sampling import Sampler, generate

LENGTHS = (37, 20, 5)  # a right-padded batch of 3 rows in 37 slots (longer than llama3's 16)


@pytest.fixture(scope="module", params=sorted(FAMILY_SHAPES))
def family_dir(request, tmp_path_factory):
    """(shape name, family, folder, transformers model) with random weights, saved."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = build_family_model(request.param, folder)
    return request.param, FAMILY_SHAPES[request.param][0], str(folder), hf


def right_padded(vocab: int, seed: int = 0):
    return right_padded_batch(vocab, LENGTHS, seed)


def real_tokens_error(ours, ref) -> float:
    return real_error(ours, ref, LENGTHS)


def test_logits_match_transformers_scanned_unrolled_and_fused(family_dir):
    name, family, folder, hf = family_dir
    ids, mask = right_padded(hf.config.vocab_size)
    ref = hf_logits(hf, ids, mask)
    unrolled = load_pretrained(folder)
    assert unrolled.config.model_type == family and unrolled.config.qk_norm == (family == "qwen3")
    out = {}
    for scan in (False, True):
        model = load_pretrained(folder, scan_layers=scan, attention="einsum")
        out[scan] = np.asarray(model(ids, attention_mask=mask))
        assert real_tokens_error(out[scan], ref) < 2e-4, (name, scan)
    assert real_tokens_error(out[True], out[False]) < 1e-5
    fused = load_pretrained(folder, scan_layers=True, attention="xla")  # right-padded fused path
    hidden, _ = fused.hidden_states(ids, attention_mask=mask, right_padded=True)
    assert real_tokens_error(fused.logits(hidden), ref) < 2e-4


def test_export_is_bit_identical_sharded_and_keeps_the_family(family_dir, tmp_path):
    name, family, folder, hf = family_dir
    model = load_pretrained(folder, scan_layers=True)
    out = save_pretrained(model, tmp_path / "out", max_shard_size="24KB")
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["model_type"] == family and cfg["architectures"] == [HF_CLASSES[family][1]]
    assert os.path.isfile(os.path.join(out, "model.safetensors.index.json"))  # sharded
    back = load_hf(out)
    assert type(back).__name__ == HF_CLASSES[family][1]
    assert back.config.head_dim == hf.config.head_dim
    assert back.config.rope_parameters == hf.config.rope_parameters
    theirs, again = hf.state_dict(), back.state_dict()
    assert set(theirs) == set(again)
    for key, tensor in theirs.items():
        assert torch.equal(tensor, again[key]), key


def test_greedy_decoding_matches_transformers_on_every_prefill_path(family_dir):
    name, family, folder, hf = family_dir
    rs = np.random.RandomState(1)
    prompts = [rs.randint(0, hf.config.vocab_size, n).tolist() for n in (5, 11, 3, 8)]
    expected = []
    with torch.no_grad():
        for p in prompts:
            seq = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              do_sample=False, max_new_tokens=10, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0)
            expected.append(seq[0, len(p):].tolist())
    sampler = Sampler()
    for scan, attention, chunk in ((False, "einsum", 0), (False, "einsum", 4), (True, "xla", -1)):
        model = load_pretrained(folder, scan_layers=scan, attention=attention)
        got = generate(model, prompts, 10, temperature=0.0, sampler=sampler, prefill_chunk=chunk)
        assert got.tokens == expected, (name, scan, attention, chunk)


def test_critic_heads_round_trip_as_the_familys_token_classifier(family_dir, tmp_path):
    name, family, folder, hf = family_dir
    critic = load_pretrained(folder, critic=True, num_heads=3, seed=1)
    out = save_pretrained(critic, tmp_path / "critic")
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == [HF_CLASSES[family][2]] and cfg["num_labels"] == 3
    assert cfg["model_type"] == family
    theirs = transformers.AutoModelForTokenClassification.from_pretrained(
        out, dtype=torch.float32).eval()
    assert type(theirs).__name__ == HF_CLASSES[family][2]
    ids, mask = right_padded(hf.config.vocab_size, seed=2)
    ours = np.asarray(critic(ids, attention_mask=mask))
    assert ours.shape == ids.shape + (3,)
    assert real_tokens_error(ours, hf_logits(theirs, ids, mask)) < 2e-4
    again = load_pretrained(out, critic=True)
    assert again.num_heads == 3
    np.testing.assert_array_equal(np.asarray(again(ids, attention_mask=mask)), ours)


# ------------------------------------------------------------------------------------ the registry
def test_registry_names_the_families_and_what_they_differ_in():
    assert family_names() == ("qwen2", "qwen3", "llama")
    qwen2, qwen3, llama = (get_family(t) for t in family_names())
    assert (qwen2.default_qkv_bias, qwen3.default_qkv_bias, llama.default_qkv_bias) == (True, False, False)
    assert (qwen2.qk_norm, qwen3.qk_norm, llama.qk_norm) == (False, True, False)
    assert "llama3" in llama.rope_types and qwen3.rope_types == ("default",)
    assert DecoderConfig(model_type="qwen3", hidden_size=64, num_attention_heads=4).head_size == 128
    assert DecoderConfig(model_type="llama", hidden_size=64, num_attention_heads=4).head_size == 16
    for model_type in family_names():
        cfg = DecoderConfig(model_type=model_type, head_dim=128)
        assert DecoderConfig.from_hf_dict(cfg.to_hf_dict()) == cfg  # the HF dict round trip


def _write_config(folder, **config) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({}, f)
    return str(folder)


SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("model_type, arch", [("gpt2", "GPT2LMHeadModel"),
                                              ("gemma3", "Gemma3ForCausalLM"),
                                              ("qwen3_moe", "Qwen3MoeForCausalLM")])
def test_unsupported_families_are_refused_before_any_weight(tmp_path, model_type, arch):
    """No safetensors in the folder: the refusal comes from config.json alone, names the
    family and the supported ones; the run's start checks refuse it too."""
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.checks import check_model_folder

    folder = _write_config(tmp_path / model_type, model_type=model_type, architectures=[arch], **SHAPE)
    with pytest.raises(ConfigError, match=rf"model_type '{model_type}' is not supported.*qwen2, qwen3, llama"):
        load_pretrained(folder)
    with pytest.raises(ConfigError, match="qwen2, qwen3, llama"):
        check_model_folder(load_config("tiny_cpu", [f"model.path={folder}"]))


@pytest.mark.parametrize("model_type, extra, match", [
    ("qwen3", dict(use_sliding_window=True, sliding_window=64), "sliding-window"),
    ("qwen2", dict(layer_types=["full_attention", "sliding_attention"]), "sliding-window"),
    ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "'yarn'"),
    ("qwen3", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "'llama3'.*qwen3"),
    ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "needs"),
    ("llama", dict(hidden_act="gelu"), "hidden_act"),
])
def test_family_configs_it_cannot_run_are_refused(tmp_path, model_type, extra, match):
    folder = _write_config(tmp_path / "m", model_type=model_type, **SHAPE, **extra)
    with pytest.raises(ConfigError, match=match):
        load_pretrained(folder)


def test_a_tensor_axis_that_does_not_split_the_heads_is_refused(tmp_path):
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.checks import check_model_folder

    assert tensor_axis_problem(32, 8, 4) is None and tensor_axis_problem(12, 2, 4) is None
    assert tensor_axis_problem(16, 8, 1) is None
    assert "query heads" in tensor_axis_problem(12, 2, 8)
    assert "key/value heads" in tensor_axis_problem(24, 6, 4)
    folder = _write_config(tmp_path / "m", model_type="qwen3", **SHAPE)
    check_model_folder(load_config("tiny_cpu", [f"model.path={folder}", "mesh.tensor=2"]))
    with pytest.raises(ValueError, match="mesh.tensor=3 does not divide the model's 4 query heads"):
        check_model_folder(load_config("tiny_cpu", [f"model.path={folder}", "mesh.tensor=3"]))


# ------------------------------------------------------------------------ released sizes, plan
PUBLISHED = {  # parameter counts transformers gives the released configs (tied embeddings once)
    "Qwen/Qwen3-0.6B": 596_049_920, "Qwen/Qwen3-4B": 4_022_468_096,
    "Qwen/Qwen3-8B": 8_190_735_360, "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
}


def test_plan_presets_count_exactly_the_parameters_of_transformers():
    from hgpo_jax.trainers.plan import PRESETS

    assert {"Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "meta-llama/Llama-3.2-1B-Instruct"} <= set(PRESETS)
    for name, cfg in PRESETS.items():
        hf_dict = cfg.to_hf_dict()
        hf_config = transformers.AutoConfig.for_model(
            **{k: v for k, v in hf_dict.items() if k != "architectures"})
        with torch.device("meta"):
            theirs = transformers.AutoModelForCausalLM.from_config(hf_config)
        assert type(theirs).__name__ == cfg.family.causal_lm
        abstract = nnx.eval_shape(lambda cfg=cfg: CausalLM(cfg))
        ours = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
        assert ours == sum(p.numel() for p in theirs.parameters()), name
        if name in PUBLISHED:
            assert ours == PUBLISHED[name], name


# ------------------------------------------------------------------------------- built models
def test_built_models_of_each_family(tmp_path):
    from hgpo_jax.build import build_agent, build_family, model_path_folder, parse_build_spec
    from hgpo_jax.models.local import build_model, train_tokenizer

    assert parse_build_spec("build:toy-tiny@plan-execute/llama") == ("toy", "tiny")
    assert build_family("build:toy-tiny@plan-execute/llama") == "llama"
    assert build_agent("build:toy-tiny@plan-execute/llama") == "plan-execute"
    assert build_family("build:toy-tiny") == "qwen2"
    assert model_path_folder("build:toy-tiny/qwen3").endswith("toy-tiny-qwen3-v1")
    assert model_path_folder("build:toy-tiny").endswith("toy-tiny-v1")  # qwen2: the old folder
    with pytest.raises(ValueError, match="no built models of family 'gpt2'"):
        parse_build_spec("build:toy-tiny/gpt2")
    tokenizer = train_tokenizer(["press the blue button", "open the red door"] * 20, 300)
    for family in ("qwen3", "llama"):
        folder = build_model(tmp_path / family, tokenizer, "tiny", family=family)
        cfg = json.load(open(os.path.join(folder, "config.json")))
        assert cfg["model_type"] == family and cfg["architectures"] == [HF_CLASSES[family][1]]
        ids = np.asarray([tokenizer.encode("press the blue button")], np.int32)
        np.testing.assert_allclose(np.asarray(load_pretrained(folder)(ids)),
                                   hf_logits(load_hf(folder), ids), atol=2e-4, rtol=0)


def test_a_built_model_takes_the_rope_base_its_env_declares(tmp_path):
    """`BuiltModel.rope_theta` (the search env's: 1e4) replaces the family's base in config.json
    and in the forward pass (matching transformers with that config); the weights are those of
    the family's default build (the base is not a weight); a base <= 0 is refused."""
    from safetensors.numpy import load_file

    from hgpo_jax.envs.registry import get_env
    from hgpo_jax.envs.search import ROPE_THETA
    from hgpo_jax.models.local import build_model, train_tokenizer

    assert get_env("search").built_model.rope_theta == ROPE_THETA == 10_000.0
    assert get_env("toy").built_model.rope_theta is None
    tokenizer = train_tokenizer(["press the blue button", "open the red door"] * 20, 300)
    plain = build_model(tmp_path / "plain", tokenizer, "tiny")
    based = build_model(tmp_path / "based", tokenizer, "tiny", rope_theta=ROPE_THETA)
    assert json.load(open(os.path.join(plain, "config.json")))["rope_theta"] == 1_000_000.0
    assert json.load(open(os.path.join(based, "config.json")))["rope_theta"] == ROPE_THETA
    a, b = (load_file(os.path.join(f, "model.safetensors")) for f in (plain, based))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    ids = np.asarray([tokenizer.encode("press the blue button open the red door")], np.int32)
    ours = np.asarray(load_pretrained(based)(ids))
    np.testing.assert_allclose(ours, hf_logits(load_hf(based), ids), atol=2e-4, rtol=0)
    assert not np.allclose(ours, np.asarray(load_pretrained(plain)(ids)), atol=1e-5)
    with pytest.raises(ValueError, match="rope_theta must be > 0"):
        build_model(tmp_path / "bad", tokenizer, "tiny", rope_theta=0.0)


# ------------------------------------------------------------------------- a run, end to end
def toy_family_folder(tmp_path, family: str) -> str:
    """A folder holding the toy env's tokenizer and a random transformers model of `family`
    (what a user brings: a Hugging Face folder, here with a vocabulary small enough for a CPU)."""
    from hgpo_jax.build import resolve_model_path
    from hgpo_jax.models import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_path("build:toy-tiny"))
    shape = dict(FAMILY_SHAPES["qwen3_tied_gqa2" if family == "qwen3" else
                               "llama_tied_llama3rope_gqa4"][1])
    shape.update(vocab_size=len(tokenizer.hf), eos_token_id=tokenizer.end_of_turn_id,
                 max_position_embeddings=2048)
    folder = str(tmp_path / f"toy-{family}")
    random_model(lambda: hf_class(family, 1)(hf_class(family, 0)(**shape)), folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_toy_ppo_run_of_each_family_trains_and_exports(tmp_path, family):
    """`hgpo-jax train tiny_cpu_ppo` (policy and critic) on a toy-tokenizer folder of the family,
    one iteration and a second one resumed; `export` with and without --critic gives folders
    transformers' Auto classes
    load as the family's classes. The Qwen3 run starts from the folder `build:toy-tiny/qwen3`
    builds, the Llama one from a transformers-made folder."""
    from hgpo_jax.cli import main as cli_main

    path = "build:toy-tiny/qwen3" if family == "qwen3" else toy_family_folder(tmp_path, family)
    run = tmp_path / "run"
    args = ["train", "tiny_cpu_ppo", f"model.path={path}", f"train.run_dir={run}", "--no-progress"]
    assert cli_main(args + ["train.iterations=1"]) == 0
    assert cli_main(args + ["train.iterations=2", "--resume"]) == 0  # policy and critic restored
    assert [json.loads(line)["step"] for line in open(run / "metrics.jsonl")] == [1, 2]
    for flag, auto, kind in (([], transformers.AutoModelForCausalLM, 1),
                             (["--critic"], transformers.AutoModelForTokenClassification, 2)):
        out = tmp_path / f"export{kind}"
        assert cli_main(["export", str(run), str(out), *flag, "--no-progress"]) == 0
        cfg = json.load(open(out / "config.json"))
        assert cfg["model_type"] == family and cfg["architectures"] == [HF_CLASSES[family][kind]]
        loaded = auto.from_pretrained(out, dtype=torch.float32)
        assert type(loaded).__name__ == HF_CLASSES[family][kind]


def test_chat_templates_render_without_thinking_and_eos_ids_come_from_the_folder(tmp_path):
    """A template with Qwen3's thinking switch is rendered with enable_thinking=False (verl-agent's
    Qwen3 runs); generation_config.json's eos ids (Llama 3 Instruct lists three) end replies too,
    while supervised replies still end with <|im_end|>."""
    from hgpo_jax.models import load_tokenizer
    from hgpo_jax.models.local import train_tokenizer

    switch = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
              "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
              "{% endif %}{% endif %}")
    tokenizer = train_tokenizer(["go to desk 1", "open drawer 2"] * 10, 300, chat_template=switch)
    tokenizer.save_pretrained(str(tmp_path))
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [3, 7, tokenizer.end_of_turn_id]}, f)
    loaded = load_tokenizer(tmp_path)
    text = loaded.decode(loaded.chat_prompt([{"role": "user", "content": "go to desk 1"}]),
                         skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert loaded.eos_token_ids[-2:] == [3, 7] and loaded.end_of_turn_id == tokenizer.end_of_turn_id
