#!/bin/bash
set -e
cd /work/main
H=.venv/bin/hgpo-jax
export XLA_FLAGS=--xla_force_host_platform_device_count=2
$H export runs/search_laptop/sft_more runs/probe/base --overwrite --no-progress
$H sft search_laptop_sft train.run_dir=runs/probe/sft_mix_s4 mesh.data=2 model.path=runs/probe/base sft.data=random_other:3000+expert_other:1000 sft.steps=300 optim.lr=1.5e-3 optim.warmup_steps=10 train.seed=4 --no-progress > runs/probe/sft.log 2>&1
$H export runs/probe/sft_mix_s4 runs/probe/warm --overwrite --no-progress
for s in 0 1 2; do
  $H train search_laptop_rl model.path=runs/probe/warm train.run_dir=runs/probe/rl_gigpo_s$s mesh.data=2 algo.estimator=gigpo train.seed=$s --no-progress > runs/probe/rl_s$s.log 2>&1 &
  sleep 15
done
wait
echo PROBEDONE
