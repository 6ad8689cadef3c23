"""Training LoRA adapters on a frozen base (`model.lora_rank`): only the adapters train and are
checkpointed (with the base's identity), the KL reference is the base with the adapters off (no
copy), resume continues exactly, `export --adapter` writes a PEFT folder that peft loads and plain
`export` the merged model that transformers loads (logits equal to each other and to the run's
policy), the base tensors stay the input folder's bit for bit, one step on 2 devices equals one,
and the refusals."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
from flax import nnx
from hf_models import hf_logits, load_hf

from hgpo_jax.checkpoint import Checkpointer
from hgpo_jax.cli import main as cli_main
from hgpo_jax.config import load_config
from hgpo_jax.models import load_pretrained
from hgpo_jax.models.lora import Adapted, BASE
from hgpo_jax.models.peft_io import AdapterError
from hgpo_jax.trainers.rl import Trainer


def lora_config(run_dir, *extra):
    return load_config("tiny_cpu_toy", [f"train.run_dir={run_dir}", "env.num_workers=1",
                                        "model.lora_rank=4", "model.lora_alpha=8", *extra])


def host(tree):
    return jax.tree.map(np.asarray, tree)


def test_only_the_adapters_train_and_the_reference_is_the_base(tmp_path):
    run = tmp_path / "run"
    with Trainer(lora_config(run, "train.iterations=1"), progress=False) as t:
        assert isinstance(t.state.params, Adapted)
        base_before = host(t.state.params.frozen)
        train_before = host(t.state.params.train)
        assert t.state.ref_params.frozen is t.state.params.frozen  # the reference shares the base
        t.train()
        assert jax.tree.all(jax.tree.map(np.array_equal, base_before, host(t.state.params.frozen)))
        moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), train_before,
                             host(t.state.params.train))
        assert max(jax.tree.leaves(moved)) > 0  # the adapters did train
        # the optimizer state covers the adapters only
        n_adapter = sum(x.size for x in jax.tree.leaves(t.state.params.train))
        n_opt = sum(x.size for x in jax.tree.leaves(t.state.opt_state) if x.ndim)
        assert n_opt == 2 * n_adapter  # Adam's two moments
        policy = t.model()
    # the checkpoint holds the adapters and their optimizer state, and the base's identity
    ckpt = Checkpointer(str(run / "checkpoints"), read_only=True)
    try:
        meta, items = ckpt.latest_meta(), ckpt.items()
        saved = ckpt.item_shapes("state")
    finally:
        ckpt.close()
    source = json.loads((run / "model_source.json").read_text())["folder"]
    # the base tensors of the run are the input folder's, bit for bit
    ref = dict(nnx.to_flat_state(nnx.state(load_pretrained(source, scan_layers=True))))
    for path, var in nnx.to_flat_state(nnx.state(policy, BASE)):
        assert np.array_equal(np.asarray(var[...]), np.asarray(ref[path][...])), path
    # exports: the adapters as a PEFT folder, the merged model; same logits as the run's policy
    assert cli_main(["export", str(run), str(tmp_path / "adapter"), "--adapter"]) == 0
    assert cli_main(["export", str(run), str(tmp_path / "merged")]) == 0
    ids = np.random.RandomState(0).randint(0, 600, (2, 12))
    ours = np.asarray(policy(jnp.asarray(ids)))
    with_peft = peft.PeftModel.from_pretrained(load_hf(source), str(tmp_path / "adapter")).eval()
    for other in (with_peft, load_hf(str(tmp_path / "merged"))):
        np.testing.assert_allclose(hf_logits(other, ids), ours, atol=2e-4)
    assert meta["base"]["folder"] == source and len(meta["base"]["fingerprint"]) == 64
    shapes = jax.tree.leaves(saved["params"], is_leaf=lambda x: isinstance(x, tuple) and
                             all(isinstance(i, int) for i in x))
    assert sum(int(np.prod(x)) for x in shapes) == n_adapter  # the adapters, no base
    assert items == ["state"]


def test_resume_continues_exactly_and_refuses_another_base(tmp_path):
    with Trainer(lora_config(tmp_path / "straight", "train.iterations=2"), progress=False) as t:
        straight = t.train()
        final = host(t.state.params.train)
    with Trainer(lora_config(tmp_path / "resumed", "train.iterations=1"), progress=False) as t:
        t.train()
    with Trainer(lora_config(tmp_path / "resumed", "train.iterations=2"), resume=True,
                 progress=False) as t:
        assert t.iteration == 1
        resumed = t.train()
        params = host(t.state.params.train)
    for key in ("train/loss", "train/kl_loss"):
        assert resumed[0][key] == pytest.approx(straight[1][key], rel=1e-6, abs=1e-7), key
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), final, params)
    # another base: refused before any weight loads
    other = tmp_path / "other"
    source = json.loads((tmp_path / "resumed" / "model_source.json").read_text())["folder"]
    model = load_pretrained(source)
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        var[...] = var[...] + 0.01
    from hgpo_jax.models import save_pretrained, load_tokenizer

    save_pretrained(model, other, tokenizer=load_tokenizer(source))
    with pytest.raises(ValueError, match="adapters were trained on the base"):
        Trainer(lora_config(tmp_path / "resumed", "train.iterations=3", f"model.path={other}"),
                resume=True, allow_change=True, progress=False)


def test_lora_refusals_before_the_weights_load(tmp_path):
    with pytest.raises(ValueError, match="unknown LoRA target 'qkv'"):
        Trainer(lora_config(tmp_path / "a", "model.lora_targets=qkv"), progress=False)
    with pytest.raises(AdapterError, match="does not exist"):
        Trainer(lora_config(tmp_path / "b", "model.lora_rank=0",
                            f"model.adapter={tmp_path / 'missing'}"), progress=False)
    with pytest.raises(ValueError, match="brings its own rank"):
        Trainer(lora_config(tmp_path / "c", f"model.adapter={tmp_path}"), progress=False)
    with pytest.raises(Exception, match="lora_rank"):
        lora_config(tmp_path / "d", "model.lora_rank=-1").validate()


def test_a_lora_step_on_two_and_eight_devices_equals_one():
    """The adapters' update sharded (fsdp=2; data=2 x fsdp=2 x tensor=2) equals one device's,
    and leaves the frozen base as it was."""
    from test_ppo import CFG, minibatch, random_batch

    from hgpo_jax.models import CausalLM, make_mesh
    from hgpo_jax.models.lora import LoraSpec, split_params
    from hgpo_jax.rl.ppo import LossConfig, make_train_step
    from hgpo_jax.rl.update import (init_opt_state, make_logprob_fn, make_optimizer,
                                    param_shardings, shard_params)

    batch = random_batch(8)
    results = []
    for mesh in (None, make_mesh(fsdp=2), make_mesh(data=2, fsdp=2, tensor=2)):
        model = CausalLM(CFG, rngs=nnx.Rngs(0), lora=LoraSpec(4, 8.0), scan_layers=True)
        for _, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):  # B not zero
            var[...] = var[...] + 0.01
        model.batch_mesh = mesh
        graphdef, params = split_params(model)
        params = shard_params(params, mesh)
        base = host(params.frozen)
        tx = make_optimizer(1e-3)
        shard = param_shardings(mesh, params) if mesh is not None else None
        opt_state, opt_shard = init_opt_state(tx, params, mesh)
        step = make_train_step(graphdef, tx, LossConfig(), 2, mesh, shard, opt_shard)
        mb = minibatch(make_logprob_fn(graphdef, mesh, shard), params, batch)
        for _ in range(2):
            params, opt_state, m = step(params, opt_state, mb)
        assert jax.tree.all(jax.tree.map(np.array_equal, base, host(params.frozen)))
        results.append((float(m["train/loss"]), host(params.train)))
    loss1, p1 = results[0]
    for loss_n, p_n in results[1:]:
        assert abs(loss1 - loss_n) <= 1e-5 * max(1.0, abs(loss1))
        # Adam divides by the gradient's own size: an adapter weight whose gradient is ~0 may step
        # by up to lr (1e-3) on a sign the reduction order decides; 1e-4 is a tenth of that
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5), p1, p_n)


def test_sft_and_eval_start_from_a_peft_adapter(tmp_path, capsys):
    """`hgpo-jax sft` trains adapters (model.lora_rank), `export --adapter` writes them, and a
    second SFT from `model.adapter=<that folder>` starts where the first ended (its held-out loss
    before training is the first run's last); `eval` plays from base + adapter as from the run."""
    import re

    first, folder, second = tmp_path / "sft", tmp_path / "adapter", tmp_path / "sft2"
    common = ["env.num_workers=1", "sft.episodes=40", "sft.eval_every=2", "--no-progress"]
    assert cli_main(["sft", "toy_format", f"train.run_dir={first}", "model.lora_rank=4",
                     "sft.steps=2", *common]) == 0
    last = float(re.findall(r"held-out NLL ([0-9.]+)", capsys.readouterr().out)[-1])
    assert cli_main(["export", str(first), str(folder), "--adapter", "--no-progress"]) == 0
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4
    assert cli_main(["sft", "toy_format", f"train.run_dir={second}", f"model.adapter={folder}",
                     "sft.steps=1", *common]) == 0
    before = re.search(r"held-out NLL per response token: ([0-9.]+) before training",
                       capsys.readouterr().out)
    assert before and abs(float(before.group(1)) - last) < 1e-3
    games = ["--split", "valid_seen", "--games", "4", "--json", "--no-progress",
             "eval.protocol=each-once", "eval.temperature=0", "env.num_workers=1"]
    results = []
    for source in ([str(first)], ["toy_format", f"model.adapter={folder}"]):
        assert cli_main(["eval", *source, *games]) == 0
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert results[0] == results[1] and results[0]["valid_seen"]["episodes"] == 4


def _buffers(tree) -> list[int]:
    return [x.addressable_shards[0].data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]


def test_a_critic_trains_its_own_adapters_on_the_policys_base_and_resumes_exactly(tmp_path):
    """PPO with LoRA: the critic's params are `Adapted` whose frozen part is the policy's base
    arrays themselves (no second copy), its adapters and value head train, its optimizer state
    covers them only, a checkpoint holds them only, and a resume continues exactly."""
    def ppo(run, *extra):
        return lora_config(run, "algo.estimator=ppo", "algo.gamma=1.0", "algo.lam=1.0",
                           "rollout.group_size=1", "rollout.num_groups=4", "critic.lr=1e-4",
                           *extra)

    with Trainer(ppo(tmp_path / "straight", "train.iterations=2"), progress=False) as t:
        critic, policy = t.state.algo_state.params, t.state.params
        assert isinstance(critic, Adapted)
        flat_policy = dict(nnx.to_flat_state(policy.frozen))
        shared = dict(nnx.to_flat_state(critic.frozen))
        assert shared and set(shared) <= set(flat_policy)
        assert _buffers([v[...] for v in shared.values()]) == _buffers(
            [flat_policy[p][...] for p in shared])  # the same buffers: no copy of the base
        assert {p[0] for p, _ in nnx.to_flat_state(critic.train)} == {"model", "score"}
        before = host(critic.train)
        straight = t.train()
        after = host(t.state.algo_state.params.train)
        n_train = sum(x.size for x in jax.tree.leaves(after))
        n_opt = sum(x.size for x in jax.tree.leaves(t.state.algo_state.opt_state) if x.ndim)
        assert n_opt == 2 * n_train
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), before, after)
    assert min(jax.tree.leaves(moved["score"])) > 0 and max(jax.tree.leaves(moved["model"])) > 0
    with Trainer(ppo(tmp_path / "resumed", "train.iterations=1"), progress=False) as t:
        t.train()
    ckpt = Checkpointer(str(tmp_path / "resumed" / "checkpoints"), read_only=True)
    try:
        saved = ckpt.item_shapes("critic")
    finally:
        ckpt.close()
    shapes = jax.tree.leaves(saved["params"], is_leaf=lambda x: isinstance(x, tuple) and
                             all(isinstance(i, int) for i in x))
    assert sum(int(np.prod(x)) for x in shapes) == n_train  # adapters and head, no base
    with Trainer(ppo(tmp_path / "resumed", "train.iterations=2"), resume=True,
                 progress=False) as t:
        resumed = t.train()
        critic = host(t.state.algo_state.params.train)
    for key in ("critic/vf_loss", "train/loss"):
        assert resumed[0][key] == pytest.approx(straight[1][key], rel=1e-6, abs=1e-7), key
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), after, critic)
    # `export --critic`: merged (W + s A B) into transformers' token-classification model
    from transformers import AutoModelForTokenClassification
    import torch

    from hgpo_jax.runs import load_run_state_model

    assert cli_main(["export", str(tmp_path / "resumed"), str(tmp_path / "critic"), "--critic",
                     "--no-progress"]) == 0
    model, _ = load_run_state_model(str(tmp_path / "resumed"))
    ids = np.random.RandomState(0).randint(0, 600, (2, 12))
    hf = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "critic")).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()[..., 0]
    np.testing.assert_allclose(theirs, np.asarray(model(jnp.asarray(ids))), atol=2e-4)
