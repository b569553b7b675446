"""GPU tests: every Triton kernel against its torch twin (oracle) over cases.GRID, fresh seeded inputs
per case (seed in the test id). Skipped without CUDA. Run as a script to print a pass list."""

from __future__ import annotations

import pytest
import torch

from kernel_cases import GRID, KIND, build, case_id, exact_attention, run
from kernel_compare import assert_attention, assert_match

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")

SEEDS = (0, 1)
PARAMS = [pytest.param(op, p, s, id=case_id(op, p, 1000 * i + s)) for i, (op, p) in enumerate(GRID) for s in SEEDS]


@pytest.mark.parametrize("op, params, seed", PARAMS)
def test_triton_matches_twin(op, params, seed):
    from dsv41_kernels import ops

    impl = getattr(ops, op)
    assert impl.triton is not None, f"{op} has no Triton kernel"
    case = build(op, params, seed, "cuda")
    got = run(op, impl.triton, case)  # kernel first (no reuse of freshly freed reference buffers)
    torch.cuda.synchronize()
    want = run(op, impl.torch, case)
    if op == "sparse_attention_paged":
        assert_attention(got, want, exact_attention(case))
    else:
        assert_match(got, want, KIND[op], what=op)


@pytest.mark.parametrize("config", [(16, 1, 4), (16, 1, 8), (16, 2, 4), (16, 4, 4), (16, 8, 4), (32, 1, 8), (32, 2, 8), (32, 4, 8)])
def test_attention_launch_configs(config):
    """Every (heads per program, splits, warps) the benchmark may pick gives the twin's output."""
    from dsv41_kernels import ops

    case = build("sparse_attention_paged", dict(t=9, h=64, d=512, w=128, k=512, short=True), 77, "cuda")
    got = ops.sparse_attention_paged.triton(*case["args"], config=config)
    want = ops.sparse_attention_paged.torch(*case["args"])
    assert_attention(got, want, exact_attention(case), what=f"attention {config}")


def test_dispatch_uses_triton_on_cuda_and_twin_when_forced(monkeypatch):
    from dsv41_kernels import ops

    op = ops.topk_select
    x = torch.randn(2, 100, device="cuda")
    assert op.uses_triton((x, 5))
    monkeypatch.setenv("SGLANG_DSV41_TORCH_OPS", "1")
    assert not op.uses_triton((x, 5))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
