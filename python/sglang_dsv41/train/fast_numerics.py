"""Fast training numerics: a reversible transformation of a QAT trainable model (`set_fast`).

The exact QAT forward (trainable.py) reproduces every serving rounding in the serving order: the
block-exact FP8 / W4A8 GEMMs (a float64 partial per 32-wide K block, added in K order), the fixed
cascade order of every RMSNorm statistic, batch-invariant fp32 GEMMs in 64-row tiles, the block-64
online softmax, the per-expert MoE loop. A training step of the small presets is then ~10^5 tiny
tensor ops whatever the batch: bound by op overhead, not FLOPs.

`set_fast(model, True)` swaps, per module instance (the class code is untouched; `set_fast(model,
False)` removes the instance attributes and restores the exact forward), the same parameters into
plain batched ops:

| exact (serving) op                                   | fast op                                              |
|------------------------------------------------------|------------------------------------------------------|
| FP8 linear: MXFP8(x), block-exact GEMM of Q(W)       | one matmul of MXFP8(x) (STE) and Q(W) (STE), bf16 out|
| routed experts: per-expert loop, W4A8 block GEMM     | every expert on every row (3 batched einsums of      |
|                                                      |   MXFP8(x) and MXFP4(W), STE), selected slots kept   |
| RMSNorm / mHC / Engram mean square, fixed cascade    | `x.square().mean(-1)`                                |
| fp32 GEMM in 64-row tiles (head, router, mHC mix,    | one fp32 `F.linear`                                  |
|   compressor ratio 2)                                |                                                      |
| sparse attention, block-64 online softmax, bf16 P    | `FastBatchDenseKV.attend`: one masked softmax per    |
|                                                      |   sequence over [own window keys | selected          |
|                                                      |   compressed keys | sink], fp32 P                    |
Kept as in the exact forward: every weight rounding (FP8 32x32, MXFP4, bf16 casts) and activation
rounding (MXFP8 before GEMMs, FP8 window KV, FP4 compressed KV, two-stage FP4 indexer) with the
same straight-through gradients, the mHC Sinkhorn, top-k / candidate selection, routing. The
values differ from the serving forward only by summation order and the bf16 rounding of the
attention probabilities (last-bit effects per op), so a model trained fast is finished with a few
exact steps and evaluated with the exact forward (train/sft.py `--exact-steps`).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from sglang_dsv41.layers import moe as moe_layer
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.compressor import Compressor
from sglang_dsv41.layers.engram import Engram, gate_streams
from sglang_dsv41.layers.mhc import sinkhorn
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.transformer import DeepseekV41, Head
from sglang_dsv41.quant import FP4_E2M1_MAX, FP8_E4M3_MAX
from sglang_dsv41.layers.rope import apply_rope
from sglang_dsv41.quant.fp4 import INDEX_AMAX_FLOOR, INDEX_FP4_BLOCK, KV_AMAX_FLOOR, KV_FP4_BLOCK, MXFP4_AMAX_FLOOR
from sglang_dsv41.quant.layouts import INDEX_STAGE2_SCALE_FLOOR
from sglang_dsv41.quant.fp8 import FP8_AMAX_FLOOR
from sglang_dsv41.train.batch_kv import BatchDenseKV
from sglang_dsv41.train.trainable import QATAttention, QATFP8Linear, QATIndexer

_SWAPPED = "_fast_swapped"
"""Instance attribute listing the (module, attribute) pairs `set_fast` set, for the way back."""


# ---------------------------------------------------------------- fake quant in few ops
# Same values as the exact quantizers (`quant.*`, tested bitwise) for finite inputs, a handful of
# elementwise ops each; none of these roundings clips (scales are the ceil power of two of
# amax / max), so the straight-through gradient is the identity: value q, gradient of w.
class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor, q: torch.Tensor, keep: torch.Tensor | None):
        ctx.save_for_backward(keep)
        return q.to(w.dtype).clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return (g if keep is None else g * keep), None, None


def _ste(w: torch.Tensor, q: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """q's value (bits and sign of zero kept) with gradient to w: identity, or zero where not `keep`."""
    return _StraightThrough.apply(w, q.detach(), keep)


def pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    """fp32 x (positive, normal, result <= 2**127) -> 2**ceil(log2 x), exact (from frexp)."""
    m, e = torch.frexp(x)
    return ((e + 126 + (m != 0.5).to(e.dtype)) << 23).view(torch.float32)


