"""Supervised warm start: samples identical to the rollout's, loss on response tokens only,
resume, export, RL from an SFT run, models built here."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from hgpo_jax.agents import get_agent
from hgpo_jax.agents.verl_agent.alfworld import ALFWORLD_INTRO, TOY_INTRO
from hgpo_jax.cli import main as cli_main
from hgpo_jax.config import load_config
from hgpo_jax.config_checks import ConfigError
from hgpo_jax.micro_batches import sft_micro_batch_size
from hgpo_jax.envs import episodes as recorded
from hgpo_jax.envs.alfworld import alfworld_episodes, list_games, walkthrough
from hgpo_jax.envs.pool import EnvPool
from hgpo_jax.envs.toy import ToyMemoryEnv, toy_episodes
from hgpo_jax.models import load_pretrained, load_tokenizer
from hgpo_jax.build import resolve_model_path
from hgpo_jax.models.local import train_tokenizer
from hgpo_jax.rl.batching import TokenRows, pack_rows
from hgpo_jax.rl.update import token_logprobs
from hgpo_jax.rl.policy import Policy
from hgpo_jax.rl.rollout import collect_rollouts
from hgpo_jax.trainers.rl import Trainer
from hgpo_jax.runs import load_model
from hgpo_jax.sft import data
from hgpo_jax.trainers.sft import SftTrainer, nll_micro_loss


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("tiny"))


TOY, ALFWORLD = get_agent("verl-agent", "toy"), get_agent("verl-agent", "alfworld")


@dataclasses.dataclass
class Out:
    tokens: list
    logprobs: list


@dataclasses.dataclass
class ExpertPolicy(Policy):
    """Replies with the SFT response of the next expert action of each env's plan."""

    plans: list = dataclasses.field(default_factory=list)
    t: int = 0
    agent: object = TOY

    def generate(self, prompts, rng, row_ids=None):
        # every env of these tests runs the same number of steps, so all are active at each step
        tokens = [self.tokenizer.encode(self.agent.scripted_reply(plan[self.t])) for plan in self.plans]
        self.t += 1
        return Out(tokens, [[0.0] * len(x) for x in tokens])


def rollout_prompts(tok, pool, tasks, plans, max_steps, memory_len, agent, max_prompt_tokens=2048):
    policy = ExpertPolicy(model=None, tokenizer=tok, max_prompt_tokens=max_prompt_tokens, plans=plans,
                          agent=agent)
    batch = collect_rollouts(policy, pool, tasks, 1, max_steps, memory_len, agent=agent)
    return {(int(i), int(t)): list(p) for i, t, p in zip(batch.traj_id, batch.step_id, batch.prompt_ids)}


def check_samples_equal_rollout(tok, episodes, rollout, memory_len, agent, max_prompt_tokens=2048):
    for i, ep in enumerate(episodes):
        texts = data.samples_from_episodes([ep], memory_len, agent)
        samples = data.tokenize_samples(texts, tok, max_prompt_tokens)
        assert len(samples) == len(ep.steps)
        for t, (sample, step) in enumerate(zip(samples, ep.steps)):
            assert list(sample.prompt_ids) == rollout[(i, t)], (i, t)
            assert list(sample.response_ids) == tok.encode(agent.scripted_reply(step.action)) + [
                tok.end_of_turn_id]


# ------------------------------------------------------------------------------ samples
@pytest.mark.parametrize("memory_len", [0, 2, 4])
def test_toy_samples_are_exactly_the_rollout_prompts(tok, memory_len):
    tasks = [0, 3, 6]  # corridors of 1 (1 + task % 3): every expert episode has 3 steps
    episodes = toy_episodes(tasks, "expert")
    plans = [[s.action for s in ep.steps] for ep in episodes]
    assert {len(p) for p in plans} == {3} and all(ep.won for ep in episodes)
    with EnvPool(ToyMemoryEnv, num_envs=3, num_workers=1) as pool:
        rollout = rollout_prompts(tok, pool, tasks, plans, 3, memory_len, TOY)
    check_samples_equal_rollout(tok, episodes, rollout, memory_len, TOY)
    # left truncation is the rollout's too
    with EnvPool(ToyMemoryEnv, num_envs=3, num_workers=1) as pool:
        short = rollout_prompts(tok, pool, tasks, plans, 3, memory_len, TOY, max_prompt_tokens=40)
    check_samples_equal_rollout(tok, episodes, short, memory_len, TOY, max_prompt_tokens=40)


