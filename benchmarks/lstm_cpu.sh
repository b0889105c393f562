#!/bin/bash
# bash benchmarks/lstm_cpu.sh [OUT]   (from the repository root; CPU; ~4 minutes on a quiet 2-core EPYC)
# The Shakespeare LSTM on CPU, for benchmarks/README.md's lead tables: the DP2-FedSAM round of
# char_lstm_small and char_lstm (JAX sequential, vmap and sharded over one CPU device per core,
# PyTorch 1 and 2 threads, the step's GEMMs timed in a loop = the limit), the JAX lines again on one
# CPU device (splitting the host must not slow them), flax's OptimizedLSTMCell against the
# FusedLSTM layer, and one full Shakespeare evaluation. Every line records the load; run it on a
# quiet machine.
set -eu
OUT=${1:-benchmarks/results/cpu-2core-epyc-quiet/lstm}
mkdir -p "$OUT"
export JAX_PLATFORMS=cpu
{ date -u; lscpu | grep 'Model name'; uptime; } | tee "$OUT/machine.txt"
ROUND="--clients=10 --batch_size=8 --personal_epochs=1 --shared_epochs=1 --torch_threads=1,2"
python3 -m benchmarks.client_throughput --model=char_lstm_small --samples_per_client=32 $ROUND \
  --rounds=5 --json_out="$OUT/char_lstm_small.json"
python3 -m benchmarks.client_throughput --model=char_lstm --samples_per_client=16 $ROUND \
  --rounds=3 --json_out="$OUT/char_lstm.json"
# The host as one CPU device (no sharded line), JAX lines only.
python3 -m benchmarks.client_throughput --model=char_lstm_small --samples_per_client=32 $ROUND \
  --rounds=5 --cpu_devices=1 --torch=false --flops=false --matmul_size=0 \
  --json_out="$OUT/char_lstm_small_one_device.json"
# Before: flax's cell under nn.RNN (same parameters), JAX lines only.
python3 -m benchmarks.client_throughput --model=char_lstm_small --samples_per_client=32 $ROUND \
  --rounds=5 --lstm_cell=optimized --modes=vmap,sequential --torch=false --flops=false --matmul_size=0 \
  --json_out="$OUT/char_lstm_small_optimized_cell.json"
python3 -m benchmarks.client_throughput --model=char_lstm --samples_per_client=16 $ROUND \
  --rounds=3 --lstm_cell=optimized --modes=vmap,sequential --torch=false --flops=false --matmul_size=0 \
  --json_out="$OUT/char_lstm_optimized_cell.json"
python3 -m benchmarks.eval_time --method=dp2fedsam --cells=fused,optimized --reps=3 \
  --json_out="$OUT/shakespeare_eval.json"
uptime | tee -a "$OUT/machine.txt"
