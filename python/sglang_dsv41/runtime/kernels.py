"""The registry op table for a device: what `NumericsPolicy.kernels(table)` runs.

    model = apply_numerics(model, NumericsPolicy.kernels(kernel_table(device)))

points every numerics slot that names an op (sglang_dsv41/numerics.py) at the table's op; the paged
KV takes the same table for its pool ops. Layers never import kernels: the table is handed in.
"""

from __future__ import annotations

import torch

from dsv41_kernels.op_table import OpTable
from dsv41_kernels.registry import all_ops, torch_forced


def kernel_table(device: torch.device | str) -> OpTable:
    """The registry op table for `device`. On CUDA, an op whose Triton kernel could not be imported
    raises here, naming the op and the import error, unless SGLANG_DSV41_TORCH_OPS forces it onto
    its twin (then that choice is explicit)."""
    if torch.device(device).type == "cuda":
        missing = [
            f"{name}: {getattr(op, 'kernel_error', None) or 'no Triton kernel registered'}"
            for name, op in all_ops().items()
            if op.triton is None and not torch_forced(name)
        ]
        if missing:
            raise RuntimeError("Triton kernels unavailable on CUDA (set SGLANG_DSV41_TORCH_OPS to run twins):\n  "
                               + "\n  ".join(missing))
    return OpTable.kernels()
