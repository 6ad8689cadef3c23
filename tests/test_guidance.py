"""Agent-G²'s guidance schedule (`hgpo_jax.rl.guidance`): every worked number of the design notes
(shared/design/agent-g2.md sections 3, 4.3, 4.5, 5.1-5.3, 8), the quirks, the state, the options,
and the authors' own functions on random cases.

The fixture tests/data/guidance_reference.json holds inputs and the outputs of the authors' code
(ZJU-REAL/Agent-G2 at 1df588f, `gmsv/alfworld.py`), produced outside the repository with

    python tests/data/guidance_reference.py <copy of their gmsv/alfworld.py> \
        tests/data/guidance_reference.json

(NumPy 2.4, Python 3.11; the script's docstring says what it drives and how). Ints and bools must
be equal, floats within 1e-9.
"""

import collections
import json
import math
import pathlib

import numpy as np
import pytest

from hgpo_jax.rl.guidance import (
    SCHEDULE_DEFAULTS,
    GaussianSchedule,
    ScheduleOptions,
    difficulty_group,
    difficulty_thresholds,
    prefix_steps,
    prefix_text,
    step_end_offsets,
)

FIXTURE = json.loads((pathlib.Path(__file__).parent / "data" / "guidance_reference.json")
                     .read_text())
ALFWORLD_SCRIPT = dict(sigma_mode="dynamic_sigma", batch_acc_low=0.5, batch_acc_high=0.5)
TOL = 1e-9


def close(actual, expected):
    assert isinstance(actual, float), (actual, expected)
    assert abs(actual - expected) <= TOL, (actual, expected)


def chars_encoder(chars):
    return lambda text: list(range(math.ceil(len(text) / chars)))


# ------------------------------------------------------------------------- section 5.1: clusters
ALFWORLD_HISTOGRAM = {3: 59, 4: 611, 5: 218, 6: 635, 7: 557, 8: 688, 9: 346, 10: 138, 11: 90,
                      12: 70, 13: 78, 14: 45, 15: 18}
ALFWORLD_LENGTHS = [n for n, c in ALFWORLD_HISTOGRAM.items() for _ in range(c)]


def test_released_alfworld_lengths():
    assert len(ALFWORLD_LENGTHS) == 3553
    assert round(np.mean(ALFWORLD_LENGTHS), 2) == 7.08
    expected = {2: [6, 15], 3: [5, 7, 15], 4: [5, 7, 8, 15], 5: [4, 6, 7, 8, 15],
                6: [4, 6, 7, 8, 9, 15], 8: [4, 5, 6, 7, 8, 9, 11, 15]}
    for k, thresholds in expected.items():
        assert difficulty_thresholds(ALFWORLD_LENGTHS, k) == thresholds, k
    for k, sizes in ((3, [888, 1192, 1473]), (5, [670, 853, 557, 688, 785])):
        t = difficulty_thresholds(ALFWORLD_LENGTHS, k)
        counts = collections.Counter(difficulty_group(n, t) for n in ALFWORLD_LENGTHS)
        assert [counts[g] for g in range(1, k + 1)] == sizes


def test_small_thresholds():
    assert difficulty_thresholds([3, 3, 4, 4, 4, 9], 5) == [3, 4, 9, 9, 9]
    assert difficulty_thresholds([0, 0, 0, 1], 3) == [1, 1, 1]
    assert difficulty_thresholds([1, 2, 2, 3], 2) == [1, 3]  # a tie: the earliest cut
    assert difficulty_thresholds([1, 2, 3, 4], 2) == [2, 4]
    assert difficulty_thresholds([], 4) == [1, 1, 1, 1]
    # a quantile is kept when above the last kept raw value (0 is stored as 1); the authors'
    # function gives these three
    assert difficulty_thresholds([0, 0, 0, 1, 1, 1, 2, 2, 2], 4) == [1, 1, 2, 2]
    assert difficulty_thresholds([0, 0, 0, 0, 0, 0, 1, 2], 5) == [1, 2, 2, 2, 2]
    assert difficulty_thresholds([0, 0, 5], 4) == [1, 1, 5, 5]
    assert difficulty_thresholds([], 0) == [1]  # K = max(1, num_groups)
    assert difficulty_thresholds([5, 7], -3) == [7]
    assert difficulty_thresholds([3, 9], 5, "short_medium_long") == [4, 7, 9]
    assert difficulty_thresholds([3, 5], 5, "short_medium_long") == [4, 7, 8]
    assert difficulty_thresholds([], 5, "short_medium_long") == [4, 7, 8]
    assert difficulty_thresholds([3, 9], 5, "webshop_3") == [4, 5, 9]
    assert difficulty_thresholds([], 5, "webshop_3") == [4, 5, 6]
    with pytest.raises(ValueError, match="difficulty mode"):
        difficulty_thresholds([3], 2, "thirds")
    with pytest.raises(ValueError, match="action count"):
        difficulty_thresholds([3, -1], 2)


