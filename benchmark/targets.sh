#!/bin/bash
# Issue 32's targets in one run on one CUDA machine (< 560 s): device/versions, the kernel target rows
# (kernels.py --targets), the driver decode sweep at batch 8 / 64 with profiles (serving-path graph set beside
# the driver's graph, the first kernels of a replay in launch order) and the 8 x 8K prefill
# (driver_bench.py), Nsight Compute of every target kernel (kernel_limits.py under ncu), then the
# table OUTDIR/targets.md (targets_report.py). Every part runs in its own process under `timeout`,
# writes OUTDIR/<part>.log and a line "<part> <exit code> <seconds>" to OUTDIR/status.txt; a failed part
# leaves the others running, and the report says which part failed and why.
#   bash benchmark/targets.sh OUTDIR
set -u
out=${1:?usage: benchmark/targets.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
: > "$out/status.txt"

part() {  # part NAME SECONDS CMD...: run CMD under timeout, log to OUTDIR/NAME.log, status line
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name $rc $((SECONDS - t0))" >> "$out/status.txt"
  echo "[$name: exit $rc after $((SECONDS - t0)) s]"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 || echo "nvidia-smi failed"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ local changes)')"
  echo "ncu: $(command -v ncu >/dev/null && ncu --version | tail -1 || echo 'not found')"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

part kernels 150 python3 benchmark/kernels.py --targets --json "$out/kernels.json" --out "$out/kernels.md"
part driver 260 python3 benchmark/driver_bench.py --preset bench --fast-weights --sweep 8,64 --context 8192 --steps 8 \
  --eager-warmup 2 --eager-steps 1 --profile --kernel-order 120 --prompts 8 --prompt-len 8192 --decode 16 --warmup --results-dir "$out"
if command -v ncu > /dev/null; then
  # stdout: ncu's CSV (kernel_limits.py writes its progress to stderr, kept in ncu.log)
  t0=$SECONDS
  timeout -k 10 120 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --csv python3 benchmark/kernel_limits.py \
    > "$out/ncu.csv" 2> "$out/ncu.log"
  rc=$?
  echo "ncu $rc $((SECONDS - t0))" >> "$out/status.txt"
  echo "[ncu: exit $rc after $((SECONDS - t0)) s]"
  python3 benchmark/kernel_limits.py --parse "$out/ncu.csv" --out "$out/limits.md" || true
else
  echo "ncu: not found on PATH" > "$out/ncu.log"
  echo "ncu 127 0" >> "$out/status.txt"
fi
python3 benchmark/targets_report.py "$out" && cat "$out/targets.md"
ls -la "$out"
