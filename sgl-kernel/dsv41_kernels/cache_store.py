"""Cache stores: quantize finished rows into the paged pools (byte layouts in sglang_dsv41.quant.layouts).

Pools are uint8 [num_slots, row_bytes]; `slots` int64 [n] are pool rows, -1 = do not write.
  window KV      [D + D/32]      MXFP8: D e4m3 bytes | D/32 UE8M0 exponents      (528 B at D=512)
  compressed KV  [D/2 + D/16]    FP4: packed E2M1 (low nibble = even) | E4M3 per 16   (288 B)
  index key      [di/2 + di/32]  FP4 two-stage: packed E2M1 | UE8M0 per 32          (68 B at 128)
RoPE uses fp32 cos/sin tables [n, rd/2] on the last rd dims and the window store's RMSNorm the
statistic `reduction.mean_square` (both from `sglang_dsv41.shared_math`, the layers' own functions).
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.quant import index_fp4_pack, index_fp4_stage1, kv_fp4_pack, window_kv_pack
from sglang_dsv41.shared_math import apply_rope, rms_norm


def _write_rows(pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """pool[slots[i]] = rows[i] for every slots[i] >= 0; other pool rows are left untouched."""
    idx = torch.nonzero(slots >= 0).flatten()
    if idx.numel():
        pool.index_copy_(0, slots.index_select(0, idx).long(), rows.index_select(0, idx).to(pool.dtype))


@register("window_kv_store")
def window_kv_store(
    kv: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    slots: torch.Tensor, pool: torch.Tensor,
) -> None:
    """kv bf16 [n, D] (= wkv(x)) -> pool[slots] = MXFP8 bytes of rope(RMSNorm(kv)) (bf16 between steps)."""
    _write_rows(pool, slots, window_kv_pack(apply_rope(rms_norm(kv, norm_weight, eps), cos, sin)))


@register("compressed_kv_store")
def compressed_kv_store(latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, pool: torch.Tensor) -> None:
    """latent bf16 [n, D] (pre-RoPE, normed) -> pool[slots] = FP4 bytes of rope(latent) at group positions."""
    _write_rows(pool, slots, kv_fp4_pack(apply_rope(latent, cos, sin)))


@register("index_key_store")
def index_key_store(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, pool: torch.Tensor) -> None:
    """k bf16 [n, di] (= k_norm(wk(latent))) -> pool[slots] = two-stage FP4 bytes of rope(k)."""
    _write_rows(pool, slots, index_fp4_pack(index_fp4_stage1(apply_rope(k, cos, sin))))


attach_kernels("dsv41_kernels.cache_store_triton", "window_kv_store", "compressed_kv_store", "index_key_store")
