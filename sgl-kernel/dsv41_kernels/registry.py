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
"""

from __future__ import annotations

import os
from typing import Callable

import torch

FORCE_TORCH_ENV = "SGLANG_DSV41_TORCH_OPS"


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
        self.__doc__ = torch_impl.__doc__

    def triton_impl(self, fn: Callable) -> Callable:
        self.triton = fn
        return fn

    def uses_triton(self, args: tuple, kwargs: dict | None = None) -> bool:
        if self.triton is None or torch_forced(self.name):
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
    """Every op (imports `dsv41_kernels.ops`, which registers them all)."""
    import dsv41_kernels.ops  # noqa: F401

    return dict(_REGISTRY)
