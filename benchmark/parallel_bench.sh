#!/bin/bash
# TP/EP scaling of the offline driver on one multi-GPU host (docs/parallel.md): TP=EP=1, 2, 4, 8
# (as many as the host has GPUs), then the table with scaling efficiency and the NCCL logits
# comparison against one GPU. Usage: benchmark/parallel_bench.sh [preset] [out dir]
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-release}
OUT=${2:-/tmp/dsv41-parallel/runs}
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
rm -rf "$OUT"
for N in 1 2 4 8; do
  [ "$N" -le "$GPUS" ] || break
  torchrun --nproc-per-node "$N" --master-port $((29500 + N)) benchmark/parallel_bench.py \
      --tp "$N" --ep "$N" --preset "$PRESET" --out-dir "$OUT"
done
python benchmark/parallel_bench.py --report "$OUT"
