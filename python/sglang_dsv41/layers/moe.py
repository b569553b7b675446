"""MoE: sqrtsoftplus router with noaux_tc bias, MXFP4 routed experts (W4A8), FP8 shared expert.

Numerics (DeepSeek reference): router logits fp32 (bf16 weight widened); scores sqrt(softplus(z));
top-k of scores + bias (bias selects, never weighs); weights renormalised (+1e-20) and scaled by
route_scale. An expert computes silu(min(g, L)) * clamp(u, -L, L) in fp32, multiplies by its routing
weight BEFORE the bf16 cast that feeds w2. Expert outputs (bf16) are summed in fp32 in expert-id
order, then the shared expert's bf16 output, then one cast to bf16.

Grouped routed experts (`routed_experts`, kernel slot `routed` -> op `moe_experts`): the (token, slot)
pairs are sorted by expert once per layer and every expert runs on its contiguous segment of rows.
Every GEMM row's math is the per-expert path's (MXFP8 quant per row, exact block partials per row), so
grouping rows changes no bit. The routed weights live in stacked tensors [E, ...] (`expert_weights`:
each expert's parameters become views of them, so the checkpoint names and memory are unchanged).

Trainable model (master weights, no scales): `expert_weights` stacks the masters each call (so
gradients reach them) and the `routed` slot takes them: TRAIN `routed_experts_ste` (the value of
`routed_experts` on the re-quantized bytes, the gradient of `routed_experts_dense`), FAST
`routed_experts_dense` (every expert on every row in three batched GEMMs, the same roundings).
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.linear import FP32_GEMM_SLOT, FP8Linear, FusedRows, MXFP4Linear, fp32_linear
from sglang_dsv41.numerics import Mode, Slot
from sglang_dsv41.quant import exact_value, fp4_linear, mxfp4_qdq_ste, mxfp8_qdq_ste, quant_mxfp4
from sglang_dsv41.shared_math import moe_combine as combine
from sglang_dsv41.shared_math import route, swiglu, swiglu_cast


class Gate(nn.Module):
    numerics_slots = {"fp32_gemm": FP32_GEMM_SLOT, "route": Slot("moe", kernel="moe_route")}  # logits GEMM, router
    fp32_gemm = staticmethod(fp32_linear)  # (x [..., K], w [N, K]) -> fp32 [..., N], batch-invariant rows
    route = staticmethod(route)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.moe
        self.topk, self.route_scale, self.norm_topk_prob = m.n_activated_experts, m.route_scale, m.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(m.n_routed_experts, cfg.hidden_size, dtype=torch.bfloat16), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(m.n_routed_experts, dtype=torch.float32), requires_grad=False)
        # with a vision tower, image-span rows select with their own bias (spec model 6.4)
        self.bias_vl = (nn.Parameter(torch.zeros(m.n_routed_experts, dtype=torch.float32), requires_grad=False)
                        if cfg.vision is not None else None)

    def apply_numerics(self, policy, shared: dict) -> None:
        """Policy hook (numerics.apply_numerics), same bits: with fp32_gemm and moe both on kernels the router
        runs as the table's one op `moe_gate` (logits GEMM, fold and route; int32 ids)."""
        self.__dict__.pop("_gate", None)
        if policy.fp32_gemm is Mode.KERNEL and policy.moe is Mode.KERNEL:
            self.__dict__["_gate"] = policy.table.moe_gate

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None,
                image_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] bf16 -> (weights fp32 [T, k], expert ids int [T, k]: int64, int32 from `moe_gate`)
        (`shared_math.route`). `forced` [T, k] replays given ids; `image_rows` bool [T]: rows inside image
        spans, which select with `bias_vl`."""
        bias = self.bias
        if image_rows is not None and self.bias_vl is not None:
            bias = torch.where(image_rows.unsqueeze(-1), self.bias_vl, bias)
        fused = self.__dict__.get("_gate")
        if fused is not None:
            return fused(x, self.weight, bias, self.topk, self.route_scale, self.norm_topk_prob, forced)
        return self.route(self.fp32_gemm(x, self.weight), bias, self.topk, self.route_scale, self.norm_topk_prob, forced)


class Expert(nn.Module):
    """SwiGLU FFN; `linear` is MXFP4Linear (routed) or FP8Linear (shared)."""

    numerics_slots = {"swiglu": Slot("moe", kernel="swiglu")}
    swiglu = staticmethod(swiglu_cast)  # (g, u bf16 [t, I], limit, weight [t, 1] | None) -> bf16 [t, I]

    def __init__(self, hidden: int, inter: int, linear: type, swiglu_limit: float):
        super().__init__()
        self.w1, self.w2, self.w3 = linear(hidden, inter), linear(inter, hidden), linear(hidden, inter)
        self.limit = swiglu_limit

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [t, H] bf16 -> (w1(x), w3(x)) bf16 [t, I]: one GEMM over [w1; w3] where the kernels policy
        fused them (`apply_numerics`; same bits per column), else two."""
        fused = self.__dict__.get("_w13")
        if fused is not None and fused.holds():
            return fused(x)
        return self.w1(x), self.w3(x)

    def apply_numerics(self, policy, shared: dict) -> None:
        """Policy hook (numerics.apply_numerics): under kernels an FP8 expert (the shared one) runs w1 and
        w3 as one GEMM (`linear.FusedRows`: their weights become views of one stacked tensor)."""
        self.__dict__.pop("_w13", None)
        fused = FusedRows.of([self.w1, self.w3]) if policy.table is not None else None
        if fused is not None:
            self.__dict__["_w13"] = fused

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """x [t, H] bf16, weight [t, 1] fp32 or None -> bf16 [t, H]."""
        return self.w2(self.swiglu(*self.gate_up(x), self.limit, weight))


