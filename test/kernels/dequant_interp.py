"""Runs the exact-bf16-operand kernels (dequant_triton) and the bf16 prefill paths built on them through
Triton's CPU interpreter; prints 'PASS name' / 'FAIL name: reason'. Start with TRITON_INTERPRET=1.
  mxfp8_qdq        bitwise (NaN as NaN) the twin's MXFP8 values times their scales, plain and gathered rows
  fp4_weight_bf16  bitwise the twin GEMM's E2M1 decode times its scales, into a strided slice (the rest untouched)
  fp8_weight_bf16  bitwise E4M3 times the 32 x 32 tile scales, N not a multiple of 32
  swiglu_qdq       against the twin's SwiGLU, routing weight and MXFP8 round trip (same bits but for
                   silu's exp: >= 99% of elements equal, relative error <= 2^-7)
  moe_bf16         moe_experts_bf16 against the twin (moe_cases tolerance), and split into expert chunks
                   (CHUNK_BYTES small) bit for bit the one-chunk result
  dense_bf16       the dense bf16 path of fp8_linear / fp4_linear against the twins (GEMM tolerance)
  attention_keys   attention_prefill's key gather bitwise the twin's dequantized keys (invalid slots: zeros)
  attention_bf16   attention_prefill's path against the fp64 oracle, no worse than the twin (kernel_compare
                   "attention": probabilities rounded against the row's final max, not a running one), rows with no
                   valid key, short windows and no compressed keys included
  attention_decode the decode kernel (attention_triton._attn_kernel) in the launch configs the GPU sweeps use
                   (head blocks, key splits, 32- and 64-key blocks) against the fp64 oracle, no worse than the twin"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "python"), str(ROOT / "sgl-kernel")]
assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"


def main() -> int:
    import torch
    import torch.nn.functional as F

    from check_runner import run_checks
    from dsv41_kernels import dequant_triton as dq
    from dsv41_kernels import ops
    from dsv41_kernels.gemm import _e2m1_decode
    from moe_cases import assert_moe_close, build_moe, same_bits
    from sglang_dsv41.quant import e8m0_to_fp32, mxfp8_quant

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(11)

    def twin_qdq(x: torch.Tensor) -> torch.Tensor:
        q, s = mxfp8_quant(x.float(), 32)
        return (q.float().unflatten(-1, (-1, 32)) * s.unsqueeze(-1)).flatten(-2).bfloat16()

    def qdq():
        x = (torch.randn(37, 160, generator=g) * torch.logspace(-7, 4, 37)[:, None]).bfloat16()
        x[3, 5], x[4, :32], x[5, 7], x[6, 40] = float("nan"), 0.0, -0.0, 1e30  # NaN group, zero group (amax clamp), -0, saturation
        want = twin_qdq(x)
        assert same_bits(dq.mxfp8_qdq(x), want), "plain rows"
        rows = torch.tensor([5, 0, 36, 12, 12, 3])
        assert same_bits(dq.mxfp8_qdq(x, rows * 3 + 2, 3), want[rows]), "gathered rows (rows // div)"
        assert dq.mxfp8_qdq(x, rows[:0]).shape == (0, 160)

    def fp4():
        e, n, k = 3, 40, 192
        w = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, generator=g)
        s = torch.randint(100, 140, (e, n, k // 32 + 1), dtype=torch.uint8, generator=g)  # a spare scale column
        out = torch.full((e, 2 * n, k), 7.0).bfloat16()
        dq.fp4_weight_bf16(w, s, out[:, n:])
        want = torch.stack([(_e2m1_decode(w[i]) * e8m0_to_fp32(s[i])[:, : k // 32].repeat_interleave(32, 1)).bfloat16()
                            for i in range(e)])
        assert torch.equal(out[:, n:].view(torch.int16), want.view(torch.int16)), "values"
        assert (out[:, :n] == 7).all(), "wrote outside its slice"

    def fp8():
        n, k = 70, 96
        w = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
        s = torch.randint(110, 135, (3, 4), dtype=torch.uint8, generator=g)
        want = (w.float() * e8m0_to_fp32(s)[torch.arange(n) // 32][:, torch.arange(k) // 32]).bfloat16()
        assert torch.equal(dq.fp8_weight_bf16(w, s).view(torch.int16), want.view(torch.int16))

    def swiglu():
        r, i = 21, 64
        gu = (torch.randn(r, 2 * i, generator=g) * 4).bfloat16()
        wt = torch.rand(r, generator=g)
        gg, uu = gu[:, :i].float().clamp(max=10.0), gu[:, i:].float().clamp(-10.0, 10.0)
        want = twin_qdq((wt[:, None] * (F.silu(gg) * uu)).bfloat16())
        got = dq.swiglu_qdq(gu, wt, 10.0)
        same = (got.view(torch.int16) == want.view(torch.int16)).float().mean().item()
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert same >= 0.99 and rel <= 2.0**-7, f"{same:.3f} of elements equal, relative error {rel:.2e}"

    def moe_bf16():
        if not hasattr(torch, "_grouped_mm"):
            print("torch has no _grouped_mm: moe_bf16 not checked")
            return
        from dsv41_kernels import moe_prefill

        x, ids, wts, *w = build_moe(40, 3, 5, 128, 96, seed=4)
        u8 = [a.view(torch.uint8) for a in w]
        got = moe_prefill.moe_experts_bf16(x, ids, wts, *u8, 10.0)
        assert_moe_close(got, ops.moe_experts.torch(x, ids, wts, *w, 10.0), "moe_experts_bf16")
        keep = moe_prefill.CHUNK_BYTES
        moe_prefill.CHUNK_BYTES = 2 * (3 * 96 * 128 * 2)  # two experts per chunk: 3 chunks
        try:
            chunked = moe_prefill.moe_experts_bf16(x, ids, wts, *u8, 10.0)
        finally:
            moe_prefill.CHUNK_BYTES = keep
        assert torch.equal(chunked.view(torch.int16), got.view(torch.int16)), "expert chunks changed bits"

    def dense_bf16():
        from dsv41_kernels.gemm_triton import _bf16_mm
        from kernel_cases import build

        for op, fp4 in (("fp8_linear", False), ("fp4_linear", True)):
            x, w, s = build(op, dict(m=24, n=72, k=128), 5, "cpu")["args"][:3]
            got = _bf16_mm(x, w.view(torch.uint8) if fp4 else w, s, 72, 128, fp4)
            want = getattr(ops, op).torch(x, w, s)
            rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
            assert rel <= 2.0**-8, f"{op}: relative error {rel:.2e}"

    def attention_keys():
        from dsv41_kernels.attention import _gather
        from dsv41_kernels.attention_prefill import gather_keys
        from kernel_cases import build
        from sglang_dsv41.quant import kv_fp4_unpack, window_kv_unpack

        q, wpool, ws, cpool, cs = build("sparse_attention_paged", dict(t=5, h=3, d=128, w=70, k=65), 3, "cpu")["args"][:5]
        got = gather_keys(wpool, ws, cpool, cs)
        wk, wv = _gather(wpool, ws, window_kv_unpack)
        ck, cv = _gather(cpool, cs, kv_fp4_unpack)
        want, valid = torch.cat([wk, ck], 1), torch.cat([wv, cv], 1)
        assert torch.equal(got[valid].view(torch.int16), want[valid].view(torch.int16)), "valid keys"
        assert (got[~valid].view(torch.int16) == 0).all(), "invalid slots are not zero keys"
        assert gather_keys(wpool, ws, None, None).shape == (5, 70, 128)

    def attention_bf16():
        from dsv41_kernels.attention_prefill import attention_bf16 as attend
        from kernel_cases import build, exact_attention
        from kernel_compare import assert_attention

        for p in (dict(t=5, h=3, d=128, w=70, k=65), dict(t=6, h=8, d=128, w=128, k=0, short=True),
                  dict(t=4, h=2, d=64, w=1, k=1)):
            case = build("sparse_attention_paged", p, 7, "cpu")
            args = case["args"]
            got = attend(*args)
            assert_attention(got, ops.sparse_attention_paged.torch(*args), exact_attention(case), what=f"attention {p}")
            if p["t"] > 2:
                assert (got[1] == 0).all(), "a row with no valid key is not zero"

    def attention_decode():
        from kernel_cases import build, exact_attention
        from kernel_compare import assert_attention

        for p, cfgs in ((dict(t=5, h=3, d=128, w=70, k=65), ((16, 1, 4, 2, 64), (16, 2, 4, 2, 32), (16, 4, 4, 2, 64))),
                        (dict(t=3, h=20, d=64, w=128, k=0, short=True), ((16, 1, 4, 2, 32), (32, 2, 8, 2, 64)))):
            case = build("sparse_attention_paged", p, 5, "cpu")
            args = case["args"]
            want, oracle = ops.sparse_attention_paged.torch(*args), exact_attention(case)
            for cfg in cfgs:
                got = ops.sparse_attention_paged.triton(*args, config=cfg)
                assert_attention(got, want, oracle, what=f"attention decode {p} config {cfg}")

    return run_checks((("mxfp8_qdq", qdq), ("fp4_weight_bf16", fp4), ("fp8_weight_bf16", fp8), ("swiglu_qdq", swiglu),
                       ("moe_bf16", moe_bf16), ("dense_bf16", dense_bf16), ("attention_keys", attention_keys),
                       ("attention_bf16", attention_bf16),
                       ("attention_decode", attention_decode)))


if __name__ == "__main__":
    raise SystemExit(main())
