"""Deterministic (batch-invariant) mode: SGLANG_DSV41_DETERMINISTIC=1.

With it set, every row's result is independent of the batch it runs in (how many other rows, which
ones) and of the decode-graph choice: the few GPU paths whose reduction order depends on the row
count are replaced by fixed-shape ones (docs/numerics.md, "Deterministic mode"):
  bf16 GEMMs (`BF16Linear`, the `wo_a` grouped product)  run as GEMMs of exactly `ROW_TILE` rows
      (the last zero-padded), so the library picks the same kernel, hence the same K order, for
      every row whatever the batch;
  sparse attention (Triton)  never splits the key list across programs (the split count depends on
      the row count, and the split partials are combined in a different order), nor runs the prefill
      library-GEMM path (`dsv41_kernels.attention_prefill`);
  FP8 / MXFP4 GEMMs and the grouped MoE  never take the bf16 prefill path (`dsv41_kernels.dequant_triton`:
      library bf16 GEMMs over exact bf16 operands, whose addition order depends on the call's size),
      nor split K at decode (`gemm_triton.fold_config`, `moe_triton.split_counts`: the chunk count,
      hence the fp32 addition points, depends on the call's row count).
  the fp32 GEMM kernel  keeps chunks of 1024 for the decode mHC mix (the default takes chunks of 256 at
      <= 64 rows, `fp32_gemm_triton.FAST_CHUNK`).
Everything else is batch-invariant by construction (row-wise Triton kernels with fixed orders, the
fp32 GEMMs `fp32_linear`: `row_tiled` 64-row tiles, or on the GPU the kernel's M-independent order).
Read at every call, like SGLANG_DSV41_TORCH_OPS; a captured decode graph
keeps the mode it was captured in.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import torch

DETERMINISTIC_ENV = "SGLANG_DSV41_DETERMINISTIC"
ROW_TILE = 64


_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def deterministic(environ: Mapping[str, str] | None = None) -> bool:
    """Whether SGLANG_DSV41_DETERMINISTIC (in `environ`, default os.environ) asks for batch-invariant numerics.
    Any value outside 1/true/yes/on and unset/0/false/no/off raises ValueError naming the variable (checked at
    server startup by `sglang.server_args.validate_flags`), never a silent default."""
    env = os.environ if environ is None else environ
    raw = env.get(DETERMINISTIC_ENV, "").strip().lower()
    if raw not in _ON + _OFF:
        raise ValueError(f"{DETERMINISTIC_ENV}={env[DETERMINISTIC_ENV]!r}: expected one of 1, true, yes, on "
                         f"(batch-invariant) or 0, false, no, off (default)")
    return raw in _ON


def row_tiled(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """fn applied to x [M, ...] as calls on exactly `tile` rows (the last tile zero-padded), the
    results concatenated and cut to M rows. fn must be row-wise (row i of fn(t) depends on t[i] only).
    Shared by `layers.linear.fp32_linear` and its kernel op's twin (`dsv41_kernels.fp32_gemm`)."""
    m = x.size(0)
    pad = -m % tile
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
    if x.size(0) == 0:
        return fn(x)
    return torch.cat([fn(t) for t in x.split(tile)])[:m]
