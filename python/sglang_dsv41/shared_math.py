"""The pure math that the layers and the kernel package's torch twins share: each formula exists once.

Plain torch, differentiable, no module state, importing only `reduction` (so `dsv41_kernels` may import
it; test/core/test_import_graph.py). Every fp32 step is one IEEE operation in a fixed order, the
rounding points of DeepSeek's reference (docs/numerics.md); the Triton kernels reproduce them and are
compared with these functions (test/kernels/*_gpu.py), and these functions are checked against
independent oracles (float64, hand-worked cases, DeepSeek's own code: test/kernels/test_twin_oracles_*.py).

  rms_norm         x * rsqrt(mean_square(x) + eps) in fp32, times the fp32 weight, one cast back
  apply_rope       interleaved pairs (x[2i], x[2i+1]) of the last 2*cos.size(-1) dims rotate in fp32:
                   y0 = x0*c - x1*s, y1 = x0*s + x1*c (each product and sum rounded), one cast back
  attend_gathered  sparse MQA over per-row key lists: online softmax over blocks of ATTN_BLOCK keys in
                   list order, running max from RUN_MAX_START, bf16 probabilities into P.V, fp32
                   denominator, sink in the denominator only (unscaled); no valid key -> zeros
  gate_streams     the Engram gate of every mHC stream (statistic passed in)
  hash_rows        Engram n-gram row ids (int64, exact)
"""

from __future__ import annotations

import torch

from sglang_dsv41.reduction import mean_square

ATTN_BLOCK = 64
"""Keys per online-softmax block (DeepSeek's sparse attention kernel)."""
RUN_MAX_START = -1e30
"""Initial running max: a row with no valid key gives exp(-inf - RUN_MAX_START) = 0, not NaN."""
GATE_CLAMP = 1e-6
"""Lower clamp of |d| under the Engram gate's signed square root."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., d] any float dtype -> x.dtype. weight [d] (bf16/fp32) or None (weightless)."""
    y = x.float() * torch.rsqrt(mean_square(x) + eps)
    if weight is not None:
        y = weight.float() * y
    return y.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [T, d] or [T, h, d]; cos, sin fp32 [T, r]: rotates the last 2r dims (interleaved pairs) in fp32
    -> x.dtype, x's shape (out of place; the first d - 2r dims copied). `inverse` rotates by -angle."""
    rd = 2 * cos.size(-1)
    if x.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if inverse:
        sin = -sin
    pairs = x[..., -rd:].float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    rot = torch.stack([y0, y1], dim=-1).flatten(-2).to(x.dtype)
    return torch.cat([x[..., :-rd], rot], dim=-1) if x.size(-1) > rd else rot


