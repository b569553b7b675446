"""CPU: the fp32 reduction orders fixed in docs/numerics.md ("Fixed fp32 reduction orders").

1. RMSNorm statistic (`reduction.mean_square`): equal to a hand-written scalar fp32 loop in the
   documented order, and to torch's CPU `x.float().square().mean(-1)` (DeepSeek's reference RMSNorm)
   for every width the model uses; the Triton helper (`triton_numerics.ordered_sumsq`, run through the
   interpreter) gives the same sums.
2. FP8 / MXFP4 GEMMs: exact block partials (one fp32 rounding each) and the K-order fp32
   accumulation equal a hand-written scalar loop; the layers' formulation (`quant.blockwise_scaled_mm`,
   a float64 bmm) equals the kernel twins' (`dsv41_kernels.gemm`, a float64 einsum).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_dsv41.quant import (
    e8m0_to_fp32,
    fp4_linear,
    fp8_linear,
    mxfp8_quant,
    quant_fp8_weight,
    quant_mxfp4,
)
from sglang_dsv41.quant.fp8 import blockwise_scaled_mm
from sglang_dsv41.reduction import mean_square
from sglang_dsv41.tiny import PRESETS

F32 = np.float32


# ------------------------------------------------------------------ hand-written orders
def hand_sum(s: list) -> np.float32:
    """The documented order, one fp32 scalar add at a time (s: np.float32 values of one row)."""
    d = len(s)

    def cascade(rows: list, width: int) -> list:
        # rows: list of `width`-tuples; ATen multi_row_sum with 4 levels
        n = len(rows)
        p = max(4, ((n - 1).bit_length() if n > 1 else 0) // 4)
        step, mask = 1 << p, (1 << p) - 1
        acc = [[F32(0)] * width for _ in range(4)]
        i = 0
        while i + step <= n:
            for _ in range(step):
                acc[0] = [acc[0][c] + rows[i][c] for c in range(width)]
                i += 1
            for lev in range(1, 4):
                acc[lev] = [acc[lev][c] + acc[lev - 1][c] for c in range(width)]
                acc[lev - 1] = [F32(0)] * width
                if i & (mask << (lev * p)):
                    break
        while i < n:
            acc[0] = [acc[0][c] + rows[i][c] for c in range(width)]
            i += 1
        out = acc[0]
        for lev in range(1, 4):
            out = [out[c] + acc[lev][c] for c in range(width)]
        return out

    def row_sum(vecs: list, lanes: int) -> list:
        n4 = len(vecs) // 4
        rows = [tuple(vecs[4 * r + k][lane] for k in range(4) for lane in range(lanes)) for r in range(n4)]
        flat = cascade(rows, 4 * lanes)  # column k * lanes + lane
        cols = [flat[k * lanes:(k + 1) * lanes] for k in range(4)]
        p0 = cols[0]
        for j in range(4 * n4, len(vecs)):
            p0 = [p0[lane] + vecs[j][lane] for lane in range(lanes)]
        for k in range(1, 4):
            p0 = [p0[lane] + cols[k][lane] for lane in range(lanes)]
        return p0

    if d < 8:
        return F32(0) + row_sum([(v,) for v in s], 1)[0]
    nv = d // 8
    lanes = row_sum([tuple(s[8 * j: 8 * j + 8]) for j in range(nv)], 8)
    total = F32(0)
    for j in range(8 * nv, d):
        total = total + s[j]
    for lane in range(8):
        total = total + lanes[lane]
    return F32(0) + total


def hand_block_gemm(a: np.ndarray, a_s: np.ndarray, b: np.ndarray, b_s: np.ndarray, block: int = 32,
                    sequential: bool = False) -> np.ndarray:
    """acc = 0; per K block in order: p = fp32(exact sum of the block's products) (or, `sequential`,
    p = 0, p += a*b one fp32 add at a time: DeepSeek's CPU order); acc += (p * a_s) * b_s."""
    m, k = a.shape
    n = b.shape[0]
    out = np.zeros((m, n), dtype=F32)
    for i in range(m):
        for j in range(n):
            acc = F32(0)
            for kb in range(k // block):
                if sequential:
                    p = F32(0)
                    for c in range(kb * block, (kb + 1) * block):
                        p = p + F32(a[i, c]) * F32(b[j, c])
                else:  # python floats are float64: each product and the 32-term sum are exact
                    p = F32(sum(float(a[i, c]) * float(b[j, c]) for c in range(kb * block, (kb + 1) * block)))
                acc = acc + (p * F32(a_s[i, kb])) * F32(b_s[j, kb])
            out[i, j] = acc
    return out


def _rows(n: int, d: int, seed: int, spread: float = 3.0, dtype=torch.bfloat16) -> torch.Tensor:
    """[n, d] with per-element magnitudes over ~e^(+-3 spread) and per-row scales 1e-6..1e6."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.exp(torch.randn(n, d, generator=g) * spread)
    return (x * torch.pow(10.0, torch.linspace(-6, 6, n)).unsqueeze(1)).to(dtype)


# ------------------------------------------------------------------ RMSNorm statistic
@pytest.mark.parametrize("d", [5, 8, 40, 45, 96, 512, 8288])
def test_mean_square_is_the_documented_order(d):
    # 5: scalar path; 40: a leftover vector; 45: a scalar tail; 512: one chunk of 16 rows;
    # 8288 = 259 rows of 32: 16 chunks (a level-2 add at 256 rows) and 3 leftover rows
    x = _rows(3, d, seed=d)
    ms = mean_square(x)
    assert ms.shape == (3, 1) and ms.dtype == torch.float32
    for r in range(3):
        sq = [F32(v) * F32(v) for v in x[r].float().tolist()]
        want = hand_sum(sq) / F32(d)
        assert np.float32(ms[r, 0].item()).tobytes() == want.tobytes(), (d, r)


def _model_widths() -> list[int]:
    widths = {5120, 1280, 512, 128, 4 * 5120}  # release: hidden, q_lora, head_dim, index dim, mHC
    for p in PRESETS.values():
        widths |= {p.hidden, p.q_lora, p.head_dim, p.index_dim, 4 * p.hidden, p.engram_dim}
    return sorted(widths)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "DEFAULT",
                    reason="compares with ATen's CPU kernels under ATEN_CPU_CAPABILITY=default (test/conftest.py)")
@pytest.mark.parametrize("d", _model_widths())
def test_mean_square_equals_torch_cpu_mean(d):
    for dtype, seed in ((torch.bfloat16, 1), (torch.float32, 2)):
        x = _rows(16, d, seed=seed + d, dtype=dtype)
        want = x.float().square().mean(-1, keepdim=True)  # DeepSeek's RMSNorm statistic
        assert torch.equal(mean_square(x).view(torch.int32), want.view(torch.int32)), (d, dtype)
        x3 = x.view(4, 4, d)  # [T, n, H] streams (Engram gate): a statistic per (token, stream)
        assert torch.equal(mean_square(x3), x3.float().square().mean(-1, keepdim=True))


def test_mean_square_is_batch_invariant():
    x = _rows(64, 1280, seed=5)
    full = mean_square(x)
    assert all(torch.equal(mean_square(x[i: i + 1]), full[i: i + 1]) for i in (0, 17, 63))
    assert torch.equal(mean_square(x[5:9]), full[5:9])


_INTERP_SCRIPT = r"""
import sys, torch, triton, triton.language as tl
from dsv41_kernels.triton_numerics import NO_FMA, ordered_sumsq, rms_rstd, sumsq_chunks
from sglang_dsv41.reduction import cascade_step, mean_square

@triton.jit
def _k(x_ptr, x_rs, ss_ptr, rs_ptr, n, eps, D: tl.constexpr, R: tl.constexpr, STEP: tl.constexpr,
       G: tl.constexpr):
    r = tl.program_id(0) * R + tl.arange(0, R)
    ok = r < n
    ss = ordered_sumsq(x_ptr + (r.to(tl.int64) * x_rs)[:, None, None], ok[:, None, None], D, STEP, G)
    tl.store(ss_ptr + r, ss, mask=ok)
    tl.store(rs_ptr + r, rms_rstd(ss, D * 1.0, eps), mask=ok)

g = torch.Generator().manual_seed(0)
for d, dt in [(d, dt) for d in (32, 96, 512) for dt in (torch.bfloat16, torch.float32)] + [(8288, torch.bfloat16)]:
    if True:
        x = (torch.randn(3, d, generator=g) * torch.exp(torch.randn(3, d, generator=g) * 3)).to(dt)
        ss, rs = torch.empty(3), torch.empty(3)
        _k[(2,)](x, x.stride(0), ss, rs, 3, 1e-20, D=d, R=2, STEP=cascade_step(d // 32),
               G=sumsq_chunks(d, cascade_step(d // 32)), **NO_FMA)
        ms = mean_square(x)[:, 0]
        ok = torch.equal(ss / d, ms) and torch.equal(rs, torch.rsqrt(ms + 1e-20))
        print(("PASS" if ok else "FAIL"), d, dt, flush=True)
"""


def test_triton_ordered_sumsq_under_interpreter():
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(root / "python"), str(root / "sgl-kernel"), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _INTERP_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert len(lines) == 7 and all(ln.startswith("PASS") for ln in lines), res.stdout + res.stderr[-2000:]


# ------------------------------------------------------------------ GEMM block partials
def _e4m3_values(shape, seed: int, spread: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * spread)
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).float()


@pytest.mark.parametrize("spread", [0.3, 2.5])
def test_block_gemm_is_the_documented_order(spread):
    from dsv41_kernels.gemm import _scaled_mm

    m, n, k = 3, 5, 96
    a, b = _e4m3_values((m, k), 1, spread), _e4m3_values((n, k), 2, spread)
    a[0, :7] = -0.0
    g = torch.Generator().manual_seed(3)
    a_s = torch.ldexp(torch.ones(m, k // 32), torch.randint(-20, 5, (m, k // 32), generator=g))
    b_s = torch.ldexp(torch.ones(n, k // 32), torch.randint(-20, 5, (n, k // 32), generator=g))
    want = hand_block_gemm(a.numpy(), a_s.numpy(), b.numpy(), b_s.numpy())
    for got in (blockwise_scaled_mm(a, a_s, b, b_s), _scaled_mm(a, a_s, b, b_s)):
        assert got.numpy().tobytes() == want.tobytes()
    if spread > 1:  # the data is order-sensitive: DeepSeek's sequential fp32 adds round differently
        seq = hand_block_gemm(a.numpy(), a_s.numpy(), b.numpy(), b_s.numpy(), sequential=True)
        assert seq.tobytes() != want.tobytes()


def _gemm_inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g) * 1.5)
    if m >= 4:
        x[0] = 0
        x[1] *= 1e4
        x[2, 5] = float("nan")
    w = torch.randn(n, k, generator=g) * torch.pow(10.0, torch.rand(n, 1, generator=g) * 2 - 3)
    return x.bfloat16(), w


@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (7, 100, 128), (40, 96, 256)])
def test_layer_gemms_equal_kernel_twins(m, n, k):
    from dsv41_kernels import gemm

    x, w = _gemm_inputs(m, n, k, seed=m)
    wq, ws = quant_fp8_weight(w)
    assert torch.equal(fp8_linear(x, wq, ws).view(torch.int16), gemm.fp8_linear.torch(x, wq, ws).view(torch.int16))
    w4, s4 = quant_mxfp4(w)
    want = fp4_linear(x, w4, s4)
    assert torch.equal(want.view(torch.int16), gemm.fp4_linear.torch(x, w4, s4).view(torch.int16))
    assert torch.equal(want.view(torch.int16), gemm.fp4_linear.torch(x, w4.view(torch.int8), s4).view(torch.int16))
    # a leading dim and a row subset give the same rows (batch invariance)
    full = fp8_linear(x, wq, ws).view(torch.int16)
    assert torch.equal(fp8_linear(x.unsqueeze(0), wq, ws)[0].view(torch.int16), full)
    assert torch.equal(fp8_linear(x[-1:], wq, ws).view(torch.int16), full[-1:])


def test_layer_gemm_is_hand_order_end_to_end():
    x, w = _gemm_inputs(2, 6, 64, seed=11)
    wq, ws = quant_fp8_weight(w)
    q, qs = mxfp8_quant(x)
    wsr = e8m0_to_fp32(ws).repeat_interleave(32, 0)[:6]
    want = torch.from_numpy(hand_block_gemm(q.float().numpy(), qs.numpy(), wq.float().numpy(), wsr.numpy()))
    assert torch.equal(fp8_linear(x, wq, ws), want.to(torch.bfloat16))