def test_alfworld_expert_samples_are_exactly_the_rollout_prompts(tok):
    import functools

    from hgpo_jax.envs.alfworld import AlfworldEnv

    game = next(g for g in list_games("valid_seen") if len(walkthrough(g)) <= 6)
    episodes = alfworld_episodes([game])
    assert len(episodes) == 1 and episodes[0].won
    ep = episodes[0]
    assert ep.steps[0].observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert ep.task and ep.task in ep.steps[0].observation
    assert [s.action for s in ep.steps] == walkthrough(game)
    with EnvPool(functools.partial(AlfworldEnv, max_steps=50), num_envs=1, num_workers=1) as pool:
        rollout = rollout_prompts(tok, pool, [game], [walkthrough(game)], len(ep.steps), 2, ALFWORLD)
    check_samples_equal_rollout(tok, episodes, rollout, 2, ALFWORLD)


def test_alfworld_search_episodes_look_for_the_objects(tok):
    """ALFWorld's hand-coded expert (kind "search") searches receptacles instead of going straight
    to the hidden object: longer than the walkthrough, every action admissible (or "look"), the
    same episode for the same seed, and its samples are the rollout's prompts as well."""
    import functools

    from hgpo_jax.envs.alfworld import AlfworldEnv

    game = list_games("train")[0]  # look_at_obj_in_light-AlarmClock-None-DeskLamp-301: 13 steps
    (ep,) = alfworld_episodes([game], kind="search", seed=0)
    assert ep.won and ep.source == f"alfworld-search:{game}"
    assert len(ep.steps) > len(walkthrough(game))
    visited = [s.action for s in ep.steps if s.action.startswith("go to ")]
    assert len(set(visited)) >= 3  # it looked in several places before the alarm clock's
    assert all(s.action in s.admissible or s.action == "look" for s in ep.steps)
    assert alfworld_episodes([game], kind="search", seed=0) == [ep]
    with EnvPool(functools.partial(AlfworldEnv, max_steps=50), num_envs=1, num_workers=1) as pool:
        rollout = rollout_prompts(tok, pool, [game], [[s.action for s in ep.steps]], len(ep.steps),
                                  2, ALFWORLD)
    check_samples_equal_rollout(tok, [ep], rollout, 2, ALFWORLD)
    with pytest.raises(ValueError, match="unknown ALFWorld episode kind"):
        alfworld_episodes([game], kind="random")


def test_alfworld_task_params_from_the_folder_name():
    from hgpo_jax.envs.alfworld import task_params

    game = "/d/train/pick_cool_then_place_in_recep-Plate-None-Cabinet-22/trial_T1/game.tw-pddl"
    assert task_params(game) == {"task_type": "pick_cool_then_place_in_recep", "object_target": "Plate",
                                 "parent_target": "Cabinet", "toggle_target": "Cabinet",
                                 "mrecep_target": ""}
    moved = "/d/pick_and_place_with_movable_recep-Pen-Mug-Desk-301/t/game.tw-pddl"
    with pytest.raises(ValueError, match="task parameters are unknown"):
        task_params(moved)


def test_sft_data_sources_mix_kinds(monkeypatch, tmp_path, tok):
    """sft.data=expert+search:N records each kind with its own count and trains on both."""
    from hgpo_jax.envs import registry
    from hgpo_jax.trainers.sft import build_samples

    cfg = load_config("toy_format", ["sft.data=expert+random:3", "sft.episodes=5"])
    assert cfg.sft.sources() == [("expert", 5), ("random", 3)]
    assert load_config("toy_format").sft.sources() == [("random", 400)]
    turns = tmp_path / "t.jsonl"
    turns.write_text("")
    assert load_config("toy_format", [f"sft.data={turns}"]).sft.sources() == []
    with pytest.raises(ConfigError, match="count of search in sft.data"):
        load_config("toy_format", ["sft.data=expert+search:0"])
    with pytest.raises(ConfigError, match="names 'expert' twice"):
        load_config("toy_format", ["sft.data=expert+expert:5"])
    calls = []
    spec = registry.get_env("toy")
    record = spec.record_episodes

    def spy(env_cfg, split, n, kind, **kw):
        calls.append((kind, n))
        return record(env_cfg, split, n, kind, **kw)

    monkeypatch.setitem(registry._specs(), "toy", dataclasses.replace(spec, record_episodes=spy))
    train, held, info = build_samples(dataclasses.replace(cfg, sft=dataclasses.replace(
        cfg.sft, heldout=0.0)), tok)
    assert calls == [("expert", 5), ("random", 3)]
    assert info["expert_episodes"] == 5 and info["random_episodes"] == 3 and info["episodes"] == 8


