"""Prefix SFT (issue 50, `guidance.sft_coef`): the supervised rows of the replayed expert steps
(their prompts are the policy's at that step, their responses the agent's SFT reply and the end
of turn, weight 1/k, one copy per rollout), their loss (fixed and token-budget micro-batches
against NumPy), and a guided toy iteration whose RL updates are those of a run without them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hf_models import TINY_SHAPES

from hgpo_jax.agents import get_agent
from hgpo_jax.build import resolve_model_path
from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.envs.toy import ToyMemoryEnv
from hgpo_jax.models import CausalLM, DecoderConfig, load_pretrained, load_tokenizer
from hgpo_jax.rl.batching import (SftRows, fixed_micro_row_weights, length_ladder, pack_rows,
                                  take_micro, token_budget_micro_batches)
from hgpo_jax.rl.prefix_sft import (PrefixSft, make_sft_budget_step, make_sft_step,
                                    prefix_sft_rows)
from hgpo_jax.rl.guides.replay import ReplayingPool
from hgpo_jax.rl.rollout import collect_rollouts
from hgpo_jax.rl.update import budget_update, init_opt_state
from toy_policies import ScriptedToyPolicy


# --------------------------------------------------------------------------- the rows
@pytest.fixture(scope="module")
def tiny():
    folder = resolve_model_path("tiny")
    return load_pretrained(folder), load_tokenizer(folder)


def toy_pool(n):
    return EnvPool(functools.partial(ToyMemoryEnv, max_steps=50), num_envs=n, num_workers=1)


def solution(task: int) -> list[str]:
    env = ToyMemoryEnv()
    env.reset(task)
    return env.solution()


@pytest.mark.filterwarnings("ignore:rollout.max_prompt_tokens")
def test_sft_rows_show_the_policys_prompt_and_teach_the_agents_reply(tiny):
    """Task 2 (press, forward x3, open): a group of 3 rollouts replays 2 expert steps, one of 3
    replays 3. Each replayed step's row has the prompt the policy saw at that step of an unguided
    rollout playing the same actions (cut to max_prompt_tokens alike), the agent's SFT reply +
    end of turn, weight 1/k; the group's rows are 3 identical copies."""
    model, tok = tiny
    plan = solution(2)
    door = plan[-1].split()[1]
    agent = get_agent("verl-agent", "toy")

    def policy():  # plays the expert's actions; prompts cut to 180 tokens
        return ScriptedToyPolicy(model, tok, think="easy", pick_door=lambda doors: door,
                                 max_prompt_tokens=180)

    with toy_pool(3) as pool:
        free = collect_rollouts(policy(), pool, [2], group_size=3, max_steps=8)
    with toy_pool(4) as pool:
        guided_policy = policy()
        guided = collect_rollouts(guided_policy,
                                  ReplayingPool(pool, [plan[:2]] * 3 + [plan[:3]], 8), [2, 2],
                                  group_size=2, max_steps=8)
    assert free.won.all() and [t.split()[0] for t in plan[:3]] == ["press", "go", "go"]
    free_prompts = {int(s): p for s, p, t in zip(free.step_id, free.prompt_ids, free.traj_id)
                    if t == 0}
    assert any(len(free_prompts[s]) == 180 for s in (0, 1, 2))  # a cut prompt is compared too

    sft = prefix_sft_rows(guided, agent, tok, 180, max_response=100)
    assert len(sft) == 3 * 2 + 3
    np.testing.assert_array_equal(sft.traj, [0, 0, 1, 1, 2, 2, 3, 3, 3])
    np.testing.assert_allclose(sft.weight, [0.5] * 6 + [1 / 3] * 3)
    actions = plan[:2] * 3 + plan[:3]
    steps = [0, 1] * 3 + [0, 1, 2]
    for prompt, response, action, step in zip(sft.prompt_ids, sft.response_ids, actions, steps):
        assert prompt == free_prompts[step]
        assert response == tok.encode(agent.scripted_reply(action)) + [tok.end_of_turn_id]
        assert response[-1] == tok.end_of_turn_id
    assert sft.prompt_ids[0:2] == sft.prompt_ids[2:4] == sft.prompt_ids[4:6]  # one copy a rollout
    # the rollout's own prompt counts are the policy's prompts only
    assert guided_policy.prompt_cuts.prompts == sum(guided_policy.batch_sizes)
    # an unguided batch has none
    assert len(prefix_sft_rows(free, agent, tok, 180)) == 0
    # a reply longer than rollout.max_new_tokens is cut there, as `hgpo-jax sft` cuts
    assert prefix_sft_rows(guided, agent, tok, 180, max_response=5).response_ids[0] == \
        sft.response_ids[0][:5]


