"""Row reductions whose fp32 summation order is fixed by definition, not by the device or batch.

`mean_square(x)` is the RMSNorm statistic (RMSNorm, mHC mixes, Engram gate). Layers and kernel
twins call it, and the Triton kernels reproduce the same order in registers, so every path rounds
the same way on every device and for every batch.

The order is the one DeepSeek's reference forward gets from `x.float().square().mean(-1)` on the
CPU: ATen's cascade sum (aten/src/ATen/native/cpu/SumKernel.cpp, `vectorized_inner_sum`) with
`Vectorized<float>` of 8 lanes (`ATEN_CPU_CAPABILITY=default`; AVX2 has 8 lanes too), then one
IEEE division by d. Written out for a row s[0..d) of fp32 squares (all adds are fp32, rounded):

1. lanes: V = d // 8 vectors, vector j holds s[8j .. 8j+8) (lane l = s[8j + l]).
2. ilp: the first 4 * (V // 4) vectors form rows i = 0 .. V//4 - 1 of 4 vectors each (row i is
   s[32i .. 32i+32), vector k of it is s[32i + 8k .. 32i + 8k + 8)); each of the 4 columns k and
   8 lanes l is summed over the rows with the cascade below (`_cascade`), giving P[k][l].
3. the V % 4 leftover vectors are added to P[0] one by one; then P = ((P0 + P1) + P2) + P3.
4. the d % 8 tail elements are summed left to right from 0, then the 8 lanes of P are added to it
   in lane order 0..7.
   (d < 8: steps 2-3 run on scalars, one lane, and the result is that sum.)
Cascade over n rows (ATen `multi_row_sum`): step = 2**max(4, ceil_log2(n) // 4); four levels of
accumulators a0..a3, all zero. Rows are added to a0 sequentially; after every full chunk of `step`
rows (i = rows consumed so far): a1 += a0, a0 = 0; if i % step**2 == 0 then a2 += a1, a1 = 0; if
moreover i % step**3 == 0 then a3 += a2, a2 = 0. Leftover rows (< step) go to a0 sequentially; the
result is ((a0 + a1) + a2) + a3. For every width below 2**22 the step is 16.

The squares are one fp32 multiply each (exact for bf16 inputs). Rows longer than 32768 elements
would be split across threads by ATen's two-pass reduction and are not reproduced by this order
(the model's widest row, the mHC statistic of hc_mult * hidden, has 20480).
"""

from __future__ import annotations

import torch

LANES = 8
"""Vectorized<float>::size() under ATEN_CPU_CAPABILITY=default (32-byte vectors)."""
ILP = 4
"""ATen row_sum's ilp_factor: the row of vectors is read as (-1, 4)."""
LEVELS = 4
MIN_LEVEL_POWER = 4


def ceil_log2(n: int) -> int:
    """ATen utils::CeilLog2: 0 for n <= 1, else the smallest p with 2**p >= n."""
    return 0 if n <= 1 else (n - 1).bit_length()


