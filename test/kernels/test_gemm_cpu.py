"""CPU: the GEMM kernels' MXFP8 activation quant (gemm_triton.mxfp8_quant_t) through Triton's
interpreter must give bitwise the bytes and scales of its oracle `sglang_dsv41.quant.mxfp8_quant` (with
`evens_first`, the oracle's bytes in the grouped MoE's K_EVENS_FIRST order)
(the GEMM itself runs through the interpreter in interp_check.py's grid); the split-K kernel, which quantizes
its K blocks in registers, gives the bits of the one-pass kernel after the separate quant on zero,
wide-range, huge and NaN rows (FP8 and FP4 weights); the two split-K orders (ordered:
block partials added in K order; folded, fast mode: K-order chunk sums added in chunk order) give bitwise
an explicit fp32 emulation of their order, on operands whose block partials are exact in fp32. TRITON_INTERPRET must be
set before Triton decorates the kernels, hence a subprocess running this file as a script."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from check_runner import run_script

pytest.importorskip("triton")


def _check() -> int:
    import torch

    from dsv41_kernels.gemm_triton import K_EVENS_FIRST, mxfp8_quant_t
    from kernel_cases import gemm_rows
    from kernel_compare import assert_match
    from sglang_dsv41.quant import mxfp8_quant

    g = torch.Generator().manual_seed(3)
    bad = 0
    for m, k in ((1, 32), (7, 96), (70, 64), (9, 256)):
        x = gemm_rows(m, k, g, special=m >= 6, inf=m >= 6)  # zero, wide-range, huge, NaN, inf rows
        q, s = mxfp8_quant_t(x)
        qe, se = mxfp8_quant_t(x, evens_first=True)
        wq, ws = mxfp8_quant(x)
        order = (torch.arange(k // 32)[:, None] * 32 + torch.tensor(K_EVENS_FIRST)[None, :]).flatten()
        try:  # e4m3 bytes exactly (NaN is the canonical 0x7F); scales bitwise up to NaN payloads
            assert_match(q.view(torch.uint8), wq.view(torch.uint8), "bitwise", what="q")
            assert_match(s.t(), ws, "bitwise", what="scale")
            assert_match(qe.view(torch.uint8), wq.view(torch.uint8)[:, order], "bitwise", what="q evens first")
            assert_match(se.t(), ws, "bitwise", what="scale (evens first)")
            print(f"PASS mxfp8_quant_t m={m} k={k}", flush=True)
        except AssertionError as e:
            bad += 1
            print(f"FAIL mxfp8_quant_t m={m} k={k}: {e}", flush=True)
    bad += _split_vs_one_pass()
    bad += _split_orders()
    return 1 if bad else 0


def _split_vs_one_pass() -> int:
    """Split-K (x quantized by `mxfp8_quant_t`) vs the one-pass kernel (x quantized by `_mxfp8_quant_kernel`),
    bitwise: ordered, and folded with chunks of one block (the same adds); 9 to 23 rows."""
    import torch

    from dsv41_kernels.gemm_triton import fp4_linear_triton, fp8_linear_triton
    from kernel_cases import build_gemm
    from kernel_compare import assert_match

    bad = 0
    for op, fn in (("fp8_linear", fp8_linear_triton), ("fp4_linear", fp4_linear_triton)):
        for m, n, k in ((9, 100, 256), (16, 64, 160), (23, 64, 160)):
            args = build_gemm(op, dict(m=m, n=n, k=k, special=True), 21 + m, "cpu")["args"]
            bm = 16 if m <= 16 else 32
            try:
                want = fn(*args, config=(64, 64, 4, 2))
                for cfg in ((bm, 64, 4, 2, 3, True), (bm, 32, 4, 2, 2, False), (bm, 64, 4, 2, 1, True, True)):
                    assert_match(fn(*args, config=cfg), want, "bitwise", what=f"{op} split-K {cfg}")
                print(f"PASS split-K vs one pass {op} m={m} n={n} k={k}", flush=True)
            except AssertionError as e:
                bad += 1
                print(f"FAIL split-K vs one pass {op} m={m} n={n} k={k}: {e}", flush=True)
    return bad


def _split_orders() -> int:
    """Integer-valued operands (|x| <= 7 on the MXFP8 grid, fp8 weights |w| <= 6) with block scales 2^-6..2^6,
    except K blocks 0 and 3 (scale 2^20, block 3 = -block 0): every 32-term block partial is exact, so the
    kernel's result depends only on how it adds the scaled partials. Emulate the ordered split (K order) and
    the folded one (chunks of KS blocks) in fp32 and compare bitwise. The two orders must differ: block 3
    cancels block 0, so the small partials added before the cancellation round away and those after it do
    not, and which ones come before it differs between the orders."""
    import torch

    from dsv41_kernels.gemm_triton import fp8_linear_triton
    from kernel_compare import assert_match

    g = torch.Generator().manual_seed(11)
    bad = 0
    for m, n, k, ks in ((3, 70, 512, 3), (20, 64, 384, 3)):
        x = torch.randint(-7, 8, (m, k), generator=g).float()
        x[:, ::32] = 7.0  # every group's amax is 7: scale 2^-6, q = 64 x exact in e4m3
        wq = torch.randint(-6, 7, (n, k), generator=g).float()
        x[:, 96:128] = x[:, 0:32]
        wq[:, 96:128] = -wq[:, 0:32]
        sexp = torch.randint(121, 134, ((n + 31) // 32, k // 32), generator=g).to(torch.uint8)  # 2^-6 .. 2^6
        sexp[:, 0] = sexp[:, 3] = 147
        w = wq.to(torch.float8_e4m3fn)
        sw = torch.pow(2.0, sexp.double() - 127).repeat_interleave(32, 0)[:n].repeat_interleave(32, 1)
        parts = (x.double()[:, None, :] * (wq.double() * sw)[None]).unflatten(2, (k // 32, 32)).sum(-1)  # [m, n, kb] exact
        parts = parts.float()

        def fold(chunk: int) -> torch.Tensor:
            out = torch.zeros(m, n)
            for c0 in range(0, k // 32, chunk):
                acc = torch.zeros(m, n)
                for kb in range(c0, min(c0 + chunk, k // 32)):
                    acc = acc + parts[:, :, kb]
                out = out + acc
            return out.bfloat16()

        xb = x.bfloat16()
        try:
            ordered = fp8_linear_triton(xb, w, sexp, config=(16 if m <= 16 else 32, 64, 4, 3, 2, True))
            folded = fp8_linear_triton(xb, w, sexp, config=(16 if m <= 16 else 32, 64, 4, 3, ks, True, True))
            assert_match(ordered, fold(1), "bitwise", what="ordered split-K")
            assert_match(folded, fold(ks), "bitwise", what="folded split-K")
            assert not torch.equal(ordered.view(torch.int16), folded.view(torch.int16)), "orders gave the same bits"
            print(f"PASS split-K orders m={m} n={n} k={k} ks={ks}", flush=True)
        except AssertionError as e:
            bad += 1
            print(f"FAIL split-K orders m={m} n={n} k={k} ks={ks}: {e}", flush=True)
    return bad


@pytest.mark.interp
def test_mxfp8_quant_kernel_bitwise_under_interpreter():
    run_script(Path(__file__), timeout=300)


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(root / "python"), str(root / "sgl-kernel")]
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    raise SystemExit(_check())