def routing_order(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids int [T, k] (distinct per row), weights fp32 [T, k] -> (expert int64 [T*k], weight fp32 [T*k],
    perm int64 [T*k]). Output row r = t*k + j is token t's j-th smallest expert id (the summation order);
    perm lists the rows grouped by expert (ascending id, rows ascending inside a group)."""
    sid, rank = ids.long().sort(dim=1)
    flat = sid.flatten()
    return flat, weights.gather(1, rank).flatten(), torch.argsort(flat, stable=True)


def routed_experts(x, ids, weights, w1, s1, w3, s3, w2, s2, limit: float) -> torch.Tensor:
    """Grouped routed experts, pure torch (the oracle of op `moe_experts`).

    x bf16 [T, H]; ids int [T, k] (distinct per row); weights fp32 [T, k]; w1 / w3 int8|uint8
    [E, I, H/2] + e8m0 scales [E, I, H/32]; w2 [E, H, I/2] + [E, H, I/32]; limit = swiglu_limit.
    -> bf16 [T, k, H]: [t, j] is the output of token t's j-th smallest expert, routing weight applied
    before w2. One host read per call (the group sizes); each segment is the per-expert math."""
    t, k = ids.shape
    expert, wt, perm = routing_order(ids, weights)
    counts = torch.bincount(expert, minlength=w1.size(0)).tolist()
    out = x.new_empty(t * k, x.size(-1))
    xs, ws = x[perm // k], wt[perm, None]
    start = 0
    for e, c in enumerate(counts):
        if c:
            seg = slice(start, start + c)
            h = swiglu(fp4_linear(xs[seg], w1[e], s1[e]), fp4_linear(xs[seg], w3[e], s3[e]), limit, ws[seg])
            out[perm[seg]] = fp4_linear(h.to(x.dtype), w2[e], s2[e])
            start += c
    return out.view(t, k, x.size(-1))


def routed_experts_dense(x, ids, weights, w1, _s1, w3, _s3, w2, _s2, limit: float) -> torch.Tensor:
    """FAST routed experts of a trainable model: stacked masters w1 / w3 [E, I, H], w2 [E, H, I]
    (scales None). Every expert on every row (bf16 GEMMs of MXFP8(x) and MXFP4(W), STE), each row's
    routing weight applied before the cast that feeds w2 (zero for unselected experts) -> bf16
    [T, k, H] in ascending expert id per row, as `routed_experts`."""
    t, k = ids.shape
    sid, rank = ids.long().sort(dim=1)
    xq = mxfp8_qdq_ste(x)
    q1, q3, q2 = (mxfp4_qdq_ste(w).to(torch.bfloat16) for w in (w1, w3, w2))
    g = torch.einsum("th,eih->tei", xq, q1)
    u = torch.einsum("th,eih->tei", xq, q3)
    dense_w = torch.zeros(t, w1.size(0), dtype=torch.float32, device=x.device).scatter(1, sid, weights.gather(1, rank))
    h = swiglu(g, u, limit, dense_w.unsqueeze(-1))  # fp32 [T, E, I]
    y = torch.einsum("tei,ehi->teh", mxfp8_qdq_ste(h.to(torch.bfloat16)), q2)  # [T, E, H]
    return y.gather(1, sid.unsqueeze(-1).expand(t, k, y.size(-1)))


def routed_experts_ste(x, ids, weights, w1, _s1, w3, _s3, w2, _s2, limit: float) -> torch.Tensor:
    """TRAIN routed experts of a trainable model (stacked masters as in `routed_experts_dense`): the
    value is `routed_experts` on the masters' MXFP4 bytes (the serving value), the gradient that of
    `routed_experts_dense` (the same rounding points)."""
    packed = [quant_mxfp4(w.detach().float()) for w in (w1, w3, w2)]

    def exact(x, weights, w1, w3, w2):
        (q1, s1), (q3, s3), (q2, s2) = packed
        return routed_experts(x, ids, weights, q1, s1, q3, s3, q2, s2, limit)

    def surrogate(x, weights, w1, w3, w2):
        return routed_experts_dense(x, ids, weights, w1, None, w3, None, w2, None, limit)

    return exact_value(exact, surrogate, x, weights, w1, w3, w2)


class MoE(nn.Module):
    numerics_slots = {"routed": Slot("moe", kernel="moe_experts", train=routed_experts_ste, fast=routed_experts_dense),
                      "combine": Slot("moe", kernel="moe_combine")}
    routed = staticmethod(routed_experts)
    combine = staticmethod(combine)  # (routed [T, k, H], shared [T, H]) -> [T, H], the fixed fp32 order

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.moe
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(
            Expert(cfg.hidden_size, m.moe_inter_dim, MXFP4Linear, m.swiglu_limit) for _ in range(m.n_routed_experts)
        )
        self.shared_experts = Expert(cfg.hidden_size, m.moe_inter_dim, FP8Linear, m.swiglu_limit)
        self._stacked: tuple[torch.Tensor, ...] | None = None

    def expert_weights(self) -> tuple[torch.Tensor, ...]:
        """(w1, s1, w3, s3, w2, s2), each stacked [E, ...]. Built on first use (and again if the
        parameters were replaced, e.g. moved or reloaded): every expert parameter then becomes a view
        of the stacked tensor, so nothing is held twice. A trainable model's experts hold masters
        only: (w1, None, w3, None, w2, None) stacked at every call (differentiable)."""
        if not hasattr(self.experts[0].w1, "scale"):
            return tuple(x for n in ("w1", "w3", "w2") for x in (torch.stack([getattr(e, n).weight for e in self.experts]), None))
        params = [p for ex in self.experts for lin in (ex.w1, ex.w3, ex.w2) for p in (lin.weight, lin.scale)]
        st = self._stacked
        if st is not None and all(p.data_ptr() == st[i % 6][i // 6].data_ptr() for i, p in enumerate(params)):
            return st
        with torch.inference_mode(False), torch.no_grad():
            st = tuple(torch.stack([p.data for p in params[i::6]]) for i in range(6))
            for i, p in enumerate(params):
                p.data = st[i % 6][i // 6]
        self._stacked = st
        return st

    def apply_numerics(self, policy, shared: dict) -> None:
        """Policy hook (numerics.apply_numerics): kernels read the stacked experts; stack them now."""
        if policy.table is not None:
            self.expert_weights()

    def forward(self, x: torch.Tensor, forced: torch.Tensor | None = None,
                image_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] bf16 -> (y bf16 [T, H], routed expert ids int32 [T, k]); image_rows: see Gate."""
        weights, ids = self.gate(x, forced, image_rows)
        w1, s1, w3, s3, w2, s2 = self.expert_weights()
        routed = self.routed(x, ids, weights, w1, s1, w3, s3, w2, s2, self.shared_experts.limit)
        return self.combine(routed, self.shared_experts(x)), ids.to(torch.int32)
