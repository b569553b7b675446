#!/bin/bash
# One device call (tool `run`, carry .whl): GPU tests, the cross-device trace (small preset, with the
# model-level Triton-vs-twin check), the driver end to end on small and bench (8 x 8K, then decode).
# Kernel timings are a separate call: benchmark/device_run.sh. Logs and results under $OUT.
#   PARTS="tests trace driver" (default all three)
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
mkdir -p /tmp/tcache && [ -f .whl/tcache.tgz ] && tar xzf .whl/tcache.tgz -C /tmp
PARTS=${PARTS:-tests trace driver}
log="$OUT/session.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
if [[ $PARTS == *tests* ]]; then
  timeout 240 python3 -m pytest test/kernels -q -rfE -m "not interp" -p no:cacheprovider ${TEST_ARGS:-} 2>&1 \
    | tail -40 | tee "$OUT/gpu_tests.txt"
fi
if [[ $PARTS == *trace* ]]; then
  timeout 150 python3 benchmark/cross_device.py record --preset small --prompts 8 --prompt-len 256 --decode 16 \
    --out "$OUT/small_trace_h200.pt" --ops-check 2>&1 | tee -a "$log"
fi
if [[ $PARTS == *driver* ]]; then
  timeout 90 python3 benchmark/driver_bench.py --preset small --prompts 8 --prompt-len 8192 --decode 32 --warmup --results-dir "$OUT" 2>&1 | tail -3 | tee -a "$log"
  timeout ${BENCH_S:-300} python3 benchmark/driver_bench.py --preset bench --prompts 8 --prompt-len 8192 --decode 32 --warmup --results-dir "$OUT" 2>&1 | tail -8 | tee -a "$log"
fi
tar czf "$OUT/tcache.tgz" -C /tmp tcache 2>/dev/null
ls -la "$OUT"
