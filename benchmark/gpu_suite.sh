#!/bin/bash
# The GPU suite on one CUDA machine: device/versions, GPU tests, the kernel table, the driver end to
# end (small and bench presets, 8 x 8K prompts, then greedy decode). Every log goes to the folder
# given as the first argument (created if missing).
#   bash benchmark/gpu_suite.sh LOGDIR [tests] [kernels] [driver]     (default: all three parts)
set -o pipefail
dir=${1:?usage: benchmark/gpu_suite.sh LOGDIR [tests] [kernels] [driver]}
shift
parts=${*:-tests kernels driver}
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null
} | tee "$dir/device.txt"
if [[ $parts == *tests* ]]; then
  timeout 420 python3 -m pytest test/kernels test/reference test/runtime -q -rfE -m "not interp" -p no:cacheprovider \
    2>&1 | tee "$dir/gpu_tests.log" | tail -30
fi
if [[ $parts == *kernels* ]]; then
  timeout 420 python3 benchmark/kernels.py --out "$dir/kernels.md" 2>&1 | tee "$dir/kernels.log" | tail -40
fi
if [[ $parts == *driver* ]]; then
  timeout 200 python3 benchmark/driver_bench.py --preset small --prompts 8 --prompt-len 8192 --decode 32 --warmup \
    --results-dir "$dir" 2>&1 | tee "$dir/driver_small.log" | tail -3
  timeout 400 python3 benchmark/driver_bench.py --preset bench --prompts 8 --prompt-len 8192 --decode 32 --warmup \
    --results-dir "$dir" 2>&1 | tee "$dir/driver_bench.log" | tail -3
fi
ls -la "$dir"