def test_random_episodes_keep_the_format_and_use_admissible_actions():
    episodes = toy_episodes(range(20), "random", seed=3, max_steps=6)
    assert any(not ep.won for ep in episodes) and any(ep.won for ep in episodes)
    for ep in episodes:
        for step in ep.steps:
            assert step.action in step.admissible
    with pytest.raises(ValueError, match="kind"):
        toy_episodes([0], "greedy")


def test_episodes_save_and_load(tmp_path):
    episodes = toy_episodes(range(3), "random", seed=1, max_steps=4)
    path = recorded.save_episodes(episodes, str(tmp_path / "eps.jsonl"))
    assert recorded.load_episodes(path) == episodes


def test_jsonl_turns(tmp_path, tok):
    path = tmp_path / "turns.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "response": "<think>x</think><action>look</action>"})
                    + "\n\n" + json.dumps({"prompt": "a", "response": "b"}) + "\n")
    turns = data.read_jsonl_turns(str(path))
    assert turns == [("hi", "<think>x</think><action>look</action>"), ("a", "b")]
    s = data.tokenize_samples(turns, tok, 64)[1]
    assert list(s.prompt_ids) == tok.chat_prompt([{"role": "user", "content": "a"}])
    assert list(s.response_ids) == tok.encode("b") + [tok.end_of_turn_id]
    for bad, msg in (("[1, 2]", "object"), ('{"prompt": "x"}', "response"), ("{oops", "JSON")):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match=msg):
            data.read_jsonl_turns(str(path))


# ------------------------------------------------------------------------------ the loss
def test_loss_covers_the_response_tokens_only(tok):
    model = load_pretrained(resolve_model_path("tiny"))
    samples = data.tokenize_samples([("go", "<think>a</think><action>look</action>"),
                                     ("a longer prompt here", "<action>x</action>")], tok, 64)
    packed = pack_rows([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                       np.zeros(2, np.float32), pad_id=tok.pad_token_id)
    micro = TokenRows.of(packed.arrays())
    loss, metrics = nll_micro_loss(model, micro)
    # by hand from the full logits: -mean over response positions of log p(token | prefix)
    logits = np.asarray(model(micro.input_ids, attention_mask=micro.attention_mask), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    picked, count = 0.0, 0
    for row, s in enumerate(samples):
        P, R = len(s.prompt_ids), len(s.response_ids)
        assert micro.response_mask[row].sum() == R and micro.response_mask[row, P:P + R].all()
        for pos in range(P, P + R):
            picked += logp[row, pos - 1, micro.input_ids[row, pos]]
            count += 1
    np.testing.assert_allclose(float(loss), -picked / count, rtol=1e-5)
    assert float(metrics["nll"]) == pytest.approx(float(loss))
    # changing the prompt tokens' targets does not change the loss's mask
    logp_all = token_logprobs(model, micro.input_ids, micro.attention_mask)
    assert np.all(np.asarray(logp_all)[:, 0] == 0.0)


# ------------------------------------------------------------------------------ runs
def sft_config(run_dir, *extra):
    return load_config("toy_format", [f"train.run_dir={run_dir}", "model.path=tiny", "sft.episodes=40",
                                      "sft.steps=4", "sft.batch_size=8", "train.micro_batch_size=4",
                                      "sft.eval_every=2", "train.keep_checkpoints=3", *extra])


def test_sft_learns_resumes_exactly_and_exports(tmp_path):
    full = tmp_path / "full"
    with SftTrainer(sft_config(full, "sft.save_every=2"), progress=False) as tr:
        assert tr.data_info["episodes"] == 36 and tr.data_info["heldout_episodes"] == 4
        before = tr.heldout_nll()
        history = tr.train()
        final = jax.tree.map(np.asarray, tr.params)
    assert [m.get("heldout/nll") is not None for m in history] == [False, True, False, True]
    assert history[-1]["heldout/nll"] < before and history[-1]["train/nll"] < history[0]["train/nll"]
    # stopped after 2 steps, then resumed: the same parameters as the uninterrupted run
    part = tmp_path / "part"
    with SftTrainer(sft_config(part, "sft.steps=2"), progress=False) as tr:
        tr.train()
    with SftTrainer(sft_config(part), resume=True, progress=False) as tr:
        assert tr.step == 2
        tr.train()
        resumed = jax.tree.map(np.asarray, tr.params)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(resumed)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # export: a Hugging Face folder with the run's weights and tokenizer
    out = tmp_path / "hf"
    assert cli_main(["export", str(full), str(out)]) == 0
    # the run trained scanned layers (model.scan_layers default): the export loads back stacked
    exported = nnx.split(load_pretrained(out, scan_layers=True), nnx.Param)[1]
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(exported)):
        np.testing.assert_allclose(a, np.asarray(b), atol=1e-6)
    assert os.path.isfile(out / "tokenizer.json")
    # model.path=RUN_DIR: an RL run (and load_model) start from the run's latest weights
    model, tokenizer, base = load_model(str(full))
    assert base == resolve_model_path("tiny") and tokenizer.vocab_size > 0
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(nnx.split(model, nnx.Param)[1])):
        np.testing.assert_allclose(a, np.asarray(b), atol=1e-6)


