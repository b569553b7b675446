"""Bit-exact DeepSeek-V4.1 quantization numerics (FP8 E4M3 / UE8M0, FP4 E2M1) and cache layouts."""

from .fp4 import (
    FP4_E2M1_MAX,
    dequant_mxfp4,
    e2m1_codes,
    e2m1_round,
    e2m1_table,
    e2m1_values,
    fp4_linear,
    index_fp4_stage1,
    kv_fp4_dequant,
    kv_fp4_qdq,
    kv_fp4_quant,
    pack_nibbles,
    quant_mxfp4,
    unpack_nibbles,
)
from .fp8 import (
    FP8_E4M3_MAX,
    blockwise_scaled_mm,
    dequant_engram_rows,
    dequant_fp8_weight,
    e4m3_satfinite,
    e8m0_to_fp32,
    fp8_linear,
    fp32_pow2_to_e8m0,
    fp32_pow2_to_exponent_byte,
    mxfp8_qdq,
    mxfp8_quant,
    quant_fp8_weight,
    ue8m0_ceil_scale,
)
from .layouts import (
    index_fp4_nbytes,
    index_fp4_pack,
    index_fp4_qdq,
    index_fp4_unpack,
    kv_fp4_nbytes,
    kv_fp4_pack,
    kv_fp4_unpack,
    window_kv_nbytes,
    window_kv_pack,
    window_kv_qdq,
    window_kv_unpack,
)

__all__ = [
    "FP4_E2M1_MAX", "FP8_E4M3_MAX",
    "blockwise_scaled_mm", "dequant_engram_rows", "dequant_fp8_weight", "dequant_mxfp4",
    "e2m1_codes", "e2m1_round", "e2m1_table", "e2m1_values", "e4m3_satfinite", "e8m0_to_fp32",
    "fp32_pow2_to_e8m0", "fp32_pow2_to_exponent_byte", "fp4_linear", "fp8_linear",
    "index_fp4_nbytes", "index_fp4_pack", "index_fp4_qdq", "index_fp4_stage1", "index_fp4_unpack",
    "kv_fp4_dequant", "kv_fp4_nbytes", "kv_fp4_pack", "kv_fp4_qdq", "kv_fp4_quant",
    "kv_fp4_unpack", "mxfp8_qdq", "mxfp8_quant", "pack_nibbles", "quant_fp8_weight",
    "quant_mxfp4", "ue8m0_ceil_scale", "unpack_nibbles", "window_kv_nbytes", "window_kv_pack",
    "window_kv_qdq", "window_kv_unpack",
]
