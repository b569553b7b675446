#!/bin/bash
# One device call (tool `run`, carry .whl): GPU kernel tests + kernel benchmark, logs under $OUT.
# .whl/ (ignored) carries SGLang 0.5.23's engram gather module and the Triton cache between calls.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
mkdir -p /tmp/tcache && [ -f .whl/tcache.tgz ] && tar xzf .whl/tcache.tgz -C /tmp
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
# RMSNorm's plain fp32 mean on CUDA depends on the batch (block shape) -> layers/norm.py sums exactly
python3 - <<'PY' | tee -a "$OUT/device.txt"
import torch
x = torch.randn(4096, 512, device="cuda").bfloat16().float()
m = lambda v: v.square().mean(-1)
full, single = m(x), torch.cat([m(x[i:i + 1]) for i in range(256)])
print("plain fp32 mean: rows differing between batch 4096 and batch 1:", int((full[:256] != single).sum()), "/ 256")
PY
python3 -m pytest test/kernels -q -rA -m "not interp" -p no:cacheprovider ${TEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^PASSED" | tail -60
python3 benchmark/kernels.py --out "$OUT/bench.md" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
tar czf "$OUT/tcache.tgz" -C /tmp tcache 2>/dev/null; ls -la "$OUT"
