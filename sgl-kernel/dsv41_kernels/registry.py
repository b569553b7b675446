"""A tiny op registry: every public op has a torch twin and optionally a Triton kernel.

    op = Op("window_kv_store", torch_impl)     # the twin defines the signature
    @op.triton_impl
    def _window_kv_store_triton(...): ...       # same signature

Calling `op(...)` runs the Triton kernel when one is registered, some tensor argument lives on
CUDA (e.g. the row ids of a gather from a pinned host table) and the op is not forced onto its
twin; otherwise the twin. `op.torch(...)` and `op.triton(...)` call one side explicitly (tests
compare them). Nothing is compiled at import.

`SGLANG_DSV41_TORCH_OPS` (read at every call, for bisecting numerics):
    unset, "", "0", "false"      every op may use its kernel
    "1", "true", "all"           every op runs its twin
    "fp8_linear,fp4_linear"      the named ops run their twins (comma-separated op names; an
                                 unknown name raises ValueError at the first op call)

Kernels are attached by `attach_kernels(module, *op_names)` at the end of each op module: it imports
the Triton module (which registers its kernels with `@op.triton_impl`). When that import fails
(no Triton, a broken kernel module), the reason is kept on each named op as `op.kernel_error`, and
a call of that op with a CUDA tensor raises RuntimeError naming the op and the import error, never
a silent fall back to the twin. Forcing the op onto its twin with
SGLANG_DSV41_TORCH_OPS makes the twin explicit; it then runs, with one logged warning per op.
CPU calls always run the twin, kernel or not.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Callable

import torch

FORCE_TORCH_ENV = "SGLANG_DSV41_TORCH_OPS"

logger = logging.getLogger(__name__)


_NONE = ("", "0", "false", "False")
_ALL = ("1", "true", "True", "all")


def parse_forced(value: str | None) -> bool | frozenset[str]:
    """Value of SGLANG_DSV41_TORCH_OPS -> True (every op forced) or the set of forced op names."""
    value = (value or "").strip()
    if value in _NONE:
        return frozenset()
    if value in _ALL:
        return True
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def torch_forced(name: str) -> bool:
    """Whether the environment forces op `name` onto its twin (see the module docstring)."""
    forced = parse_forced(os.environ.get(FORCE_TORCH_ENV))
    if forced is True or not forced:
        return bool(forced)
    unknown = forced - set(all_ops())
    if unknown:
        raise ValueError(f"{FORCE_TORCH_ENV}: unknown op name(s) {sorted(unknown)}; known: {sorted(all_ops())}")
    return name in forced


class Op:
    def __init__(self, name: str, torch_impl: Callable):
        self.name = name
        self.torch = torch_impl
        self.triton: Callable | None = None
        self.kernel_module: str | None = None  # the Triton module that should register `triton`
        self.kernel_error: str | None = None  # why that module failed to import (None: it imported)
        self._warned = False
        self.__doc__ = torch_impl.__doc__

    def triton_impl(self, fn: Callable) -> Callable:
        self.triton = fn
        return fn

    def kernel_missing(self) -> str | None:
        """Why this op has no kernel although one was attached (None: it has one, or none is expected)."""
        if self.triton is not None or self.kernel_module is None:
            return None
        return self.kernel_error or f"{self.kernel_module} imported but registered no kernel for {self.name!r}"

    def uses_triton(self, args: tuple, kwargs: dict | None = None) -> bool:
        """Whether a call with these arguments runs the Triton kernel: some tensor argument is on
        CUDA, the op has a kernel and is not forced onto its twin. Raises RuntimeError for a CUDA call
        of an op whose kernel module failed to import (see the module docstring)."""
        if self.triton is None and self.kernel_module is None:
            return False
        if torch_forced(self.name):
            if self.kernel_missing() and not self._warned and _on_cuda(args, kwargs):
                self._warned = True
                logger.warning("dsv41_kernels op %r runs its torch twin on CUDA (%s=%s); its kernel is unavailable: %s",
                               self.name, FORCE_TORCH_ENV, os.environ.get(FORCE_TORCH_ENV), self.kernel_missing())
            return False
        if not _on_cuda(args, kwargs):
            return False
        missing = self.kernel_missing()
        if missing is not None:
            raise RuntimeError(
                f"dsv41_kernels op {self.name!r} was called with CUDA tensors but has no Triton kernel: {missing}. "
                f"Fix the kernel import, or set {FORCE_TORCH_ENV}={self.name} (or 1) to run its torch twin explicitly."
            )
        return True

    def __call__(self, *args, **kwargs):
        impl = self.triton if self.uses_triton(args, kwargs) else self.torch
        return impl(*args, **kwargs)

    def __repr__(self) -> str:
        state = "yes" if self.triton else ("failed" if self.kernel_missing() else "no")
        return f"Op({self.name}, triton={state})"


def _on_cuda(args: tuple, kwargs: dict | None) -> bool:
    return any(a.is_cuda for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor))


_REGISTRY: dict[str, Op] = {}


def register(name: str) -> Callable[[Callable], Op]:
    """Decorator for a torch twin: `@register("name") def name(...)` -> Op."""

    def wrap(fn: Callable) -> Op:
        if name in _REGISTRY:
            raise ValueError(f"op {name!r} registered twice")
        op = Op(name, fn)
        _REGISTRY[name] = op
        return op

    return wrap


def all_ops() -> dict[str, Op]:
    """Every op (imports `dsv41_kernels.ops`, which registers them all)."""
    import dsv41_kernels.ops  # noqa: F401

    return dict(_REGISTRY)


def attach_kernels(module: str, *op_names: str) -> None:
    """Import the Triton module `module` (it registers the kernels of `op_names` on import). On
    ImportError the reason is recorded on each named op (`op.kernel_error`); CUDA calls of those ops
    then raise instead of running the twin (module docstring). The ops must be registered already."""
    ops = [_REGISTRY[name] for name in op_names]
    for op in ops:
        op.kernel_module = module
    try:
        importlib.import_module(module)
    except ImportError as e:
        reason = f"import {module} failed: {type(e).__name__}: {e}"
        logger.debug("dsv41_kernels: %s (ops %s run their twins on CPU only)", reason, ", ".join(op_names))
        for op in ops:  # a kernel registered before the failure belongs to a broken module: drop it
            op.kernel_error, op.triton = reason, None