def test_difficulty_group():
    t = [4, 6, 7, 8, 15]
    assert [difficulty_group(n, t) for n in (0, 3, 4, 5, 6, 7, 8, 9, 15, 16, 40)] == \
        [1, 1, 1, 2, 2, 3, 4, 5, 5, 5, 5]
    assert difficulty_group(3, [1, 1, 1]) == 3  # above every threshold: the last
    with pytest.raises(ValueError):
        difficulty_group(3, [])


# ---------------------------------------------------------------------- section 5.2, 5.3: depth
TOILET = ["go to toiletpaperhanger 1", "go to toilet 1", "take toiletpaper 1 from toilet 1",
          "go to toiletpaperhanger 1", "move toiletpaper 1 to toiletpaperhanger 1"]


def test_prefix_text_and_offsets():
    assert prefix_text(["a", "b c"]) == "Step 1: a\nStep 2: b c"
    assert prefix_text([]) == ""
    assert step_end_offsets(chars_encoder(3), TOILET) == [11, 19, 33, 44, 61]
    assert step_end_offsets(chars_encoder(3), []) == []
    # each prefix is encoded whole: not the sum of the steps' own counts
    offsets = step_end_offsets(chars_encoder(4), TOILET)
    summed = np.cumsum([len(chars_encoder(4)(prefix_text([a]))) for a in TOILET]).tolist()
    assert offsets != summed


def test_prefix_steps_worked_cases():
    off = [13, 23, 38, 52, 71]

    def steps(ratio, max_steps=20, full=False):
        return prefix_steps(off, 71, ratio, 5, max_steps, allow_full_prefix=full)

    assert steps(0.05) == (1, True)
    assert steps(0.2) == (2, True)
    assert steps(0.4) == steps(0.5) == (3, True)
    assert steps(0.6) == (4, True)
    for ratio in (0.75, 0.8, 0.9, 1.0):
        assert steps(ratio) == (4, False), ratio  # the cap T - 1: extended reset
    assert steps(0.75, full=True) == (5, True)
    assert steps(1.0, full=True) == (5, False)
    for ratio in (0.4, 0.6, 1.0):
        assert steps(ratio, max_steps=3) == (2, False)
    assert steps(0.0) == (0, False)
    assert steps(0.01) == (0, False)  # floor(0.71) = 0 tokens
    assert steps(23 / 71) == (2, False)  # exactly at a step's end
    assert prefix_steps([], 0, 0.7, 0, 20) == (0, False)
    assert prefix_steps([4], 4, 0.7, 1, 20) == (0, False)  # one step: the policy plays it
    with pytest.raises(ValueError, match="step_end_offsets"):
        prefix_steps([3, 5], 20, 0.5, 3, 20)


# --------------------------------------------------------------------------- section 4: schedule
def test_seed_one_draws():
    s = GaussianSchedule(5, fixed_sigma=0.1)
    assert s.mu(1) == 0.8 and s.sigma(1) == 0.1
    draws = [s.sample(1) for _ in range(6)]
    assert [d[0] for d in draws] == [0.8345584192064787, 0.8821618143501159, 0.8330437076183388,
                                     0.6696842768395639, 0.8905355866673118, 0.8446374572364012]
    assert [d[1] for d in draws] == [0.8, 0.8, 0.8, 0.6696842768395639, 0.8, 0.8]
    assert not any(d[2] for d in draws)


