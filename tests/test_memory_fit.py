"""What fits, runs (hgpo_jax.trainers.memory, hgpo_jax.commands.fit): the memory fraction a run
sets from its plan, the refusal before the weights load of a run whose planned peak exceeds the
device, and the device's memory, simulated on this CPU by HGPO_JAX_DEVICE_MEMORY_GIB."""

from __future__ import annotations

import json
import os

import pytest

from hgpo_jax.trainers.memory import (CARD_80GB_BYTES, DEVICE_MEMORY_VAR, FRACTION_VAR, GIB,
                                      HEADROOM_BYTES, JAX_DEFAULT_FRACTION, MAX_FRACTION,
                                      device_memory_bytes, fits, memory_fraction, memory_keys,
                                      refusal, run_peak, smallest_gpu_bytes)


# --------------------------------------------------------------------------- the decision
def test_memory_fraction_is_the_peak_with_headroom_between_jax_default_and_the_cap():
    device = int(80 * GIB)
    assert memory_fraction(0, device) == JAX_DEFAULT_FRACTION  # a small plan never shrinks JAX's pool
    assert memory_fraction(int(20 * GIB), device) == JAX_DEFAULT_FRACTION
    assert memory_fraction(int(67 * GIB), device) == pytest.approx(68 / 80, abs=1e-4)
    assert memory_fraction(int(200 * GIB), device) == MAX_FRACTION
    fractions = [memory_fraction(int(g * GIB), device) for g in range(0, 120, 5)]
    assert fractions == sorted(fractions) and all(0 < f <= 1 for f in fractions)
    with pytest.raises(ValueError, match="device_bytes must be > 0"):
        memory_fraction(GIB, 0)


def test_fits_leaves_the_headroom_within_the_share_the_run_may_take():
    room = MAX_FRACTION * CARD_80GB_BYTES - HEADROOM_BYTES  # 74.2 GiB of an 80 GB card
    assert fits(int(room), CARD_80GB_BYTES) and not fits(int(room) + 2**20, CARD_80GB_BYTES)
    assert fits(int(66.6 * GIB), CARD_80GB_BYTES)  # the 1.5B HiPER run that the H100 ran
    assert not fits(int(66.6 * GIB), CARD_80GB_BYTES, fraction=0.75)  # JAX's default: it failed
    keys = memory_keys(int(66.6 * GIB))
    assert keys == {"memory_fraction": pytest.approx(67.6 / 79.2, abs=1e-3),
                    "device_memory_gib": 79.2, "fits_device": None, "fits_80gb": True}
    assert memory_keys(int(76 * GIB), int(141 * GIB))["fits_80gb"] is False  # an H200 present
    assert memory_keys(int(76 * GIB), int(141 * GIB))["fits_device"] is True
    assert memory_keys(int(76 * GIB), int(141 * GIB))["memory_fraction"] == JAX_DEFAULT_FRACTION


def test_the_refusal_names_the_peak_the_device_and_the_knobs():
    line = refusal(int(90 * GIB), CARD_80GB_BYTES, what="hgpo_k2_alfworld_qwen2.5_7b")
    assert "\n" not in line
    for needle in ("hgpo_k2_alfworld_qwen2.5_7b does not fit the device",
                   "peaks at 90.0 GiB per device in its update",
                   "the device has 79.2 GiB", "at most 0.95 (75.2 GiB)", "train.micro_batch_size",
                   "train.max_tokens_per_micro_batch", "mesh.fsdp", "train.remat=true",
                   f"{DEVICE_MEMORY_VAR}=0"):
        assert needle in line, (needle, line)


def test_the_run_peak_is_the_update_or_the_sampler():
    assert run_peak(60, 50) == (60, "update") and run_peak(40, 50) == (50, "sampler")
    assert run_peak(40) == (40, "update") and run_peak(60, None, kind="eval") == (60, "update")
    assert run_peak(60, 50, kind="eval") == (50, "sampler")  # eval never updates
    # eval plays with the policy alone: its own planned peak, when there is one
    assert run_peak(60, 50, kind="eval", eval_bytes=20) == (20, "sampler")
    assert run_peak(60, 50, eval_bytes=20) == (60, "update")


