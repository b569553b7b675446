"""A tiny op registry: every public op has a torch twin and optionally a Triton kernel.

    op = Op("window_kv_store", torch_impl)     # the twin defines the signature
    @op.triton_impl
    def _window_kv_store_triton(...): ...       # same signature

Calling `op(...)` runs the Triton kernel when one is registered, some tensor argument lives on
CUDA (e.g. the row ids of a gather from a pinned host table) and `SGLANG_DSV41_TORCH_OPS` is not
set to 1; otherwise the twin. `op.torch(...)` and
`op.triton(...)` call one side explicitly (tests compare them). Nothing is compiled at import.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

FORCE_TORCH_ENV = "SGLANG_DSV41_TORCH_OPS"


def torch_ops_forced() -> bool:
    return os.environ.get(FORCE_TORCH_ENV, "0") not in ("", "0", "false", "False")


class Op:
    def __init__(self, name: str, torch_impl: Callable):
        self.name = name
        self.torch = torch_impl
        self.triton: Callable | None = None
        self.__doc__ = torch_impl.__doc__

    def triton_impl(self, fn: Callable) -> Callable:
        self.triton = fn
        return fn

    def uses_triton(self, args: tuple, kwargs: dict | None = None) -> bool:
        if self.triton is None or torch_ops_forced():
            return False
        tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        return any(a.is_cuda for a in tensors)

    def __call__(self, *args, **kwargs):
        impl = self.triton if self.uses_triton(args, kwargs) else self.torch
        return impl(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Op({self.name}, triton={'yes' if self.triton else 'no'})"


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
    """Every registered op (importing `dsv41_kernels.ops` registers them all)."""
    return dict(_REGISTRY)
