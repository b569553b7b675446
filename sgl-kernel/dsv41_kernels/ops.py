"""Every public op, importable from one place: `from dsv41_kernels import ops; ops.window_kv_store(...)`."""

from dsv41_kernels.attention import sparse_attention_paged
from dsv41_kernels.cache_store import compressed_kv_store, index_key_store, window_kv_store
from dsv41_kernels.engram import engram_gate, engram_gather, engram_hash
from dsv41_kernels.fp32_gemm import fp32_linear
from dsv41_kernels.gemm import fp4_linear, fp8_linear
from dsv41_kernels.indexer import candidate_blocks, index_query_quant, index_scores, topk_select
from dsv41_kernels.mhc import mhc_collapse, mhc_enter, mhc_expand, mhc_gates
from dsv41_kernels.moe import moe_combine, moe_experts, moe_gate, moe_route
from dsv41_kernels.moe import swiglu_op as swiglu
from dsv41_kernels.norm import rms_norm
from dsv41_kernels.rope import rope_rotate

__all__ = [
    "candidate_blocks", "compressed_kv_store", "engram_gate", "engram_gather", "engram_hash",
    "fp4_linear", "fp8_linear", "fp32_linear", "index_key_store", "index_query_quant", "index_scores", "mhc_collapse",
    "mhc_enter", "mhc_expand", "mhc_gates", "moe_combine", "moe_experts", "moe_gate", "moe_route", "rms_norm",
    "rope_rotate",
    "sparse_attention_paged", "swiglu", "topk_select", "window_kv_store",
]