def test_worked_update():
    s = GaussianSchedule(5, **ALFWORLD_SCRIPT)
    m = s.update([1] * 8 + [2] * 8, [1, 1, 1, 0, 0, 0, 0, 0] + [1] * 8)
    assert m["guidance/batch_success"] == 0.6875
    assert s.mu_global == 0.7000000000000001
    assert s.accuracy(1) == 0.07500000000000001 and s.accuracy(2) == 0.2
    assert s.variance(1) == 0.046875 and m["guidance/group_1/batch_var"] == 0.234375
    assert s.mu(2) == 0.79

    m = s.update([1] * 5 + [3] * 5, [1, 1, 1, 0, 0] + [0] * 5)
    assert m["guidance/batch_success"] == 0.30000001192092896
    assert s.mu_global == 0.8
    assert s.accuracy(1) == 0.18000000476837158 and s.variance(1) == 0.08550000190734863

    m = s.update([4] * 8 + [5] * 8, [0] * 8 + [0] * 7 + [1])
    assert m["guidance/batch_success"] == 0.0625 and s.mu_global == 0.8
    assert s.accuracy(5) == 0.025 and s.variance(5) == 0.021875000000000002

    m = s.update([2] * 6 + [4] * 6, [1] * 6 + [1, 1, 0, 0, 0, 0], [False] * 6 + [True] * 6)
    assert m["guidance/batch_success"] == 1.0 and s.mu_global == 0.7000000000000001
    assert m["guidance/controls"] == 6.0 and m["guidance/success"] == float(np.float32(8 / 12))
    assert s.accuracy(2) == 0.36000000000000004
    assert s.accuracy(4) == 0.0 and "guidance/group_4/batch_mean" not in m  # controls only
    assert s.mu(1) == 0.7959999985694886 and s.mu(2) == 0.7420000000000001

    m = s.update([5] * 3, [1, 1, 1])
    assert m["guidance/batch_success"] == 1.0 and s.mu_global == 0.6000000000000001
    assert s.accuracy(5) == 0.22000000000000003 and s.variance(5) == 0.0175 and s.mu(5) == 0.684

    m = s.update([], [])
    assert m["guidance/batch_success"] == 0.0 and s.mu_global == 0.7000000000000001
    assert s.mu(5) == 0.784
    assert all(s.sigma(g) == 0.1 for g in s.groups)


def test_float32_three_fifths_lowers_mu_global():
    s = GaussianSchedule(2)  # batch_acc_high 0.6
    m = s.update([1] * 5, [1, 1, 1, 0, 0])
    assert m["guidance/batch_success"] == 0.6000000238418579 > 0.6
    assert s.mu_global == pytest.approx(0.7)
    assert m["guidance/group_1/batch_mean"] == 0.6000000238418579


def test_success_is_a_positive_float32():
    s = GaussianSchedule(1)
    m = s.update([1] * 4, [10.0, 1e-3, 1e-50, -0.1])  # 1e-50 is 0 in float32
    assert m["guidance/batch_success"] == 0.5


def test_no_value_raises_mu_global():
    s = GaussianSchedule(3, mu_global_init=0.5)
    assert s.update([], [])["guidance/batch_success"] == 0.0
    assert s.mu_global == 0.6
    s.update([1, 2], [1, 1], [True, True])  # controls only: no value either
    assert s.mu_global == pytest.approx(0.7)
    assert s.accuracy(1) == 0.0 and s.accuracy(2) == 0.0


def test_frozen_baseline_changes_nothing():
    s = GaussianSchedule(3, frozen_no_prefix_baseline=True, mu_global_init=0.5)
    assert s.sample(2) == (0.0, 0.0, True)
    assert s.sample(2, is_train=False) == (0.0, 0.0, True)
    m = s.update([1, 1, 2], [1, 0, 1], [True, True, True])
    assert m["guidance/mu_global"] == s.mu_global == 0.5
    m = s.update([1, 2], [0, 0])
    assert s.mu_global == 0.5 and s.accuracy(1) == 0.0 and "guidance/group_1/batch_mean" not in m
    s.load_state_dict({"mu_global": 0.1, "scoreboard": {"1": {"accuracy_ema": 0.9}}})
    assert s.mu_global == 0.5 and s.accuracy(1) == 0.0
    assert s._rng.random() == np.random.default_rng(1).random()  # no draw was made
    # with a control ratio the frozen baseline still draws it (and nothing else)
    s = GaussianSchedule(3, frozen_no_prefix_baseline=True, train_no_prefix_ratio=0.5)
    rng = np.random.default_rng(1)
    assert s.sample(1) == (0.0, 0.0, True)
    rng.random()
    assert s._rng.random() == rng.random()


