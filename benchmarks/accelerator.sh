#!/usr/bin/env bash
# The speed benchmarks of a GPU or TPU machine in one command (benchmarks/README.md, "Accelerators"):
#
#   bash benchmarks/accelerator.sh [OUT_DIR]
#
# installs the project (launch/setup.sh, without TensorFlow) and the JAX build for the accelerator it
# finds (CUDA 13 for an NVIDIA driver >= 580, else CUDA 12; TPU on a TPU VM / Colab TPU), then runs
# python -m benchmarks.accelerator: cost against the cohort (table + plot), vmap over sequential at
# 16/50/100/500 clients (cifar_cnn) and 10/50/100/500 (char_lstm, the Shakespeare round), the
# executors' agreement, and a 200-round paper-regime run.
# SMOKE=1: toy sizes (CI runs this on its CPU); SKIP_INSTALL=1: use what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results/accelerator-$(date +%Y%m%d-%H%M)}"
if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  SKIP_TFDS=1 bash launch/setup.sh
  JAX_VERSION="$(python3 -c 'import jax; print(jax.__version__)')"
  if python3 -c 'import jax, sys; sys.exit(jax.default_backend() == "cpu")' 2>/dev/null; then
    :  # JAX already sees the accelerator
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | cut -d. -f1)"
    CUDA="cuda12"; [ "${DRIVER:-0}" -ge 580 ] && CUDA="cuda13"
    python3 -m pip install -q "jax[${CUDA}]==${JAX_VERSION}"
  elif [ -e /dev/accel0 ] || [ -e /dev/vfio/0 ] || [ -n "${TPU_ACCELERATOR_TYPE:-}${COLAB_TPU_ADDR:-}" ]; then
    python3 -m pip install -q "jax[tpu]==${JAX_VERSION}"
  fi
fi
SMOKE_FLAG=""; [ "${SMOKE:-0}" = "1" ] && SMOKE_FLAG="--smoke"
python3 -m benchmarks.accelerator --out="${OUT}" ${SMOKE_FLAG}
