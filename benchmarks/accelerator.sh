#!/usr/bin/env bash
# The speed benchmarks of a GPU or TPU machine in one command (benchmarks/README.md; on a lent
# machine without network, benchmarks/device/README.md):
#
#   bash benchmarks/accelerator.sh [OUT_DIR]
#
# installs the project (launch/setup.sh, without TensorFlow) and the JAX build for the accelerator it
# finds (CUDA 13 for an NVIDIA driver >= 580, else CUDA 12; TPU on a TPU VM / Colab TPU), then runs
# python -m benchmarks.accelerator: the conv lowering sweep of the CIFAR CNN (xla / im2col, vmap and
# sequential, bf16 and f32 precision), pfl-research's CIFAR-10 setup (FedAvg, DP-FedAvg, DP2-FedSAM),
# the executors' agreement, a 200-round paper-regime run and a 1,000-client cohort: about 6 minutes
# on one H100/H200, JSON under OUT_DIR (default benchmarks/results/<device>-<UTC date>) with a
# summary.json. SMOKE=1: toy sizes (CI runs this on its CPU); SKIP_INSTALL=1: use what is installed
# (a machine without network: the JAX build for its accelerator must already be there).
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS=()
if [ -n "${1:-}" ]; then ARGS+=("--out=$1"); fi
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
if [ "${SMOKE:-0}" = "1" ]; then ARGS+=("--smoke"); fi
python3 -m benchmarks.accelerator ${ARGS[@]+"${ARGS[@]}"}