def test_no_prefix_when_mu_zero_is_not_a_control():
    s = GaussianSchedule(2, no_prefix_when_mu_zero=True, mu_global_init=0.0, lambda_value=1.0,
                         initial_group_accuracy=0.5)
    assert s.mu(1) == 0.0
    assert s.sample(1) == (0.0, 0.0, False)
    assert s._rng.random() == np.random.default_rng(1).random()  # no draw was made
    s.update([1], [0])  # A_1 = 0.4, mu_global = 0.1: mu_1 = 0.2
    assert s.sample(1)[2] is False and s.sample(1)[0] != 0.0


def test_train_no_prefix_ratio_draw_order():
    s = GaussianSchedule(1, train_no_prefix_ratio=0.5, seed=4)
    rng = np.random.default_rng(4)
    for is_train in (True, True, False, True, False, True, True, True):
        sampled, ratio, control = s.sample(1, is_train=is_train)
        if is_train and rng.random() < 0.5:
            assert (sampled, ratio, control) == (0.0, 0.0, True)
            continue
        assert control is False
        assert sampled == rng.normal(0.8, 0.25) and ratio == min(max(sampled, 0.0), 0.8)
    # an empty expert: the control's draw happens, the ratio's does not
    s = GaussianSchedule(1, train_no_prefix_ratio=0.5, seed=4)
    rng = np.random.default_rng(4)
    assert s.sample(1, empty=True) == (0.0, 0.0, rng.random() < 0.5)
    assert s.sample(1, is_train=False)[0] == rng.normal(0.8, 0.25)


def test_uniform_fixed():
    s = GaussianSchedule(1, prefix_sample_mode="uniform_fixed", uniform_half_width=0.3,
                         max_length=1.2, mu_global_max=1.2, mu_global_init=0.9, seed=5)
    rng = np.random.default_rng(5)
    assert s.mu(1) == pytest.approx(1.05)  # 0.9 + 0.3 (0.5 - 0): centre clip(1.05, 0, r_max 1)
    sampled, ratio, control = s.sample(1)
    assert sampled == ratio == rng.uniform(0.7, 1.0) and not control
    s = GaussianSchedule(1, prefix_sample_mode="uniform_fixed", uniform_half_width=0.0)
    assert s.sample(1) == (0.8, 0.8, False)  # high == low: no draw
    assert s._rng.random() == np.random.default_rng(1).random()
    s = GaussianSchedule(1, prefix_sample_mode="uniform_fixed", max_length=-0.5,
                         mu_global_min=-1.0)
    assert s.sample(1) == (0.0, 0.0, False)  # r_max 0


def test_sigma_modes():
    s = GaussianSchedule(2, sigma_mode="dynamic_sigma", gamma=2.0, sigma_min=0.05,
                         initial_group_variance=0.2)
    assert s.sigma(1) == 0.4
    s = GaussianSchedule(2, sigma_mode="dynamic_sigma", initial_group_variance=0.02)
    assert s.sigma(2) == 0.1
    assert GaussianSchedule(2, initial_group_variance=0.9).sigma(1) == 0.25


def test_state_round_trip():
    s = GaussianSchedule(4, **ALFWORLD_SCRIPT)
    for _ in range(3):
        s.sample(2)
    s.update([1, 1, 2, 3, 3, 4], [1, 0, 1, 0, 0, 1])
    s.update([2, 2, 4], [0, 1, 1])
    state = json.loads(json.dumps(s.state_dict()))
    assert set(state) == {"mu_global", "scoreboard"}
    assert list(state["scoreboard"]) == ["1", "2", "3", "4"]
    fresh = GaussianSchedule(4, **ALFWORLD_SCRIPT)
    fresh.load_state_dict(state)
    assert fresh.mu_global == s.mu_global
    for g in range(1, 5):
        assert (fresh.mu(g), fresh.sigma(g), fresh.accuracy(g), fresh.variance(g)) == \
            (s.mu(g), s.sigma(g), s.accuracy(g), s.variance(g))
    assert fresh.state_dict() == s.state_dict()
    # the generator is not saved: the loaded schedule draws from its seed again
    rng = np.random.default_rng(1)
    assert fresh.sample(3)[0] == rng.normal(fresh.mu(3), fresh.sigma(3))
    assert s.sample(3)[0] != fresh.sample(3)[0]


