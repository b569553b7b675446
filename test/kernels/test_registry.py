"""CPU: the registry's dispatch switch SGLANG_DSV41_TORCH_OPS ("1" = every op on its twin, or a
comma-separated list of op names). Oracle: the rules in dsv41_kernels.registry's docstring. CUDA
tensors are faked with a Tensor subclass whose `is_cuda` is True (dispatch only reads that flag)."""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels import ops
from dsv41_kernels.registry import FORCE_TORCH_ENV, parse_forced


class _FakeCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:
        return True


def _cuda_like() -> torch.Tensor:
    return torch.zeros(2, 64).as_subclass(_FakeCuda)


@pytest.mark.parametrize("value, want", [
    (None, frozenset()), ("", frozenset()), ("0", frozenset()), ("false", frozenset()), ("False", frozenset()),
    ("1", True), ("true", True), ("True", True), ("all", True), (" 1 ", True),
    ("fp8_linear", frozenset({"fp8_linear"})), ("fp8_linear,fp4_linear", frozenset({"fp8_linear", "fp4_linear"})),
    (" fp8_linear , topk_select ,", frozenset({"fp8_linear", "topk_select"})),
])
def test_parse_forced(value, want):
    assert parse_forced(value) == want


def test_dispatch_follows_env(monkeypatch):
    x = _cuda_like()
    monkeypatch.delenv(FORCE_TORCH_ENV, raising=False)
    assert ops.fp8_linear.uses_triton((x,)) and ops.fp4_linear.uses_triton((x,)) and ops.topk_select.uses_triton((x, 1))
    assert not ops.fp8_linear.uses_triton((torch.zeros(2, 64),))  # CPU tensors always take the twin
    monkeypatch.setenv(FORCE_TORCH_ENV, "fp8_linear,fp4_linear")
    assert not ops.fp8_linear.uses_triton((x,)) and not ops.fp4_linear.uses_triton((x,))
    assert ops.topk_select.uses_triton((x, 1))
    monkeypatch.setenv(FORCE_TORCH_ENV, "1")
    assert not any(op.uses_triton((x,)) for op in (ops.fp8_linear, ops.topk_select, ops.window_kv_store))
    monkeypatch.setenv(FORCE_TORCH_ENV, "0")
    assert ops.fp8_linear.uses_triton((x,))


def test_unknown_op_name_raises(monkeypatch):
    monkeypatch.setenv(FORCE_TORCH_ENV, "fp8_linaer")
    with pytest.raises(ValueError, match="fp8_linaer"):
        ops.fp8_linear.uses_triton((_cuda_like(),))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
