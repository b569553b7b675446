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
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