def test_load_the_authors_file():
    authors = {"loaded_global_step": 150, "train_batches_completed": 0, "mu_global": 0.95,
               "scoreboard": {"1": {"accuracy_ema": 0.7, "variance_ema": 0.2},
                              "2": {"accuracy_ema": 0.1},
                              "6": {"accuracy_ema": 0.3, "variance_ema": 0.15}}}
    s = GaussianSchedule(3, sigma_mode="dynamic_sigma", initial_group_variance=0.05)
    s.load_state_dict(authors)
    assert s.mu_global == 0.8  # clipped to mu_global_max
    assert (s.accuracy(1), s.variance(1)) == (0.7, 0.2)
    assert (s.accuracy(2), s.variance(2)) == (0.1, 0.05)  # a missing field keeps its value
    assert (s.accuracy(3), s.variance(3)) == (0.0, 0.05)  # not listed: unchanged
    assert s.groups == (1, 2, 3, 6)  # the authors' loader adds a cluster it does not know
    assert s.sigma(6) == 0.15 and s.mu(6) == 0.8  # 0.8 + 0.3 (0.5 - 0.3), clipped
    s.load_state_dict({"mu_global": -2.0})
    assert s.mu_global == 0.0 and s.accuracy(1) == 0.7
    s.load_state_dict({})
    assert s.mu_global == 0.0
    for bad in ({"scoreboard": [1, 2]}, {"scoreboard": {"0": {}}}, {"scoreboard": {"1": 0.5}},
                [("mu_global", 0.2)]):
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
    assert s.groups == (1, 2, 3, 6) and s.mu_global == 0.0


# ---------------------------------------------------------------------------------- options
def test_options_defaults_and_errors():
    assert SCHEDULE_DEFAULTS == {
        "sigma_mode": "fixed_sigma", "mu_global_init": 0.8, "mu_global_min": 0.0,
        "mu_global_max": 0.8, "global_step_delta": 0.1, "batch_acc_low": 0.4,
        "batch_acc_high": 0.6, "alpha": 0.2, "lambda_value": 0.3, "max_length": 0.8,
        "sigma_min": 0.1, "gamma": 1.0, "fixed_sigma": 0.25, "prefix_sample_mode": "gaussian",
        "uniform_half_width": 0.25, "no_prefix_when_mu_zero": False,
        "frozen_no_prefix_baseline": False, "train_no_prefix_ratio": 0.0,
        "initial_group_accuracy": 0.0, "initial_group_variance": 0.0, "seed": 1}
    s = GaussianSchedule(2, alpha=1, seed=3.0, no_prefix_when_mu_zero=1)
    assert s.options == ScheduleOptions(ema_alpha=1.0, seed=3, no_prefix_when_mu_zero=True)
    assert isinstance(s.options.ema_alpha, float) and isinstance(s.options.seed, int)
    with pytest.raises(TypeError, match=r"'sigma'.*known: .*'fixed_sigma'"):
        GaussianSchedule(2, sigma=0.1)
    for bad, match in ((dict(uniform_half_width=-0.1), "uniform_half_width"),
                       (dict(sigma_mode="std"), "sigma_mode"),
                       (dict(prefix_sample_mode="beta"), "prefix_sample_mode"),
                       (dict(alpha="0.2"), "alpha"), (dict(seed=1.5), "seed"),
                       (dict(frozen_no_prefix_baseline="false"), "frozen_no_prefix_baseline"),
                       (dict(gamma=float("nan")), "gamma")):
        with pytest.raises(ValueError, match=match):
            GaussianSchedule(2, **bad)
    for k in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_groups"):
            GaussianSchedule(k)
    assert GaussianSchedule(1, mu_global_init=2.0).mu_global == 0.8
    assert GaussianSchedule(1, mu_global_min=0.5, mu_global_max=0.2).mu_global == 0.5


def test_update_and_sample_errors():
    s = GaussianSchedule(3)
    for group in (0, 4):
        with pytest.raises(ValueError, match="cluster"):
            s.sample(group)
        with pytest.raises(ValueError, match="cluster"):
            s.update([1, group], [1, 1])
    with pytest.raises(ValueError, match="one of each per rollout"):
        s.update([1, 2], [1])
    with pytest.raises(ValueError, match="one of each per rollout"):
        s.update([1, 2], [1, 0], [True])
    assert s.mu_global == 0.8 and s.accuracy(1) == 0.0  # nothing changed


