"""Runs the grouped MoE and RMSNorm Triton kernels through Triton's CPU interpreter on small
cases against their twins; prints 'PASS name' / 'FAIL name: reason'. Start with TRITON_INTERPRET=1."""

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

        got = ops.moe_experts.triton(*args, 10.0)
        assert_moe_close(got, ops.moe_experts.torch(*args, 10.0))
        for cfg in ((64, 32, 32, 4, 1), (16, 64, 64, 4, 1, True), (32, 32, 64, 4, 1, True)):  # SWAP tiles: same bits
            other = moe_experts_triton(*args, 10.0, config=cfg)
            assert torch.equal(other.view(torch.int16), got.view(torch.int16)), f"config {cfg}"

    def norm():
        g = torch.Generator().manual_seed(2)
        x = (torch.randn(5, 640, generator=g) * 3).bfloat16()
        w = torch.rand(640, generator=g).bfloat16()
        assert torch.equal(ops.rms_norm.triton(x, w, 1e-6).view(torch.int16), ops.rms_norm.torch(x, w, 1e-6).view(torch.int16))

    return run_checks((("moe_experts", moe), ("rms_norm", norm)))


if __name__ == "__main__":
    raise SystemExit(main())
