"""Runs the fp32 GEMM kernel (`fp32_linear`, fp32_gemm_triton.py) through Triton's CPU interpreter; prints
'PASS name' / 'FAIL name: reason'. Start with TRITON_INTERPRET=1.

Oracles: the twin `ops.fp32_linear.torch`, within fp32_gemm_cases.tolerance (K * 2**-22 * sum_k |x w|);
and, bit for bit, `chained` below: the kernel's documented order written out in torch (chunks of CHUNK,
each an fp32 chain from +0 in K order, the chunks added to +0 in order), which is what the kernel must
give under the interpreter, where its MMA step is a sequential chain (fp32_gemm_triton.py). Then batch
invariance (a row alone, or among 7 / 64 / 300 rows) and every launch config, bit for bit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "python"), str(ROOT / "sgl-kernel")]
assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402  (after the path and the interpreter switch)

from check_runner import run_checks  # noqa: E402
from dsv41_kernels import ops  # noqa: E402
from dsv41_kernels.fp32_gemm_triton import CHUNK, pick_config  # noqa: E402
from fp32_gemm_cases import assert_bits_equal, assert_within, build  # noqa: E402

BF, F32 = torch.bfloat16, torch.float32
# (m, n, k, x dtype, w dtype): FMA (an fp32 operand) and bf16 (SWAP / plain tiles), K below one chunk,
# several chunks with a short last one, split and unsplit picks, M = 0
CASES = [(7, 24, 2100, BF, F32), (70, 24, 1100, BF, F32), (5, 100, 300, BF, BF), (70, 100, 1100, BF, BF),
         (9, 40, 1030, F32, BF), (3, 17, 64, F32, F32), (0, 24, 300, BF, F32)]
# launch configs (BM, BN, BK, SWAP, SPLIT, warps, stages) that must all give the same bits
TC_CONFIGS = [(16, 64, 128, True, False, 4, 4), (32, 64, 64, True, True, 4, 4), (64, 64, 128, True, False, 4, 3),
              (64, 16, 64, False, False, 4, 4), (64, 128, 32, False, True, 8, 4), (128, 64, 64, False, False, 8, 4)]
FMA_CONFIGS = [(16, 32, 32, False, False, 4, 3), (32, 32, 32, False, True, 4, 3), (64, 32, 16, False, False, 4, 3),
               (16, 64, 16, False, True, 4, 3), (32, 64, 128, False, False, 4, 3)]


def chained(x: torch.Tensor, w: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """x [M, K], w [N, K] -> fp32 [M, N]: per chunk p = +0, p = p + x[:, k] * w[:, k] (product rounded,
    then the add) for k in order; the result +0 + p_0 + p_1 + ..."""
    xf, wf = x.float(), w.float()
    k = xf.size(1)
    total = torch.zeros(xf.size(0), wf.size(0))
    for c0 in range(0, k, chunk):
        p = torch.zeros_like(total)
        for j in range(c0, min(c0 + chunk, k)):
            p = p + xf[:, j : j + 1] * wf[:, j][None, :]
        total = total + p
    return total


def main() -> int:
    torch.set_num_threads(1)
    checks = []
    for m, n, k, xdt, wdt in CASES:
        def case(m=m, n=n, k=k, xdt=xdt, wdt=wdt):
            x, w = build(m, n, k, xdt, wdt, seed=m * 1000 + n + k)
            got = ops.fp32_linear.triton(x, w)
            cfg = pick_config(max(m, 1), n, k, wdt == xdt == BF, "cpu")
            chunk = cfg[7] if len(cfg) > 7 else CHUNK  # the fast mode's decode mHC mix: FAST_CHUNK
            assert_within(got, ops.fp32_linear.torch(x, w), x, w, what="vs twin")
            assert_bits_equal(got, chained(x, w, chunk), what=f"vs chained order, chunks of {chunk}")
            os.environ["SGLANG_DSV41_DETERMINISTIC"] = "1"  # deterministic mode: CHUNK for every call
            try:
                assert_bits_equal(ops.fp32_linear.triton(x, w), chained(x, w), what="deterministic mode")
            finally:
                del os.environ["SGLANG_DSV41_DETERMINISTIC"]

        name = f"m{m}-n{n}-k{k}-{str(xdt)[6:]}x{str(wdt)[6:]}-{pick_config(max(m, 1), n, k, wdt == xdt == BF, 'cpu')}"
        checks.append((f"fp32_linear-{name}", case))

    def layouts():  # leading dims; x a column slice of wider rows (row stride != K); x with column stride 2
        x, w = build(6, 24, 1100, BF, F32, seed=3)
        cfg = pick_config(6, 24, 1100, False, "cpu")
        want = chained(x, w, cfg[7] if len(cfg) > 7 else CHUNK)
        assert_bits_equal(ops.fp32_linear.triton(x.view(2, 3, 1100), w), want.view(2, 3, 24), what="leading dims")
        wide = torch.cat([x, x[:, :100]], dim=1)
        assert_bits_equal(ops.fp32_linear.triton(wide[:, :1100], w), want, what="row stride")
        spaced = torch.stack([x, x], dim=-1).flatten(1)[:, ::2]
        assert_bits_equal(ops.fp32_linear.triton(spaced, w), want, what="column stride 2")

    checks.append(("fp32_linear-layouts", layouts))

    for label, wdt, k, configs in (("bf16", BF, 1100, TC_CONFIGS), ("fp32-weight", F32, 1100, FMA_CONFIGS)):
        def rows_alone(wdt=wdt, k=k):  # deterministic mode: rows of a 300-row call equal them in calls of 1, 7, 64
            os.environ["SGLANG_DSV41_DETERMINISTIC"] = "1"
            try:
                x, w = build(300, 24, k, BF, wdt, seed=11)
                full = ops.fp32_linear.triton(x, w)
                for m in (1, 7, 64):
                    assert_bits_equal(ops.fp32_linear.triton(x[:m], w), full[:m], what=f"M={m}")
                assert_bits_equal(ops.fp32_linear.triton(x[293:], w), full[293:], what="last 7 rows")
            finally:
                del os.environ["SGLANG_DSV41_DETERMINISTIC"]

        def configs_agree(wdt=wdt, k=k, configs=configs):
            x, w = build(70, 48, k, BF, wdt, seed=12)
            want = chained(x, w)
            for cfg in configs:
                assert_bits_equal(ops.fp32_linear.triton(x, w, config=cfg), want, what=str(cfg))

        checks += [(f"fp32_linear-batch-invariant-{label}", rows_alone), (f"fp32_linear-configs-{label}", configs_agree)]
    return run_checks(checks)


if __name__ == "__main__":
    raise SystemExit(main())