def test_length_grouped_order_is_a_permutation_of_similar_length_batches():
    from hgpo_jax.trainers.sft import GROUP_POOL, length_grouped_order

    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 2000, 1000)
    order = length_grouped_order(lengths, 8, np.random.default_rng(1))
    assert sorted(order.tolist()) == list(range(1000))
    batches = lengths[order].reshape(-1, 8)  # 1000 = 125 batches of 8
    # each batch is a run of one length-sorted pool: its spread is a fraction of a uniform draw's
    spread = (batches.max(1) - batches.min(1)).mean()
    uniform = lengths[rng.permutation(1000)].reshape(-1, 8)
    assert spread < 0.2 * (uniform.max(1) - uniform.min(1)).mean()
    assert not np.all(np.diff(batches.mean(1)) >= 0)  # the batches themselves are shuffled
    # a pool is GROUP_POOL batches: lengths sorted within it, in batches of 8
    one = length_grouped_order(lengths[:GROUP_POOL * 8], 8, np.random.default_rng(2))
    assert sorted(lengths[one].reshape(-1, 8).tolist()) == \
        np.sort(lengths[:GROUP_POOL * 8]).reshape(-1, 8).tolist()
    tail = length_grouped_order(lengths[:13], 4, np.random.default_rng(3))  # a partial batch stays last
    assert sorted(tail.tolist()) == list(range(13))


def test_sft_group_by_length_pads_less_and_resumes_exactly(tmp_path):
    """sft.group_by_length: fewer padded positions than uniform batches on the same turns, and a
    stop-and-resume run equals the uninterrupted one (the grouped order is saved)."""
    def padded(cfg):
        with SftTrainer(cfg, progress=False) as tr:
            return sum(tr._pack([tr.train_samples[i] for i in tr.next_indices(8)], 4).input_ids.size
                       for _ in range(8))
    extra = ("sft.group_by_length=true", "train.pad_multiple=8")
    assert padded(sft_config(tmp_path / "g", *extra)) < padded(sft_config(tmp_path / "u", "train.pad_multiple=8"))
    with SftTrainer(sft_config(tmp_path / "full", *extra), progress=False) as tr:
        tr.train()
        final = jax.tree.map(np.asarray, tr.params)
    with SftTrainer(sft_config(tmp_path / "part", *extra, "sft.steps=2"), progress=False) as tr:
        tr.train()
    with SftTrainer(sft_config(tmp_path / "part", *extra), resume=True, progress=False) as tr:
        assert tr.step == 2
        tr.train()
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(jax.tree.map(np.asarray, tr.params))):
            np.testing.assert_allclose(a, b, atol=1e-6)


