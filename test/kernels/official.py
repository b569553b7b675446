"""DeepSeek's own CPU functions as independent oracles of the kernel twins (imported, never copied).

The folder is `../shared/official` relative to the repository root (override: SGLANG_DSV41_OFFICIAL_DIR,
for a checkout that is not next to `shared/`); every test that needs it skips, naming the folder, when
it is absent. `kernel_cpu()` is DeepSeek's `kernel_cpu.py` (CPU ports of its tilelang kernels:
act_quant, fp4_act_quant, fp8_gemm, fp4_gemm, sparse_attn, hc_split_sinkhorn, pack/unpack_fp4);
`model()` its reference `model.py` (RMSNorm, apply_rotary_emb, Engram, Expert, MoE, Block.hc_pre /
hc_post, select_candidate_blocks); `engram()` its `engram.py` (hash multipliers, NgramHashState).
Exact comparisons rely on ATEN_CPU_CAPABILITY=default (test/conftest.py sets it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FOLDER = Path(os.environ.get("SGLANG_DSV41_OFFICIAL_DIR") or ROOT.parent / "shared" / "official")
PACKAGE = "dsv41_official.models.demos.deepseek_v3_d_p.reference.deepseek_v41"


def _module(name: str):
    if not (FOLDER / "dsv41_official").is_dir():
        pytest.skip(f"DeepSeek's reference code not found: ../shared/official (looked in {FOLDER})")
    if str(FOLDER) not in sys.path:
        sys.path.insert(0, str(FOLDER))
    return importlib.import_module(f"{PACKAGE}.{name}")


def kernel_cpu():
    return _module("kernel_cpu")


def model():
    return _module("model")


def engram():
    return _module("engram")


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """The official GEMMs cast their fp32 result to torch's default dtype (bf16 in its model)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def freqs_cis(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """fp32 cos, sin [T, r] -> complex64 [T, r], the official rotary table (cos + i sin)."""
    return torch.complex(cos.float(), sin.float())


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Official `apply_rotary_emb` on the last 2r dims of x [T, d] or [T, h, d] (a copy; batch dim added)."""
    y = x.clone().unsqueeze(0)
    model().apply_rotary_emb(y[..., -2 * cos.size(-1) :], freqs_cis(cos, sin), inverse)
    return y[0]


def e8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """Official UE8M0 scales (float8_e8m0fnu, or fp32 powers of two) -> their exponent bytes uint8."""
    if scale.dtype != torch.float8_e8m0fnu:
        scale = scale.float().to(torch.float8_e8m0fnu)
    return scale.view(torch.uint8)