# --------------------------------------------------------------------------- the loss
CFG = DecoderConfig(**TINY_SHAPES["untied_gqa1"])
WINDOW = 12


def sft_batch(rows=16, seed=0):
    """Ragged SFT rows (prompts 3..42 tokens, responses 1..12) with weights 1/k, two inert."""
    rng = np.random.RandomState(seed)
    prompts = [list(rng.randint(0, CFG.vocab_size, rng.choice([3, 6, 20, 40]) + rng.randint(0, 3)))
               for _ in range(rows)]
    responses = [list(rng.randint(0, CFG.vocab_size, rng.randint(1, WINDOW + 1)))
                 for _ in range(rows)]
    weight = (1.0 / rng.randint(1, 6, rows)).astype(np.float32)
    weight[[3, 10]] = 0.0  # inert rows (gather_rows's padding)
    rows_ = PrefixSft(prompts, responses, weight, np.arange(rows)).pack(0, length_multiple=8)
    assert np.array_equal(rows_.weight, weight)
    return rows_


def numpy_sft_loss(model, rows: SftRows, num_micro: int, temperature: float) -> float:
    """The mean over the fixed micro-batches (rows j, j + num_micro, ...) of the weighted mean of
    each row's token-mean cross-entropy, from the whole logits, in NumPy (float64)."""
    ids = jnp.asarray(rows.input_ids)
    hidden, _ = model.hidden_states(ids, attention_mask=jnp.asarray(rows.attention_mask))
    logits = np.asarray(model.logits(hidden).astype(jnp.float32), np.float64) / temperature
    logits -= logits.max(-1, keepdims=True)
    logsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    logp = np.zeros(rows.input_ids.shape)
    logp[:, 1:] = np.take_along_axis(logsm[:, :-1], rows.input_ids[:, 1:, None], -1)[..., 0]
    mask = rows.response_mask.astype(np.float64)
    ce = -(logp * mask).sum(1) / np.maximum(mask.sum(1), 1)
    w = rows.weight.astype(np.float64)
    parts = [(w[j::num_micro] * ce[j::num_micro]).sum() / w[j::num_micro].sum()
             if w[j::num_micro].sum() > 0 else 0.0 for j in range(num_micro)]
    return float(np.mean(parts))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sft_loss_is_the_weighted_token_mean_cross_entropy_and_the_budget_form_equals_it(
        temperature):
    """make_sft_step's loss is coef x the NumPy loss; the token-budget update (micro-batches of
    1 to 6 rows, 16 to 56 tokens) has the same gradient, metrics and new parameters."""
    rows = sft_batch()
    coef, num_micro = 0.5, 4
    model = CausalLM(CFG, rngs=nnx.Rngs(0))
    want = numpy_sft_loss(model, rows, num_micro, temperature)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.sgd(0.1)
    fixed = make_sft_step(graphdef, tx, coef, num_micro, window=WINDOW, temperature=temperature)
    p0, _, m0 = fixed(jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0], rows)
    np.testing.assert_allclose(float(m0["train/prefix_sft_loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(m0["train/loss"]), coef * want, rtol=1e-5)
    assert float(m0["train/grad_norm"]) > 0

    weighted = rows.replace(budget_weight=fixed_micro_row_weights(rows.weight, num_micro))
    lengths = np.where(rows.weight > 0, rows.attention_mask.sum(1), 0)
    plan = token_budget_micro_batches(lengths, 96, length_ladder(rows.input_ids.shape[1], 8))
    assert len({m.shape for m in plan}) >= 3
    micros = [take_micro(weighted, m.rows[0], m.length) for m in plan]
    step = make_sft_budget_step(graphdef, tx, coef, 96, window=WINDOW, temperature=temperature)
    p1, _, m1 = budget_update(step, jax.tree.map(jnp.copy, params), init_opt_state(tx, params)[0],
                              micros)
    assert sorted(m0) == sorted(m1)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-4, atol=1e-7, err_msg=k)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), p1, p0)


