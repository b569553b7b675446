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
} | tee "$dir/device.txt"
if [[ $parts == *tests* ]]; then
  # every test that needs CUDA (the CPU suite is `python -m pytest test -q`)
  timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider test/kernels/test_triton_gpu.py \
    test/kernels/test_gemm_gpu.py test/kernels/test_moe_gpu.py test/kernels/test_registry.py test/runtime/test_runtime_gpu.py \
    test/runtime/test_decode_graphs_gpu.py test/train/test_serving_values_gpu.py \
    test/reference/test_reference_model.py::test_runs_on_cuda_and_matches_cpu_with_decisions_replayed \
    test/core/test_engram_hash.py::test_cuda_matches_cpu test/core/test_quant.py::test_cuda_matches_cpu \
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
