#!/usr/bin/env bash
# CI: hgpo-jax as a user installs it. Build the sdist and the wheel with the standard tool
# (`python -m build`), install the wheel with its declared dependencies from the package registry
# (no --no-deps; the ALFWorld engine as the `alfworld` extra) into a fresh virtual environment
# outside the checkout, and from another folder: train the shipped `tiny_cpu` config for one
# iteration, plan `hgpo_k2_alfworld_qwen2.5_1.5b` (named configs from the package data), list
# the configs, and build a tiny model in three lines of Python.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hgpo-jax-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
"$PY" -m build --sdist --wheel --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log"; exit 1; }
wheel=$(ls "$WORK"/dist/hgpo_jax-*.whl)
ls "$WORK"/dist/hgpo_jax-*.tar.gz > /dev/null
echo "wheel check: built $(basename "$wheel") and the sdist in $(( $(date +%s) - start )) s"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "${wheel}[alfworld]" > "$WORK/pip.log" 2>&1 \
    || { grep -v "^WARNING: Location" "$WORK/pip.log" | tail -30; exit 1; }
echo "wheel check: installed with its dependencies in $(( $(date +%s) - start )) s"
archive="$ROOT/../shared/data/alfworld/json_2.1.1.tar.xz"
if [ -f "$archive" ]; then export HGPO_JAX_ALFWORLD_ARCHIVE="$archive"; fi
mkdir "$WORK/elsewhere" && cd "$WORK/elsewhere"
"$WORK/venv/bin/hgpo-jax" configs tiny_cpu > /dev/null
"$WORK/venv/bin/hgpo-jax" train tiny_cpu train.iterations=1 env.num_workers=1 \
    train.run_dir="$WORK/run" --no-progress > "$WORK/train.log" 2>&1 \
    || { tail -30 "$WORK/train.log"; exit 1; }
"$WORK/venv/bin/hgpo-jax" plan hgpo_k2_alfworld_qwen2.5_1.5b | tail -1
"$WORK/venv/bin/python" - <<'PYTHON'
from flax import nnx; from hgpo_jax.models import CausalLM, DecoderConfig; import jax.numpy as jnp
model = CausalLM(DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2), rngs=nnx.Rngs(0))
print("wheel check: a tiny model's logits", model(jnp.ones((1, 4), jnp.int32)).shape)
PYTHON
test -z "$(ls "$WORK/elsewhere")"  # nothing written in the working folder
echo "wheel check: passed in $(( $(date +%s) - start )) s"