def _fp8_value(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()


def _e2m1_value(v: torch.Tensor) -> torch.Tensor:
    """fp32 in [-6, 6] -> nearest E2M1 value, ties to the even code (0.25->0, 1.75->2, 5->4)."""
    a = v.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.round(v / step) * step


def fp8_weight_qdq(w: torch.Tensor, block: int = 32) -> torch.Tensor:
    """master [N, K] -> fp32 [N, K] = dequant(quant_fp8_weight(w)) (32x32 tiles, UE8M0)."""
    n, k = w.shape
    p = F.pad(w.detach().float(), (0, -k % block, 0, -n % block))
    tiles = p.unflatten(0, (-1, block)).unflatten(2, (-1, block))  # [nb, b, kb, b]
    s = pow2_ceil(tiles.abs().amax(dim=(1, 3), keepdim=True).clamp_min(FP8_AMAX_FLOOR) * (1.0 / FP8_E4M3_MAX))
    return (_fp8_value(tiles / s) * s).flatten(2).flatten(0, 1)[:n, :k]


def mxfp8_qdq(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., K] -> bf16 = quant.mxfp8_qdq(x) (E4M3 per 1x32, UE8M0), identity gradient."""
    g = x.detach().float().unflatten(-1, (-1, 32))
    s = pow2_ceil(g.abs().amax(dim=-1, keepdim=True).clamp_min(FP8_AMAX_FLOOR) * (1.0 / FP8_E4M3_MAX))
    return _ste(x, (_fp8_value(g / s) * s).flatten(-2).to(torch.bfloat16))


def mxfp4_qdq(w: torch.Tensor) -> torch.Tensor:
    """master [..., N, K] -> fp32 = dequant_mxfp4(quant_mxfp4(w)) (E2M1 per 1x32, UE8M0)."""
    g = w.detach().float().unflatten(-1, (-1, 32))
    s = pow2_ceil(g.abs().amax(dim=-1, keepdim=True).clamp_min(MXFP4_AMAX_FLOOR) * (1.0 / FP4_E2M1_MAX))
    return (_e2m1_value((g / s).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)) * s).flatten(-2)


def kv_fp4_qdq(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., D] -> bf16 = quant.kv_fp4_qdq(x) (E2M1 per 16, E4M3 scale of amax / 6); gradient
    zero where the quantizer clipped (|x / s| > 6), as `fake_quant.kv_fp4`."""
    g = x.detach().float().unflatten(-1, (-1, KV_FP4_BLOCK))
    amax = g.abs().amax(dim=-1, keepdim=True).clamp_min(KV_AMAX_FLOOR)
    s = _fp8_value(amax / torch.full_like(amax, FP4_E2M1_MAX))  # a true division, E4M3 RNE
    v = g / s
    q = (_e2m1_value(v.clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)) * s).flatten(-2).to(torch.bfloat16)
    return _ste(x, q, (v.abs() <= FP4_E2M1_MAX).flatten(-2))


def index_fp4_qdq(x: torch.Tensor) -> torch.Tensor:
    """bf16 [..., d] -> bf16 = quant.index_fp4_qdq(x): stage 1 (E2M1 per 32, UE8M0 ceil scale),
    stage 2 (the packer's E2M1 per 32 with scale 2**ceil(log2(max(amax/6, 1e-4))), -0 -> +0)."""
    g = x.detach().float().unflatten(-1, (-1, INDEX_FP4_BLOCK))
    s1 = pow2_ceil(g.abs().amax(dim=-1, keepdim=True).clamp_min(INDEX_AMAX_FLOOR) * (1.0 / FP4_E2M1_MAX))
    y1 = (_e2m1_value((g / s1).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)) * s1).to(torch.bfloat16).float()
    s2 = pow2_ceil((y1.abs().amax(dim=-1, keepdim=True) * (1.0 / FP4_E2M1_MAX)).clamp_min(INDEX_STAGE2_SCALE_FLOOR))
    y2 = _e2m1_value((y1 / s2).clamp(-FP4_E2M1_MAX, FP4_E2M1_MAX)) * s2 + 0.0
    return _ste(x, y2.flatten(-2).to(torch.bfloat16))


