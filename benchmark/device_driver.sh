#!/bin/bash
# One device call: re-run the GPU kernel tests, then the standalone driver end to end on the small
# and bench presets with the Triton kernels (8 x 8K prompts, then greedy decode). Logs under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
mkdir -p /tmp/tcache && [ -f .whl/tcache.tgz ] && tar xzf .whl/tcache.tgz -C /tmp
timeout 150 python3 -m pytest test/kernels -q -m "not interp" -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/gpu_kernel_tests.txt"
timeout 60 python3 benchmark/driver_bench.py --preset small --prompts 8 --prompt-len 256 --decode 16 \
    --results-dir "$OUT" --tokens-out "$OUT/small_tokens_h200.json"
timeout 120 python3 benchmark/driver_bench.py --preset small --prompts 8 --prompt-len 8192 --decode 32 --results-dir "$OUT"
timeout 240 python3 benchmark/driver_bench.py --preset bench --prompts 8 --prompt-len 8192 --decode 32 --results-dir "$OUT"
ls -la "$OUT"
