"""Runs the mHC Triton kernels through Triton's CPU interpreter against their twins, bit for bit (gates,
stream collapse and expand), and the gates kernel's chunked sum of squares against
`reduction.ordered_sum`, and the fused site entry (`mhc_enter`) against the twins given its GEMM; prints 'PASS name' / 'FAIL name: reason'. Start with TRITON_INTERPRET=1 (and
ATEN_CPU_CAPABILITY=default: the interpreter runs torch's CPU exp / sigmoid, see mhc_triton.py).
Oracle: `ops.mhc_gates.torch`, `ops.mhc_collapse.torch`, `ops.mhc_expand.torch`, `reduction.ordered_sum`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "python"), str(ROOT / "sgl-kernel")]
assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402  (after the path and the interpreter switch)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dsv41_kernels import ops  # noqa: E402
from dsv41_kernels.triton_numerics import ordered_sumsq  # noqa: E402
from check_runner import run_checks  # noqa: E402
from mhc_cases import (assert_bits_equal, assert_gates_equal, build_enter, build_gates, build_streams,  # noqa: E402
                       enter_oracle)
from sglang_dsv41.reduction import cascade_step, ordered_sum  # noqa: E402

# (t, n, h, rows, chunks, dtype, extreme, iters, mix_scale)
GATE_CASES = [
    (5, 4, 128, 1, None, "bf16", False, 20, 3.0),
    (13, 4, 128, 4, None, "bf16", True, 20, 3.0),  # 13 rows: the last program has 1 live row of 4
    (9, 4, 128, 2, None, "fp32", True, 20, 30.0),  # fp32 streams, large logits
    (3, 4, 5120, 1, None, "bf16", False, 20, 3.0),  # the released width D = 20480 (5 loop iterations of 8 chunks)
    (10, 4, 5120, 4, 16, "bf16", True, 20, 3.0),  # 16 chunks per iteration: the last one is half masked
    (7, 3, 96, 2, None, "bf16", False, 20, 3.0),  # n = 3: a padded 4 x 4 tile
    (8, 1, 64, 8, None, "fp32", True, 20, 3.0),
    (4, 2, 400, 1, None, "bf16", False, 1, 3.0),  # iters = 1; D = 800: 1 full chunk + 9 leftover rows
    (6, 4, 128, 1, None, "bf16", False, 3, 1e3),  # saturated sigmoids, exp underflow everywhere
    (0, 4, 128, 1, None, "bf16", False, 20, 3.0),
]
# (rows of 32, chunks per iteration): leftover rows, one and many chunks, level-2 pushes (every 256 rows),
# masked chunks past the last full one (325 rows in 16-chunk iterations: a push would fall on a masked chunk)
# (t, n, h, streams dtype, y dtype, extreme, tb, block_h): T not a multiple of tb, H not a multiple of
# block_h, n = 1..4, fp32 streams (and a bf16 y beside them), T = 0, the launch defaults at H = 5120
STREAM_CASES = [
    (13, 4, 1100, "bf16", "bf16", True, 4, 256),
    (12, 3, 96, "fp32", "fp32", True, 8, 64),
    (14, 2, 300, "bf16", "bf16", True, 2, 128),
    (12, 1, 200, "bf16", "bf16", True, 1, 128),
    (5, 4, 5120, "bf16", "bf16", False, None, None),
    (12, 4, 80, "fp32", "bf16", True, 4, 32),
    (0, 4, 5120, "bf16", "bf16", False, None, None),
]
# (t, n, h, streams dtype, extreme, rows, mix GEMM config): the GEMM split in 2 and 4 chunk partials (the
# kernel folds them) or not (C = 1), 13 rows in programs of 4, n = 3, fp32 streams, T = 0
_SPLIT256 = (16, 32, 64, False, True, 4, 3, 256)
ENTER_CASES = [
    (5, 4, 128, "bf16", False, None, _SPLIT256),
    (13, 4, 256, "bf16", True, 4, _SPLIT256),
    (9, 4, 128, "bf16", True, 2, (16, 32, 64, False, False, 4, 3)),
    (7, 3, 96, "bf16", False, None, (16, 32, 32, False, True, 4, 3, 96)),
    (8, 4, 64, "fp32", True, 1, _SPLIT256),
    (0, 4, 128, "bf16", False, None, None),
]
SUMSQ_CASES = [(1, 1), (15, 1), (16, 1), (53, 1), (53, 4), (640, 8), (640, 16), (640, 1), (600, 2), (300, 8), (325, 16)]


@triton.jit
def sumsq_kernel(x_ptr, out_ptr, M, D: tl.constexpr, STEP: tl.constexpr, G: tl.constexpr, ROWS: tl.constexpr):
    """x [M, D] contiguous -> out [M]: the kernel's sum of squares per row."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = row < M
    tl.store(out_ptr + row, ordered_sumsq(x_ptr + row[:, None, None] * D, ok[:, None, None], D, STEP, G), mask=ok)