def attend_gathered(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-row key lists. q bf16 [t, h, d]; keys [t, K, d] (bf16 values; K = V); valid bool [t, K];
    sink fp32 [h] -> bf16 [t, h, d] = sum_k p_k key_k / (sum_k p_k + exp(sink - max)), keys visited
    ATTN_BLOCK at a time in list order. Invalid keys are zeroed before any product (a NaN row never
    reaches the sums)."""
    t, h, d = q.shape
    qf = q.float()
    sc = torch.tensor(scale, dtype=torch.float32, device=q.device)
    acc = torch.zeros(t, h, d, dtype=torch.float32, device=q.device)
    denom = torch.zeros(t, h, dtype=torch.float32, device=q.device)
    run_max = torch.full((t, h), RUN_MAX_START, dtype=torch.float32, device=q.device)
    for s in range(0, keys.size(1), ATTN_BLOCK):
        ok = valid[:, s : s + ATTN_BLOCK]
        blk = torch.where(ok.unsqueeze(-1), keys[:, s : s + ATTN_BLOCK].float(), 0.0)  # [t, b, d]
        logits = torch.einsum("thd,tbd->thb", qf, blk)
        logits = torch.where(ok.unsqueeze(1), logits, float("-inf")) * sc
        prev = run_max
        run_max = torch.maximum(prev, logits.amax(dim=-1))
        rescale = torch.exp(prev - run_max)
        p = torch.exp(logits - run_max.unsqueeze(-1))
        denom = denom * rescale + p.sum(dim=-1)
        acc = acc * rescale.unsqueeze(-1) + torch.einsum("thb,tbd->thd", p.to(torch.bfloat16).float(), blk)
    denom = denom + torch.exp(sink.float() - run_max)
    return (acc / denom.unsqueeze(-1)).to(torch.bfloat16)


def gate_streams(streams, kv, q_weight, k_weight, eps, token_mask, mean_sq) -> torch.Tensor:
    """streams [T, n, H] bf16, kv [T, (n+1)H] bf16 (n keys then the shared value), q/k_weight [n, H],
    token_mask bool [T] or None (False = row unchanged), mean_sq: fp32 [..., H] -> [..., 1] (the serving
    path passes `reduction.mean_square`) -> bf16 [T, n, H]. Per stream j, in fp32 with one final cast:
      d_j = sum(R_j * (q_w[j] * k_w[j]) * key_j) * (rsqrt(ms(R_j) + eps) * rsqrt(ms(key_j) + eps)) * H^-0.5
      R_j + sigmoid(sign(d_j) sqrt(max(|d_j|, GATE_CLAMP))) * value."""
    n, hidden = streams.size(1), streams.size(2)
    key, value = kv.split([n * hidden, hidden], dim=-1)
    key = key.float().unflatten(-1, (n, hidden))
    h = streams.float()
    w = q_weight.float() * k_weight.float()
    rstd = torch.rsqrt(mean_sq(h)[..., 0] + eps) * torch.rsqrt(mean_sq(key)[..., 0] + eps)
    d = (h * w * key).sum(-1) * rstd * hidden**-0.5
    gate = torch.sigmoid(torch.copysign(d.abs().clamp_min(GATE_CLAMP).sqrt(), d))
    if token_mask is not None:
        gate = gate.masked_fill(~token_mask.unsqueeze(-1), 0)
    return (h + gate.unsqueeze(-1) * value.float().unsqueeze(-2)).to(streams.dtype)


def engram_gate(streams, kv, q_weight, k_weight, eps: float, token_mask=None) -> torch.Tensor:
    """`gate_streams` with the serving statistic `reduction.mean_square`."""
    return gate_streams(streams, kv, q_weight, k_weight, eps, token_mask, mean_square)


def hash_rows(
    windows: torch.Tensor, positions: torch.Tensor, multipliers: torch.Tensor, primes: torch.Tensor,
    offsets: torch.Tensor, pad_class: int,
) -> torch.Tensor:
    """windows int64 [T, N] (column s: class of the s-th predecessor, -1 dead), positions int [T],
    multipliers int64 [L, N] (odd), primes / offsets int64 [L, N-1, Hh], pad_class -> row ids int64
    [T, L, (N-1)*Hh]. A column is blocked (pad class) when dead or p < s, cumulatively from newer to
    older; then row(l, i, h) = (XOR_{s<=i} class_s * mult[l, s]) mod primes[l, i-1, h] + offsets[l, i-1, h]."""
    n = windows.shape[1]
    positions = positions.to(device=windows.device, dtype=torch.long).reshape(-1, 1)
    cols = torch.arange(n, device=windows.device, dtype=torch.long).reshape(1, n)
    blocked = (windows < 0) | (positions < cols)
    for s in range(1, n):  # cumulative from newer (s-1) to older (s)
        blocked[:, s] |= blocked[:, s - 1]
    classes = torch.where(blocked, torch.full_like(windows, pad_class), windows)
    prod = classes.unsqueeze(1) * multipliers.unsqueeze(0)  # [T, L, N]
    rolling = [prod[:, :, 0]]
    for s in range(1, n):
        rolling.append(torch.bitwise_xor(rolling[-1], prod[:, :, s]))
    r = torch.stack(rolling[1:], dim=2)  # [T, L, N-1]
    rows = torch.remainder(r.unsqueeze(-1), primes.unsqueeze(0)) + offsets.unsqueeze(0)  # [T, L, N-1, Hh]
    return rows.reshape(windows.shape[0], multipliers.size(0), -1)
