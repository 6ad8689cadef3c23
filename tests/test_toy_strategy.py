"""The toy env's strategies behind `make run`'s trap (issue 46), and the diagnosis scripts
experiments/toy_strategy.py and experiments/make_run_seeds.py on exact inputs."""

import os
import sys
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import make_run_seeds, toy_strategy  # noqa: E402
from hgpo_jax.config import load_config  # noqa: E402
from hgpo_jax.envs.toy import PALETTE, ToyMemoryEnv, _list_tasks  # noqa: E402


def play(env, task, choose, max_steps=12):
    """Play `choose(obs, info) -> action` on env; returns the actions taken."""
    obs, info = env.reset(task)
    actions = []
    for _ in range(max_steps):
        actions.append(choose(obs, info))
        obs, _, done, info = env.step(actions[-1])
        if done:
            break
    return actions


def held_out_tasks():
    return _list_tasks(load_config("toy_hgpo").env, "valid_seen")[:48]


@pytest.mark.parametrize("colour", PALETTE)
def test_a_fixed_colour_habit_wins_exactly_half_of_the_held_out_tasks(colour):
    """`make run`'s plateau at 24/48: pressing and opening one colour whatever the room shows wins
    the tasks whose three colours include it (3 of the 6 rotations) and idles on the others."""
    env = ToyMemoryEnv(max_steps=12)
    won = 0
    for task in held_out_tasks():
        def habit(obs, info):
            return f"press {colour} button" if "button" in obs else (
                "go forward" if "corridor" in obs else f"open {colour} door")
        actions = play(env, task, habit)
        won += env.won
        if colour not in env.colors:  # every press is inadmissible: "Nothing happens." to the limit
            assert toy_strategy.inadmissible(env, task, actions) == len(actions) == 12
    assert won == 24


def test_a_consistent_rule_wins_every_held_out_task():
    """Press the first listed button, open the first listed door: no memory needed, all 48 won."""
    env = ToyMemoryEnv(max_steps=12)
    for task in held_out_tasks():
        play(env, task, lambda obs, info: info["admissible_actions"][0])
        assert env.won


def test_classify_reads_press_door_and_memory_distance():
    env = ToyMemoryEnv(max_steps=12)
    task = held_out_tasks()[3]  # corridor 1 + task % 3
    actions = play(env, task, lambda obs, info: "go forward" if "corridor" in obs
                   else info["admissible_actions"][-1])
    turns = [SimpleNamespace(parsed=SimpleNamespace(action=a, valid=True)) for a in actions]
    row = toy_strategy.classify(turns, env)
    assert row["button_pos"] == 2 and row["door_pos"] == 2 and row["won"]
    assert row["button"] == env.colors[2] and row["door"] == env.colors[2]
    assert row["press_in_memory"] == env.corridor + 1 and row["length"] == env.corridor + 2
    assert toy_strategy.inadmissible(env, task, actions) == 0


def test_thirds_as_the_trainers_summary():
    curve = [0.0, 0.1, 0.2, 0.5, 0.5, 0.5, 0.9, 1.0, 0.8, 0.7]  # 10 points: thirds of 3
    first, last, change = make_run_seeds.thirds(curve, len(curve))
    assert first == pytest.approx(0.1) and last == pytest.approx(2.5 / 3)
    assert change == pytest.approx(2.5 / 3 - 0.1)
    assert make_run_seeds.thirds(curve, 6) == pytest.approx((0.05, 0.5, 0.45))
