"""Triton cache stores: one program per token row, fused norm / RoPE / quantize / paged store.

Byte layouts are those of `cache_store.py` (and `sglang_dsv41.quant.layouts`); every byte equals
the torch twin's. A row is held as interleaved pairs (x0 = even, x1 = odd elements) tiled
[groups, pairs per group], so a quantization group is one tile row and an FP4 byte is one pair.
Slots < 0 are skipped; pool rows not named by `slots` are never touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_kernels.cache_store import compressed_kv_store, index_key_store, window_kv_store
from dsv41_kernels.triton_numerics import (
    NO_FMA,
    bf16_round,
    exponent_byte,
    fp4_stage1,
    fp4_stage2,
    kv_fp4_group,
    load_pairs,
    mxfp8_group,
    next_pow2,
    rms_rstd,
    rope_tail,
)


@triton.jit
def _window_kv_store_kernel(
    kv_ptr, kv_rs, w_ptr, cos_ptr, sin_ptr, cs_rs, slot_ptr, pool_ptr, pool_rs, eps,
    D: tl.constexpr, RP: tl.constexpr, G: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        NP: tl.constexpr = D // 2
        pair, x0, x1 = load_pairs(kv_ptr + row.to(tl.int64) * kv_rs, G, 16, NP)
        ok = pair < NP
        # RMSNorm: exact fp64 sum of squares, fp32 rstd, weight * (x * rstd), one bf16 rounding
        ss = tl.sum(tl.sum(x0.to(tl.float64) * x0.to(tl.float64) + x1.to(tl.float64) * x1.to(tl.float64), 1), 0)
        rstd = rms_rstd(ss, D * 1.0, eps)
        w0 = tl.load(w_ptr + 2 * pair, mask=ok, other=0.0).to(tl.float32)
        w1 = tl.load(w_ptr + 2 * pair + 1, mask=ok, other=0.0).to(tl.float32)
        y0 = bf16_round(w0 * (x0 * rstd))
        y1 = bf16_round(w1 * (x1 * rstd))
        y0, y1 = rope_tail(y0, y1, pair, cos_ptr + row * cs_rs, sin_ptr + row * cs_rs, NP, RP)
        q0, q1, s = mxfp8_group(y0, y1)
        dst = pool_ptr + slot * pool_rs
        tl.store(dst + 2 * pair, q0.to(tl.uint8), mask=ok)
        tl.store(dst + 2 * pair + 1, q1.to(tl.uint8), mask=ok)
        g = tl.arange(0, G)[:, None]
        tl.store(dst + D + g, exponent_byte(s).to(tl.uint8), mask=g < D // 32)


@triton.jit
def _compressed_kv_store_kernel(
    x_ptr, x_rs, cos_ptr, sin_ptr, cs_rs, slot_ptr, pool_ptr, pool_rs,
    D: tl.constexpr, RP: tl.constexpr, G: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        NP: tl.constexpr = D // 2
        pair, x0, x1 = load_pairs(x_ptr + row.to(tl.int64) * x_rs, G, 8, NP)
        ok = pair < NP
        x0, x1 = rope_tail(x0, x1, pair, cos_ptr + row * cs_rs, sin_ptr + row * cs_rs, NP, RP)
        c0, c1, s8 = kv_fp4_group(x0, x1)
        dst = pool_ptr + slot * pool_rs
        tl.store(dst + pair, (c0 | (c1 << 4)).to(tl.uint8), mask=ok)
        g = tl.arange(0, G)[:, None]
        tl.store(dst + NP + g, s8.to(tl.uint8), mask=g < D // 16)


@triton.jit
def _index_key_store_kernel(
    k_ptr, k_rs, cos_ptr, sin_ptr, cs_rs, slot_ptr, pool_ptr, pool_rs,
    D: tl.constexpr, RP: tl.constexpr, G: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        NP: tl.constexpr = D // 2
        pair, x0, x1 = load_pairs(k_ptr + row.to(tl.int64) * k_rs, G, 16, NP)
        ok = pair < NP
        x0, x1 = rope_tail(x0, x1, pair, cos_ptr + row * cs_rs, sin_ptr + row * cs_rs, NP, RP)
        x0, x1 = fp4_stage1(x0, x1)
        c0, c1, scale = fp4_stage2(x0, x1)
        dst = pool_ptr + slot * pool_rs
        tl.store(dst + pair, (c0 | (c1 << 4)).to(tl.uint8), mask=ok)
        g = tl.arange(0, G)[:, None]
        tl.store(dst + NP + g, exponent_byte(scale).to(tl.uint8), mask=g < D // 32)


# ------------------------------------------------------------------------------------ wrappers
def _check_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, pool: torch.Tensor,
                row_bytes: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    assert d % group == 0 and pool.dtype == torch.uint8 and pool.dim() == 2 and pool.size(1) == row_bytes, (x.shape, pool.shape)
    assert pool.stride(1) == 1 and slots.shape == (n,) and cos.shape == sin.shape and cos.size(0) == n
    assert 2 * cos.size(1) <= d and cos.dtype == sin.dtype == torch.float32
    if x.stride(1) != 1:
        x = x.contiguous()
    return x, cos.contiguous(), sin.contiguous()


@window_kv_store.triton_impl
def window_kv_store_triton(kv, norm_weight, eps, cos, sin, slots, pool, num_warps: int = 4):
    n, d = kv.shape
    if n == 0:
        return
    kv, cos, sin = _check_rows(kv, cos, sin, slots, pool, d + d // 32, 32)
    _window_kv_store_kernel[(n,)](
        kv, kv.stride(0), norm_weight.contiguous(), cos, sin, cos.stride(0), slots.contiguous(), pool, pool.stride(0),
        float(eps), D=d, RP=cos.size(1), G=next_pow2(d // 32), num_warps=num_warps, **NO_FMA,
    )


@compressed_kv_store.triton_impl
def compressed_kv_store_triton(latent, cos, sin, slots, pool, num_warps: int = 4):
    n, d = latent.shape
    if n == 0:
        return
    latent, cos, sin = _check_rows(latent, cos, sin, slots, pool, d // 2 + d // 16, 16)
    _compressed_kv_store_kernel[(n,)](
        latent, latent.stride(0), cos, sin, cos.stride(0), slots.contiguous(), pool, pool.stride(0),
        D=d, RP=cos.size(1), G=next_pow2(d // 16), num_warps=num_warps, **NO_FMA,
    )


@index_key_store.triton_impl
def index_key_store_triton(k, cos, sin, slots, pool):
    n, d = k.shape
    if n == 0:
        return
    k, cos, sin = _check_rows(k, cos, sin, slots, pool, d // 2 + d // 32, 32)
    _index_key_store_kernel[(n,)](
        k, k.stride(0), cos, sin, cos.stride(0), slots.contiguous(), pool, pool.stride(0),
        D=d, RP=cos.size(1), G=next_pow2(d // 32), num_warps=1, **NO_FMA,
    )


__all__ = ["compressed_kv_store_triton", "index_key_store_triton", "window_kv_store_triton"]
