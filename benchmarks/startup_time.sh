#!/bin/bash
# bash benchmarks/startup_time.sh   (from the repository root; the persistent compilation cache)
# Start-up to the first round line of the default config (num_rounds=1), CPU backend:
# 3 runs without the persistent compilation cache, one that fills it, 3 that use it.
set -u
export PYTHONPATH=$PWD JAX_PLATFORMS=cpu
python3 -c "import jax, orbax.checkpoint, dp_accounting; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
nproc; ls /usr/share/datasets/fashion-mnist 2>&1 | head -3
CACHE=$(mktemp -d)
run() {
  rm -rf /tmp/x_measure
  t0=$(date +%s.%N)
  timeout 300 python3 -m experiments.train --config=experiments/configs/default.py --workdir=/tmp/x_measure \
      --config.num_rounds=1 --compilation_cache=$1 > /tmp/out.txt 2> /tmp/err.txt
  rc=$?
  t1=$(date +%s.%N)
  line=$(grep -n "round 1/1" /tmp/err.txt | head -1)
  comp=$(grep -o "Compiled the round step and the evaluation in [0-9.]* s" /tmp/err.txt)
  first=$(python3 - "$t0" /tmp/err.txt <<'PY'
import datetime, re, sys
t0 = float(sys.argv[1])
for line in open(sys.argv[2]):
  m = re.match(r'I\d{4} (\d+):(\d+):(\d+\.\d+) .*round 1/1', line)
  if m:
    day = datetime.datetime.fromtimestamp(t0).replace(hour=0, minute=0, second=0, microsecond=0)
    t = day.timestamp() + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    print(round(t - t0, 1))
PY
)
  echo "$2 rc=$rc first_round_line=${first}s exit=$(python3 -c "print(round($t1-$t0,1))")s [$comp] load=$(cut -d' ' -f1 /proc/loadavg)"
  [ $rc -ne 0 ] && tail -3 /tmp/err.txt
}
for i in 1 2 3; do run off "off#$i"; done
run $CACHE "cold"
for i in 1 2 3; do run $CACHE "warm#$i"; done
