#!/usr/bin/env bash
# The Shakespeare study of experiments/configs/shakespeare_field.py, in order, resumable: rerun the
# same command and every finished step is skipped, every stopped run resumes from its checkpoint.
#   1. the centralized bound of each model (experiments.centralized; a partial file is redone)
#   2. the FedAvg tuning (launch.tune, root $ROOT/tuning), then a check that the config's
#      OPERATING_POINT holds the selected values (stops here until it does; ACCEPT_OP=1 runs anyway)
#   3. the protocol and privacy blocks (launch.sweep, root $ROOT); the privacy block only once the
#      config's PROTOCOL_DECIDED is True (the protocol block decides its head epochs: step 6 says so)
#      and its PRIVATE_POINT is set (the private runs' lrs: the private tuning of step 3b selects
#      them, and the step stops until the config holds its selection; ADOPT_PRIVATE=1 writes it)
#   4. every finished run re-evaluated under the config's ADAPT protocol, with the parts its
#      REEVALUATIONS lists (FedAvg: head and full fine-tune), skipped where evaluations.jsonl has it
#   5. the report of the finished runs into experiments/results/shakespeare_field
#   6. the protocol decision until PROTOCOL_DECIDED, then the privacy verdict: rules (b) and (c) of
#      experiments/studies/shakespeare_field.py, the study's logic beside the config
# Environment: ROOT (default $HOME/sweeps), MODELS (default "char_lstm_small"; on a GPU
# "char_lstm_small char_lstm"), EPOCHS (centralized epochs, default 10), SECONDS_LEFT (stop every
# step with SIGTERM after this many seconds: runs checkpoint at a round boundary; for a bounded
# device call), PLAN=1 (print the plans only), PARALLEL (runs at a time for the tuning and the
# sweep, default 1), JAX_NUM_CPU_DEVICES (default: one per core).
# The config's executor is 'sharded': on a CPU each device (one per core) loops over its share of
# the cohort, 1.8x one sequential run on 2 cores and ~1.4x two of them at a time, so keep
# PARALLEL=1 there; a GPU vmaps the cohort.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-$HOME/sweeps}
MODELS=${MODELS:-char_lstm_small}
EPOCHS=${EPOCHS:-10}
PARALLEL=${PARALLEL:-1}
export JAX_NUM_CPU_DEVICES=${JAX_NUM_CPU_DEVICES:-$(nproc)}
CONFIG=experiments/configs/shakespeare_field.py
NAME=shakespeare_field
START=$(date +%s)

bounded() {  # runs "$@", stopped by SIGTERM when SECONDS_LEFT is spent (exit 143: resume later)
  if [ -n "${SECONDS_LEFT:-}" ]; then
    local left=$(( SECONDS_LEFT - ($(date +%s) - START) ))
    if [ "$left" -le 30 ]; then echo "time budget spent: rerun to resume" >&2; exit 143; fi
    timeout -s TERM -k 120 "$left" "$@"
  else
    "$@"
  fi
}

study_of() { [ "$1" = char_lstm_small ] && echo fedavg || echo "fedavg_$1"; }

if [ "${PLAN:-0}" = 1 ]; then
  for model in $MODELS; do
    python3 -m launch.tune --config=$CONFIG --study="$(study_of "$model")" --root="$ROOT/tuning" --plan
  done
  python3 -m launch.tune --config=$CONFIG --study=dp_fedavg_eps2 --root="$ROOT/tuning" --plan
  python3 -m launch.sweep --config=$CONFIG --root="$ROOT" --plan
  for model in $MODELS; do
    [ "$model" = char_lstm_small ] || python3 -m launch.sweep --config=$CONFIG --root="$ROOT" \
        --grid=model="$model" --plan
  done
  exit 0
fi

# 1. The centralized bound (SGD lr 1, batch 10, as docs/evaluation.md section 5).
mkdir -p "$ROOT/$NAME"
for model in $MODELS; do
  out="$ROOT/$NAME/centralized_$model.jsonl"
  if [ -f "$out" ] && [ "$(wc -l < "$out")" -ge "$EPOCHS" ]; then
    echo "skip    centralized $model ($out)"; continue
  fi
  rm -f "$out"
  bounded python3 -m experiments.centralized --config="$CONFIG:model=$model" --epochs="$EPOCHS" \
      --batch_size=10 --lr=1.0 --out="$out"
done

# 2. The FedAvg tuning and the operating-point check.
for model in $MODELS; do
  bounded python3 -m launch.tune --config=$CONFIG --study="$(study_of "$model")" --root="$ROOT/tuning" \
      --parallel="$PARALLEL"
done
python3 - "$ROOT/tuning/$NAME/fedavg/tuning.json" <<'EOF' || [ "${ACCEPT_OP:-0}" = 1 ]
import json, sys
from experiments.configs import shakespeare_field as c
selected = json.load(open(sys.argv[1]))['selected_values'] or {}
differ = {k: (c.OPERATING_POINT.get(k), v) for k, v in selected.items() if c.OPERATING_POINT.get(k) != v}
if differ:
  sys.exit(f'OPERATING_POINT differs from the tuning\'s selection (config, selected): {differ}; copy the '
           'selected values into experiments/configs/shakespeare_field.py (or ACCEPT_OP=1), then rerun.')
