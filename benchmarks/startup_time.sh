#!/bin/bash
# bash benchmarks/startup_time.sh   (from the repository root; the persistent compilation cache)
# Compile seconds and start-up to the first round line of the default config, CPU backend:
#   off      no persistent cache
#   fresh    a new run on an empty cache (fills it), stopped by SIGTERM after its first round
#   again    an identical new run in another workdir (the cache serves it)
#   resumed  the first run started again: it resumes from its checkpoint (the cache serves it too)
set -u
export PYTHONPATH=$PWD JAX_PLATFORMS=cpu
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
echo "cores: $(nproc)"
TMP=$(mktemp -d)
CACHE=$TMP/cache
ROUNDS=3  # the stopped run ends after round 1 or 2: the resumed one has a round left to compile for

# run NAME WORKDIR CACHE [stop]: one run of the binary; `stop` sends SIGTERM at its first round line.
run() {
  local err=$TMP/$1.err t0 t1 rc
  t0=$(date +%s.%N)
  python3 -m experiments.train --config=experiments/configs/default.py --workdir="$2" \
      --config.num_rounds=$ROUNDS --config.eval_every=1 --compilation_cache="$3" \
      > "$TMP/$1.out" 2> "$err" &
  local pid=$!
  if [ "${4:-}" = stop ]; then
    until grep -q "round 1/$ROUNDS" "$err" 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.5; done
    kill -TERM $pid 2>/dev/null
  fi
  wait $pid; rc=$?
  t1=$(date +%s.%N)
  local compiled first
  compiled=$(sed -n 's/.*Compiled the round step and the evaluation in \([0-9.]*\) s.*/\1 s/p' "$err")
  first=$(python3 - "$t0" "$err" <<'PY'
import datetime, re, sys
t0 = float(sys.argv[1])
for line in open(sys.argv[2]):
  m = re.match(r'I\d{4} (\d+):(\d+):(\d+\.\d+) .*round \d+/\d+  acc', line)
  if m:
    day = datetime.datetime.fromtimestamp(t0).replace(hour=0, minute=0, second=0, microsecond=0)
    t = day.timestamp() + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    print(round(t - t0, 1))
    break
PY
)
  printf '%-8s rc=%-3s compile=%-8s first_round_line=%ss exit=%ss load=%s\n' "$1" "$rc" "${compiled:-?}" \
      "${first:-?}" "$(python3 -c "print(round($t1 - $t0, 1))")" "$(cut -d' ' -f1 /proc/loadavg)"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ] && tail -3 "$err"
}

run off "$TMP/off" off
run fresh "$TMP/run" "$CACHE" stop
run again "$TMP/again" "$CACHE"
run resumed "$TMP/run" "$CACHE"
rm -rf "$TMP"
