"""Runs the Triton kernels through Triton's CPU interpreter on cases.INTERP_GRID and compares with the
twins; prints one line per case ('PASS id' / 'FAIL id: reason'). Must start with TRITON_INTERPRET=1
(Triton decides at decoration time), hence a separate process: see test_triton_interpreter.py."""

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
    from kernel_cases import INTERP_GRID, KIND, build, case_id, run
    from kernel_compare import assert_match

    torch.set_num_threads(1)
    bad = 0
    for i, (op, params) in enumerate(INTERP_GRID):
        seed = 7 + i
        impl = getattr(ops, op)
        cid = case_id(op, params, seed)
        try:
            case = build(op, params, seed, "cpu")
            assert_match(run(op, impl.triton, case), run(op, impl.torch, case), KIND[op], what=op, bound=case.get("bound"))
            print(f"PASS {cid}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            bad += 1
            print(f"FAIL {cid}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    bad += host_gather_cases(assert_match, build)
    bad += folded_split_cases(assert_match)
    return 1 if bad else 0


def folded_split_cases(assert_match) -> int:
    """The folded split-K whose last program per weight-row tile adds the chunk sums (gemm_triton
    `_block_partials_kernel` FOLD): chunks of one K block give the one-pass kernel's bits (every scaled
    partial is exact, so both add the same values in the same order), twice in a row (the arrival counters
    are zeroed by each call's quant launch); chunks of three blocks are within the twin's tolerance."""
    import torch

    from dsv41_kernels import ops
    from kernel_cases import build_gemm

    bad = 0
    for i, op in enumerate(("fp8_linear", "fp4_linear")):
        cid = f"{op}-folded-split-last-arrival"
        try:
            impl = getattr(ops, op)
            case = build_gemm(op, dict(m=5, n=200, k=256, special=True), 300 + i, "cpu")
            ref = impl.triton(*case["args"], config=(64, 64, 4, 4)).view(torch.int16)
            for _ in range(2):
                got = impl.triton(*case["args"], config=(16, 64, 4, 4, 1, True, True)).view(torch.int16)
                assert torch.equal(got, ref), f"{(got != ref).sum().item()} of {ref.numel()} outputs differ"
            assert_match(impl.triton(*case["args"], config=(16, 64, 4, 4, 3, True, True)), impl.torch(*case["args"]),
                         "fp8_gemm", what=cid, bound=case["bound"])
            print(f"PASS {cid}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            bad += 1
            print(f"FAIL {cid}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return bad


def host_gather_cases(assert_match, build) -> int:
    """The pinned-host gather path (ids sorted, rows written back through the sort order), which on a
    GPU runs only for a host table: here on CPU tensors, 16-byte-load hints on and off, and a table
    base that is not 16-byte aligned (byte loads). Oracle: the twin, bitwise."""
    import torch

    from dsv41_kernels import ops
    from dsv41_kernels.engram_triton import gather_sorted

    bad = 0
    for i, (shape, wide, shift) in enumerate((((37, 24), None, 0), ((5, 3), False, 0), ((9, 24), None, 1))):
        cid = f"engram_gather-host-sorted-shape{shape}-wide{wide}-shift{shift}"
        try:
            w, s, ids = build("engram_gather", dict(shape=shape), 100 + i, "cpu")["args"]
            if shift:  # the same rows at a base address 1 byte past a 16-byte boundary
                buf = torch.empty(w.numel() + 16, dtype=torch.uint8)[shift : shift + w.numel()]
                w = buf.view(w.shape).copy_(w.view(torch.uint8)).view(torch.float8_e4m3fn)
            n = ids.numel()
            out = torch.full((n, w.size(1)), float("nan"), dtype=torch.bfloat16)
            gather_sorted(w.view(torch.uint8), s.view(torch.uint8), ids.reshape(-1), out, 4, 2, wide)
            assert_match(out.view(*shape, -1), ops.engram_gather.torch(w, s, ids), "bitwise", what=cid)
            print(f"PASS {cid}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every case
            bad += 1
            print(f"FAIL {cid}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
