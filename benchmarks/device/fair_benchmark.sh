#!/usr/bin/env bash
# One block of the fair benchmark (launch/fair_benchmark.py, docs/benchmark.md) in one bounded call
# on a lent GPU machine:
#
#   BLOCK=d bash benchmarks/device/fair_benchmark.sh OUT_DIR
#
# 1. benchmarks/device/setup.sh: the carried wheels (.whl/) into /tmp/site and the carried
#    Fashion-MNIST (.device_data/) into place, without the network (benchmarks/device/payload.sh
#    builds both here: PAYLOAD=shakespeare for block (d), the default for (a), (b), (c));
# 2. starts every row of BLOCK as its own process (launch.fair_benchmark --rows=<row>), each
#    PER_ROW runs at a time: ~10 on the one GPU (XLA's preallocation off so that they share it);
#    what experiments/results holds of the block is not run again (--seed_from's default), and
#    a CPU root's searches under way continue with their secret where `benchmarks/device/tree.sh
#    stage` put them into ROOT (carry it; stop the CPU sweep first, restart it after unpacking);
# 3. at SECONDS_LEFT - STOP_MARGIN sends each SIGTERM: its runs stop at a round boundary with their
#    checkpoints, and a second call on the same warm machine resumes them from ROOT (inside the
#    working tree, ignored);
# 4. packs every run's small files into OUT_DIR/small_files.tar.gz (paths relative to ROOT) and the
#    block's plan into OUT_DIR/plan.txt. The tuner's operator files come back too: a search resumes
#    only with its secret (never committed: .gitignore; launch.fair_benchmark --publish leaves them
#    out). Here: tar xzf small_files.tar.gz -C $HOME/fair, then --publish, then commit. A second-
#    design block (e) needs no staging: its searches travel committed, in experiments/results/
#    <block>/searches/ (launch.fair_benchmark.carry_searches), and each row resumes its draw.
# Environment: BLOCK (default d: the Shakespeare block, the first to run on a GPU), SECONDS_LEFT
# (default 540), STOP_MARGIN (default 45), PER_ROW (default 3 for d's 4 rows, else 2), ROOT
# (default .device_sweeps/fair).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: BLOCK=d benchmarks/device/fair_benchmark.sh OUT_DIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
BLOCK=${BLOCK:-d}
SECONDS_LEFT=${SECONDS_LEFT:-540}
STOP_MARGIN=${STOP_MARGIN:-45}
ROOT=${ROOT:-.device_sweeps/fair}
if [ "$BLOCK" = d ]; then PER_ROW=${PER_ROW:-3}; else PER_ROW=${PER_ROW:-2}; fi
mkdir -p "$ROOT"

source benchmarks/device/setup.sh || exit 1  # the carried wheels and data (benchmarks/device/payload.sh)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1  # the rows share the one GPU

ROWS=$(python3 -c 'import sys; from launch import fair_benchmark as f
print(" ".join(r.name for r in f.load_block(sys.argv[1])[2].all_rows()))' "$BLOCK") || exit 1
PIDS=()
for row in $ROWS; do
  python3 -m launch.fair_benchmark --root="$ROOT" --blocks="$BLOCK" --rows="$row" \
      --parallel="$PER_ROW" > "$ROOT/$BLOCK.$row.log" 2>&1 &
  PIDS+=($!)
done
while [ $(( SECONDS_LEFT - STOP_MARGIN - ($(date +%s) - START) )) -gt 0 ]; do
  alive=0
  for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && break
  sleep 5
done
for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done  # each forwards it to its runs
wait
echo "rows ended after $(( $(date +%s) - START )) s"

source benchmarks/device/small_files.sh
(cd "$ROOT" && small_files . | tar czf "$OUT/small_files.tar.gz" --null -T -)
python3 -m launch.fair_benchmark --root="$ROOT" --blocks="$BLOCK" --plan > "$OUT/plan.txt" 2>&1
echo "done after $(( $(date +%s) - START )) s"