# --------------------------------------------------------------- the authors' functions: fixture
def test_reference_thresholds():
    assert len(FIXTURE["thresholds"]) == 300
    for pairs, k, mode, expected in FIXTURE["thresholds"]:
        counts = [length for length, n in pairs for _ in range(n)]
        assert difficulty_thresholds(counts, k, mode) == expected, (pairs, k, mode)


def test_reference_offsets():
    for actions, chars, offsets, total in FIXTURE["offsets"]:
        got = step_end_offsets(chars_encoder(chars), actions)
        assert got == offsets and got[-1] == total


def test_reference_depth():
    assert len(FIXTURE["depth"]) == 2000
    for offsets, ratio, steps, max_steps, allow, expected, extended in FIXTURE["depth"]:
        got = prefix_steps(offsets, offsets[-1] if offsets else 0, ratio, steps, max_steps,
                           allow_full_prefix=bool(allow))
        assert got == (expected, bool(extended)), (offsets, ratio, steps, max_steps, allow)


RUNS = {run["name"]: run for run in FIXTURE["schedules"]}


@pytest.mark.parametrize("name", list(RUNS))
def test_reference_schedule(name):
    run = RUNS[name]
    k, options = run["K"], run["options"]
    s = GaussianSchedule(k, **options)
    for i, batch in enumerate(run["batches"]):
        for group, is_train, offsets, sampled, ratio, control, steps, extended in batch["draws"]:
            got = s.sample(group, is_train=bool(is_train), empty=not offsets)
            close(got[0], sampled)
            close(got[1], ratio)
            assert got[2] is bool(control)
            assert prefix_steps(offsets, offsets[-1] if offsets else 0, got[1], len(offsets),
                                run["max_steps"], run["allow_full_prefix"]) == \
                (steps, bool(extended))
        m = s.update(batch["groups"], batch["rewards"], [bool(c) for c in batch["controls"]])
        names = ("rollouts", "controls", "success", "batch_success", "mu_global_before",
                 "mu_global")
        for key, value in zip(names, batch["m"]):
            close(m[f"guidance/{key}"], value)
        updated = {key.split("/")[1] for key in m if key.endswith("/batch_mean")}
        assert updated == {f"group_{g}" for g in batch["batch"]}
        for g, (mean, var) in batch["batch"].items():
            close(m[f"guidance/group_{g}/batch_mean"], mean)
            close(m[f"guidance/group_{g}/batch_var"], var)
        for g in range(1, k + 1):
            for key in ("A", "V", "sigma", "mu"):
                close(m[f"guidance/group_{g}/{key}"], batch[key][g - 1])
            close(s.mu(g), batch["mu"][g - 1])
            close(s.sigma(g), batch["sigma"][g - 1])
        if "saved" in batch:  # their file after this batch; a fresh runtime loaded it
            saved = batch["saved"]
            mine = s.state_dict()
            close(mine["mu_global"], saved["mu_global"])
            assert list(mine["scoreboard"]) == list(saved["scoreboard"])
            for g, fields in saved["scoreboard"].items():
                close(mine["scoreboard"][g]["accuracy_ema"], fields["accuracy_ema"])
                close(mine["scoreboard"][g]["variance_ema"], fields["variance_ema"])
            s = GaussianSchedule(k, **options)
            s.load_state_dict(saved)


def test_reference_loads():
    assert len(FIXTURE["loads"]) == 4 * len(RUNS)
    for case in FIXTURE["loads"]:
        run = RUNS[case["set"]]
        s = GaussianSchedule(run["K"], **run["options"])
        s.load_state_dict(case["state"])
        close(s.mu_global, case["mu_global"])
        assert sorted(s.groups) == sorted(int(g) for g in case["groups"])
        for g, (accuracy, variance, mu, sigma) in case["groups"].items():
            for got, expected in ((s.accuracy(int(g)), accuracy), (s.variance(int(g)), variance),
                                  (s.mu(int(g)), mu), (s.sigma(int(g)), sigma)):
                close(got, expected)
        group, sampled, ratio, control = case["draw"]
        got = s.sample(group)
        close(got[0], sampled)
        close(got[1], ratio)
        assert got[2] is bool(control)
