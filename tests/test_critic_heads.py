"""A critic of several value heads (`CriticModel(num_heads=H)`): values [..., H], the loss as the
sum of each head's clipped value loss, the Hugging Face round trip with num_labels=H
(transformers' Qwen2ForTokenClassification as the reference), the critic rows' head axis, and an
update step; with one head everything is as it was."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hf_models import TINY_SHAPES, build_hf_model
from transformers import AutoModelForTokenClassification
from transformers import Qwen2Config as HFQwen2Config
from transformers import Qwen2ForTokenClassification

from hgpo_jax.models import DecoderConfig, CriticModel, CausalLM, load_pretrained, save_pretrained
from hgpo_jax.models.hf_io import CheckpointError
from hgpo_jax.models.critic import critic_from_policy
from hgpo_jax.rl.batching import CriticRows, gather_rows, pack_rows
from hgpo_jax.rl.critic import critic_value_loss, make_value_fn, token_values, value_loss, window_masks

SHAPE = TINY_SHAPES["tied_gqa2"]
WINDOW = 6


def tiny_rows(seed=0, window=WINDOW, rows=6):
    """Right-padded rows with responses of 1..window tokens and one inert padding row."""
    rng = np.random.RandomState(seed)
    lengths = [window, 1] + list(rng.randint(1, window + 1, rows - 3))
    prompts = [list(rng.randint(1, 50, rng.randint(2, 6))) for _ in lengths]
    responses = [list(rng.randint(1, 50, n)) for n in lengths]
    return pack_rows(prompts, responses, np.zeros(len(lengths)), row_multiple=rows, length_multiple=8)


def test_three_heads_give_values_per_head_and_head_0_is_a_one_head_critic():
    one = CriticModel(DecoderConfig(**SHAPE), rngs=nnx.Rngs(1))
    three = CriticModel(DecoderConfig(**SHAPE), rngs=nnx.Rngs(2), num_heads=3)
    assert three.score.kernel.shape == (SHAPE["hidden_size"], 3) and three.score.bias.shape == (3,)
    nnx.update(three.model, nnx.state(one.model))          # the same backbone
    kernel = np.asarray(three.score.kernel[...]).copy()
    kernel[:, 0] = np.asarray(one.score.kernel[...])[:, 0]
    three.score.kernel[...] = jnp.asarray(kernel)
    three.score.bias[...] = jnp.asarray([0.3, -1.0, 2.0])
    one.score.bias[...] = jnp.asarray([0.3])

    b = tiny_rows()
    ids, att, rm = (jnp.asarray(x) for x in (b.input_ids, b.attention_mask, b.response_mask))
    hidden, _ = one.hidden_states(ids, attention_mask=att)             # the backbone both share
    v1, v3 = np.asarray(one.values(hidden)), np.asarray(three.values(hidden))
    assert v1.shape == ids.shape and v3.shape == ids.shape + (3,) and v3.dtype == np.float32
    np.testing.assert_allclose(v3[..., 0], v1, atol=1e-6)
    assert not np.allclose(v3[..., 1], v1, atol=1e-3)

    t3 = np.asarray(token_values(three, ids, att, rm, WINDOW))
    assert t3.shape == (6, WINDOW, 3)
    value_mask = np.asarray(window_masks(rm, WINDOW)[1])
    assert (t3[value_mask == 0] == 0).all() and (t3[value_mask > 0] != 0).all()
    for i in range(5):  # V_0 reads the last prompt token's values, every head
        start = int(np.flatnonzero(b.response_mask[i])[0])
        np.testing.assert_allclose(t3[i, 0], v3[i, start - 1], atol=1e-6)


def test_critic_from_policy_with_one_head_draws_todays_head_and_with_three_a_wider_one():
    policy = CausalLM(DecoderConfig(**SHAPE), rngs=nnx.Rngs(0))
    D = SHAPE["hidden_size"]
    one, default = critic_from_policy(policy, seed=5, num_heads=1), critic_from_policy(policy, seed=5)
    today = (0.02 * np.asarray(jax.random.normal(jax.random.PRNGKey(5), (D, 1), jnp.float32)))
    np.testing.assert_array_equal(np.asarray(one.score.kernel[...]), today.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(default.score.kernel[...]), np.asarray(one.score.kernel[...]))
    assert one.num_heads == 1
    three = critic_from_policy(policy, seed=5, num_heads=3)
    assert three.num_heads == 3 and three.score.kernel.shape == (D, 3)
    assert (np.asarray(three.score.bias[...]) == 0).all()
    assert np.ptp(np.asarray(three.score.kernel[...]), axis=0).min() > 0   # the heads differ
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="num_heads >= 1"):
            CriticModel(DecoderConfig(**SHAPE), num_heads=bad)


def test_the_loss_of_h_heads_is_the_sum_of_each_heads_value_loss():
    rng = np.random.RandomState(0)
    S, W, H, clip = 5, 6, 3, 0.5
    vpred, old, ret = (jnp.asarray(rng.randn(S, W, H).astype(np.float32) * s) for s in (2, 2, 4))
    masks = (rng.rand(S, W, H) < 0.7).astype(np.float32)
    masks[..., 2] = 0.0                                              # a head with no positions here
    loss, m = critic_value_loss(vpred, old, ret, jnp.asarray(masks), clip)
    heads = [value_loss(vpred[..., h], old[..., h], ret[..., h], jnp.asarray(masks[..., h]), clip)
             for h in range(H)]
    np.testing.assert_allclose(float(loss), sum(float(l) for l, _ in heads), rtol=1e-6)
    np.testing.assert_allclose(float(m["vf_loss"]), float(loss), rtol=1e-6)
    for h, (head_loss, head_m) in enumerate(heads):
        np.testing.assert_allclose(float(m[f"vf_loss/head{h}"]), float(head_loss), rtol=1e-6)
        np.testing.assert_allclose(float(m[f"vf_clipfrac/head{h}"]), float(head_m["vf_clipfrac"]), rtol=1e-6)
    assert float(heads[2][0]) == 0.0 and float(m["vf_loss/head2"]) == 0.0   # an empty mask adds 0
    # the gradient reaches each head through its own mask only (none for the empty head)
    grad = np.asarray(jax.grad(lambda v: critic_value_loss(v, old, ret, jnp.asarray(masks), clip)[0])(vpred))
    assert (grad[masks == 0] == 0).all() and (grad[..., 2] == 0).all()

    # one [S, W] mask serves every head
    shared = masks[..., 0]
    loss_shared, _ = critic_value_loss(vpred, old, ret, jnp.asarray(shared), clip)
    loss_tiled, _ = critic_value_loss(vpred, old, ret, jnp.asarray(np.repeat(shared[..., None], H, -1)), clip)
    np.testing.assert_allclose(float(loss_shared), float(loss_tiled), rtol=1e-6)
    # one head: value_loss as it is, today's metric names alone
    loss1, m1 = critic_value_loss(vpred[..., 0], old[..., 0], ret[..., 0], jnp.asarray(shared), clip)
    want1, want_m1 = value_loss(vpred[..., 0], old[..., 0], ret[..., 0], jnp.asarray(shared), clip)
    assert float(loss1) == float(want1)
    assert sorted(m1) == sorted(want_m1) == ["vf_clipfrac", "vf_loss", "vpred_mean"]
    with pytest.raises(ValueError, match="does not fit values of shape"):
        critic_value_loss(vpred, old, ret, jnp.asarray(masks[..., :2]), clip)
    with pytest.raises(ValueError, match="must have one shape"):
        critic_value_loss(vpred, old[..., 0], ret, jnp.asarray(masks), clip)


def _hf_inputs():
    ids = np.random.RandomState(0).randint(0, SHAPE["vocab_size"], (2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    return ids, mask


def _hf_values(model, ids, mask):
    with torch.no_grad():
        return model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def test_hf_round_trip_with_three_labels(tmp_path):
    """transformers' Qwen2ForTokenClassification(num_labels=3) loads as a 3-head critic with its
    logits as values; our 3-head critic exports with num_labels=3 and transformers reads it back;
    it loads back with its 3 heads, and a head count that disagrees is an error."""
    ids, mask = _hf_inputs()
    torch.manual_seed(0)
    hf = Qwen2ForTokenClassification(HFQwen2Config(**SHAPE, num_labels=3)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.08)
    hf.save_pretrained(tmp_path / "hf3")
    ours = load_pretrained(tmp_path / "hf3", critic=True)
    assert isinstance(ours, CriticModel) and ours.num_heads == 3
    values = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    m3 = mask[..., None]
    np.testing.assert_allclose(values * m3, _hf_values(hf, ids, mask) * m3, atol=2e-5)

    save_pretrained(ours, tmp_path / "ours3")
    cfg = json.loads((tmp_path / "ours3" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForTokenClassification"]
    assert cfg["num_labels"] == 3 and len(cfg["id2label"]) == len(cfg["label2id"]) == 3
    again_hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "ours3", dtype=torch.float32).eval()
    assert again_hf.config.num_labels == 3
    np.testing.assert_allclose(_hf_values(again_hf, ids, mask) * m3, values * m3, atol=2e-5)
    again = load_pretrained(tmp_path / "ours3", critic=True, seed=99, num_heads=3)
    np.testing.assert_array_equal(np.asarray(again.score.kernel[...]), np.asarray(ours.score.kernel[...]))
    with pytest.raises(CheckpointError, match="has 3 value heads, not the 1 asked for"):
        load_pretrained(tmp_path / "ours3", critic=True, num_heads=1)

    # a causal LM's folder starts new heads, as many as asked for; exported with one label
    build_hf_model(SHAPE, tmp_path / "lm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh = load_pretrained(tmp_path / "lm", critic=True, num_heads=3)
    assert fresh.score.kernel.shape == (SHAPE["hidden_size"], 3)
    save_pretrained(load_pretrained(tmp_path / "lm", critic=True), tmp_path / "one")
    cfg1 = json.loads((tmp_path / "one" / "config.json").read_text())
    assert cfg1["num_labels"] == 1 and cfg1["id2label"] == {"0": "LABEL_0"}
    # a config.json whose labels disagree with the head it holds
    cfg["num_labels"], cfg["id2label"] = 2, {"0": "LABEL_0", "1": "LABEL_1"}
    (tmp_path / "ours3" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="declares 2 labels but score.weight holds 3"):
        load_pretrained(tmp_path / "ours3", critic=True)


def test_critic_rows_spec_and_gather_with_heads():
    assert [x.shape for x in jax.tree.leaves(CriticRows.spec(2, 3))] == [(2, 3)] * 5
    one = CriticRows.spec(2, 8, window=5)
    assert one.values.shape == one.returns.shape == (2, 5) and one.input_ids.shape == (2, 8)
    assert CriticRows.spec(2, 8, window=5, num_heads=1) == one
    three = CriticRows.spec(2, 8, window=5, num_heads=3)
    assert three.values.shape == three.returns.shape == (2, 5, 3)
    assert three.input_ids.shape == three.response_mask.shape == (2, 8)
    assert CriticRows.spec(2, 3, num_heads=3).values.shape == (2, 3, 3)
    with pytest.raises(ValueError, match="num_heads >= 1"):
        CriticRows.spec(2, 8, window=5, num_heads=0)

    b = tiny_rows()
    S = b.input_ids.shape[0]
    values = np.arange(S * WINDOW * 3, dtype=np.float32).reshape(S, WINDOW, 3)
    rows = CriticRows(input_ids=b.input_ids, attention_mask=b.attention_mask,
                      response_mask=b.response_mask, values=values, returns=values + 0.5)
    got = gather_rows(rows, np.array([3, -1, 0]))
    assert got.values.shape == got.returns.shape == (3, WINDOW, 3)
    np.testing.assert_array_equal(got.values[0], values[3])
    np.testing.assert_array_equal(got.returns[2], values[0] + 0.5)
    assert (got.response_mask[1] == 0).all() and (got.attention_mask[1] == 0).all()  # inert


def test_a_three_head_critic_built_on_a_mesh_lowers_each_heads_loss(tmp_path):
    """`Critic.build(num_heads=3)` on a 2-device mesh: values [S, W, 3], and updates of two
    micro-batches lower every head's loss (`critic/vf_loss` their sum); a run's checkpoint tells
    how many heads its critic has (`rl.algorithms.saved_state_signature`, from its metadata)."""
    from hgpo_jax.checkpoint import Checkpointer
    from hgpo_jax.config import load_config
    from hgpo_jax.models import make_mesh
    from hgpo_jax.rl.critic import Critic
    from hgpo_jax.rl.update import on_mesh
    from hgpo_jax.rl.algorithms import saved_state_signature

    cfg = load_config("tiny_cpu_ppo", [f"rollout.max_new_tokens={WINDOW}", "critic.lr=1e-2"])
    mesh = make_mesh(2, 1, 1)
    policy = CausalLM(DecoderConfig(**SHAPE), rngs=nnx.Rngs(0), batch_mesh=mesh)
    critic, state = Critic.build(cfg, policy, mesh, num_micro=2, seed=3, num_heads=3)
    assert critic.num_heads == 3
    b = tiny_rows(rows=8)
    host = {"input_ids": b.input_ids, "attention_mask": b.attention_mask, "response_mask": b.response_mask}
    ids, att, rm = (on_mesh(np.asarray(x), mesh) for x in host.values())
    with pytest.raises(ValueError, match="has 3 value heads"):
        make_value_fn(critic.graphdef, WINDOW)(state.params, ids, att, rm)
    value_mask = np.asarray(window_masks(jnp.asarray(b.response_mask), WINDOW)[1])[..., None]
    returns = np.where(value_mask > 0, np.array([3.0, -2.0, 1.0]), 0.0).astype(np.float32)
    history = []
    for _ in range(3):
        values = critic.value_fn(state.params, ids, att, rm)
        assert values.shape == (8, WINDOW, 3)
        mb = on_mesh(CriticRows(**host, values=np.asarray(values), returns=returns), mesh)
        state, metrics = critic.update(state, mb)
        history.append({k: float(v) for k, v in metrics.items()})
    heads = [[m[f"critic/vf_loss/head{h}"] for m in history] for h in range(3)]
    for h in range(3):
        assert heads[h][-1] < heads[h][0]
    np.testing.assert_allclose(history[0]["critic/vf_loss"], sum(x[0] for x in heads), rtol=1e-5)
    assert 0 <= history[-1]["critic/vf_clipfrac"] <= 1

    ckpt = Checkpointer(tmp_path / "checkpoints")
    ckpt.save(1, {"params": {"w": jnp.zeros(2)}, "opt_state": {"m": jnp.zeros(2)},
                  "critic": {"params": state.params, "opt_state": state.opt_state}}, {"iteration": 1})
    ckpt.close()
    reader = Checkpointer(tmp_path / "checkpoints", read_only=True)
    try:
        assert saved_state_signature(reader.items(), reader.item_shapes) == ("critic", 3)
    finally:
        reader.close()


def test_plan_sizes_the_critic_each_algorithm_runs():
    """`Algorithm.plan_state` is the update the run compiles: HiPER's critic of three heads (a
    one-head critic's parameters and two more head columns of D + 1) on mini-batches that carry
    each head's value mask [M, W, 3]; PPO's of one head without one. `plan_state` compiles it."""
    import math

    from hgpo_jax.config import load_config
    from hgpo_jax.models import make_mesh
    from hgpo_jax.rl.algorithms import build_algorithm
    from hgpo_jax.trainers.plan import plan_state

    model_cfg = DecoderConfig(**SHAPE)
    one = nnx.state(nnx.eval_shape(lambda: CriticModel(model_cfg)), nnx.Param)
    one_count = sum(math.prod(x.shape) for x in jax.tree.leaves(one))
    for name, heads in (("tiny_cpu_hiper", 3), ("tiny_cpu_ppo", 1)):
        cfg = load_config(name, [f"rollout.max_new_tokens={WINDOW}"])
        mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
        M = cfg.train.mini_batch_size
        sp = build_algorithm(cfg, mesh, 1).plan_state(model_cfg, "einsum")
        assert sp.label == "critic" and sp.facts == {"heads": heads}
        window = (M, WINDOW) + ((heads,) if heads > 1 else ())
        assert sp.batch.values.shape == window
        if heads > 1:  # HiPER's heads are each trained at their own positions
            assert sp.batch.value_mask is not None and sp.batch.value_mask.shape == window
        else:
            assert sp.batch.value_mask is None
        got = plan_state(sp, mesh)
        assert got["critic_params"] == one_count + (heads - 1) * (SHAPE["hidden_size"] + 1)
        assert got["critic_heads"] == heads and got["critic_step_bytes"] > 0