print('operating point = the tuning\'s selection')
EOF

# 3. The protocol and privacy blocks (char_lstm_small's workdirs do not name the model).
sweep_blocks() {
  for model in $MODELS; do
    if [ "$model" = char_lstm_small ]; then
      bounded python3 -m launch.sweep --config=$CONFIG --root="$ROOT" --parallel="$PARALLEL"
    else
      bounded python3 -m launch.sweep --config=$CONFIG --root="$ROOT" --grid=model="$model" \
          --parallel="$PARALLEL"
    fi
  done
}
sweep_blocks

# 3b. Once PROTOCOL_DECIDED: the private tuning (study dp_fedavg_eps2: DP-FedAvg trials at eps 2,
# the selection's epsilon counted), then the privacy block with its selection. PRIVATE_POINT must
# hold that selection; while it is None the step stops, or with ADOPT_PRIVATE=1 writes it into the
# config file (for a device call's copy of the tree).
PRIVATE_TUNING="$ROOT/tuning/$NAME/dp_fedavg_eps2/tuning.json"
if python3 -c 'import sys; from experiments.configs import shakespeare_field as c
sys.exit(not c.PROTOCOL_DECIDED)'; then
  bounded python3 -m launch.tune --config=$CONFIG --study=dp_fedavg_eps2 --root="$ROOT/tuning" \
      --parallel="$PARALLEL"
  python3 - "$PRIVATE_TUNING" "${ADOPT_PRIVATE:-0}" <<'EOF'
import json, re, sys
from experiments.configs import shakespeare_field as c
selected = json.load(open(sys.argv[1]))['selected_values']
if selected is None:
  sys.exit(f'{sys.argv[1]} selected nothing (K = 0, or every trial failed): the privacy block has '
           'no lrs.')
if c.PRIVATE_POINT is not None:
  if c.PRIVATE_POINT != selected:
    sys.exit(f'PRIVATE_POINT {c.PRIVATE_POINT} is not the private tuning\'s selection {selected}.')
elif sys.argv[2] == '1':
  text = open(c.__file__).read()
  open(c.__file__, 'w').write(re.sub(r'^PRIVATE_POINT = None$', f'PRIVATE_POINT = {selected!r}',
                                     text, flags=re.M))
  print(f'PRIVATE_POINT = {selected} (adopted from the private tuning)')
else:
  sys.exit(f'PRIVATE_POINT is None; the private tuning selected {selected}: copy it into '
           'experiments/configs/shakespeare_field.py (or ADOPT_PRIVATE=1), then rerun.')
EOF
  sweep_blocks
fi

# 4. Re-evaluations under the config's test-time protocol (nothing trains twice).
python3 -c 'import sys; from experiments.studies import shakespeare_field as study
for d, flags in study.pending_reevaluations(sys.argv[1]): print(d, *flags)' "$ROOT/$NAME" \
    > "$ROOT/$NAME/reevaluations.txt"
while read -r workdir flags; do
  # shellcheck disable=SC2086
  bounded python3 -m experiments.evaluate --workdir="$workdir" $flags < /dev/null
done < "$ROOT/$NAME/reevaluations.txt"

# 5. The report of the finished runs (FedAvg the reference: every gap is against it).
python3 -m experiments.report --root="$ROOT/$NAME" --out=experiments/results/$NAME --copy_runs \
    --finished_only --reference=fedavg

# 6. The privacy block waits for the protocol decision.
python3 - <<'EOF'
from experiments.configs import shakespeare_field as c
from experiments.studies import shakespeare_field as study
if not c.PROTOCOL_DECIDED:
  decision = study.protocol_decision('experiments/results/shakespeare_field/runs')
  print(f"The privacy block has not run. Rule (b) of experiments/studies/shakespeare_field.py on the "
        f"runs so far: {decision}. "
        "Once personal_epochs is not None (3 seeds of every row), set PROTOCOL = {'personal_epochs': "
        "that} and PROTOCOL_DECIDED = True in experiments/configs/shakespeare_field.py (the test "
        "tests/test_configs.py holds them to the runs), then rerun this script.")
elif c.PRIVATE_POINT is None:
  print('The privacy block has not run: it waits for PRIVATE_POINT, the lrs the private tuning '
        '(step 3b) selects (experiments/configs/shakespeare_field.py, docstring (c)).')
else:  # the verdict rule (c) of the study module, on the privacy runs finished so far
  for eps, verdict in study.privacy_decision('experiments/results/shakespeare_field/runs').items():
    print(f"eps {eps:g}: the papers' order {verdict['order']}; DP2-FedSAM against "
          + ', '.join(f'{m} {v[0]} ({100 * v[1]:+.2f} points)' for m, v in verdict['against'].items())
          + f"; clip binds: {verdict['binds']}")
EOF
