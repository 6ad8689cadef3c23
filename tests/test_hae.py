"""HiPER's hierarchical advantage estimation (`hgpo_jax.rl.hae`): the worked example of the design
(shared/design/hiper.md section 2.11), numbers of the authors' own function on random
batches, the quirks reproduced, a plain loop reference of sections 2.2-2.7 on random batches, row
order, compilation buckets and input errors."""

import numpy as np
import pytest

import hgpo_jax.rl
from hgpo_jax.rl.hae import HAEResult, hae_advantages, hae_device

# ----------------------------------------------------------------------------------------------
# Section 2.11: two trajectories A (4 turns) and B (3 turns)

EX_TRAJ = ["A", "A", "A", "A", "B", "B", "B"]
EX_TURN = [0, 1, 2, 3, 0, 1, 2]
EX_SWITCH = [True, False, True, False, True, True, False]
EX_REWARD = [0, 0, 0, 10, 0, 0, 0]
EX_DONE = [0, 0, 0, 1, 0, 0, 0]
EX_VALID = [1, 1, 0, 1, 1, 1, 1]
EX_CHANGED = [0, 0, 0, 1, 0, 0, 0]  # A3's sub-goal differs from A2's; A1 = A0, B2 = B1
EX_VL = [1, 2, 3, 6, 0.5, 1.5, 2.5]
EX_VH = [0.8, 99.0, 2.5, -99.0, 0.4, 1.2, 77.0]  # read on segment starts A0, A2, B0, B1 only
EX_VT = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
ALFWORLD = dict(valid=EX_VALID, subgoal_changed=EX_CHANGED, keep_penalty=-0.3,
                keep_penalty_mode="normalized", invalid_penalty=0.1,
                keep_consistency_penalty=-0.3, bootstrap_truncated=True)
NO_SHAPING = dict(invalid_penalty=0.0)


def example(**kw) -> HAEResult:
    return hae_advantages(EX_TRAJ, EX_TURN, EX_REWARD, EX_DONE, EX_SWITCH, EX_VL, EX_VH, EX_VT,
                          **kw)


def close(actual, expected, atol=1e-4):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=0, atol=atol)


