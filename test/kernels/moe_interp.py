"""Runs the grouped MoE, its combine and RMSNorm Triton kernels through Triton's CPU interpreter on small
cases against their twins (also with K split in 2-5 runs, fast-mode decode), the shared expert's SwiGLU and
the router bit for bit against theirs (torch CPU's transcendentals: transcendentals.py), and the block-scaled GEMM's tile configs (one pass, SWAP one pass, ordered
split-K; 1, 2 and 4 K blocks per iteration) against each other, bit for bit; prints 'PASS name' /
'FAIL name: reason'. The fused routing tables equal the torch ones bit for bit. Start with TRITON_INTERPRET=1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "python"), str(ROOT / "sgl-kernel")]
assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"


def main() -> int:
    import torch

    from dsv41_kernels import ops
    from check_runner import run_checks
    from moe_cases import assert_moe_close, build_moe

    torch.set_num_threads(1)
    checks = []

    def moe():
        args = build_moe(9, 3, 5, 128, 96, seed=1)
        from dsv41_kernels.moe_triton import moe_experts_triton

        want = ops.moe_experts.torch(*args, 10.0)
        got = moe_experts_triton(*args, 10.0, config=(16, 64, 128, 4, 1, True))
        assert_moe_close(got, want)
        # SWAP tiles (hidden 128 = 4 K blocks: packed scale words in w1 / w3): same bits
        for cfg in ((64, 32, 32, 4, 1), (16, 64, 64, 4, 1, True), (32, 32, 64, 4, 1, True)):
            other = moe_experts_triton(*args, 10.0, config=cfg)
            assert torch.equal(other.view(torch.int16), got.view(torch.int16)), f"config {cfg}"
        # K split (fast-mode decode): the runs of K blocks each added once; the default call splits
        assert_moe_close(ops.moe_experts.triton(*args, 10.0), want)
        args = build_moe(9, 3, 5, 512, 384, seed=4)  # 16 / 12 K blocks
        want = ops.moe_experts.torch(*args, 10.0)
        for cfg in ((16, 64, 128, 4, 1, True, 2, 3), (16, 64, 128, 4, 1, True, 3, 2), (16, 32, 64, 4, 1, True, 4, 5),
                    (16, 64, 128, 4, 1, True, 2, 3, 80)):  # + a register cap (MAXNREG)
            assert_moe_close(moe_experts_triton(*args, 10.0, config=cfg), want)
        # stream-K: half a program per SM (every item cut into segments of one or two units), and 7 programs in all
        # (runs of whole items and of segments); each twice in a row (counters zeroed by each call)
        for cfg in ((16, 64, 128, 4, 1, True, 1, 1, None, 0.5), (16, 64, 128, 4, 1, True, 1, 1, None, 7 / 132),
                    (32, 64, 64, 4, 1, True, 1, 1, None, 5 / 132)):
            first = moe_experts_triton(*args, 10.0, config=cfg)
            assert_moe_close(first, want)
            assert torch.equal(moe_experts_triton(*args, 10.0, config=cfg).view(torch.int16), first.view(torch.int16))

    def gemm_configs():
        from dsv41_kernels.gemm_triton import fp4_linear_triton, fp8_linear_triton
        from kernel_cases import build

        configs = ((64, 64, 4, 4), (16, 64, 4, 4, 0, True), (64, 32, 4, 4, 0, True), (16, 64, 4, 4, 3, True))
        for op, fn in (("fp8_linear", fp8_linear_triton), ("fp4_linear", fp4_linear_triton)):
            for m, n, k in ((1, 96, 128), (8, 40, 64), (20, 33, 96)):  # 4, 2, 1 K blocks per iteration
                args = build(op, dict(m=m, n=n, k=k, special=True), 30 + m, "cpu")["args"]
                ref = fn(*args, config=(64, 16, 4, 4)).view(torch.int16)
                for cfg in configs if m <= 16 else configs[:3]:
                    got = fn(*args, config=cfg).view(torch.int16)
                    assert torch.equal(got, ref), f"{op} m={m} n={n} k={k} config {cfg}"

    def norm():
        g = torch.Generator().manual_seed(2)
        # 640: one partial cascade chunk; 5120: two loop iterations of 8 chunks (the last one part
        # masked); 20480: cascade level pushes at 256 and 512 rows of 32 (`ordered_sumsq`)
        for m, d in ((5, 640), (3, 5120), (2, 20480)):
            x = (torch.randn(m, d, generator=g) * torch.pow(10.0, torch.rand(m, 1, generator=g) * 6 - 3)).bfloat16()
            w = torch.rand(d, generator=g).bfloat16()
            got, want = ops.rms_norm.triton(x, w, 1e-6), ops.rms_norm.torch(x, w, 1e-6)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"rms_norm m={m} d={d}"

    def routing():
        from dsv41_kernels.moe_routing_triton import routing_tiles_fused
        from dsv41_kernels.moe_triton import routing_tiles

        g = torch.Generator().manual_seed(5)
        for t, k, e, bm in ((1, 6, 16, 16), (8, 6, 16, 16), (64, 6, 16, 16), (85, 6, 384, 16), (3, 2, 5, 64),
                            (256, 2, 3, 16), (7, 1, 40, 16)):
            ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
            if t == 8:
                ids[:, 0] = 3  # one expert in every row; the rest ascending / descending
                ids[:4, 1:] = torch.arange(4, 4 + k - 1)
                ids[4:, 1:] = torch.arange(4 + k - 2, 3, -1)
            w = torch.rand(t, k, generator=g)
            want = routing_tiles(ids, w, e, bm)
            got = routing_tiles_fused(ids.int() if t == 64 else ids, w, e, bm)
            for name, a, b in zip(("perm", "wt", "tile expert", "first", "end"), got, want):
                assert a.dtype == b.dtype and torch.equal(a, b), f"{name} T={t} k={k} E={e} BM={bm}: {a} != {b}"

    def combine():
        from moe_cases import combine_cases, same_bits

        for routed, shared in combine_cases():
            assert same_bits(ops.moe_combine.triton(routed, shared), ops.moe_combine.torch(routed, shared))

    def swiglu():
        from moe_cases import same_bits, swiglu_cases

        for gg, uu, limit, w in swiglu_cases():
            assert same_bits(ops.swiglu.triton(gg, uu, limit, w), ops.swiglu.torch(gg, uu, limit, w)), tuple(gg.shape)

    def route():
        from moe_cases import route_cases

        for case in route_cases():
            w, ids = ops.moe_route.triton(*case)
            want_w, want_ids = ops.moe_route.torch(*case)
            assert torch.equal(ids, want_ids), f"ids {tuple(case[0].shape)} k={case[2]}"
            assert torch.equal(w.view(torch.int32), want_w.view(torch.int32)), f"weights {tuple(case[0].shape)} k={case[2]}"

    def gate():
        from moe_cases import gate_cases

        for x, w, b, k, sc, nm, f, cfg in gate_cases():
            got_w, got_ids = ops.moe_gate.triton(x, w, b, k, sc, nm, f, gemm_config=cfg)
            want_w, want_ids = ops.moe_route.triton(ops.fp32_linear.triton(x, w, config=cfg), b, k, sc, nm, f)
            assert got_ids.dtype == torch.int32 and torch.equal(got_ids, want_ids.int()), f"ids {tuple(x.shape)} {cfg}"
            assert torch.equal(got_w.view(torch.int32), want_w.view(torch.int32)), f"weights {tuple(x.shape)} {cfg}"

    return run_checks((("moe_experts", moe), ("gemm_configs", gemm_configs), ("rms_norm", norm),
                       ("moe_combine", combine), ("moe_routing", routing), ("swiglu", swiglu), ("moe_route", route),
                       ("moe_gate", gate)))


if __name__ == "__main__":
    raise SystemExit(main())