def main() -> int:
    torch.set_num_threads(1)
    checks = []
    for t, n, h, rows, chunks, dt, extreme, iters, ms in GATE_CASES:
        def gates(t=t, n=n, h=h, rows=rows, chunks=chunks, dt=dt, extreme=extreme, iters=iters, ms=ms):
            dtype = torch.bfloat16 if dt == "bf16" else torch.float32
            x, mix, base, scale = build_gates(t, n, h, seed=t * 31 + n * h, dtype=dtype, mix_scale=ms, extreme=extreme)
            args = (x, mix, base, scale, iters, 1e-6, 1e-6)
            assert_gates_equal(ops.mhc_gates.triton(*args, rows=rows, chunks=chunks), ops.mhc_gates.torch(*args))

        checks.append((f"mhc_gates-t{t}-n{n}-h{h}-rows{rows}-chunks{chunks}-{dt}-extreme{extreme}-iters{iters}", gates))

    def strided():  # x a column slice of a wider tensor (row stride != D), mix from a transposed buffer
        x, mix, base, scale = build_gates(11, 4, 128, seed=5, extreme=True)
        wide = torch.cat([x, x[:, :64]], dim=1)[:, :512]
        mix_t = mix.t().contiguous().t()
        args = (wide, mix_t, base, scale, 20, 1e-6, 1e-6)
        assert_gates_equal(ops.mhc_gates.triton(*args, rows=4), ops.mhc_gates.torch(x, mix, base, scale, 20, 1e-6, 1e-6))

    checks.append(("mhc_gates-strided-inputs", strided))

    for t, n, h, dt, ydt, ex, tb, bh in STREAM_CASES:
        def inputs(t=t, n=n, h=h, dt=dt, ydt=ydt, ex=ex):
            dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
            y, r, pre, post, comb = build_streams(t, n, h, seed=t * 7 + n * h, dtype=dtypes[dt], extreme=ex)
            return y.to(dtypes[ydt]), r, pre, post, comb

        def collapse(inputs=inputs, tb=tb, bh=bh):
            _, r, pre, _, _ = inputs()
            assert_bits_equal(ops.mhc_collapse.triton(r, pre, tb=tb, block_h=bh), ops.mhc_collapse.torch(r, pre))

        def expand(inputs=inputs, tb=tb, bh=bh):
            y, r, _, post, comb = inputs()
            want = ops.mhc_expand.torch(y, r, post, comb)
            assert_bits_equal(ops.mhc_expand.triton(y, r, post, comb, tb=tb, block_h=bh), want)

        cid = f"t{t}-n{n}-h{h}-{dt}-y{ydt}-extreme{ex}-tb{tb}-bh{bh}"
        checks += [(f"mhc_collapse-{cid}", collapse), (f"mhc_expand-{cid}", expand)]

    def streams_strided():  # streams and y column slices of wider rows (token / stream strides != H)
        y, r, pre, post, comb = build_streams(13, 4, 200, seed=9, extreme=True)
        wide_r = torch.cat([r, r[:, :, :56]], dim=2)[:, :, :200]
        wide_y = torch.cat([y, y[:, :40]], dim=1)[:, :200]
        assert_bits_equal(ops.mhc_collapse.triton(wide_r, pre, tb=4, block_h=64), ops.mhc_collapse.torch(r, pre))
        got = ops.mhc_expand.triton(wide_y, wide_r, post, comb.transpose(1, 2).contiguous().transpose(1, 2), tb=4,
                                    block_h=64)
        assert_bits_equal(got, ops.mhc_expand.torch(y, r, post, comb))

    checks.append(("mhc_collapse_expand-strided-inputs", streams_strided))

    for t, n, h, dt, ex, rows, cfg in ENTER_CASES:
        def enter(t=t, n=n, h=h, dt=dt, ex=ex, rows=rows, cfg=cfg):
            dtype = torch.bfloat16 if dt == "bf16" else torch.float32
            args = build_enter(t, n, h, seed=t * 13 + n * h, dtype=dtype, extreme=ex)
            got = ops.mhc_enter.triton(*args, rows=rows, gemm_config=cfg)
            mix = ops.fp32_linear.triton(args[0].flatten(1), args[1], config=cfg)
            want = enter_oracle(args, mix)
            assert_gates_equal(got[:3], want[:3], "gates")
            assert_bits_equal(got[3], want[3], "x")
            assert_bits_equal(got[3], ops.mhc_enter.torch(*args)[3], "x vs the twin")

        checks.append((f"mhc_enter-t{t}-n{n}-h{h}-{dt}-extreme{ex}-rows{rows}-cfg{cfg}", enter))

    for nrows, g in SUMSQ_CASES:
        def sumsq(nrows=nrows, g=g):
            d, m = 32 * nrows, 5
            gen = torch.Generator().manual_seed(nrows + g)
            x = (torch.randn(m, d, generator=gen) * torch.pow(10.0, torch.rand(m, d, generator=gen) * 6 - 3)).bfloat16()
            x[3:].view(2, nrows, 32)[:, :, 1:] = 0  # one live accumulator: the total is its sum, last bits kept
            out = torch.empty(m)
            sumsq_kernel[(triton.cdiv(m, 2),)](x, out, m, D=d, STEP=cascade_step(nrows), G=g, ROWS=2)
            xf = x.float()
            want = ordered_sum(xf * xf)
            assert torch.equal(out.view(torch.int32), want.view(torch.int32)), (out - want).abs().max().item()

        checks.append((f"ordered_sumsq-d{32 * nrows}-chunks{g}", sumsq))

    return run_checks(checks)


if __name__ == "__main__":
    raise SystemExit(main())
