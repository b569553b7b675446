"""CPU: the registry's dispatch. Oracle: the rules in dsv41_kernels.registry's docstring.

- SGLANG_DSV41_TORCH_OPS ("1" = every op on its twin, or a comma-separated list of op names);
- `attach_kernels`: a kernel module that fails to import leaves the reason on its ops; a CUDA call
  of such an op raises RuntimeError naming the op and the import error, unless the env forces the
  op onto its twin (then the twin runs, with a logged warning); CPU calls always run the twin.
CUDA tensors are faked with a Tensor subclass whose `is_cuda` is True (dispatch only reads that
flag). Test ops live in the registry only for the duration of a test (monkeypatch)."""

from __future__ import annotations

import importlib.util
import logging
import sys
import types

import pytest
import torch

from dsv41_kernels import ops, registry
from dsv41_kernels.registry import FORCE_TORCH_ENV, Op, attach_kernels, parse_forced


class _FakeCuda(torch.Tensor):
    @property
    def is_cuda(self) -> bool:
        return True


def _cuda_like() -> torch.Tensor:
    return torch.zeros(2, 64).as_subclass(_FakeCuda)


def _make_op(monkeypatch, name: str, kernel: bool = True) -> Op:
    op = Op(name, lambda *a, **k: "twin")
    if kernel:
        op.triton_impl(lambda *a, **k: "kernel")
        op.kernel_module = "test.kernel.module"
    monkeypatch.setitem(registry._REGISTRY, name, op)
    return op


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(FORCE_TORCH_ENV, raising=False)


@pytest.mark.parametrize("value, want", [
    (None, frozenset()), ("", frozenset()), ("0", frozenset()), ("false", frozenset()), ("False", frozenset()),
    ("1", True), ("true", True), ("True", True), ("all", True), (" 1 ", True),
    ("fp8_linear", frozenset({"fp8_linear"})), ("fp8_linear,fp4_linear", frozenset({"fp8_linear", "fp4_linear"})),
    (" fp8_linear , topk_select ,", frozenset({"fp8_linear", "topk_select"})),
])
def test_parse_forced(value, want):
    assert parse_forced(value) == want


def test_dispatch_follows_env(monkeypatch, no_env):
    a, b, c = (_make_op(monkeypatch, f"_test_op_{s}") for s in "abc")
    x = _cuda_like()
    assert all(op.uses_triton((x,)) for op in (a, b, c)) and a(x) == "kernel"
    assert not a.uses_triton((torch.zeros(2, 64),)) and a(torch.zeros(1)) == "twin"  # CPU: always the twin
    assert a.uses_triton((), {"t": x}) and not a.uses_triton((1, "x"))  # kwargs count; no tensor: twin
    monkeypatch.setenv(FORCE_TORCH_ENV, "_test_op_a,_test_op_b")
    assert not a.uses_triton((x,)) and not b.uses_triton((x,)) and a(x) == "twin"
    assert c.uses_triton((x,)) and c(x) == "kernel"
    monkeypatch.setenv(FORCE_TORCH_ENV, "1")
    assert not any(op.uses_triton((x,)) for op in (a, b, c))
    monkeypatch.setenv(FORCE_TORCH_ENV, "0")
    assert a.uses_triton((x,))


def test_real_ops_dispatch_follows_env(monkeypatch, no_env):
    if not all(op.triton for op in (ops.fp8_linear, ops.fp4_linear, ops.topk_select)):
        pytest.skip("Triton kernels not importable here (test_every_op_has_its_kernel_or_the_reason covers it)")
    x = _cuda_like()
    assert ops.fp8_linear.uses_triton((x,)) and ops.topk_select.uses_triton((x, 1))
    monkeypatch.setenv(FORCE_TORCH_ENV, "fp8_linear,fp4_linear")
    assert not ops.fp8_linear.uses_triton((x,)) and not ops.fp4_linear.uses_triton((x,))
    assert ops.topk_select.uses_triton((x, 1))


def test_unknown_op_name_raises(monkeypatch):
    monkeypatch.setenv(FORCE_TORCH_ENV, "fp8_linaer")
    with pytest.raises(ValueError, match="fp8_linaer"):
        ops.fp8_linear.uses_triton((_cuda_like(),))


def test_op_without_a_kernel_module_runs_its_twin_everywhere(monkeypatch, no_env):
    op = _make_op(monkeypatch, "_test_op_plain", kernel=False)
    assert not op.uses_triton((_cuda_like(),)) and op(_cuda_like()) == "twin" and op.kernel_missing() is None


