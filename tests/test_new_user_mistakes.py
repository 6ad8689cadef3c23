"""What a new user's mistakes get (issue 61, item 5): each command a one-line refusal (exit 2, no
traceback, no run folder written) before anything heavy, or what the docs say it does. The
memory-plan cases (a device too small in `plan`, a memory fraction outside (0, 1]) are in
tests/test_memory_fit.py."""

from __future__ import annotations

import pytest

from hgpo_jax.cli import main


def refused(capsys, args, *needles) -> str:
    """Run `hgpo-jax ARGS`: exit 2 and one error line holding every needle; returns the line."""
    code = main(args)
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.startswith("hgpo-jax ")]
    assert code == 2 and "Traceback" not in err and lines, err
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]


@pytest.mark.parametrize("overrides, needles", [
    (["algo.keep_penalty=5"], ["algo.keep_penalty=5.0: must be <= 0"]),
    (["algo.keep_consistency_penalty=0.3"], ["algo.keep_consistency_penalty=0.3: must be <= 0"]),
])
def test_a_positive_hiper_penalty_is_refused(tmp_path, capsys, overrides, needles):
    run = tmp_path / "run"
    refused(capsys, ["train", "tiny_cpu_hiper", *overrides, f"train.run_dir={run}"], *needles)
    assert not run.exists()


GUIDED = ["guidance.kind=g2", "env.num_workers=1"]


@pytest.mark.parametrize("overrides, needles", [
    (["guidance.batch_acc_low=1.5"], ["guidance.batch_acc_low=1.5: must be in [0, 1]"]),
    (["guidance.train_no_prefix_ratio=2"], ["guidance.train_no_prefix_ratio=2.0: must be in [0, 1]"]),
    (["guidance.fixed_sigma=-0.5"], ["guidance.fixed_sigma=-0.5: must be a finite number >= 0"]),
    (["guidance.mu_global_min=0.6", "guidance.mu_global_max=0.2"],
     ["guidance.mu_global_min=0.6: must be <= guidance.mu_global_max (0.2)"]),
    (["env.max_steps=1"], ["env.max_steps=1: must be >= 2 with guidance.kind=g2"]),
])
def test_guidance_values_out_of_range_are_refused(tmp_path, capsys, overrides, needles):
    run = tmp_path / "run"
    refused(capsys, ["train", "tiny_cpu_toy", *GUIDED, *overrides, f"train.run_dir={run}"],
            *needles)
    assert not run.exists()


def test_a_guidance_option_of_another_kind_is_refused(tmp_path, capsys):
    """Prefix SFT (an option of guidance.kind=g2) without guidance names the kind that reads it;
    the old key guidance.enable still turns Agent-G²'s guidance on, with a warning."""
    run = tmp_path / "run"
    refused(capsys, ["train", "tiny_cpu_toy", "guidance.sft_coef=0.5", f"train.run_dir={run}"],
            "guidance.sft_coef=0.5: guidance.kind=none never reads it (an option of "
            "guidance.kind=g2)", "set guidance.kind=g2")
    assert not run.exists()
    from hgpo_jax.config import load_config

    with pytest.warns(UserWarning, match="guidance.enable is now guidance.kind"):
        cfg = load_config("tiny_cpu_toy", ["guidance.enable=true", "guidance.gamma=2"])
    assert cfg.guidance.kind == "g2" and cfg.guidance.sigma_gamma == 2.0


def test_the_ragged_decode_off_a_gpu_is_refused_before_the_model_loads(tmp_path, capsys):
    run = tmp_path / "run"
    refused(capsys, ["train", "tiny_cpu_toy", "rollout.decode_attention=ragged",
                     f"train.run_dir={run}"],
            "rollout.decode_attention=ragged is a Pallas GPU kernel", "backend here is cpu",
            "rollout.decode_attention=auto")
    assert not run.exists()


def test_resuming_on_another_family_is_refused_naming_both(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "tiny_cpu_toy", "train.iterations=1", "env.num_workers=1",
                 f"train.run_dir={run}", "--no-progress"]) == 0
    capsys.readouterr()
    refused(capsys, ["train", str(run), "--resume", "--allow-change",
                     "model.path=build:toy-tiny/llama", "train.iterations=2", "--no-progress"],
            f"--resume: {run} trained a qwen2 model", "is a llama of another shape",
            "model_type qwen2 -> llama")
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]


def test_demo_takes_a_model_built_on_first_use(capsys):
    assert main(["demo", "--model", "build:toy-tiny/qwen3", "--max-new-tokens", "4",
                 "--no-progress"]) == 0
    assert "reply" in capsys.readouterr().out
