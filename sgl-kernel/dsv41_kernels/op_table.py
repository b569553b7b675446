"""An op table: the named ops a caller hands to the model (`NumericsPolicy.kernels(table)`, sglang_dsv41/numerics.py) and to the paged KV.

    OpTable.kernels()   every registry op (dispatches to its Triton kernel on CUDA, twin elsewhere)
    OpTable.twins()     every op's torch twin, on any device
    table, calls = OpTable.kernels().counting()
        same ops, and `calls` counts each call as (op name, "triton" | "torch"): what a run really
        called, for benchmark records
Attribute access returns the callable: `table.window_kv_store(...)`.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Mapping

from dsv41_kernels.registry import Op, all_ops


class OpTable:
    def __init__(self, fns: Mapping[str, Callable]):
        self._fns = dict(fns)

    def __getattr__(self, name: str) -> Callable:
        fns = self.__dict__.get("_fns", {})
        if name not in fns:
            raise AttributeError(f"op table has no op {name!r}; it has {sorted(fns)}")
        return fns[name]

    def names(self) -> list[str]:
        return sorted(self._fns)

    @staticmethod
    def kernels() -> "OpTable":
        return OpTable(all_ops())

    @staticmethod
    def twins() -> "OpTable":
        return OpTable({name: op.torch for name, op in all_ops().items()})

    def counting(self) -> tuple["OpTable", Counter]:
        """A table of the same ops that counts calls by (name, implementation that ran)."""
        calls: Counter = Counter()

        def wrap(name: str, fn: Callable) -> Callable:
            def counted(*args, **kwargs):
                impl = "triton" if isinstance(fn, Op) and fn.uses_triton(args, kwargs) else "torch"
                calls[(name, impl)] += 1
                return fn(*args, **kwargs)

            return counted

        return OpTable({name: wrap(name, fn) for name, fn in self._fns.items()}), calls