def test_worked_example_no_shaping():
    res = example(gamma=1.0, lam=1.0, lam_seg=0.95, norm_adv=False, **NO_SHAPING)
    close(res.low, [1.5, 0.5, 7, 4, 0.7, -1.5, -2.5])
    close(res.high, [8.825, 0, 7.5, 0, -0.34, -1.2, 0])
    close(res.term, [2.4, 2.3, 9.7, 9.6, 0.7, -0.6, -0.7])
    close(res.low_return, [2.5, 2.5, 10, 10, 1.2, 0, 0])
    close(res.high_return, [9.625, 0, 10, 0, 0.06, 0, 0])  # R^high_B1 = -1.2 + 1.2 = 0
    np.testing.assert_array_equal(res.has_high, [1, 0, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(res.segment_end, [0, 1, 0, 1, 1, 0, 1])
    close(res.rewards, EX_REWARD, atol=0)
    for level in ("low", "high", "term"):  # norm_adv=False: the raw values
        np.testing.assert_array_equal(getattr(res, level), getattr(res, level + "_raw"))


def test_worked_example_discounted():
    res = example(gamma=0.9, lam=0.8, lam_seg=0.95, norm_adv=False, **NO_SHAPING)
    close(res.low, [0.98, 0.25, 5.28, 4, 0.58, -1.05, -2.5])
    close(res.high, [6.2268, 0, 6.5, 0, -0.346, -1.2, 0])
    close(res.term, [1.925, 2.05, 8.7, 9.6, 0.58, -0.6, -0.7])


def test_worked_example_alfworld_shaping():
    res = example(gamma=1.0, lam=1.0, lam_seg=0.95, norm_adv=False, **ALFWORLD)
    close(res.rewards, [0, -0.075, -0.1, 9.625, 0, 0, -0.1])
    close(res.low, [1.425, 0.425, 6.525, 3.625, 0.7, 0.9, -0.1])
    close(res.high, [8.2987, 0, 7.025, 0, 0.705, -0.1, 0])
    close(res.term, [2.325, 2.225, 9.225, 9.225, 0.7, 0.5, 0.4])
    close(res.term_return[4:], [1.2, 1.1, 1.1])


def test_worked_example_alfworld_normalized():
    raw = example(gamma=1.0, lam=1.0, lam_seg=0.95, norm_adv=False, **ALFWORLD)
    res = example(gamma=1.0, lam=1.0, lam_seg=0.95, norm_adv=True, **ALFWORLD)
    close(res.low, [-0.2312, -0.6904, 2.1105, 0.7789, -0.5641, -0.4723, -0.9314])
    close(res.high[res.has_high], [1.1610, 0.8184, -0.8814, -1.0979])
    close(res.high[~res.has_high], 0, atol=0)
    close(res.term, [-0.3228, -0.3500, 1.5501, 1.5501, -0.7639, -0.8182, -0.8453])
    for name in ("low_return", "high_return", "term_return", "low_raw", "high_raw", "term_raw",
                 "rewards"):  # returns and raw advantages are not normalized
        np.testing.assert_array_equal(getattr(res, name), getattr(raw, name))
    for level in ("low", "high", "term"):
        x = getattr(res, level)[getattr(res, level + "_mask")]
        close(x.mean(), 0, atol=1e-5)
        close(x.std(), 1, atol=1e-5)


def test_exported_from_rl():
    assert hgpo_jax.rl.hae_advantages is hae_advantages
    assert "hae_advantages" in hgpo_jax.rl.__all__


# ----------------------------------------------------------------------------------------------
# The authors' function on random batches.
#
# How these numbers were obtained: the authors' `hiper_hae/core_hae.py` (JonP07/HiPER-agent at
# 9d3c118) was run outside the repository (nothing of it is in the project) with torch on CPU and
# a stand-in `verl.DataProto`, on the rows below in this (shuffled) order, with an HAEConfig of
# `kwargs` (invalid_action_penalty_coef = invalid_penalty,
# keep_consistency_requires_both=True). Each reply had 6 tokens: switch span 0-1 (mask empty when
# has_switch is 0), sub-goal span 2-3 (token ids = the row's sub-goal id, mask empty when
# has_subgoal is 0; subgoal_changed = both spans present and the ids differ), action span 4-5;
# VL at token 4 (value_mask_low), VH at token 0 on segment starts (value_mask_high), a junk value
# at the last token (the fallback read-out off segment starts: the VH column holds it on the
# other rows; it must not matter), VT at token 0. Read back: advantages_low at token 4,
# advantages_high at token 2 (0 unless a segment start with a sub-goal span), advantages_term at
# token 0 (0 unless a switch span), returns_low at token 4, returns_high and returns_term at
# token 0; rounded to 6 decimals.
AUTHORS_CASES = [
    {
        "kwargs": dict(gamma=1.0, lam=1.0, lam_seg=0.95, keep_penalty=0.0,
                       keep_penalty_mode="fixed", invalid_penalty=0.0,
                       keep_consistency_penalty=0.0, bootstrap_truncated=False, norm_adv=False),
        # traj, turn, switch, done, reward, valid, has_subgoal, has_switch, subgoal_changed,
        # VL, VH, VT
        "rows": [
            ("t1", 3, 1, 0, 0.342, 1, 1, 1, 0, -1.251, -1.165, 0.901),
            ("t0", 4, 1, 1, 0, 1, 1, 1, 1, 0.111, -0.381, 0.115),
            ("t2", 0, 0, 1, 0, 0, 1, 0, 0, -0.99, 1.872, -0.241),
            ("t0", 0, 0, 0, 0, 1, 1, 0, 0, 1.266, -0.506, 2.545),
            ("t3", 0, 1, 1, 0, 1, 1, 0, 0, 1.868, 0.906, -0.861),
            ("t0", 1, 1, 0, 0, 1, 0, 1, 0, -0.078, 1.09, 0.097),
            ("t1", 1, 0, 0, 0, 1, 0, 0, 0, -0.634, -0.36, -0.672),
            ("t0", 3, 1, 0, 0, 1, 1, 1, 1, -0.888, -1.981, -0.348),
            ("t1", 4, 1, 1, -1.536, 0, 1, 1, 0, -1.071, 1.054, -0.403),
            ("t1", 2, 1, 0, 0, 1, 1, 1, 0, -0.907, 0.052, 0.729),
            ("t4", 1, 1, 0, 0, 1, 0, 1, 0, -0.574, 0.672, 0.407),
            ("t0", 2, 0, 0, 0, 1, 1, 1, 0, -1.356, 0.706, -0.844),
            ("t4", 3, 0, 1, 0.819, 1, 1, 1, 0, 0.403, -0.657, 0.514),
            ("t4", 2, 1, 0, 0.539, 0, 1, 1, 0, 0.142, 0.582, 1.355),
            ("t4", 0, 0, 0, -0.275, 1, 1, 0, 0, -0.747, 0.01, -0.558),
            ("t1", 0, 0, 0, 0, 1, 1, 1, 0, -1.194, 1.141, 1.509),
        ],
        "expected": {
            "low": [
                2.647, -0.111, 0.99, -0.176, -1.868, -1.903, 0.686, 0.507, -0.465, -0.258, 1.156,
                -0.625, 0.416, 1.216, 1.144, 1.246
            ],
            "high": [
                0.1005, 0.381, -1.872, 0.44921, -0.906, 0, 0, 1.96195, -2.59, -1.121525, 0, 0, 0,
                0.776, 1.00184, -2.154449
            ],
            "term": [
                0.495, -0.115, 0, 0, 0, -2.078, 0, -0.033, -1.133, -1.894, 0.175, -1.137, 0.305,
                0.003, 0, -1.457
            ],
            "low_return": [
                1.396, 0, 0, 1.09, 0, -1.981, 0.052, -0.381, -1.536, -1.165, 0.582, -1.981, 0.819,
                1.358, 0.397, 0.052
            ],
            "high_return": [
                -1.0645, 0, 0, -0.05679, 0, -0.117148, 0, -0.01905, -1.536, -1.069525, 1.3192, 0,
                0, 1.358, 1.01184, -1.013449
            ],
            "term_return": [
                1.396, 0, 0, 1.09, 0, -1.981, 0.052, -0.381, -1.536, -1.165, 0.582, -1.981, 0.819,
                1.358, 0.397, 0.052
            ],
        },
    },
    {
        "kwargs": dict(gamma=0.9, lam=0.8, lam_seg=0.7, keep_penalty=-0.3,
                       keep_penalty_mode="fixed", invalid_penalty=0.1,
                       keep_consistency_penalty=0.0, bootstrap_truncated=True, norm_adv=False),
        # traj, turn, switch, done, reward, valid, has_subgoal, has_switch, subgoal_changed,
        # VL, VH, VT
        "rows": [
            ("t4", 1, 1, 0, 0, 1, 1, 1, 0, -0.517, -0.997, 0.249),
            ("t1", 1, 0, 0, -0.167, 0, 0, 1, 0, 0.917, 2.186, 1.52),
            ("t4", 3, 1, 0, -0.594, 0, 1, 1, 0, 0.988, -1.273, 0.314),
            ("t1", 2, 0, 0, -1.396, 1, 1, 1, 0, 0.316, 0.828, -0.306),
            ("t2", 0, 1, 0, 0.741, 1, 1, 1, 0, -0.954, 0.069, 0.473),
            ("t1", 3, 1, 0, 0, 0, 0, 1, 0, -0.222, -0.201, 0.187),
            ("t4", 4, 0, 0, 1.293, 0, 1, 1, 0, 0.281, 0.369, 1.16),
            ("t3", 2, 0, 0, -0.735, 1, 1, 1, 1, -0.261, 0.389, 0.718),
            ("t0", 5, 1, 0, -0.747, 1, 1, 0, 0, 1.692, 2.042, 0.448),
            ("t0", 2, 1, 0, 0, 1, 0, 1, 0, 0.373, -0.892, 1.736),
            ("t4", 5, 1, 1, 0, 0, 1, 1, 0, 0.811, 1.044, -0.401),
            ("t3", 0, 1, 0, -0.779, 1, 0, 1, 0, 1.121, 0.409, -0.025),
            ("t0", 1, 0, 0, 0, 1, 0, 1, 0, 0.637, 0.73, -0.567),
            ("t3", 3, 0, 1, 1.071, 1, 1, 1, 0, 1.632, 1.432, -0.572),
            ("t4", 2, 0, 0, 0, 0, 1, 0, 0, 2.191, 0.901, -0.647),
            ("t1", 4, 0, 0, 0, 1, 1, 1, 0, 0.122, 0.185, 1.199),
            ("t1", 0, 0, 0, 0.023, 1, 1, 1, 0, -0.209, 0.587, 0.839),
            ("t4", 0, 1, 0, 0, 1, 1, 0, 0, 0.441, -0.1, -0.136),
            ("t5", 0, 1, 1, -1.119, 0, 1, 1, 0, 1.956, -1.029, 0.607),
            ("t0", 0, 0, 0, -0.528, 1, 0, 1, 0, -1.073, -2.363, 1.135),
            ("t0", 3, 0, 0, 0, 1, 1, 1, 0, -0.907, -0.123, -0.684),
            ("t1", 5, 0, 0, 0, 1, 1, 1, 0, -0.62, 1.225, -0.447),
            ("t0", 4, 1, 0, -0.936, 0, 0, 1, 0, -0.264, 0.538, 1.528),
            ("t3", 1, 1, 0, 0, 1, 1, 1, 0, 1.628, 0.338, -1.199),
        ],
        "expected": {
            "low": [
                -0.201524, -2.778488, -0.311948, -2.1929, 0.8364, -0.597179, 1.5516, 0.07488,
                -0.9162, -0.403636, -0.911, -1.5958, -1.7398, -0.861, -3.7367, -1.15136, -1.243212,
                -1.3383, -3.175, -0.434356, 1.0912, -0.238, 1.0658, -1.808987
            ],
            "high": [
                0.501555, 0, 1.579692, 0, 0.7341, 0, 0, 0, -0.9512, 0, -1.144, 0, 0, 0, 0, 0,
                -3.179606, -0.48132, -0.19, 0, 0, 0, 0, -0.64499
            ],
            "term": [
                -1.64013, -3.77621, 0.64134, -1.5709, 0.3301, -0.946529, 0.6726, -1.0591, 0,
                -1.57022, 0.301, -0.4498, -0.5358, 1.343, 0, -1.93181, -3.146589, 0, -1.826,
                -2.95552, 0.8682, -0.0339, -0.7262, 0.89201
            ],
            "low_return": [
                -0.718524, -1.861488, 0.676052, -1.8769, -0.1176, -0.819179, 1.8326, -0.18612,
                0.7758, -0.030636, -0.1, -0.4748, -1.1028, 0.771, -1.5457, -1.02936, -1.452212,
                -0.8973, -1.219, -1.507356, 0.1842, -0.858, 0.8018, -0.180987
            ],
            "high_return": [
                -0.495445, 0, 0.306692, 0, 0.8031, -0.759529, 0, 0, 1.0908, -0.024424, -0.1,
                -0.881144, 0, 0, 0, 0, -2.592606, -0.58132, -1.219, -1.328604, 0, 0, 0.202544,
                -0.30699
            ],
            "term_return": [
                -1.39113, -2.25621, 0.95534, -1.8769, 0.8031, -0.759529, 1.8326, -0.3411, 1.0908,
                0.16578, -0.1, -0.4748, -1.1028, 0.771, -1.5457, -0.73281, -2.307589, -0.8973,
                -1.219, -1.82052, 0.1842, -0.4809, 0.8018, -0.30699
            ],
        },
    },
    {
        "kwargs": dict(gamma=1.0, lam=1.0, lam_seg=0.95, keep_penalty=-0.3,
                       keep_penalty_mode="normalized", invalid_penalty=0.1,
                       keep_consistency_penalty=-0.3, bootstrap_truncated=True, norm_adv=True),
        # traj, turn, switch, done, reward, valid, has_subgoal, has_switch, subgoal_changed,
        # VL, VH, VT
        "rows": [
            ("t1", 0, 0, 0, 0, 1, 1, 1, 0, 0.089, -0.748, 0.009),
            ("t2", 1, 0, 0, 0, 1, 1, 1, 0, 1.327, -1.155, -1.201),
            ("t5", 3, 0, 0, 0, 1, 1, 1, 0, -0.108, 0.307, -1.089),
            ("t1", 2, 0, 0, 0, 0, 1, 1, 1, 0.598, 0.806, 0),
            ("t1", 3, 0, 0, 0, 1, 1, 1, 0, -1.902, -0.292, -0.689),
            ("t3", 1, 0, 0, 0.666, 1, 1, 1, 0, -1.245, 0.799, 0.424),
            ("t3", 0, 1, 0, 0.402, 1, 1, 1, 0, 1.046, 0.041, 0.156),
            ("t4", 2, 1, 1, 1.08, 1, 1, 1, 0, 0.784, -1.118, 0.735),
            ("t0", 0, 0, 1, 0.503, 1, 0, 0, 0, -1.245, 0.74, -1.424),
            ("t5", 0, 1, 0, 0, 1, 1, 1, 0, 1.001, -0.427, 1.442),
            ("t1", 1, 1, 0, 0, 1, 1, 1, 1, -0.156, -0.525, -2.22),
            ("t4", 0, 1, 0, 0, 1, 1, 1, 0, 1.263, -0.247, -0.714),
            ("t2", 2, 0, 0, -1.543, 0, 0, 1, 0, 1.357, 0.034, 0.501),
            ("t4", 1, 1, 0, 0, 0, 1, 1, 0, -0.363, -1.976, -0.926),
            ("t2", 3, 0, 1, -1.242, 0, 1, 1, 0, -0.574, -1.968, 1.392),
            ("t5", 4, 1, 0, 0.521, 1, 1, 1, 1, -0.595, 0.87, -1.087),
            ("t1", 4, 1, 1, 0, 0, 1, 1, 0, 1.093, 1.405, 0.54),
            ("t5", 2, 0, 0, 0, 1, 1, 1, 0, 0.5, -0.379, -0.649),
            ("t5", 1, 0, 0, 0, 1, 1, 1, 0, -1.868, 1.344, -2.359),
            ("t2", 0, 0, 0, 0, 1, 1, 0, 0, -0.844, -1.912, 1.327),
        ],
        "expected": {
            "low": [
                -0.121337, -2.032938, 0.666463, 0.354213, 1.818966, 0.467533, -0.467236, 0.358667,
                1.077187, 0.058293, 0.727329, -1.390625, -2.01067, -0.210905, -0.204966, 0.470008,
                -0.378164, 0.335903, 1.478015, -0.995735
            ],
            "high": [
                -0.365565, 0, 0, 0, 0, 0, 0.214786, 1.174834, 0, 0.735274, -0.488562, 0.257384, 0,
                1.660933, 0, -0.082979, -1.602555, 0, 0, -1.50355
            ],
            "term": [
                -0.438433, -1.191527, 0.888397, 0.348724, 0.960247, -0.051507, 0.305082, 0.061324,
                0, -0.522524, 1.530257, -0.793957, -2.057453, -0.277702, -1.617305, 1.196554,
                -0.462915, 0.622286, 1.500453, 0
            ],
            "low_return": [
                -0.585, -3.21, 0.81, 0.885, 1.345, -0.729, -0.327, 1.08, 0.503, 0.69, 0.885,
                -1.976, -3.135, -1.218, -1.417, -0.074, -0.1, 0.75, 0.69, -3.285
            ],
            "high_return": [
                -0.603763, 0, 0, 0, 0, 0, 0.959, 1.08, 0.503, 1.18495, -0.54475, 0.727795, 0,
                0.8701, 0, 1.391, -0.1, 0, 0, -3.285
            ],
            "term_return": [
                -0.585, -3.21, 0.81, 0.885, 1.345, 0.557, 0.959, 1.08, 0.503, 0.69, 0.885, -1.976,
                -3.135, -1.218, -1.417, 1.391, -0.1, 0.75, 0.69, -3.285
            ],
        },
    },
    {
        "kwargs": dict(gamma=0.95, lam=0.9, lam_seg=0.95, keep_penalty=-3.5,
                       keep_penalty_mode="normalized", invalid_penalty=0.1,
                       keep_consistency_penalty=-0.3, bootstrap_truncated=False, norm_adv=True),
        # traj, turn, switch, done, reward, valid, has_subgoal, has_switch, subgoal_changed,
        # VL, VH, VT
        "rows": [
            ("t4", 2, 0, 0, -1.516, 1, 1, 1, 0, 1.132, -0.263, -1.056),
            ("t5", 0, 0, 0, -0.09, 1, 1, 1, 0, 0.177, 1.611, -0.542),
            ("t3", 1, 0, 0, 0, 1, 1, 1, 0, -0.678, -3.329, 0.275),
            ("t4", 3, 1, 0, 1.955, 1, 1, 1, 0, -2.77, 0.805, -0.631),
            ("t1", 1, 1, 1, -2.248, 1, 1, 1, 0, -0.268, 0.841, 1.086),
            ("t0", 2, 0, 1, 0.668, 0, 1, 1, 1, 0.286, 0.745, -0.23),
            ("t0", 0, 0, 0, 0, 1, 1, 1, 0, -0.46, -0.058, 2.078),
            ("t4", 4, 1, 0, 0.766, 1, 0, 1, 0, -0.1, -2.869, 1.823),
            ("t4", 0, 0, 0, 0, 0, 1, 0, 0, 0.359, -0.382, -0.635),
            ("t3", 2, 1, 0, 0, 1, 1, 1, 0, 1.118, -1.606, -0.873),
            ("t3", 3, 0, 0, 0, 1, 1, 0, 1, 1.233, -0.731, -0.531),
            ("t1", 0, 0, 0, 1.976, 1, 1, 1, 0, 0.255, 1.064, -0.99),
            ("t4", 1, 1, 0, -0.198, 0, 1, 1, 0, 0.619, 0.72, 1.542),
            ("t3", 4, 1, 1, 0, 0, 1, 0, 0, 0.576, -1.816, 0.955),
            ("t0", 1, 0, 0, 0, 1, 1, 1, 0, -1.844, 0.613, -1.594),
            ("t3", 0, 0, 0, 0, 0, 1, 1, 0, -0.563, 1.128, 0.322),
            ("t2", 0, 0, 0, 1.476, 1, 1, 1, 0, 1.048, 1.334, -0.197),
            ("t2", 1, 1, 1, 0, 1, 1, 1, 0, -0.488, 0.32, 0.251),
            ("t5", 1, 0, 0, 0, 1, 1, 1, 0, 0.422, 0.539, 1.246),
        ],
        "expected": {
            "low": [
                -0.798568, -1.361763, -0.143202, 2.101673, -0.416791, 0.08655, -0.754149, 1.38435,
                0.535675, -1.271738, -1.668729, 1.323563, -0.461268, 0.408468, 0.795874, -0.558796,
                0.192028, 1.145126, -0.538301
            ],
            "high": [
                0, -1.780486, 0, 1.518147, -0.801085, 0, -0.771597, 0, 0.413825, 0.929529, 0,
                -0.674274, 0.241047, 1.523451, 0, -1.059781, -0.077262, 0.538486, 0
            ],
            "term": [
                0.689517, -0.761926, -0.501767, 0.834194, -0.973256, 0.534815, -2.008713, 0.315092,
                0, -0.057742, 0, 2.053231, -0.908011, 0, 0.671892, -0.918041, 1.041592, 0.771135,
                -0.782012
            ],
            "low_return": [
                -1.45125, -3.29616, -2.2257, -0.77055, -2.248, -0.898667, -2.973064, 0.766, -0.116,
                -2.212911, -2.7252, 1.02495, -1.431279, -0.1, -1.907857, -2.767383, 0.03, 0, -1.75
            ],
            "high_return": [
                0, -3.5025, 0, 2.510038, -2.248, 0, -3.086046, 0.766, -0.959685, -1.117684, 0,
                -1.762872, -0.214831, -0.1, 0, -2.495745, -0.2588, 0, 0
            ],
            "term_return": [
                -1.45125, -3.5025, -2.2257, -0.77055, -2.248, -0.898667, -3.086047, 0.766, -0.116,
                -2.58894, -2.7252, 1.02495, -1.676687, -0.1, -2.0204, -2.914415, 0.03, 0, -1.75
            ],
        },
    },
    {
        "kwargs": dict(gamma=0.9, lam=0.95, lam_seg=0.9, keep_penalty=-0.3,
                       keep_penalty_mode="normalized", invalid_penalty=0.1,
                       keep_consistency_penalty=-0.3, bootstrap_truncated=True, norm_adv=True),
        # dones on any turn, not only the last
        # traj, turn, switch, done, reward, valid, has_subgoal, has_switch, subgoal_changed,
        # VL, VH, VT
        "rows": [
            ("t0", 0, 0, 1, 0, 1, 1, 0, 0, -0.418, -1.585, -0.648),
            ("t4", 1, 0, 0, 0, 0, 0, 1, 0, 1.107, -0.359, -0.619),
            ("t4", 0, 0, 1, 2.077, 1, 1, 1, 0, -0.702, -1.61, -0.621),
            ("t0", 1, 1, 1, 0.619, 1, 0, 0, 0, -0.088, -0.18, 0.202),
            ("t1", 1, 0, 1, 0, 0, 0, 1, 0, 0.755, 1.369, -0.992),
            ("t3", 0, 1, 0, 0, 1, 0, 0, 0, -0.494, -0.511, 0.047),
            ("t0", 2, 0, 0, 0, 1, 1, 1, 0, -0.715, 2.223, -1.209),
            ("t1", 3, 0, 0, 0, 1, 1, 1, 0, 0.476, 1.334, 1.059),
            ("t1", 2, 0, 0, 0, 1, 0, 1, 0, 0.626, 0.116, 0.569),
            ("t2", 1, 1, 0, 0, 1, 0, 1, 0, -0.175, 0.151, -0.595),
            ("t1", 0, 1, 1, 0.394, 1, 1, 1, 0, -1.106, 0.838, 2.088),
            ("t2", 0, 1, 1, 1.585, 1, 1, 0, 0, -1.429, -0.565, -1.543),
        ],
        "expected": {
            "low": [
                -0.184345, -0.76187, 1.782151, 0.146666, -1.246303, -0.412904, -0.479192,
                -0.559264, -0.7761, -0.440049, 0.821452, 2.109758
            ],
            "high": [0.12604, 0, 0.693935, 0, 0, 0, 0, 0, 0, 0, -1.668238, 0.848263],
            "term": [
                0, -1.270157, 0.922488, 0, 1.215779, 0, 0.847376, -0.538683, -0.176101, 0.621625,
                -1.622327, 0
            ],
            "low_return": [
                -0.1, 0.7463, 1.927, 0.619, -0.175, -0.4446, -0.7435, 0.3534, 0.248577, -0.1575,
                0.394, 1.585
            ],
            "high_return": [-0.1, 0, 0.3979, 0.3832, 0, -0.4599, 0, 0, 0, 0.1359, 0.670887, 1.585],
            "term_return": [
                -0.1, -1.699, 0.3979, 0.3832, 0.307652, -0.4599, -0.262, 0.6792, 0.53628, 0.1359,
                0.670887, 1.585
            ],
        },
    },
]


@pytest.mark.parametrize("case", range(len(AUTHORS_CASES)))
def test_matches_the_authors_function(case):
    spec = AUTHORS_CASES[case]
    cols = list(zip(*spec["rows"]))
    traj, turn, switch, done, reward, valid, has_sub, has_sw, changed, vl, vh, vt = cols
    res = hae_advantages(traj, turn, reward, done, switch, vl, vh, vt, valid=valid,
                         subgoal_changed=changed, has_subgoal=has_sub, has_switch=has_sw,
                         **spec["kwargs"])
    expected = spec["expected"]
    # the authors' token outputs show a level only where its tokens are
    close(np.where(res.high_mask, res.high, 0), expected["high"], atol=2e-5)
    close(np.where(res.term_mask, res.term, 0), expected["term"], atol=2e-5)
    for name in ("low", "low_return", "high_return", "term_return"):
        close(getattr(res, name), expected[name], atol=2e-5)


# ----------------------------------------------------------------------------------------------
# A plain loop transcription of the design's sections 2.2-2.5 and 2.7 (float64)


def reference_hae(traj, turn, reward, done, switch, vl, vh, vt, valid, changed, has_sub, has_sw, *,
                  gamma, lam, lam_seg, keep_penalty, keep_penalty_mode, invalid_penalty,
                  keep_consistency_penalty, bootstrap_truncated, norm_adv):
    n = len(traj)
    episodes = {}
    for i in range(n):
        episodes.setdefault(traj[i], []).append(i)
    r = [float(x) for x in reward]
    low, low_ret = [0.0] * n, [0.0] * n
    high, high_ret = [0.0] * n, [0.0] * n
    term_ret = [0.0] * n
    starts = [False] * n
    for rows in episodes.values():
        rows = sorted(rows, key=lambda i: turn[i])
        T = len(rows)
        # 2.2 shaping, in order: keep, invalid, consistency
        for pos, i in enumerate(rows):
            keep = not switch[i]
            if keep_penalty != 0.0 and keep:
                if keep_penalty_mode == "fixed":
                    r[i] += keep_penalty
                elif T >= 2:
                    r[i] += keep_penalty / T
            if not valid[i]:
                r[i] -= invalid_penalty
            if (keep_consistency_penalty != 0.0 and pos >= 1 and keep and changed[i]
                    and has_sub[i] and has_sub[rows[pos - 1]]):
                r[i] += keep_consistency_penalty
        # segments
        bounds = [pos for pos in range(T) if pos == 0 or switch[rows[pos]]]
        segs = [(s, (bounds[k + 1] - 1) if k + 1 < len(bounds) else T - 1)
                for k, s in enumerate(bounds)]
        for s, _ in segs:
            starts[rows[s]] = True
        a_high_next = 0.0
        for k in range(len(segs) - 1, -1, -1):
            s, e = segs[k]
            has_next = k + 1 < len(segs)
            vh_next = vh[rows[segs[k + 1][0]]] if has_next else None
            # 2.3 low level
            a_next = 0.0
            for t in range(e, s - 1, -1):
                i = rows[t]
                nd = 0.0 if done[i] else 1.0
                if t < e:
                    v_next = vl[rows[t + 1]]
                elif nd == 0.0:
                    v_next = 0.0
                elif has_next:
                    v_next = vh_next
                elif bootstrap_truncated:
                    v_next = vl[i]
                else:
                    v_next = 0.0
                delta = r[i] + gamma * nd * v_next - vl[i]
                a_next = delta + gamma * lam * nd * a_next
                low[i], low_ret[i] = a_next, a_next + vl[i]
            # 2.4 high level
            d = e - s + 1
            seg_return = sum(gamma ** j * r[rows[s + j]] for j in range(d))
            nd = 0.0 if done[rows[e]] else 1.0
            if nd == 0.0:
                boot = 0.0
            elif has_next:
                boot = vh_next
            elif bootstrap_truncated:
                boot = vh[rows[s]]
            else:
                boot = 0.0
            delta = seg_return + gamma ** d * nd * boot - vh[rows[s]]
            a_high_next = delta + gamma ** d * lam_seg * nd * a_high_next
            high[rows[s]], high_ret[rows[s]] = a_high_next, a_high_next + vh[rows[s]]
            # 2.5 termination level
            g = boot
            for t in range(e, s - 1, -1):
                g = r[rows[t]] + gamma * g
                term_ret[rows[t]] = g
    term = [term_ret[i] - vt[i] for i in range(n)]
    out = {"rewards": r, "low_raw": low, "high_raw": high, "term_raw": term, "low_return": low_ret,
           "high_return": high_ret, "term_return": term_ret, "has_high": starts}
    # 2.7 normalization: statistics over the rows carrying the level's tokens
    stat_rows = {"low": [True] * n, "high": [starts[i] and has_sub[i] for i in range(n)],
                 "term": list(has_sw)}
    for level, values in (("low", low), ("high", high), ("term", term)):
        x = np.array(values, np.float64)
        sel = np.array(stat_rows[level], bool)
        if norm_adv and sel.any():
            x = (x - x[sel].mean()) / (x[sel].std() + 1e-8)
        if level == "high":
            x = np.where(starts, x, 0.0)
        out[level] = x
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def random_batch(seed: int, dones_anywhere: bool = False):
    """Rows of a random batch in a random order, and random options. Dones on last turns only
    (or none), or with `dones_anywhere` on any turn (the formulas read a done wherever it is)."""
    rng = np.random.RandomState(seed)
    rows = []
    for e in range(rng.randint(1, 9)):
        length = rng.randint(1, 10)
        ends_done = rng.rand() < 0.5
        p_switch = rng.choice([0.0, 0.3, 0.7, 1.0])
        for t in range(length):
            done = (rng.rand() < 0.3) if dones_anywhere else (ends_done and t == length - 1)
            rows.append((f"ep{e}", t, rng.rand() < p_switch, done,
                         rng.randn() if rng.rand() < 0.4 else 0.0, rng.rand() < 0.8,
                         rng.rand() < 0.9, rng.rand() < 0.85, rng.rand() < 0.4,
                         rng.randn(), rng.randn(), rng.randn()))
    rows = [rows[i] for i in rng.permutation(len(rows))]
    cols = [list(c) for c in zip(*rows)]
    options = dict(gamma=float(rng.choice([1.0, 0.95, 0.7])),
                   lam=float(rng.choice([1.0, 0.9, 0.5])),
                   lam_seg=float(rng.choice([0.95, 0.8, 1.0])),
                   keep_penalty=float(rng.choice([0.0, -0.3, -3.5])),
                   keep_penalty_mode=str(rng.choice(["normalized", "fixed"])),
                   invalid_penalty=float(rng.choice([0.0, 0.1])),
                   keep_consistency_penalty=float(rng.choice([0.0, -0.3])),
                   bootstrap_truncated=bool(rng.rand() < 0.5), norm_adv=bool(rng.rand() < 0.5))
    return cols, options


def run_hae(cols, options, order=None):
    traj, turn, switch, done, reward, valid, has_sub, has_sw, changed, vl, vh, vt = (
        [c[i] for i in order] if order is not None else c for c in cols)
    return hae_advantages(traj, turn, reward, done, switch, vl, vh, vt, valid=valid,
                          subgoal_changed=changed, has_subgoal=has_sub, has_switch=has_sw,
                          **options)


@pytest.mark.parametrize("seed, dones_anywhere", [(s, False) for s in range(12)]
                         + [(s, True) for s in range(12, 16)])
def test_matches_the_loop_reference(seed, dones_anywhere):
    cols, options = random_batch(seed, dones_anywhere)
    traj, turn, switch, done, reward, valid, has_sub, has_sw, changed, vl, vh, vt = cols
    ref = reference_hae(traj, turn, reward, done, switch, vl, vh, vt, valid, changed, has_sub,
                        has_sw, **options)
    res = run_hae(cols, options)
    for name, expected in ref.items():
        scale = max(1.0, float(np.abs(expected).max()))
        close(getattr(res, name), expected, atol=2e-5 * scale)
    np.testing.assert_array_equal(res.high_mask, (ref["has_high"] > 0) & np.array(has_sub, bool))
    np.testing.assert_array_equal(res.term_mask, np.array(has_sw, bool))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_row_order_does_not_matter(seed):
    cols, options = random_batch(seed)
    res = run_hae(cols, options)
    order = np.random.RandomState(100 + seed).permutation(len(cols[0]))
    shuffled = run_hae(cols, options, order)
    for f in ("low", "high", "term", "low_return", "high_return", "term_return", "rewards",
              "has_high", "segment_end", "high_mask", "term_mask"):
        np.testing.assert_allclose(getattr(shuffled, f), getattr(res, f)[order], rtol=1e-6,
                                   atol=1e-6, err_msg=f)
    # integer trajectory ids and NumPy inputs give the same numbers
    as_int = [np.array([int(t[2:]) for t in cols[0]])] + [np.asarray(c) for c in cols[1:]]
    close(run_hae(as_int, options).low, res.low, atol=1e-6)


def test_object_arrays_as_verl_holds_them():
    cols, options = random_batch(4)
    as_objects = [np.array(c, dtype=object) for c in cols]
    res, ref = run_hae(as_objects, options), run_hae(cols, options)
    for f in ("low", "high", "term", "low_return", "high_return", "term_return"):
        np.testing.assert_array_equal(getattr(res, f), getattr(ref, f))


# ----------------------------------------------------------------------------------------------
# Quirks


def one_trajectory(switch, rewards=None, done_last=False, vl=None, vh=None, vt=None, **kw):
    n = len(switch)
    return hae_advantages(["x"] * n, list(range(n)), rewards or [0.0] * n,
                          [0] * (n - 1) + [int(done_last)], switch,
                          vl or [0.0] * n, vh or [0.0] * n, vt or [0.0] * n, norm_adv=False,
                          **{"invalid_penalty": 0.0, **kw})


def test_turn_zero_is_a_boundary_even_when_keep():
    kw = dict(rewards=[1.0, 0.5, 2.0], vl=[0.3, 0.2, 0.1], vh=[0.7, 0.0, 0.0], gamma=0.9)
    keep = one_trajectory([False, False, False], **kw)
    switch = one_trajectory([True, False, False], **kw)
    np.testing.assert_array_equal(keep.has_high, [True, False, False])
    for f in ("low", "high", "term", "high_return"):
        np.testing.assert_array_equal(getattr(keep, f), getattr(switch, f))
    close(keep.high[0], 1.0 + 0.9 * 0.5 + 0.81 * 2.0 - 0.7)
    # the keep penalty sees turn 0's KEEP (normalized: p/T on each KEEP row; fixed: p)
    close(one_trajectory([False, True, False], keep_penalty=-0.3).rewards, [-0.1, 0, -0.1])
    close(one_trajectory([True, True, False], keep_penalty=-0.3).rewards, [0, 0, -0.1])
    close(one_trajectory([False, True, False], keep_penalty=-0.3,
                         keep_penalty_mode="fixed").rewards, [-0.3, 0, -0.3])


def test_bootstrap_truncated_reads_different_heads_per_level():
    # segments [0, 1] and [2, 3]; the last turn is not done
    kw = dict(rewards=[0.0, 0.0, 1.0, 2.0], vl=[0.1, 0.2, 0.3, 0.4], vh=[5.0, 0.0, 7.0, 9.0],
              vt=[0.0, 0.0, 0.5, 0.25], gamma=0.9, lam=1.0, lam_seg=1.0)
    on = one_trajectory([True, False, True, False], bootstrap_truncated=True, **kw)
    off = one_trajectory([True, False, True, False], bootstrap_truncated=False, **kw)
    # low: the last row bootstraps from its own VL
    close(on.low[3], 2.0 + 0.9 * 0.4 - 0.4, atol=1e-6)
    close(off.low[3], 2.0 - 0.4, atol=1e-6)
    # high and term: from VH of the segment's own start (7.0), not VH on the last row (9.0)
    close(on.high[2], 1.0 + 0.9 * 2.0 + 0.81 * 7.0 - 7.0, atol=1e-6)
    close(off.high[2], 1.0 + 0.9 * 2.0 - 7.0, atol=1e-6)
    close(on.term_return[2:], [1.0 + 0.9 * (2.0 + 0.9 * 7.0), 2.0 + 0.9 * 7.0], atol=1e-6)
    close(off.term_return[2:], [1.0 + 0.9 * 2.0, 2.0], atol=1e-6)
    # the first segment bootstraps from the next start's VH either way
    close(on.low[1], 0.9 * 7.0 - 0.2, atol=1e-6)
    np.testing.assert_array_equal(on.low[:2], off.low[:2])
    # a done last turn is not bootstrapped
    done = one_trajectory([True, False, True, False], bootstrap_truncated=True, done_last=True,
                          **kw)
    close(done.low[3], 2.0 - 0.4, atol=1e-6)
    close(done.term_return[3], 2.0, atol=1e-6)


def test_normalized_keep_penalty_per_trajectory_length():
    res = hae_advantages(["a"] * 4 + ["b"] + ["c"] * 2, [0, 1, 2, 3, 0, 0, 1],
                         [0.0] * 7, [0] * 7, [False, False, True, False, False, False, True],
                         [0.0] * 7, [0.0] * 7, [0.0] * 7, keep_penalty=-1.0, invalid_penalty=0.0,
                         norm_adv=False)
    close(res.rewards, [-0.25, -0.25, 0, -0.25, 0.0, -0.5, 0], atol=1e-7)  # 1-row "b": none
    fixed = hae_advantages(["a"] * 4 + ["b"] + ["c"] * 2, [0, 1, 2, 3, 0, 0, 1],
                           [0.0] * 7, [0] * 7, [False, False, True, False, False, False, True],
                           [0.0] * 7, [0.0] * 7, [0.0] * 7, keep_penalty=-1.0, invalid_penalty=0.0,
                           keep_penalty_mode="fixed", norm_adv=False)
    close(fixed.rewards, [-1, -1, 0, -1, -1, -1, 0], atol=0)


def test_consistency_penalty_rows():
    # changed is read on KEEP rows of turn >= 1 whose span and previous span exist
    res = one_trajectory([False, False, True, False, False, False],
                         subgoal_changed=[1, 1, 1, 1, 1, 1], has_subgoal=[1, 1, 1, 1, 0, 1],
                         keep_consistency_penalty=-0.3)
    close(res.rewards, [0, -0.3, 0, -0.3, 0, 0], atol=1e-7)


def test_invalid_penalty_and_v_high_off_starts():
    res = one_trajectory([True, False], valid=[True, False], invalid_penalty=0.1,
                         vh=[1.0, float("nan")])
    close(res.rewards, [0, -0.1], atol=1e-7)
    assert np.isfinite(res.low).all() and np.isfinite(res.high).all()


def test_level_without_statistics_rows_stays_raw():
    """No segment start with a sub-goal span, no switch span: those levels keep their raw
    values; the low level is still normalized."""
    kw = dict(traj_ids=["x", "x"], turn_ids=[0, 1], rewards=[1.0, 2.0], dones=[0, 1],
              new_segment=[True, True], v_low=[0.5, 0.25], v_high=[0.3, 0.0],
              v_term=[0.1, 0.2], has_subgoal=[0, 0], has_switch=[0, 0], invalid_penalty=0.0)
    res = hae_advantages(**kw)
    assert not res.high_mask.any() and not res.term_mask.any()
    np.testing.assert_array_equal(res.high, res.high_raw)
    np.testing.assert_array_equal(res.term, res.term_raw)
    close(res.low, (res.low_raw - res.low_raw.mean()) / (res.low_raw.std() + 1e-8), atol=1e-6)


def test_empty_batch_and_buckets():
    empty = hae_advantages([], [], [], [], [], [], [], [])
    assert empty.low.shape == (0,) and empty.has_high.shape == (0,)
    traj, turn = ["a", "b", "b", "c"], [0, 0, 1, 0]
    sizes = []
    for k in (1, 2, 3, 4):  # every one in the smallest [E, T] bucket: compiled once
        hae_advantages(traj[:k], turn[:k], [1.0] * k, [0] * k, [True] * k, [0.0] * k,
                       [0.0] * k, [0.0] * k, gamma=0.9 + 0.01 * k, norm_adv=k % 2 == 0)
        sizes.append(hae_device._cache_size())
    assert len(set(sizes)) == 1


# ----------------------------------------------------------------------------------------------
# Input errors


def good_inputs(**override):
    kw = dict(traj_ids=["a", "a", "b"], turn_ids=[0, 1, 0], rewards=[0.0, 1.0, 0.0],
              dones=[0, 1, 1], new_segment=[1, 0, 1], v_low=[0.0] * 3, v_high=[0.0] * 3,
              v_term=[0.0] * 3)
    kw.update(override)
    return kw


@pytest.mark.parametrize("override, message", [
    (dict(rewards=[0.0, 1.0]), "rewards must be 1-D of length N=3"),
    (dict(traj_ids=["a", "a"]), "traj_ids has 2 rows, turn_ids 3"),
    (dict(v_term=[[0.0] * 3]), "v_term must be 1-D"),
    (dict(valid=[1, 0]), "valid must be 1-D of length N=3"),
    (dict(turn_ids=[0, 2, 0]), "turns must be exactly 0..n-1"),
    (dict(turn_ids=[1, 2, 0]), "turns must be exactly 0..n-1"),
    (dict(turn_ids=[0, 0, 0]), "appears 2 times"),
    (dict(turn_ids=[0, -1, 0]), "must be >= 0"),
    (dict(turn_ids=[0, 0.5, 0]), "turn_ids must be integers"),
    (dict(rewards=[0.0, float("nan"), 0.0]), "rewards must be finite"),
    (dict(v_low=[0.0, float("inf"), 0.0]), "v_low must be finite"),
    (dict(v_high=[float("nan"), 0.0, 0.0]), r"v_high \(on segment starts\) must be finite"),
    (dict(dones=[0, 2, 1]), "dones must be booleans"),
    (dict(rewards=["x", "y", "z"]), "rewards must be numbers"),
    (dict(keep_penalty_mode="ratio"), "keep_penalty_mode must be one of"),
    (dict(gamma=float("nan")), "gamma must be finite"),
    (dict(lam_seg="high"), "lam_seg must be a number"),
])
def test_bad_inputs(override, message):
    with pytest.raises(ValueError, match=message):
        hae_advantages(**good_inputs(**override))


def test_duplicated_rows_are_an_error_not_an_extra_turn():
    """The authors' trainer pads its batch with duplicated rows before HAE (they become extra
    turns); here that is an error: pad with inert rows after HAE."""
    kw = good_inputs()
    dup = {k: (v + [v[1]] if isinstance(v, list) else v) for k, v in kw.items()}
    with pytest.raises(ValueError, match="pad with inert rows after HAE"):
        hae_advantages(**dup)