def test_sft_cli_and_errors(tmp_path, capsys):
    run = tmp_path / "cli"
    assert cli_main(["sft", "toy_format", "--no-progress", f"train.run_dir={run}", "model.path=tiny",
                     "sft.episodes=20", "sft.steps=2", "sft.batch_size=8", "train.micro_batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "held-out NLL per response token" in out and f"model.path={run}" in out
    # `hgpo-jax eval RUN_DIR` on a supervised run: its weights, logged in RUN_DIR/eval; the run's
    # own config and checkpoints stay as they were
    config_before = (run / "config.yaml").read_text()
    assert cli_main(["eval", str(run), "--no-progress", "--games", "3", "eval.protocol=each-once",
                     "eval.splits=[valid_seen]"]) == 0
    assert "eval/valid_seen/all" in capsys.readouterr().out
    assert (run / "eval" / "metrics.jsonl").is_file() and (run / "config.yaml").read_text() == config_before
    # resuming it as an RL run is refused before the folder is touched
    with pytest.raises(ValueError, match="supervised .* not an RL run"):
        Trainer(load_config(str(run), ["rollout.temperature=0.5"]), resume=True, progress=False)
    assert (run / "config.yaml").read_text() == config_before
    # an SFT step smaller than (or not a multiple of) the RL micro-batch runs in divisor-sized pieces
    assert sft_micro_batch_size(load_config("toy_format", ["sft.batch_size=6", "train.micro_batch_size=4"])) == 3
    assert sft_micro_batch_size(load_config("hgpo_k2_alfworld_qwen2.5_1.5b")) == 32
    assert sft_micro_batch_size(load_config("grpo_alfworld_qwen2.5_1.5b")) == 32
    with pytest.raises(ConfigError, match="sft.heldout"):
        load_config("toy_format", ["sft.heldout=1"])
    assert cli_main(["sft", "toy_format", f"train.run_dir={tmp_path / 'x'}", "model.path=tiny",
                     "sft.data=/no/such.jsonl"]) == 2
    assert "no existing JSONL file" in capsys.readouterr().err
    assert cli_main(["sft", "toy_format", f"train.run_dir={tmp_path / 'x'}", "model.path=tiny",
                     "sft.data=expert+search:many"]) == 2
    assert "is not KIND or KIND:N" in capsys.readouterr().err
    assert cli_main(["train", "toy_hgpo", f"train.run_dir={tmp_path / 'y'}",
                     f"model.path={tmp_path / 'x'}"]) == 2  # a run folder without checkpoints


def test_env_tokenizer_keeps_prompts_short_and_uses_qwen_chat_template():
    episodes = toy_episodes(range(50), "expert") + toy_episodes(range(50), "random", max_steps=6)
    texts = data.samples_from_episodes(episodes, 2, TOY)
    from hgpo_jax.models.tokenizer import QWEN2_5_CHAT_TEMPLATE

    tok = train_tokenizer(data.chat_texts(texts, QWEN2_5_CHAT_TEMPLATE), 1024)
    rendered = tok.hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                          add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                        "helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    samples = data.tokenize_samples(texts, tok, 4096)
    chars = np.mean([len(p) for p, _ in texts])
    tokens = np.mean([len(s.prompt_ids) for s in samples])
    assert tokens < chars / 10  # the template's fixed text becomes a handful of tokens
    for (p, r), s in zip(texts[:20], samples[:20]):
        assert tok.decode(s.response_ids, skip_special_tokens=True) == r  # round trip


def test_build_spec_models_are_built_from_each_envs_corpus(tmp_path, monkeypatch):
    """`model.path=build:<env>-<size>` builds a tokenizer from the env's own prompts (its registry
    prompt builder) and a random Qwen2, once, in the cache."""
    from hgpo_jax import build
    from hgpo_jax.envs import alfworld

    monkeypatch.setenv("HGPO_JAX_CACHE", str(tmp_path))
    folder = resolve_model_path("build:toy-tiny")
    assert folder.startswith(str(tmp_path)) and os.path.isfile(os.path.join(folder, "config.json"))
    tok = load_tokenizer(folder)
    prompt = data.samples_from_episodes(toy_episodes([0], "expert"), 4, TOY)[0][0]
    assert TOY_INTRO in prompt and len(tok.encode(prompt)) < len(prompt) / 5
    assert load_pretrained(folder).config.vocab_size == tok.vocab_size
    assert resolve_model_path("build:toy-tiny") == folder  # built once

    step = recorded.Step("You are in the middle of a room.", ("go to desk 1", "look"), "go to desk 1")
    episode = recorded.Episode("put a pen in desk.", (step, step), True, "alfworld:x")
    monkeypatch.setattr(alfworld, "cached_alfworld_episodes", lambda split, n, *a, **k: [episode])
    texts = build.env_corpus("alfworld")
    assert len(texts) == 2 and ALFWORLD_INTRO in texts[0] and "<action>go to desk 1</action>" in texts[0]
    with pytest.raises(ValueError, match="build:<env>-<size>"):
        resolve_model_path("build:nowhere-tiny")


def test_webshop_build_spec_model(tmp_path, monkeypatch):
    """build:webshop-<size>: a tokenizer trained on 200 scripted WebShop purchases' prompts."""
    from hgpo_jax import build
    from hgpo_jax.envs.registry import get_env

    monkeypatch.setattr(build, "CORPUS_EPISODES", 20)
    texts = build.env_corpus("webshop")
    assert len(texts) > 20 and all("<|im_start|>assistant" in t for t in texts)
    tok = train_tokenizer(texts, 1024)
    from hgpo_jax.config import EnvConfig

    ep = get_env("webshop").record_episodes(EnvConfig(name="webshop"), "train", 1, "expert")[0]
    prompt = data.samples_from_episodes([ep], 2, get_agent("verl-agent", "webshop"))[-1][0]
    assert len(tok.encode(prompt)) < len(prompt) / 2  # product text merges less than templates
