"""Record the authors' similarity-based GiGPO on random cases: the fixture
tests/data/gigpo_similarity_reference.json that tests/test_similarity_groups.py checks
`compute_step_advantages("gigpo", ..., similarity_thresh=t)` against.

    mkdir -p /tmp/verl-agent-20bd331
    git --git-dir=<mirror of verl-agent> archive 20bd331 gigpo verl agent_system/reward_manager \
        | tar -x -C /tmp/verl-agent-20bd331
    python tests/data/gigpo_similarity_reference.py /tmp/verl-agent-20bd331 \
        tests/data/gigpo_similarity_reference.json

The first argument is a copy of verl-agent at 20bd331 kept outside this repository (the project
holds none of their code). Three of its files are loaded by path and driven as the trainer drives
them (`verl/trainer/ppo/ray_trainer.py`, `fit` and `compute_advantage`): `gigpo/core_gigpo.py`
(`compute_step_discounted_returns`, `compute_gigpo_outcome_advantage`, and `build_step_group`,
`episode_norm_reward`, `step_norm_reward` for the parts), `agent_system/reward_manager/episode.py`
(`EpisodeRewardManager`: the episode reward on each row's last response token) and the function
`apply_invalid_action_penalty` taken out of `ray_trainer.py` with `ast` (the module itself needs
ray and the rest of verl). Their only use of `verl` is `DataProto`, as a type and as the batch;
`verl.DataProto` is stubbed in `sys.modules` and the batch is a small stand-in with the fields
they read. This script imports nothing of hgpo_jax.

Each case: 2-6 tasks, 3-6 trajectories each, 1-4 steps each; rows in verl-agent's batch order
(`gather_rollout_data`: env by env, i.e. task by task, each trajectory's steps in order); task and
trajectory ids are random hex strings (their uuids: sorting them does not give the batch order).
Anchors come from a small pool of near duplicates of two base strings, one of 40-80 characters and
one of 210-320 (over difflib's 200, where its autojunk heuristic starts), each variant a few
characters edited, so the ratios straddle the thresholds; equal anchors are common. Reward 1 or 0
on a trajectory's last step; in half of the cases some steps are invalid and the search scripts'
penalty 0.01 applies (their `apply_invalid_action_penalty`: the row's last-token score and its
step return). gamma 0.95, mode mean_std_norm, step_advantage_w 1, epsilon 1e-6, thresholds 0.5,
0.8, 0.9, 0.95.

Per case the fixture holds the pool ("anchors"), the task and trajectory ids, the rows [task
index, trajectory index, step, anchor index, reward, valid] in batch order, and per row the authors' values on the first response token: "adv" (the full
advantage), "episode" and "step" (the two terms; adv = episode + step), and "groups": their step
groups as the index of each row's group in order of first appearance (their group ids are fresh
uuids, only the partition matters).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import sys
import types

import numpy as np
import torch

SEED = 20260601
THRESHOLDS = (0.5, 0.8, 0.9, 0.95)
CASES_PER_THRESHOLD = 40
GAMMA = 0.95
PENALTY = 0.01  # verl-agent's search scripts: invalid_action_penalty_coef=0.01
EPS = 1e-6
PROMPT_LEN, RESPONSE_LEN = 4, 8
LETTERS = "abcdefghijklmnopqrstuvwxyz      .,:{}\"0123456789"


class DataProto:
    """The stand-in batch: tensors in `batch`, NumPy arrays in `non_tensor_batch`; `data[i]` is a
    row (the fields their functions read)."""

    def __init__(self, batch: dict, non_tensor_batch: dict):
        self.batch, self.non_tensor_batch = batch, non_tensor_batch

    def __len__(self) -> int:
        return len(next(iter(self.batch.values())))

    def __getitem__(self, i):
        return types.SimpleNamespace(batch={k: v[i] for k, v in self.batch.items()},
                                     non_tensor_batch={k: v[i] for k, v in self.non_tensor_batch.items()})


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False) -> str:
        return ""


def load_by_path(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_authors(root: str) -> types.SimpleNamespace:
    verl = types.ModuleType("verl")
    verl.DataProto = DataProto
    sys.modules["verl"] = verl
    gigpo = load_by_path("authors_core_gigpo", os.path.join(root, "gigpo", "core_gigpo.py"))
    episode = load_by_path("authors_episode_reward",
                           os.path.join(root, "agent_system", "reward_manager", "episode.py"))
    trainer_path = os.path.join(root, "verl", "trainer", "ppo", "ray_trainer.py")
    with open(trainer_path) as f:
        tree = ast.parse(f.read(), trainer_path)
    node = next(n for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == "apply_invalid_action_penalty")
    namespace = {"np": np, "torch": torch, "DataProto": DataProto}
    exec(compile(ast.Module(body=[node], type_ignores=[]), trainer_path, "exec"), namespace)
    return types.SimpleNamespace(gigpo=gigpo, reward_manager=episode.EpisodeRewardManager,
                                 apply_invalid_action_penalty=namespace["apply_invalid_action_penalty"])


def edit(rng, text: str, edits: int) -> str:
    """`text` with `edits` random single-character substitutions, insertions or deletions."""
    chars = list(text)
    for _ in range(edits):
        k = int(rng.integers(len(chars) + 1))
        kind = int(rng.integers(3))
        if kind == 0 and k < len(chars):
            chars[k] = LETTERS[int(rng.integers(len(LETTERS)))]
        elif kind == 1 or not chars:
            chars.insert(k, LETTERS[int(rng.integers(len(LETTERS)))])
        elif k < len(chars):
            del chars[k]
    return "".join(chars)


def base_string(rng, low: int, high: int) -> str:
    words = ["go", "to", "cabinet", "drawer", "the", "search", "result", "doc", "title", "{", "}",
             '"id":', "12", "contents", "river", "album", "born", "in", "of", "and"]
    out = []
    n = int(rng.integers(low, high))
    while len(" ".join(out)) < n:
        out.append(words[int(rng.integers(len(words)))])
    return " ".join(out)[:n]


def anchor_pool(rng) -> list[str]:
    pool = []
    for base in (base_string(rng, 40, 80), base_string(rng, 210, 320)):
        pool.append(base)
        for edits in rng.choice([1, 2, 3, 4, 6, 9, 14, 25, 40], size=5, replace=False):
            pool.append(edit(rng, base, int(edits)))
    return pool


def hex_id(rng) -> str:
    return "".join("0123456789abcdef"[int(i)] for i in rng.integers(16, size=12))


def random_case(rng, t: float) -> dict:
    pool = anchor_pool(rng)
    weights = rng.random(len(pool)) ** 2 + 0.02  # skewed: some anchors repeat often
    weights /= weights.sum()
    with_invalid = bool(rng.random() < 0.5)
    tasks, trajs, rows = [], [], []
    for _ in range(int(rng.integers(2, 7))):
        tasks.append(hex_id(rng))
        for _ in range(int(rng.integers(3, 7))):
            trajs.append(hex_id(rng))
            length = int(rng.integers(1, 5))
            won = int(rng.random() < 0.5)
            for step in range(length):
                valid = int(not (with_invalid and rng.random() < 0.25))
                rows.append([len(tasks) - 1, len(trajs) - 1, step,
                             int(rng.choice(len(pool), p=weights)), won if step == length - 1 else 0,
                             valid])
    return {"t": t, "penalty": PENALTY if with_invalid else 0.0, "anchors": pool, "tasks": tasks,
            "trajs": trajs, "rows": rows}


def authors_values(authors, case: dict, rng) -> dict:
    """Their advantages of one case, built as their trainer builds its inputs."""
    rows = case["rows"]
    n = len(rows)
    task = np.array([case["tasks"][r[0]] for r in rows], dtype=object)
    traj = np.array([case["trajs"][r[1]] for r in rows], dtype=object)
    anchors = np.array([case["anchors"][r[3]] for r in rows], dtype=object)
    rewards = np.array([r[4] for r in rows], np.float32)
    valid = np.array([r[5] for r in rows], bool)
    episode_reward = {tr: 0.0 for tr in traj}
    episode_length = {tr: 0 for tr in traj}
    for tr, r in zip(traj, rewards):
        episode_reward[tr] += float(r)
        episode_length[tr] += 1
    lengths = rng.integers(1, RESPONSE_LEN + 1, size=n)
    response_mask = torch.tensor(np.arange(RESPONSE_LEN)[None, :] < lengths[:, None], dtype=torch.int64)
    attention = torch.cat([torch.ones(n, PROMPT_LEN, dtype=torch.int64), response_mask], dim=1)
    batch = DataProto(
        batch={"prompts": torch.zeros(n, PROMPT_LEN, dtype=torch.int64),
               "responses": torch.zeros(n, RESPONSE_LEN, dtype=torch.int64),
               "input_ids": torch.zeros(n, PROMPT_LEN + RESPONSE_LEN, dtype=torch.int64),
               "attention_mask": attention},
        non_tensor_batch={"rewards": rewards, "traj_uid": traj, "uid": task, "anchor_obs": anchors,
                          "active_masks": np.ones(n, bool), "is_action_valid": valid,
                          "episode_rewards": np.array([episode_reward[tr] for tr in traj], np.float32),
                          "episode_lengths": np.array([episode_length[tr] for tr in traj], np.float32),
                          "data_source": np.array(["search"] * n, dtype=object)})
    g = authors.gigpo
    batch.batch["step_rewards"] = g.compute_step_discounted_returns(batch, GAMMA)    # fit()
    batch.batch["response_mask"] = response_mask
    batch.batch["token_level_scores"] = authors.reward_manager(Tokenizer(), num_examine=0)(batch)
    if case["penalty"]:
        batch, _ = authors.apply_invalid_action_penalty(batch, invalid_action_penalty_coef=case["penalty"])
    token_rewards = batch.batch["token_level_scores"]                # use_kl_in_reward False
    kw = dict(anchor_obs=anchors, index=task, traj_index=traj, step_advantage_w=1.0,
              mode="mean_std_norm", enable_similarity=True, similarity_thresh=case["t"])
    with contextlib.redirect_stdout(io.StringIO()):                  # their group-size print
        adv, _ = g.compute_gigpo_outcome_advantage(token_level_rewards=token_rewards.clone(),
                                                   step_rewards=batch.batch["step_rewards"].clone(),
                                                   response_mask=response_mask, **kw)
        groups = g.build_step_group(anchors, task, True, case["t"])
    episode = g.episode_norm_reward(token_rewards.clone(), response_mask, task, traj, EPS, remove_std=False)
    step = g.step_norm_reward(batch.batch["step_rewards"].clone(), response_mask, groups, EPS, remove_std=False)
    first = {}
    labels = [first.setdefault(u, len(first)) for u in groups]
    adv0, episode0, step0 = (x[:, 0].tolist() for x in (adv, episode, step))
    assert np.allclose(adv0, np.add(episode0, step0), atol=1e-6)  # the same partition both times
    return {"adv": [round(x, 6) for x in adv0], "episode": [round(x, 6) for x in episode0],
            "step": [round(x, 6) for x in step0], "groups": labels}


def main(root: str, out_path: str) -> None:
    authors = load_authors(root)
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    cases = []
    for t in THRESHOLDS:
        for _ in range(CASES_PER_THRESHOLD):
            case = random_case(rng, t)
            case.update(authors_values(authors, case, rng))
            cases.append(case)
    fixture = {"source": "verl-agent 20bd331 gigpo/core_gigpo.py (+ agent_system/reward_manager/"
                         "episode.py, apply_invalid_action_penalty of verl/trainer/ppo/"
                         "ray_trainer.py), tests/data/gigpo_similarity_reference.py",
               "gamma": GAMMA, "eps": EPS, "mode": "mean_std_norm", "cases": cases}
    with open(out_path, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    rows = sum(len(c["rows"]) for c in cases)
    print(f"wrote {out_path}: {len(cases)} cases, {rows} rows, {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