def test_fixed_micro_row_weights():
    """Row r of fixed micro-batch j weighs w_r / (num_micro W_j); a micro-batch of weight 0
    gives 0; the global rows of two processes interleave as the fixed split's."""
    w = np.asarray([[1.0, 0.5, 0.0, 0.0], [1.0, 0.5, 0.25, 0.0]])  # [P=2, M=4], 2 micro-batches
    got = fixed_micro_row_weights(w, 2)
    flat = w.reshape(-1)  # micro 0: rows 0, 2, 4, 6 (W = 2.25); micro 1: 1, 3, 5, 7 (W = 1)
    want = np.where(np.arange(8) % 2 == 0, flat / (2 * 2.25), flat / 2).reshape(2, 4)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert fixed_micro_row_weights(np.zeros(4), 2).sum() == 0
    with pytest.raises(ValueError, match="cannot form 3"):
        fixed_micro_row_weights(np.ones(4), 3)


def test_packed_sft_rows_are_inert_past_the_real_ones():
    rows = PrefixSft([[1, 2, 3]], [[4, 5]], np.asarray([0.5], np.float32), np.asarray([0])).pack(
        0, row_multiple=4, length_multiple=8)
    assert rows.input_ids.shape == (4, 8) and rows.weight.tolist() == [0.5, 0, 0, 0]
    np.testing.assert_array_equal(rows.response_mask[0], [0, 0, 0, 1, 1, 0, 0, 0])
    ref = pack_rows([[1, 2, 3]], [[4, 5]], [0.0], row_multiple=4, length_multiple=8)
    np.testing.assert_array_equal(rows.input_ids, ref.input_ids)


# --------------------------------------------------------------------------- the trainer
def test_a_guided_toy_iteration_with_prefix_sft_keeps_the_rl_updates(tmp_path, monkeypatch):
    """tiny_cpu_toy, guided, one iteration with guidance.sft_coef 0 and 0.5 (the same rollouts):
    with 0 nothing of prefix SFT runs; with 0.5 the SFT rows train after the RL updates, and
    the RL updates (their metrics, the parameters before the first SFT update) are bit for bit
    those of the run without them."""
    from hgpo_jax.config import load_config
    from hgpo_jax.trainers.rl import Trainer

    before_sft = []
    original = Trainer._sft_update

    def spy(self, sft, idx):
        if not before_sft:
            before_sft.append(jax.tree.map(np.asarray, self.state.params))
        return original(self, sft, idx)

    monkeypatch.setattr(Trainer, "_sft_update", spy)
    out = []
    for coef in (0.0, 0.5):
        cfg = load_config("tiny_cpu_toy", [f"train.run_dir={tmp_path}/c{coef}", "env.num_workers=1",
                                           "guidance.kind=g2", "train.iterations=1",
                                           f"guidance.sft_coef={coef}", "train.diagnostics=false",
                                           "guidance.initial_group_accuracy=0.5"])
        with Trainer(cfg, progress=False) as t:
            assert (t.sft_step is None) == (coef == 0)
            (m,) = t.train()
            out.append((m, jax.tree.map(np.asarray, t.params)))
    (m0, p0), (m1, p1) = out
    assert not any(k.startswith("train/prefix_sft") for k in m0) and not before_sft[1:]
    assert m1["train/prefix_sft_rows"] > 0 and m1["train/prefix_sft_updates"] >= 1
    assert np.isfinite(m1["train/prefix_sft_loss"]) and m1["train/prefix_sft_loss"] > 0
    assert m1["train/prefix_sft_grad_norm"] > 0
    assert m1["train/updates"] == m0["train/updates"] + m1["train/prefix_sft_updates"]
    for k in ("train/loss", "train/pg_loss", "train/kl_loss", "train/entropy", "train/grad_norm",
              "rollout/steps", "guidance/prefix_steps"):
        assert m1[k] == m0[k], k
    jax.tree.map(np.testing.assert_array_equal, before_sft[0], p0)  # ppo_epochs 1: RL first
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p0)))
