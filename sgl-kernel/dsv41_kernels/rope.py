"""RoPE on whole query / attention-output rows: the layers' `apply_rope` as one kernel launch.

    rope_rotate(x, cos, sin, inverse=False) -> x.dtype, x's shape

x [T, d] or [T, h, d] bf16|fp32; cos, sin fp32 [T, r] (one row per token, shared by the heads). The last
2r elements of each row are r interleaved pairs (x0 = element 2j, x1 = element 2j + 1 of the tail),
rotated in fp32 with each product and sum rounded, then cast once:
    y0 = x0 * cos - x1 * sin,   y1 = x0 * sin + x1 * cos      (inverse: by -angle, i.e. sin -> -sin)
The first d - 2r elements are copied. The twin's torch formulation is ~8 launches and a full-row
concatenation per call on a GPU (q and the attention output of every layer); the kernel (rope_triton.py)
reads each row once and writes it once.
"""

from __future__ import annotations

import torch

from dsv41_kernels.registry import attach_kernels, register
from sglang_dsv41.shared_math import apply_rope


@register("rope_rotate")
def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """See the module docstring (twin: `sglang_dsv41.shared_math.apply_rope`)."""
    return apply_rope(x, cos, sin, inverse)


attach_kernels("dsv41_kernels.rope_triton", "rope_rotate")