# ---------------------------------------------------------------- plain reductions and GEMMs
def mean_square(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] -> fp32 [..., 1] (any summation order)."""
    xf = x.float()
    return (xf * xf).mean(-1, keepdim=True)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """`layers.norm.rms_norm` with a plain fp32 mean square."""
    y = x.float() * torch.rsqrt(mean_square(x) + eps)
    if weight is not None:
        y = weight.float() * y
    return y.to(x.dtype)


def linear_fp8(self: QATFP8Linear, x: torch.Tensor) -> torch.Tensor:
    """x bf16 [..., K] -> bf16 [..., N] = MXFP8(x) @ Q_fp8(W)^T, one matmul (STE through both)."""
    w = _ste(self.weight, fp8_weight_qdq(self.weight, self.block)).to(torch.bfloat16)
    return F.linear(mxfp8_qdq(x), w)


def window_keys(self, kv: torch.Tensor, freqs) -> torch.Tensor:
    """`QATAttention.window_keys` with the few-op MXFP8 (FP8 window KV over all D dims)."""
    return mxfp8_qdq(self.rotary.apply(self.kv_norm(kv), freqs))


def compressed_kv(self, latent: torch.Tensor, group_freqs) -> torch.Tensor:
    return kv_fp4_qdq(self.rotary.apply(latent, group_freqs))


def index_keys(self, latent: torch.Tensor, rotate) -> torch.Tensor:
    return index_fp4_qdq(rotate(self.k_norm(self.wk(latent))))


def index_query_quant(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return index_fp4_qdq(apply_rope(q, cos, sin))


def hc_mix(self: Block, site: str, streams: torch.Tensor):
    """`Block.hc_mix` with one fp32 GEMM and a plain mean square (Sinkhorn unchanged)."""
    fn, base, scale = (getattr(self, f"hc_{site}_{k}") for k in ("fn", "base", "scale"))
    n = streams.size(1)
    x = streams.flatten(1).float()
    mix = F.linear(x, fn) * torch.rsqrt(mean_square(x) + self.norm_eps)
    pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + self.hc_eps
    post = 2 * torch.sigmoid(mix[:, n: 2 * n] * scale[1] + base[n: 2 * n])
    c = (mix[:, 2 * n:] * scale[2] + base[2 * n:]).unflatten(-1, (n, n))
    return pre, post, sinkhorn(c, self.hc_iters, self.hc_eps)


def engram_gate(streams, kv, q_weight, k_weight, eps, token_mask=None):
    """`layers.engram.engram_gate` with a plain mean square."""
    return gate_streams(streams, kv, q_weight, k_weight, eps, token_mask, mean_square)


def head(self: Head, h: torch.Tensor) -> torch.Tensor:
    return F.linear(h.float(), self.weight.float())


def gate_scores(self: moe_layer.Gate, x: torch.Tensor) -> torch.Tensor:
    return F.softplus(F.linear(x.float(), self.weight.float())).sqrt()


def compressor_project(self: Compressor, x: torch.Tensor):
    xf = x.float()
    return F.linear(xf, self.wkv.weight.float()), F.linear(xf, self.wgate.weight.float())


def routed_dense(x, ids, weights, w1, _s1, w3, _s3, w2, _s2, limit):
    """QAT `routed` slot, dense: every expert on every row (stacked masters [E, N, K], MXFP4 STE),
    then each row's selected experts in ascending id order -> bf16 [T, k, H]."""
    t, k = ids.shape
    sid, rank = ids.long().sort(dim=1)
    wt = weights.gather(1, rank)  # [T, k] routing weights in slot order
    xq = mxfp8_qdq(x)
    q1, q3, q2 = (_ste(w, mxfp4_qdq(w)).to(torch.bfloat16) for w in (w1, w3, w2))
    g = torch.einsum("th,eih->tei", xq, q1)
    u = torch.einsum("th,eih->tei", xq, q3)
    dense_w = torch.zeros(t, w1.size(0), dtype=torch.float32, device=x.device).scatter(1, sid, wt)
    h = moe_layer.swiglu(g, u, limit, dense_w.unsqueeze(-1))  # fp32 [T, E, I]
    hq = mxfp8_qdq(h.to(torch.bfloat16))
    y = torch.einsum("tei,ehi->teh", hq, q2)  # [T, E, H]; unselected experts give zeros
    return y.gather(1, sid.unsqueeze(-1).expand(t, k, y.size(-1)))


_MISSING = object()


def _swap(mod, name: str, value, swapped: list) -> None:
    """Set an instance attribute, remembering the instance's previous value (or its absence)."""
    swapped.append((mod, name, mod.__dict__.get(name, _MISSING)))
    setattr(mod, name, value)


