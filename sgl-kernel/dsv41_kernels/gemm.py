"""Block-scaled GEMMs of the quantized linears: dense FP8 (W8A8) and routed-expert MXFP4 (W4A8).

Both quantize the activations to MXFP8 (E4M3 + power-of-two scale per 1x32 group, `mxfp8_quant`)
and accumulate 32-wide K-block partials in fp32 strictly in K order, each partial scaled by
a_scale[m, kb] * w_scale[n, kb] (`blockwise_scaled_mm`); one bf16 rounding at the end. Weight scales:
  fp8_linear  w e4m3 [N, K], w_scale e8m0/uint8 [ceil(N/32), K/32] (one per 32x32 tile)
  fp4_linear  w_packed uint8/int8 [N, K/2] (E2M1, low nibble = even element), w_scale [N, K/32]
The twins compute each partial exactly (fp64, rounded once); the Triton kernels use the fp8 tensor
cores, whose 32-term partials are not exact, so they match the twins within an fp8 tolerance
(test/kernels/test_gemm_gpu.py). Both are batch invariant: a row's result does not depend on the
other rows or on the row count (no split-K).
"""

from __future__ import annotations

from dsv41_kernels.registry import register
from sglang_dsv41.quant import fp4_linear as _fp4_linear
from sglang_dsv41.quant import fp8_linear as _fp8_linear

fp8_linear = register("fp8_linear")(_fp8_linear)
fp4_linear = register("fp4_linear")(_fp4_linear)

from dsv41_kernels.registry import attach_kernels  # noqa: E402

attach_kernels("dsv41_kernels.gemm_triton", "fp8_linear", "fp4_linear")