def test_the_plan_gives_the_evaluations_memory_beside_the_training(monkeypatch, capsys):
    """`plan --sampler`: the eval peak is the policy's weights + the larger sampler program, no
    optimizer state, reference or critic (trainers.evaluator), so below the training sampler's."""
    from hgpo_jax.cli import main

    monkeypatch.delenv(DEVICE_MEMORY_VAR, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert main(["plan", "tiny_cpu_hiper", "--sampler", "--json"]) == 0
    p = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    s, t = p["sampler"], p["train_step"]
    programs = max(s["prefill_gib"], s["decode_gib"])
    assert s["eval_peak_gib"] == pytest.approx(t["params_gib"] + programs, abs=2e-4)
    assert s["peak_gib"] == pytest.approx(s["resident_gib"] + programs, abs=2e-4)
    assert s["resident_gib"] > t["params_gib"] + t["opt_gib"]  # the critic's too
    assert main(["plan", "tiny_cpu_hiper", "--sampler"]) == 0
    assert "eval peak" in capsys.readouterr().out
    line = refusal(int(85 * GIB), CARD_80GB_BYTES, program="sampler")
    assert "in the rollout's sampler" in line and "rollout.num_groups" in line
    assert "train.remat" not in line and "mesh.fsdp" in line


# --------------------------------------------------------------------------- the device
def test_device_memory_simulated_read_from_nvidia_smi_or_none():
    smi = lambda: "81559, 459\n81559, 459\n"  # noqa: E731  two H100 80GB: 81,100 MiB usable each
    assert device_memory_bytes({}, smi) == 81100 * 2**20
    assert device_memory_bytes({DEVICE_MEMORY_VAR: "1.5"}, smi) == int(1.5 * GIB)
    assert device_memory_bytes({DEVICE_MEMORY_VAR: "0"}, smi) is None  # no plan
    assert device_memory_bytes({"JAX_PLATFORMS": "cpu"}, smi) is None  # JAX will not use the GPU
    assert device_memory_bytes({"JAX_PLATFORMS": "cuda,cpu"}, smi) == 81100 * 2**20
    assert device_memory_bytes({}, lambda: None) is None  # no nvidia-smi
    for bad in ("lots", "-1"):
        with pytest.raises(ValueError, match=DEVICE_MEMORY_VAR):
            device_memory_bytes({DEVICE_MEMORY_VAR: bad}, smi)
    # the smallest GPU; a driver that does not report its reserved memory; no GPU
    assert smallest_gpu_bytes("81559, [N/A]\n40960, 0\n") == 40960 * 2**20
    assert smallest_gpu_bytes("") is None and smallest_gpu_bytes(None) is None


# --------------------------------------------------------------------------- the commands
@pytest.fixture
def no_fraction(monkeypatch):
    """XLA_PYTHON_CLIENT_MEM_FRACTION unset, and restored as it was after the test."""
    monkeypatch.setenv(FRACTION_VAR, "0.75")
    monkeypatch.delenv(FRACTION_VAR)


@pytest.fixture
def no_weights(monkeypatch):
    """runs.load_model raises: a command that gets past its memory plan stops there."""
    import hgpo_jax.runs as runs

    def must_not_run(*a, **k):
        raise ValueError("the weights were loaded")
    monkeypatch.setattr(runs, "load_model", must_not_run)


def test_train_on_a_device_too_small_is_refused_before_the_weights_load(
        tmp_path, monkeypatch, capsys, no_fraction, no_weights):
    from hgpo_jax.cli import main

    monkeypatch.setenv(DEVICE_MEMORY_VAR, "0.5")  # under the 1 GiB headroom alone
    code = main(["train", "tiny_cpu_toy", f"train.run_dir={tmp_path}/run", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("hgpo-jax train: error: tiny_cpu_toy does not fit the device "
                           f"({DEVICE_MEMORY_VAR}): its memory plan peaks at "), line
    for needle in ("the device has 0.5 GiB", "train.max_tokens_per_micro_batch", "mesh.fsdp"):
        assert needle in line, (needle, line)
    assert FRACTION_VAR not in os.environ and not (tmp_path / "run").exists()


def test_train_sets_the_fraction_from_its_plan_and_keeps_the_users(
        tmp_path, monkeypatch, capsys, no_fraction, no_weights):
    """A simulated 1.25 GiB device: the tiny run's plan (a few MiB) + 1 GiB headroom is a share
    above JAX's default, set before JAX would start; a fraction the user set stays, and is the
    share the plan is checked against."""
    from hgpo_jax.cli import main

    monkeypatch.setenv(DEVICE_MEMORY_VAR, "1.25")
    args = ["train", "tiny_cpu_toy", f"train.run_dir={tmp_path}/run", "--no-progress"]
    assert main(args) == 2  # past the plan: stopped where the weights load
    out, err = capsys.readouterr()
    assert err.strip().endswith("the weights were loaded"), err
    (line,) = [x for x in out.splitlines() if x.startswith("memory plan: peak ")]
    fraction = float(os.environ[FRACTION_VAR])
    peak_gib = float(line.split()[3])
    assert JAX_DEFAULT_FRACTION < fraction < MAX_FRACTION, line
    assert abs(fraction - (peak_gib + 1) / 1.25) < 5e-3, line  # the line rounds the peak
    assert f"of 1.25 GiB ({DEVICE_MEMORY_VAR}) -> {FRACTION_VAR}={fraction}" in line

    monkeypatch.setenv(FRACTION_VAR, "0.9")  # the user's: kept
    assert main(args) == 2
    out, _ = capsys.readouterr()
    assert os.environ[FRACTION_VAR] == "0.9" and f"{FRACTION_VAR}=0.9 (yours)" in out

    monkeypatch.setenv(FRACTION_VAR, "0.5")  # the user's, too small for the plan: refused
    assert main(args) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "does not fit the device" in line and f"may take {FRACTION_VAR}=0.5 (0.6 GiB)" in line


def test_eval_is_refused_on_a_device_too_small(tmp_path, monkeypatch, capsys, no_fraction,
                                               no_weights):
    from hgpo_jax.cli import main

    monkeypatch.setenv(DEVICE_MEMORY_VAR, "0.5")
    assert main(["eval", "tiny_cpu_toy", f"train.run_dir={tmp_path}/run", "--no-progress"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("hgpo-jax eval: error: tiny_cpu_toy does not fit the device"), line


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_bad_model_folder_is_refused_before_the_memory_plan(tmp_path, monkeypatch, capsys,
                                                               no_fraction, command):
    """The inputs are checked before the plan's child compiles: a mistyped model.path fails at
    once on a GPU too, naming the folder, and nothing was planned."""
    from hgpo_jax.cli import main
    from hgpo_jax.commands import fit

    monkeypatch.setenv(DEVICE_MEMORY_VAR, "80")
    monkeypatch.setattr(fit, "child_plan", lambda *a: pytest.fail("planned before the checks"))
    missing = tmp_path / "no-such-model"
    code = main([command, "tiny_cpu_toy", f"model.path={missing}",
                 f"train.run_dir={tmp_path}/run", "--no-progress"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and f"model.path={missing}" in line and "is not a folder" in line, line
    assert FRACTION_VAR not in os.environ


def test_without_a_gpu_nothing_is_planned_set_or_refused(tmp_path, monkeypatch, capsys,
                                                         no_fraction, no_weights):
    from hgpo_jax.commands import fit

    monkeypatch.delenv(DEVICE_MEMORY_VAR, raising=False)
    monkeypatch.setattr(fit, "child_plan", lambda *a: pytest.fail("planned without a GPU"))
    if device_memory_bytes() is not None:
        pytest.skip("this machine has a GPU")
    from hgpo_jax.cli import main

    assert main(["train", "tiny_cpu_toy", f"train.run_dir={tmp_path}/run", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().endswith("the weights were loaded")
    assert FRACTION_VAR not in os.environ


def test_plan_reports_the_fraction_and_whether_an_80gb_card_fits(monkeypatch, capsys):
    from hgpo_jax.cli import main

    monkeypatch.delenv(DEVICE_MEMORY_VAR, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # no GPU read here: an 80 GB card's numbers
    assert main(["plan", "tiny_cpu_toy", "--json"]) == 0
    p = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert p["memory_fraction"] == JAX_DEFAULT_FRACTION and p["fits_80gb"] is True
    assert p["device_memory_gib"] == 79.2 and p["train_step"]["token_budget"] == 0
    monkeypatch.setenv(DEVICE_MEMORY_VAR, "1.25")  # the device present (simulated)
    assert main(["plan", "tiny_cpu_toy"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("  memory: peak ") and (
        "on a device of 1.25 GiB; fits this device: yes; fits an 80 GB card: yes") in line
    # a device too small: the plan says so, as train decides (text and --json)
    monkeypatch.setenv(DEVICE_MEMORY_VAR, "1.0")  # under the peak + 1 GiB headroom
    assert main(["plan", "tiny_cpu_toy"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "fits this device: NO (train and eval refuse it); fits an 80 GB card: yes" in line
    assert main(["plan", "tiny_cpu_toy", "--json"]) == 0
    p = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert p["fits_device"] is False and p["fits_80gb"] is True


@pytest.mark.parametrize("fraction", ["2", "0", "x"])
def test_a_fraction_outside_0_1_is_refused_before_the_plan(tmp_path, monkeypatch, capsys,
                                                           no_fraction, fraction):
    from hgpo_jax.cli import main
    from hgpo_jax.commands import fit

    monkeypatch.setenv(DEVICE_MEMORY_VAR, "1")
    monkeypatch.setenv(FRACTION_VAR, fraction)
    monkeypatch.setattr(fit, "child_plan", lambda *a: pytest.fail("planned before the check"))
    code = main(["train", "tiny_cpu_toy", f"train.run_dir={tmp_path}/run", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{FRACTION_VAR}='{fraction}'" in err and "a number in (0, 1]" in err
    assert not (tmp_path / "run").exists()
