#!/usr/bin/env bash
# The first command on a lent GPU machine, prepared so that device time only runs:
#
#   bash benchmarks/device/payload.sh     # here: .whl and .device_data (checks the 64 MiB)
#   bash benchmarks/device/tree.sh slim   # here, only if payload.sh says over 64 MiB
#   device run, carry [.whl, .device_data], timeout_s 600:
#     bash benchmarks/device/first_call.sh $OUT
#
# 1. benchmarks/device/setup.sh: the carried wheels and Fashion-MNIST;
# 2. benchmarks/accelerator.sh with SKIP_INSTALL=1 (the image's JAX sees the GPU): the conv sweep,
#    pfl-research's CIFAR-10 setup, the executors' agreement, the 200-round paper regime, the cohort
#    scaling and the top-k masks if time is left (~6 minutes; its own budget skips the last steps on
#    a slower device);
# 3. launch/colab_tpu.ipynb run end to end by launch/run_notebook.py (the default experiment:
#    Fashion-MNIST (1000, 2), DP2-FedSAM, eps 2, 40 rounds), the project installed by its install
#    cell from a wheel built there, its executed copy kept;
# 4. $OUT: accelerator.tar.gz (the results folder without checkpoints; unpack it into
#    benchmarks/results/), colab_tpu_executed.ipynb, first_call.log. The tool brings back at most
#    8 files, 2 folders down: hence the archive.
# A step that fails is logged and the next one runs; the exit status is the first failure's.
# SMOKE=1 (a CPU check of this script): the accelerator's toy sizes and 2 rounds of the notebook.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bash benchmarks/device/first_call.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/first_call.log") 2>&1
START=$(date +%s)
status=0
step() { echo "== $1 after $(( $(date +%s) - START )) s"; }
failed() { local rc=$?; [ "$status" != 0 ] || status=$rc; }  # keeps the first failure's status

step setup
source benchmarks/device/setup.sh || exit 1
export PYTHONUNBUFFERED=1

step accelerator
RESULTS=/tmp/accelerator_results
SKIP_INSTALL=1 bash benchmarks/accelerator.sh "$RESULTS" || failed
(cd "$(dirname "$RESULTS")" && tar czf "$OUT/accelerator.tar.gz" --exclude=checkpoints \
    "$(basename "$RESULTS")") || failed

step notebook
# As a Colab user runs it: the install cell installs the project's wheel (built here from the
# checkout) into a virtual environment over the image's packages, and every cell runs from outside
# the checkout, so the cells after the install import the installed copy. On the lent machine (the
# carried .whl/) pip reads no index: the build's setuptools and the dependencies come from .whl/
# and the image (which must hold matplotlib).
CHECKOUT=$PWD
NOTEBOOK_TMP=$(mktemp -d)
OFFLINE=()
if compgen -G '.whl/*.whl' > /dev/null; then
  OFFLINE=(PIP_NO_INDEX=1 "PIP_FIND_LINKS=$CHECKOUT/.whl" PYTHONPATH=/tmp/site)  # setup.sh's site
fi
env "${OFFLINE[@]}" python3 -m pip wheel -q --no-deps -w "$NOTEBOOK_TMP/wheel" . || failed
python3 -m venv --system-site-packages --without-pip "$NOTEBOOK_TMP/venv" || failed
WHEEL=$(ls "$NOTEBOOK_TMP"/wheel/*.whl 2>/dev/null | head -1)
SETS=("--set=INSTALL_FROM='$WHEEL'" "--set=WORKDIR='$NOTEBOOK_TMP/colab/dp2fedsam'"
      "--set=REPORT_ROOT='$NOTEBOOK_TMP/colab'" "--set=REPORT_DIR='$NOTEBOOK_TMP/colab_report'")
if [ "${SMOKE:-0}" = 1 ]; then SETS+=("--set=OVERRIDES={'num_rounds': 2, 'eval_every': 1}"); fi
(cd "$NOTEBOOK_TMP" && env -u PYTHONPATH "${OFFLINE[@]}" "$NOTEBOOK_TMP/venv/bin/python" \
     "$CHECKOUT/launch/run_notebook.py" --out="$OUT/colab_tpu_executed.ipynb" "${SETS[@]}") || failed

step "done (exit $status)"
exit "$status"