def cascade_step(n: int) -> int:
    """Chunk length of the cascade over n rows: 2**max(4, ceil_log2(n) // 4)."""
    return 1 << max(MIN_LEVEL_POWER, ceil_log2(n) // LEVELS)


def _add(acc: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """acc + x, where None is an accumulator still at its initial zero. Dropping that zero-start add
    is exact except for the sign of a zero (0 + -0 = +0); `ordered_sum` restores it with one final
    `+ 0.0`, since a -0 can only come out of a sum whose every term is -0."""
    return x if acc is None else acc + x


def _cascade(rows: torch.Tensor) -> torch.Tensor | None:
    """rows [..., n, *cols] fp32 -> [..., *cols] (None if n == 0): the multi-level cascade sum over
    dim -3 (the last two dims are independent columns), exactly as ATen's multi_row_sum adds."""
    n = rows.size(-3)
    step = cascade_step(n)
    full = n // step
    acc: list[torch.Tensor | None] = [None] * LEVELS
    if full:
        # level 0 of every full chunk at once: a0 starts at 0 and adds the chunk's rows in order
        chunks = rows[..., : full * step, :, :].unflatten(-3, (full, step))  # [..., full, step, *cols]
        level0 = chunks[..., 0, :, :]
        for j in range(1, step):
            level0 = level0 + chunks[..., j, :, :]
        for c in range(full):
            i = (c + 1) * step
            acc[1] = _add(acc[1], level0[..., c, :, :])
            if i % (step**2) == 0:
                acc[2], acc[1] = _add(acc[2], acc[1]), None
                if i % (step**3) == 0:
                    acc[3], acc[2] = _add(acc[3], acc[2]), None
    for r in range(full * step, n):
        acc[0] = _add(acc[0], rows[..., r, :, :])
    out = acc[0]
    for j in range(1, LEVELS):
        if acc[j] is not None:
            out = _add(out, acc[j])
    return out


def _row_sum(vecs: torch.Tensor) -> torch.Tensor | None:
    """vecs [..., V, L] -> [..., L] (None if V == 0): ATen row_sum (ilp 4 columns, cascade,
    leftover vectors into column 0, then the columns folded in order)."""
    v = vecs.size(-2)
    rows = v // ILP
    part = _cascade(vecs[..., : rows * ILP, :].unflatten(-2, (rows, ILP)))  # [..., ILP, L]
    p0 = None if part is None else part[..., 0, :]
    for j in range(rows * ILP, v):
        p0 = _add(p0, vecs[..., j, :])
    if part is not None:
        for k in range(1, ILP):
            p0 = _add(p0, part[..., k, :])
    return p0


def ordered_sum(s: torch.Tensor) -> torch.Tensor:
    """fp32 [..., d] -> fp32 [...]: sum over the last dim in the fixed order of the module docstring
    (bitwise torch CPU `s.sum(-1)` under ATEN_CPU_CAPABILITY=default for d < 32768), on any device."""
    if s.dtype != torch.float32:
        raise TypeError(f"ordered_sum takes fp32, got {s.dtype}")
    d = s.size(-1)
    if d < LANES:  # ATen's scalar_inner_sum: the same row_sum on single elements
        total = _row_sum(s.unsqueeze(-1))
        total = None if total is None else total[..., 0]
    else:
        nv = d // LANES
        lanes = _row_sum(s[..., : nv * LANES].unflatten(-1, (nv, LANES)))  # [..., LANES]
        total = None
        for j in range(nv * LANES, d):  # the scalar tail first, then the lanes in order
            total = _add(total, s[..., j])
        for lane in range(LANES):
            total = _add(total, lanes[..., lane])
    if total is None:
        return s.new_zeros(s.shape[:-1])
    return total + 0.0  # ATen's zero start (and its zero-filled output): -0 -> +0, nothing else


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] any float dtype -> fp32 [..., 1] = ordered_sum(fp32(x)^2) / d (IEEE division).

    Bitwise equal to torch CPU `x.float().square().mean(-1, keepdim=True)` under
    ATEN_CPU_CAPABILITY=default (DeepSeek's reference RMSNorm), on any device and batch."""
    xf = x.float()
    ss = ordered_sum(xf * xf)
    d = torch.full((), float(x.size(-1)), dtype=torch.float32, device=x.device)
    return (ss / d).unsqueeze(-1)


def plain_mean_square(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] -> fp32 [..., 1], torch's own summation order (device- and shape-dependent): the
    mean square of the FAST numerics policy (sglang_dsv41/numerics.py)."""
    xf = x.float()
    return (xf * xf).mean(-1, keepdim=True)


def plain_row_sums(m: torch.Tensor) -> torch.Tensor:
    """m [..., n, n] -> [..., n, 1] in torch's own order: Sinkhorn's row sums under FAST (one kernel
    instead of `shared_math.row_sums`' n - 1 sliced adds, which autograd turns into n zero-fills)."""
    return m.sum(-1, keepdim=True)


def plain_col_sums(m: torch.Tensor) -> torch.Tensor:
    """m [..., n, n] -> [..., 1, n] in torch's own order (Sinkhorn's column sums under FAST)."""
    return m.sum(-2, keepdim=True)
