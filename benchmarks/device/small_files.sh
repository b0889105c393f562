# The small files of the runs under the folders given (sourced by fair_benchmark.sh and tree.sh
# here): what a device call brings back and what a CPU root stages for one. Each run's
# config, metrics, sweep record and train.log, each search's tuning.json and its operator file (the
# secret K a search resumes from: never committed, .gitignore), the block's row.json and
# benchmark.json; no checkpoints, TensorBoard events or absl logs.
#   small_files DIR...   NUL-separated paths, as find prints them
small_files() {
  find "$@" -path '*/checkpoints' -prune -o -type f \( -name config.json \
      -o -name metrics.jsonl -o -name train_metrics.jsonl -o -name evaluations.jsonl -o -name hosts.jsonl \
      -o -name sweep.json -o -name failure.json -o -name tuning.json -o -name row.json \
      -o -name benchmark.json -o -name tuning_operator_private.json -o -name '*.log' \) -print0
}