def test_failed_kernel_import_raises_on_cuda_only(monkeypatch, no_env, caplog):
    op = _make_op(monkeypatch, "_test_op_fail", kernel=False)
    attach_kernels("dsv41_kernels._no_such_kernel_module", "_test_op_fail")
    assert op.triton is None and op.kernel_module == "dsv41_kernels._no_such_kernel_module"
    assert "ModuleNotFoundError" in op.kernel_error and "_no_such_kernel_module" in op.kernel_error
    assert op(torch.zeros(3)) == "twin" and not op.uses_triton((torch.zeros(3),))  # CPU: unchanged
    with pytest.raises(RuntimeError, match=r"'_test_op_fail'.*ModuleNotFoundError.*_no_such_kernel_module"):
        op(_cuda_like())
    with pytest.raises(RuntimeError, match="_test_op_fail"):
        op.uses_triton((), {"x": _cuda_like()})  # the check a call-counting wrapper makes raises too
    assert "failed" in repr(op)
    for forced in ("_test_op_fail", "1"):  # forcing the twin makes the fall back explicit
        monkeypatch.setenv(FORCE_TORCH_ENV, forced)
        with caplog.at_level(logging.WARNING, logger="dsv41_kernels.registry"):
            assert op(_cuda_like()) == "twin"
    warnings = [r for r in caplog.records if "_test_op_fail" in r.getMessage()]
    assert len(warnings) == 1 and "ModuleNotFoundError" in warnings[0].getMessage()  # once per op


def test_failed_import_of_a_real_kernel_module(monkeypatch, no_env):
    """Simulates `import dsv41_kernels.attention_triton` failing (a None entry in sys.modules makes
    the import raise ImportError): a CUDA call of the real op raises before computing anything."""
    op = ops.sparse_attention_paged
    for attr in ("triton", "kernel_module", "kernel_error", "_warned"):
        monkeypatch.setattr(op, attr, getattr(op, attr))
    monkeypatch.setitem(sys.modules, "dsv41_kernels.attention_triton", None)
    attach_kernels("dsv41_kernels.attention_triton", "sparse_attention_paged")
    assert op.triton is None and "dsv41_kernels.attention_triton" in op.kernel_error
    q = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    args = (q.as_subclass(_FakeCuda), torch.zeros(1, 66, dtype=torch.uint8), torch.full((1, 1), -1), None, None,
            torch.zeros(1), 1.0)
    with pytest.raises(RuntimeError, match=r"'sparse_attention_paged'.*import dsv41_kernels\.attention_triton failed"):
        op(*args)
    monkeypatch.setenv(FORCE_TORCH_ENV, "sparse_attention_paged")
    assert torch.equal(op(*args), q)  # the twin: no valid key -> zeros


def test_kernel_module_that_registers_nothing(monkeypatch, no_env):
    op = _make_op(monkeypatch, "_test_op_empty", kernel=False)
    monkeypatch.setitem(sys.modules, "_dsv41_test_empty_kernels", types.ModuleType("_dsv41_test_empty_kernels"))
    attach_kernels("_dsv41_test_empty_kernels", "_test_op_empty")
    assert op.kernel_error is None and op(torch.zeros(1)) == "twin"
    with pytest.raises(RuntimeError, match="registered no kernel for '_test_op_empty'"):
        op(_cuda_like())


def test_kernel_module_attaches_on_import(monkeypatch, no_env, tmp_path):
    op = _make_op(monkeypatch, "_test_op_ok", kernel=False)
    (tmp_path / "_dsv41_test_ok_kernels.py").write_text(
        "from dsv41_kernels.registry import _REGISTRY\n"
        "_REGISTRY['_test_op_ok'].triton_impl(lambda *a, **k: 'kernel')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "_dsv41_test_ok_kernels", raising=False)
    attach_kernels("_dsv41_test_ok_kernels", "_test_op_ok")
    assert op.kernel_error is None and op(_cuda_like()) == "kernel" and op(torch.zeros(1)) == "twin"


def test_kernel_module_failing_after_registering_drops_the_kernel(monkeypatch, no_env, tmp_path):
    op = _make_op(monkeypatch, "_test_op_half", kernel=False)
    (tmp_path / "_dsv41_test_half_kernels.py").write_text(
        "from dsv41_kernels.registry import _REGISTRY\n"
        "_REGISTRY['_test_op_half'].triton_impl(lambda *a, **k: 'kernel')\n"
        "import _dsv41_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    attach_kernels("_dsv41_test_half_kernels", "_test_op_half")
    assert op.triton is None and "_dsv41_no_such_dependency" in op.kernel_error
    with pytest.raises(RuntimeError, match="_test_op_half"):
        op(_cuda_like())


def test_every_op_has_its_kernel_or_the_reason():
    """Every public op attaches a kernel module; with Triton installed every module imports (a broken
    one would otherwise only show on a GPU), without it every op says why."""
    have_triton = importlib.util.find_spec("triton") is not None
    for name, op in registry.all_ops().items():
        assert op.kernel_module and op.kernel_module.startswith("dsv41_kernels."), name
        if have_triton:
            assert op.triton is not None and op.kernel_error is None, f"{name}: {op.kernel_error}"
        else:
            assert op.triton is None and "triton" in op.kernel_error, name


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-rA"]))