def set_fast(model: DeepseekV41, fast: bool = True) -> DeepseekV41:
    """Switch a trainable model (`make_trainable`) to the fast numerics (module docstring) or back to
    the exact QAT forward. Same parameters either way; returns the model."""
    for mod, name, old in reversed(model.__dict__.pop(_SWAPPED, [])):
        if old is _MISSING:
            delattr(mod, name)
        else:
            setattr(mod, name, old)
    if not fast:
        return model
    swapped: list = []
    bound = {QATFP8Linear: ("forward", linear_fp8), Block: ("hc_mix", hc_mix), Head: ("forward", head),
             moe_layer.Gate: ("scores", gate_scores), QATAttention: ("window_keys", window_keys)}
    for mod in model.modules():
        for cls, (name, fn) in bound.items():
            if isinstance(mod, cls):
                _swap(mod, name, types.MethodType(fn, mod), swapped)
        if isinstance(mod, QATAttention):
            _swap(mod, "compressed_kv", types.MethodType(compressed_kv, mod), swapped)
        if isinstance(mod, QATIndexer):
            _swap(mod, "query_quant", index_query_quant, swapped)
            if hasattr(mod, "wk"):
                _swap(mod, "keys", types.MethodType(index_keys, mod), swapped)
        if isinstance(mod, RMSNorm):
            _swap(mod, "norm", rms_norm, swapped)
        elif isinstance(mod, Engram):
            _swap(mod, "gate", engram_gate, swapped)
        elif isinstance(mod, Compressor) and mod.ratio > 1:
            _swap(mod, "project", types.MethodType(compressor_project, mod), swapped)
        elif isinstance(mod, moe_layer.MoE):
            _swap(mod, "routed", routed_dense, swapped)
    model.__dict__[_SWAPPED] = swapped
    return model


def use_position_tables(model: DeepseekV41, n: int) -> None:
    """Every attention's RoPE reads a device table of positions 0..n-1 (`Rotary.use_table`, the
    same bits as the CPU-built rows) instead of building rows on the CPU per call: no host sync in
    the forward (needed to capture it as a CUDA graph). One table per distinct RoPE kind."""
    tables: dict = {}
    for mod in model.modules():
        if isinstance(mod, QATAttention):
            key = mod.rotary.table_key
            if key not in tables:
                tables[key] = mod.rotary.position_table(n, model.embed.weight.device)
            mod.rotary.use_table(tables[key])


def is_fast(model: DeepseekV41) -> bool:
    return bool(model.__dict__.get(_SWAPPED))


class FastBatchDenseKV(BatchDenseKV):
    """`BatchDenseKV` whose attention is one masked softmax per sequence (fast numerics): the same
    visible keys (the row's window, its selected compressed positions) and sink, fp32 probabilities.
    `engram_ids` (int64 [B*T, layers, cols], `EngramHasher.hash_packed` of the rows) may be computed
    by the caller ahead of time (e.g. outside a captured CUDA graph: the hash syncs with the host)."""

    def __init__(self, cfg, batch: int, length: int, device, engram_ids: torch.Tensor | None = None):
        super().__init__(cfg, batch, length, device)
        self._engram_ids = engram_ids

    def engram_ids(self, hasher, input_ids: torch.Tensor) -> torch.Tensor:
        return self._engram_ids if self._engram_ids is not None else super().engram_ids(hasher, input_ids)

    def attend(self, attn, q: torch.Tensor, topk: torch.Tensor | None) -> torch.Tensor:
        b, t, w = self.batch, self.length, self.cfg.attention.window_size
        h, d = q.shape[1], q.shape[2]
        pos = torch.arange(t, device=q.device)
        rel = pos.unsqueeze(1) - pos.unsqueeze(0)  # query p, key j: p - j
        mask = ((rel >= 0) & (rel < w)).expand(b, t, t)
        keys = self._window.view(b, t, d)
        if topk is not None:
            n = t // attn.role.compress_ratio
            keys = torch.cat([keys, self.compressed[attn.role.kv_source].view(b, n, d)], dim=1)
            slot = torch.where(topk >= 0, topk.long(), n)
            sel = torch.zeros(b * t, n + 1, dtype=torch.bool, device=q.device).scatter(1, slot, True)[:, :n]
            mask = torch.cat([mask, sel.view(b, t, n)], dim=-1)
        kf = keys.float()
        logits = torch.einsum("bphd,bkd->bhpk", q.view(b, t, h, d).float(), kf) * attn.softmax_scale
        logits = logits.masked_fill(~mask.unsqueeze(1), float("-inf"))
        sink = attn.attn_sink.float().view(1, h, 1, 1).expand(b, h, t, 1)
        p = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        o = torch.einsum("bhpk,bkd->bphd", p, kf)
        return o.reshape(b * t, h, d).to(torch.bfloat16)
