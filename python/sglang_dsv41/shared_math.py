"""The pure math that the layers and the kernel package's torch twins share: each formula exists once.

Plain torch, differentiable, no module state, importing only `reduction` and `determinism` (so
`dsv41_kernels` may import it; test/core/test_import_graph.py). Every fp32 step is one IEEE operation in a fixed order, the
rounding points of DeepSeek's reference (docs/numerics.md); the Triton kernels reproduce them and are
compared with these functions (test/kernels/*_gpu.py), and these functions are checked against
independent oracles (float64, hand-worked cases, DeepSeek's own code: test/kernels/test_twin_oracles_*.py).

  rms_norm         x * rsqrt(mean_square(x) + eps) in fp32, times the fp32 weight, one cast back
  apply_rope       interleaved pairs (x[2i], x[2i+1]) of the last 2*cos.size(-1) dims rotate in fp32:
                   y0 = x0*c - x1*s, y1 = x0*s + x1*c (each product and sum rounded), one cast back
  attend_gathered  sparse MQA over per-row key lists: online softmax over full tiles of ATTN_BLOCK keys
                   in list order (a short last tile is padded with invalid keys), running max from
                   RUN_MAX_START, bf16 probabilities into P.V, fp32 denominator, sink in the
                   denominator only (unscaled); no valid key -> zeros
  gate_streams     the Engram gate of every mHC stream (statistic passed in)
  hash_rows        Engram n-gram row ids (int64, exact)
  mhc_gates        an mHC site's (pre, post, comb) after its GEMM: statistic, affine, sigmoids, Sinkhorn
  mhc_collapse     sum_j pre_j R_j from +0, j ascending (fp32, one cast)
  mhc_expand       post_k y + sum_j comb_jk R_j from +0, j ascending (fp32, one cast)
  swiglu           weight * silu(min(g, L)) * clamp(u, -L, L) in fp32 (`swiglu_cast`: cast to w2's input dtype)
  route            MoE router: sqrt(softplus(z)) scores, top-k of scores + bias, renormalised weights
  moe_combine      fp32 sum from +0 of the routed slots in order, then the shared expert, one cast
  fp32_linear      fp32(x) @ fp32(w)^T as GEMMs of exactly ROW_TILE rows (batch-invariant rows)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sglang_dsv41.determinism import row_tiled
from sglang_dsv41.reduction import mean_square, ordered_sum

ATTN_BLOCK = 64
"""Keys per online-softmax block (DeepSeek's sparse attention kernel)."""
RUN_MAX_START = -1e30
"""Initial running max: a row with no valid key gives exp(-inf - RUN_MAX_START) = 0, not NaN."""
GATE_CLAMP = 1e-6
"""Lower clamp of |d| under the Engram gate's signed square root."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, mean_sq=mean_square) -> torch.Tensor:
    """x [..., d] any float dtype -> x.dtype. weight [d] (bf16/fp32) or None (weightless). `mean_sq`
    (fp32 [..., 1] of x): the fixed-order statistic, or the plain one (`reduction.plain_mean_square`)."""
    y = x.float() * torch.rsqrt(mean_sq(x) + eps)
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


def attend_gathered(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor, scale: float,
                    full_tiles: bool = True) -> torch.Tensor:
    """Per-row key lists. q bf16 [t, h, d]; keys [t, K, d] (bf16 values; K = V); valid bool [t, K];
    sink fp32 [h] -> bf16 [t, h, d] = sum_k p_k key_k / (sum_k p_k + exp(sink - max)), keys visited
    ATTN_BLOCK at a time in list order, the last tile padded with invalid keys. Invalid keys are
    zeroed before any product (a NaN row never reaches the sums). `full_tiles=False`: the last tile is
    the list's remainder (DeepSeek's DSpark lists: [context window | block], exactly that long)."""
    t, h, d = q.shape
    # Full tiles: every block reduction (sum of p, P.V) runs over exactly ATTN_BLOCK keys, invalid ones
    # exact zeros, so a row's bits do not depend on how many -1 entries pad its list (the dense KV's
    # min(topk, T) width, a paged prefill's widest row, a fixed-shape decode's capacity). torch's CPU
    # sum over a shorter dimension associates the same terms differently (docs/numerics.md).
    pad = -keys.size(1) % ATTN_BLOCK if full_tiles else 0
    if pad:
        keys = F.pad(keys, (0, 0, 0, pad))
        valid = F.pad(valid, (0, pad), value=False)
    qf = q.float()
    sc = torch.full((), scale, dtype=torch.float32, device=q.device)  # a fill: no host copy (graph-capturable)
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


# ---------------------------------------------------------------------------------------------- mHC
def row_sums(m: torch.Tensor) -> torch.Tensor:
    """m [..., n, n] -> [..., n, 1]: ((m[.., 0] + m[.., 1]) + m[.., 2]) + ... left to right in fp32
    (the order torch CPU's `.sum(-1)` adds n <= 4 elements in, written out so every device adds so)."""
    s = m[..., 0:1]
    for k in range(1, m.size(-1)):
        s = s + m[..., k : k + 1]
    return s


def col_sums(m: torch.Tensor) -> torch.Tensor:
    """m [..., n, n] -> [..., 1, n]: ((m[0] + m[1]) + m[2]) + ... over the rows, top to bottom."""
    s = m[..., 0:1, :]
    for j in range(1, m.size(-2)):
        s = s + m[..., j : j + 1, :]
    return s


def sinkhorn(c: torch.Tensor, iters: int, eps: float, rows=row_sums, cols=col_sums) -> torch.Tensor:
    """c [..., n, n] fp32 logits -> approximately doubly-stochastic matrix (reference op order:
    exp(c - rowmax) / rowsum + eps, then column, then (iters-1) x (row, column) normalisations; iters < 1
    runs the first round only). Row and column sums are `row_sums` / `col_sums`: for n <= 4 bitwise torch
    CPU's `.sum(-1)` / `.sum(-2)` of the reference (entries are >= 0, so its zero start changes nothing).
    `rows` / `cols`: those sums, or the plain ones (`reduction.plain_row_sums` / `plain_col_sums`)."""
    m = torch.exp(c - c.amax(dim=-1, keepdim=True))
    m = m / rows(m) + eps
    m = m / (cols(m) + eps)
    for _ in range(iters - 1):
        m = m / (rows(m) + eps)
        m = m / (cols(m) + eps)
    return m


def hc_mult_of(mix_dim: int) -> int:
    """n with (2 + n) * n == mix_dim (ValueError otherwise)."""
    n = math.isqrt(mix_dim + 1) - 1
    if n < 1 or (2 + n) * n != mix_dim:
        raise ValueError(f"mix width {mix_dim} is not (2 + n) * n for an integer n >= 1")
    return n


def mhc_gates(x: torch.Tensor, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
              hc_eps: float, norm_eps: float, mean_sq=mean_square, rows=row_sums,
              cols=col_sums) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One site's gates after its GEMM. x [T, n*H] bf16|fp32 (the flattened input streams), mix
    [T, (2+n)n] fp32 = x . fn^T (raw, before the rsqrt), base [(2+n)n] fp32, scale [3] fp32, n from
    base -> (pre [T,n], post [T,n], comb [T,n,n]) fp32, every step one IEEE operation:
      z = (mix * rsqrt(mean_square(x) + norm_eps)) * scale[part] + base   (part 0: pre, 1: post, 2: comb)
      pre = sigmoid(z[:n]) + hc_eps, post = 2 * sigmoid(z[n:2n]), comb = sinkhorn(z[2n:] as [n, n]).
    `mean_sq`, `rows`, `cols`: the fixed-order statistic and Sinkhorn sums, or the plain ones (FAST:
    `reduction.plain_mean_square`, `plain_row_sums`, `plain_col_sums`)."""
    n = hc_mult_of(base.numel())
    mix = mix * torch.rsqrt(mean_sq(x) + norm_eps)
    pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    c = (mix[:, 2 * n :] * scale[2] + base[2 * n :]).unflatten(-1, (n, n))
    return pre, post, sinkhorn(c, iters, hc_eps, rows, cols)


def mhc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """streams [T, n, H] bf16|fp32, pre [T, n] fp32 -> [T, H] in the stream dtype: acc = +0; for
    j = 0..n-1: acc = acc + pre[:, j] * R[:, j] (each product and add one fp32 rounding), one cast.
    The order of torch CPU's `.sum(dim=1)` of the products (bitwise, -0 -> +0), written out."""
    acc = None
    for j in range(streams.size(1)):
        term = pre[:, j : j + 1] * streams[:, j].float()
        acc = term + 0.0 if acc is None else acc + term  # term + 0.0 == 0 + term: the sum starts at +0
    return acc.to(streams.dtype)


def mhc_enter(streams: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
              hc_eps: float, norm_eps: float, prev_pre: torch.Tensor,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Entering a sublayer site: streams [T, n, H] bf16|fp32, the site's fn [(2+n)n, nH], base, scale (fp32),
    the previous site's prev_pre [T, n] fp32, the sublayer's norm weight [H] -> (pre, post, comb) of the site
    (`mhc_gates` of mix = `fp32_linear(flat(streams), fn)`) and the sublayer input
    x [T, H] = rms_norm(mhc_collapse(streams, prev_pre), weight, norm_eps) (the lag, layers/mhc.py)."""
    flat = streams.flatten(1)
    pre, post, comb = mhc_gates(flat, fp32_linear(flat, fn), base, scale, iters, hc_eps, norm_eps)
    return pre, post, comb, rms_norm(mhc_collapse(streams, prev_pre), weight, norm_eps)


def mhc_expand(y: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y [T, H], streams [T, n, H] (bf16|fp32), post [T, n], comb [T, n, n] fp32 (row-major (j, k))
    -> R' [T, n, H] in y's dtype, per output stream k, in fp32:
      mixed[k] = +0; for j = 0..n-1: mixed[k] = mixed[k] + comb[:, j, k] * R[:, j]
      R'[:, k] = cast((post[:, k] * y) + mixed[k])."""
    rf = [streams[:, j].float() for j in range(streams.size(1))]
    yf = y.float()
    out = []
    for k in range(len(rf)):
        mixed = None
        for j, r in enumerate(rf):
            term = comb[:, j, k : k + 1] * r
            mixed = term + 0.0 if mixed is None else mixed + term
        out.append(post[:, k : k + 1] * yf + mixed)
    return torch.stack(out, dim=1).to(y.dtype)


# ---------------------------------------------------------------------------------------------- MoE
def swiglu(g: torch.Tensor, u: torch.Tensor, limit: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """g, u bf16 [t, I] (w1 / w3 outputs) -> fp32 [t, I] = weight * silu(min(g, L)) * clamp(u, -L, L)
    (limit L = 0: no clamp; weight fp32 [t, 1] or None)."""
    g, u = g.float(), u.float()
    if limit > 0:
        u = u.clamp(-limit, limit)
        g = g.clamp(max=limit)
    h = F.silu(g) * u
    return h if weight is None else weight * h


def swiglu_cast(g: torch.Tensor, u: torch.Tensor, limit: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """`swiglu` cast to g's dtype (bf16 [t, I]): the input of an expert's w2."""
    return swiglu(g, u, limit, weight).to(g.dtype)


def route(logits: torch.Tensor, bias: torch.Tensor, k: int, scale: float, norm: bool,
          forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE router after its GEMM. logits fp32 [T, E]; bias fp32 [E] or [T, E] (selects, never weighs)
    -> (weights fp32 [T, k], expert ids int64 [T, k]):
        s = sqrt(softplus(z))                        softplus is z for z > 20
        ids = top-k of s + bias, descending          (`forced` [T, k]: these ids instead)
        w = s[ids]; w / (sum_j w_j + 1e-20) when norm and k > 1 (`reduction.ordered_sum`: torch CPU's
        order, the reference's `w.sum(-1)`, on every device); times scale."""
    s = F.softplus(logits).sqrt()
    ids = forced.to(logits.device).long() if forced is not None else (s + bias).topk(k, dim=-1).indices
    w = s.gather(1, ids)
    if norm and k > 1:
        w = w / (ordered_sum(w).unsqueeze(-1) + 1e-20)
    return w * scale, ids


def moe_combine(routed: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """routed bf16 [T, k, H] (ascending expert id), shared bf16 [T, H] -> [T, H] in shared's dtype: fp32
    sum from +0 in slot order, then the shared expert, one cast."""
    y = torch.zeros(shared.shape, dtype=torch.float32, device=shared.device)
    for j in range(routed.size(1)):
        y = y + routed[:, j].float()
    return (y + shared.float()).to(shared.dtype)


# ---------------------------------------------------------------------------------------------- GEMM
def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K], w [N, K] (bf16|fp32, widened exactly) -> fp32 [..., N] = fp32(x) @ fp32(w)^T, every
    row independent of the other rows and of the row count: BLAS picks kernels (and so summation
    orders) by shape, so every call runs as GEMMs of exactly ROW_TILE rows (`determinism.row_tiled`,
    the last tile zero-padded)."""
    wf = w.float()
    rows = row_tiled(lambda t: F.linear(t, wf), x.reshape(-1, x.size(-1)).float())
    return rows.reshape(*x.shape[:-1], w.size(0))
