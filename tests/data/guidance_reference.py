"""Record the authors' Agent-G² schedule on random cases: the fixture
tests/data/guidance_reference.json that tests/test_guidance.py checks `hgpo_jax.rl.guidance`
against.

    python tests/data/guidance_reference.py /path/to/Agent-G2/gmsv/alfworld.py \
        tests/data/guidance_reference.json

The first argument is the authors' `gmsv/alfworld.py` (ZJU-REAL/Agent-G2 at 1df588f), a copy kept
outside this repository (the project holds none of their code). It is loaded by path; its one
import from verl (`find_latest_ckpt_path`, used only to resume from a run folder) is stubbed in
`sys.modules`. This script imports nothing of hgpo_jax: it only drives their functions and writes
inputs and outputs (JSON, compact):

- thresholds: their `_compute_group_thresholds(counts, max(1, K))` (the loader's call) and
  `_compute_short_medium_long_thresholds` on random length lists (given as [length, count] pairs;
  the list is the pairs expanded in order);
- offsets: their `build_step_end_offsets` with two stand-in tokenizers (3 and 4 characters a
  token over the whole text, so tokens cross line breaks);
- depth: their `_sample_plan` with the ratio draw replaced by a given ratio, on random offsets,
  step budgets and allow_full_prefix: the steps and extended_to_step_end;
- schedule: their runtime (expert store replaced by K empty clusters) under several option sets:
  per batch, draws of `_sample_plan` (group, is_train, an empty expert or not) and one
  `update_after_train_batch` (each rollout 1-3 rows of one reward, unmatched rollouts mixed in;
  the fixture lists the matched rollouts only, in batch order), a `save_to_checkpoint` after
  batch 20 and a fresh runtime that loads it (their `_load_persisted_state`) for the rest;
- loads: their `_load_persisted_state` on hand-made state files (extra keys, missing fields, a
  cluster beyond K, mu_global out of range), then one draw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import types
from types import SimpleNamespace

import numpy as np

SEED = 20260501
OPTION_SETS = [  # (name, K, max_steps, allow_full_prefix, options)
    ("alfworld_script", 5, 20, False,
     dict(sigma_mode="dynamic_sigma", batch_acc_low=0.5, batch_acc_high=0.5)),
    ("defaults", 3, 15, False, {}),
    ("uniform_controls", 4, 20, True,
     dict(sigma_mode="dynamic_sigma", prefix_sample_mode="uniform_fixed", uniform_half_width=0.3,
          train_no_prefix_ratio=0.25, max_length=1.0, mu_global_max=1.0, lambda_value=1.0,
          seed=7)),
    ("mu_zero", 5, 12, False,
     dict(sigma_mode="dynamic_sigma", no_prefix_when_mu_zero=True, mu_global_init=0.0,
          lambda_value=1.0, global_step_delta=0.2, batch_acc_low=0.2, batch_acc_high=0.3,
          gamma=2.0, sigma_min=0.05, initial_group_accuracy=0.6, initial_group_variance=0.1,
          train_no_prefix_ratio=0.1, alpha=0.35, seed=3)),
    ("frozen", 2, 20, False, dict(frozen_no_prefix_baseline=True, train_no_prefix_ratio=0.5)),
    ("uniform_narrow", 3, 20, False,
     dict(prefix_sample_mode="uniform_fixed", uniform_half_width=0.0, max_length=1.2,
          mu_global_max=1.2, mu_global_init=1.1, fixed_sigma=0.4, seed=11)),
]
BATCHES = 40
SAVE_AFTER = 20
REWARDS = [0.0, 10.0, -0.1, 0.5, 1e-3, 1e-50]  # 1e-50 is 0 in float32: not a success
YAML = dict(sigma_mode="fixed_sigma", mu_global_init=0.8, mu_global_min=0.0, mu_global_max=0.8,
            global_step_delta=0.1, batch_acc_low=0.4, batch_acc_high=0.6, alpha=0.2,
            lambda_value=0.3, max_length=0.8, sigma_min=0.1, gamma=1.0, fixed_sigma=0.25,
            prefix_sample_mode="gaussian", uniform_half_width=0.25, no_prefix_when_mu_zero=False,
            frozen_no_prefix_baseline=False, train_no_prefix_ratio=0.0,
            initial_group_accuracy=0.0, initial_group_variance=0.0, seed=1)  # their yaml's gmsv:


def load_authors(path: str) -> types.ModuleType:
    stub = types.ModuleType("verl.utils.checkpoint.checkpoint_manager")
    stub.find_latest_ckpt_path = lambda folder: None
    for name in ("verl", "verl.utils", "verl.utils.checkpoint"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["verl.utils.checkpoint.checkpoint_manager"] = stub
    spec = importlib.util.spec_from_file_location("authors_gmsv_alfworld", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # their dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class CharTokenizer:
    def __init__(self, chars: int):
        self.chars = chars

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(-(-len(text) // self.chars)))


def make_runtime(g2, k: int, max_steps: int, allow_full: bool, options: dict):
    class Runtime(g2.GMSVAlfworldPrefixRuntime):
        def _load_expert_store(self):
            return g2.ExpertTrajectoryStore({}, list(range(1, k + 1)))

    gmsv = dict(YAML, **options, allow_full_prefix=allow_full)
    config = SimpleNamespace(gmsv=gmsv,
                             env=SimpleNamespace(env_name="alfworld/AlfredTWEnv",
                                                 max_steps=max_steps),
                             trainer=SimpleNamespace(resume_mode="disable"))
    return Runtime(CharTokenizer(3), config)


def trajectory(g2, group: int, offsets: list[int]):
    n = len(offsets)
    return g2.ExpertTrajectory(trial_id="t", task_type="", actions=[f"a{i}" for i in range(n)],
                               thinks=[], action_count=n, difficulty_group=group,
                               step_end_offsets=list(offsets),
                               full_prefix_token_ids=list(range(offsets[-1] if n else 0)))


def random_offsets(rng, steps: int, most: int = 15) -> list[int]:
    return np.cumsum(rng.integers(1, most + 1, size=steps)).tolist()


def thresholds_cases(g2, rng) -> list:
    cases = []
    for i in range(300):
        if i == 0:
            pairs = []
        else:
            pool = 5 if i % 11 == 5 else 31  # short lengths, 0 included: the quantile path
            distinct = int(rng.integers(1, min(15, pool)))
            lengths = rng.choice(np.arange(0, pool), size=distinct, replace=False)
            if i % 7 == 0:  # equal sizes: ties between cut points
                sizes = np.full(distinct, int(rng.integers(1, 5)))
            else:
                sizes = rng.integers(1, 61, size=distinct)
            pairs = [[int(a), int(b)] for a, b in zip(lengths, sizes)]
        counts = [a for a, b in pairs for _ in range(b)]
        if i % 10 == 9:
            cases.append([pairs, 3, "short_medium_long",
                          g2._compute_short_medium_long_thresholds(counts)])
        else:
            k = int(rng.integers(-1, 9))
            cases.append([pairs, k, "auto", g2._compute_group_thresholds(counts, max(1, k))])
    return cases


def offsets_cases(g2, rng) -> list:
    words = ["go", "to", "take", "from", "put", "in/on", "open", "cabinet", "1", "12", "drawer",
             "toiletpaper", "countertop", "search[red shoes]", "click[buy now]", "B07XYZ1234"]
    cases = []
    for i in range(40):
        actions = [" ".join(rng.choice(words, size=int(rng.integers(1, 6)))) for _ in
                   range(int(rng.integers(1, 9)))]
        chars = 3 if i % 2 == 0 else 4
        offsets, ids = g2.build_step_end_offsets(CharTokenizer(chars), actions)
        cases.append([actions, chars, offsets, len(ids)])
    return cases


def depth_cases(g2, rng) -> list:
    cases = []
    for i in range(2000):
        steps = int(rng.integers(0, 14)) if i % 50 == 0 else int(rng.integers(1, 14))
        offsets = random_offsets(rng, steps, 12)
        total = offsets[-1] if offsets else 0
        kind = i % 4
        if kind == 0 and offsets:  # exactly at a step's end
            ratio = offsets[int(rng.integers(0, steps))] / total
        elif kind == 1:
            ratio = float(rng.choice([0.0, 1.0, 0.8, 1e-9, 1 - 1e-12]))
        else:
            ratio = round(float(rng.uniform(0.0, 1.0)), 6)
        max_steps = int(rng.integers(1, 26))
        allow = bool(rng.random() < 0.3)
        runtime = make_runtime(g2, 1, max_steps, allow, {})
        runtime._sample_prefix_ratio = lambda mu, sigma, r=ratio: (r, r)
        plan = runtime._sample_plan(trajectory(g2, 1, offsets), True, "t")
        cases.append([offsets, ratio, steps, max_steps, int(allow), plan.prefix_step_count,
                      int(plan.extended_to_step_end)])
    return cases


def compact_metrics(metrics: dict, k: int) -> dict:
    """Their update's metrics as lists: "m" = [matched rollouts, controls, success of all,
    scoreboard success b, mu_global before, mu_global after]; "batch" = {cluster: [batch mean,
    batch variance]} for the clusters updated; "A", "V", "sigma" = [K] after the update."""
    m = [metrics[f"train/{key}"] for key in (
        "matched_prompt_count", "fixed_no_prefix_prompt_count", "batch_prompt_accuracy",
        "batch_prompt_accuracy_for_scoreboard", "mu_global_before_update",
        "mu_global_after_update")]
    batch = {str(g): [metrics[f"scoreboard/group_{g}/batch_acc"],
                      metrics[f"scoreboard/group_{g}/batch_var"]]
             for g in range(1, k + 1) if f"scoreboard/group_{g}/batch_acc" in metrics}
    per = {tail: [metrics[f"scoreboard/group_{g}/{tail}_k"] for g in range(1, k + 1)]
           for tail in ("A", "V", "sigma")}
    return {"m": m, "batch": batch, **per}


def schedule_run(g2, rng, name, k, max_steps, allow, options) -> dict:
    runtime = make_runtime(g2, k, max_steps, allow, options)
    run = {"name": name, "K": k, "max_steps": max_steps, "allow_full_prefix": allow,
           "options": options, "batches": []}
    for b in range(BATCHES):
        draws = []
        for _ in range(int(rng.integers(0, 11))):
            group = int(rng.integers(1, k + 1))
            is_train = bool(rng.random() < 0.85)
            empty = bool(rng.random() < 0.05)
            offsets = [] if empty else random_offsets(rng, int(rng.integers(1, 11)), 9)
            plan = runtime._sample_plan(trajectory(g2, group, offsets), is_train, "t")
            draws.append([group, int(is_train), offsets, plan.sampled_ratio, plan.clipped_ratio,
                          int(plan.fixed_no_prefix_train), plan.prefix_step_count,
                          int(plan.extended_to_step_end)])
        rollouts = int(rng.integers(0, 25)) if b % 9 else 0
        control_p = float(rng.choice([0.0, 0.2, 0.6]))
        groups, rewards, controls = [], [], []
        batch = {"traj_uid": [], "gmsv_difficulty_group": [], "episode_rewards": [],
                 "gmsv_expert_matched": [], "gmsv_fixed_no_prefix_train": []}

        def add_rows(uid, group, reward, matched, control):
            for _ in range(int(rng.integers(1, 4))):
                batch["traj_uid"].append(uid)
                batch["gmsv_difficulty_group"].append(group)
                batch["episode_rewards"].append(reward)
                batch["gmsv_expert_matched"].append(matched)
                batch["gmsv_fixed_no_prefix_train"].append(control)

        for r in range(rollouts):
            if rng.random() < 0.15:  # unmatched: the caller leaves it out
                add_rows(f"u{r}", 1, float(rng.choice(REWARDS)), False, False)
            group = int(rng.integers(1, k + 1))
            reward = float(rng.choice(REWARDS))
            control = bool(rng.random() < control_p)
            add_rows(f"r{r}", group, reward, True, control)
            groups.append(group)
            rewards.append(reward)
            controls.append(int(control))
        if not batch["traj_uid"]:  # their update skips a batch of no row at all
            add_rows("u", 1, 0.0, False, False)
        record = {"draws": draws, "groups": groups, "rewards": rewards, "controls": controls,
                  **compact_metrics(runtime.update_after_train_batch(batch), k),
                  "mu": [runtime._compute_mu(g) for g in range(1, k + 1)]}
        if b + 1 == SAVE_AFTER:
            with tempfile.TemporaryDirectory() as folder:
                runtime.save_to_checkpoint(folder)
                with open(os.path.join(folder, "gmsv_runtime_state.json")) as f:
                    record["saved"] = json.load(f)
                runtime = make_runtime(g2, k, max_steps, allow, options)
                runtime._load_persisted_state(folder)
        run["batches"].append(record)
    return run


def load_cases(g2) -> list:
    states = [
        {"loaded_global_step": 150, "train_batches_completed": 0, "mu_global": 0.35,
         "scoreboard": {"1": {"accuracy_ema": 0.7, "variance_ema": 0.2},
                        "2": {"accuracy_ema": 0.1, "variance_ema": 0.05},
                        "3": {"accuracy_ema": 0.4, "variance_ema": 0.24}}},
        {"mu_global": 1.7, "scoreboard": {"2": {"accuracy_ema": 0.9}, "3": {"variance_ema": 0.3},
                                          "7": {"accuracy_ema": 0.25, "variance_ema": 0.15}}},
        {"mu_global": -0.4, "train_batches_completed": 3},
        {"scoreboard": {"1": {}}},
    ]
    cases = []
    for name, k, max_steps, allow, options in OPTION_SETS:
        for state in states:
            runtime = make_runtime(g2, k, max_steps, allow, options)
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "gmsv_runtime_state.json"), "w") as f:
                    json.dump(state, f)
                runtime._load_persisted_state(folder)
            groups = sorted(runtime.group_stats)
            after = {str(g): [runtime.group_stats[g].accuracy_ema,
                              runtime.group_stats[g].variance_ema,
                              runtime._compute_mu(g), runtime._compute_sigma(g)] for g in groups}
            plan = runtime._sample_plan(trajectory(g2, groups[-1], [5, 9, 14]), True, "t")
            cases.append({"set": name, "state": state, "mu_global": runtime.mu_global,
                          "groups": after,
                          "draw": [groups[-1], plan.sampled_ratio, plan.clipped_ratio,
                                   int(plan.fixed_no_prefix_train)]})
    return cases


def main(authors_path: str, out_path: str) -> None:
    g2 = load_authors(authors_path)
    rng = np.random.default_rng(SEED)
    fixture = {
        "source": "ZJU-REAL/Agent-G2 1df588f gmsv/alfworld.py, tests/data/guidance_reference.py",
        "thresholds": thresholds_cases(g2, rng),
        "offsets": offsets_cases(g2, rng),
        "depth": depth_cases(g2, rng),
        "schedules": [schedule_run(g2, rng, *s) for s in OPTION_SETS],
        "loads": load_cases(g2),
    }
    with open(out_path, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path}: {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
