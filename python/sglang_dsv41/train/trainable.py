"""The trainable model: a transformation of a built `DeepseekV41` (QAT with master weights).

`make_trainable(model)` rewrites a loaded (or randomly built) model in place, in the spirit of a
quantization pass over nn.Linear modules:

| serving tensor (checkpoint dtype)                 | trainable form                                         |
|---------------------------------------------------|--------------------------------------------------------|
| FP8Linear weight E4M3 + scale UE8M0 (32x32)       | `QATFP8Linear`: master [N, K] (dequantized), forward = |
|                                                   |   exact `quant.fp8_linear` of the re-quantized master  |
| MXFP4Linear (routed experts) I8 + UE8M0 (1x32)    | `QATMXFP4Linear`: master [N, K], W4A8 forward          |
| MoE routed slot (grouped experts)                 | exact `routed_experts` on the re-quantized masters,    |
|                                                   |   gradient of an fp32 STE surrogate                    |
| BF16 tensors (embed, head, norms, router, compressor, indexer wk / weights_proj, Engram q/k) |   |
|                                                   | fp32 master, forward reads bf16(master) (parametrize)  |
| F32 tensors (mHC fn/base/scale, attention sink)   | trained as they are (fp32)                             |
| router bias (noaux_tc, selects only), Engram tables (FP8 rows) | frozen                                    |
Window KV, compressed KV and indexer q/k roundings go through the straight-through ops of
`train/fake_quant.py` (Attention / Indexer methods swapped for their QAT twins, same arithmetic).
Everything else (fp32 mHC / Sinkhorn / router / compressor gates / Engram gate / sink, the block-64
softmax, top-k and candidate selection) is the unchanged layer code, run with autograd.

The forward is THE forward, `DeepseekV41.forward`, over a `reference.DenseKV` (`forward_train`); on the
CPU its logits equal `ReferenceModel` on `export.checkpoint_tensors(model)` bit for bit.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from sglang_dsv41.layers import moe as moe_layer
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.indexer import Indexer
from sglang_dsv41.layers.linear import FP8Linear, MXFP4Linear
from sglang_dsv41.layers.rope import apply_rope
from sglang_dsv41.layers.transformer import DeepseekV41, ForwardOutput
from sglang_dsv41.quant import dequant_fp8_weight, dequant_mxfp4
from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.train import fake_quant as fq

FROZEN_SUFFIXES = (".gate.bias", ".engram.embed.weight", ".engram.embed.scale")
"""Checkpoint tensors that never get a gradient: the noaux_tc router bias (it only selects experts;
load balancing adjusts it outside the loss) and the Engram tables (frozen, never synced)."""


class QATFP8Linear(nn.Module):
    """Master weight [N, K] (fp32 or bf16) of a dense FP8 linear; forward = the serving GEMM."""

    def __init__(self, src: FP8Linear, master_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features, self.block = src.in_features, src.out_features, src.block
        w = dequant_fp8_weight(src.weight.detach(), src.scale.detach(), src.block)
        self.weight = nn.Parameter(w.to(master_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fq.fp8_linear_ste(x, self.weight, self.block)

    def dequantized(self) -> torch.Tensor:
        """bf16 [N, K] on the FP8 grid (wo_a runs as a bf16 einsum on it), STE gradient."""
        return fq.fp8_block_weight(self.weight, self.block).to(torch.bfloat16)

    def quantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (E4M3 [N, K], UE8M0 [ceil(N/32), ceil(K/32)]): the exported bytes."""
        q, s, _ = fq.quantize_fp8_block(self.weight.detach(), self.block)
        return q, s


class QATMXFP4Linear(nn.Module):
    """Master weight [N, K] of a routed-expert MXFP4 linear; forward = the serving W4A8 GEMM."""

    def __init__(self, src: MXFP4Linear, master_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = src.in_features, src.out_features
        w = dequant_mxfp4(src.weight.detach().view(torch.uint8), src.scale.detach())
        self.weight = nn.Parameter(w.to(master_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fq.mxfp4_linear_ste(x, self.weight)

    def quantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (I8 packed E2M1 [N, K/2], UE8M0 [N, K/32]): the exported bytes."""
        q, s, _ = fq.quantize_mxfp4(self.weight.detach())
        return q, s


class QATAttention(Attention):
    """Attention with the window-KV and compressed-KV roundings as straight-through ops."""

    def window_keys(self, kv: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        return fq.window_kv(self.rotary.apply(self.kv_norm(kv), freqs))

    def compressed_kv(self, latent: torch.Tensor, group_freqs: torch.Tensor) -> torch.Tensor:
        return fq.kv_fp4(self.rotary.apply(latent, group_freqs))


class QATIndexer(Indexer):
    """Indexer with the two-stage FP4 of keys and queries as straight-through ops."""

    query_quant = staticmethod(lambda q, cos, sin: fq.index_fp4(apply_rope(q, cos, sin)))

    def keys(self, latent: torch.Tensor, rotate) -> torch.Tensor:
        return fq.index_fp4(rotate(self.k_norm(self.wk(latent))))


class _AsBF16(nn.Module):
    """Parametrization: the layer reads bf16(master); the cast's gradient is the identity."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.to(torch.bfloat16)


def _stacked_masters(moe: nn.Module):
    """QAT replacement of `MoE.expert_weights`: (w1, None, w3, None, w2, None) masters stacked [E, ...]."""
    ex = moe.experts
    return tuple(x for name in ("w1", "w3", "w2") for x in (torch.stack([getattr(e, name).weight for e in ex]), None))


def _routed_surrogate(ids: torch.Tensor, limit: float, quantized: list):
    """fp32 STE twin of `routed_experts` (gradient only): same rows, slots and rounding points.
    `quantized` holds each stacked master's (dequantized values, keep mask) from the forward."""

    def run(x, weights, w1, w3, w2):
        t, k = ids.shape
        sid, rank = ids.long().sort(dim=1)
        flat, wt = sid.flatten(), weights.gather(1, rank).flatten()
        xq = fq.mxfp8_act(x).float()
        q1, q3, q2 = (fq.ste(w, v, keep) for w, (v, keep) in zip((w1, w3, w2), quantized))
        out = torch.zeros(t * k, x.size(-1), dtype=torch.float32, device=x.device)
        for e in torch.unique(flat).tolist():
            r = torch.nonzero(flat == e).flatten()
            xe = xq[r // k]
            h = moe_layer.swiglu(xe @ q1[e].t(), xe @ q3[e].t(), limit, wt[r, None])
            out = out.index_put((r,), fq.mxfp8_act(h.to(torch.bfloat16)).float() @ q2[e].t())
        return out.view(t, k, -1).to(x.dtype)

    return run


def _qat_routed(x, ids, weights, w1, _s1, w3, _s3, w2, _s2, limit):
    """QAT replacement of the MoE `routed` slot (grouped experts): takes the stacked masters
    [E, N, K]; the value is the serving `routed_experts` on their MXFP4 bytes."""
    packed = [fq.quantize_mxfp4(w.detach()) for w in (w1, w3, w2)]
    quantized = [(dequant_mxfp4(q.view(torch.uint8), s), keep) for q, s, keep in packed]

    def exact(x, weights, w1, w3, w2):
        (q1, s1, _), (q3, s3, _), (q2, s2, _) = packed
        return moe_layer.routed_experts(x, ids, weights, q1, s1, q3, s3, q2, s2, limit)

    return fq.exact_value(exact, _routed_surrogate(ids, limit, quantized), x, weights, w1, w3, w2)


def _is_frozen(name: str) -> bool:
    return name.endswith(FROZEN_SUFFIXES)


def make_trainable(model: DeepseekV41, master_dtype: torch.dtype = torch.float32) -> DeepseekV41:
    """Turn a built `DeepseekV41` (serving parameters, e.g. from `load_model`) into its QAT trainable
    form IN PLACE and return it. `master_dtype` (fp32 or bf16) holds every trained weight; bf16
    checkpoint tensors with fp32 masters are read through a bf16 cast. Kernels must not be applied."""
    if master_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"master_dtype must be torch.float32 or torch.bfloat16, got {master_dtype}")
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            if type(child) is FP8Linear:
                setattr(mod, cname, QATFP8Linear(child, master_dtype))
            elif type(child) is MXFP4Linear:
                setattr(mod, cname, QATMXFP4Linear(child, master_dtype))
        if type(mod) is Attention:
            mod.__class__ = QATAttention
        elif type(mod) is Indexer:
            mod.__class__ = QATIndexer
        elif isinstance(mod, moe_layer.MoE) and hasattr(mod, "routed"):  # grouped routed experts
            mod.expert_weights = _stacked_masters.__get__(mod)
            mod.routed = _qat_routed
            mod._stacked = None
    for mname, mod in list(model.named_modules()):
        if isinstance(mod, (QATFP8Linear, QATMXFP4Linear)) or ".parametrizations" in f".{mname}":
            continue
        for pname, p in list(mod._parameters.items()):
            full = f"{mname}.{pname}" if mname else pname
            if p is None:
                continue
            if _is_frozen(full) or not p.dtype.is_floating_point or p.dtype.itemsize == 1:
                p.requires_grad_(False)
            elif p.dtype == torch.bfloat16 and master_dtype == torch.float32:
                setattr(mod, pname, nn.Parameter(p.detach().float()))
                parametrize.register_parametrization(mod, pname, _AsBF16(), unsafe=True)
            else:
                p.requires_grad_(True)
    model.train()
    return model


def load_trainable(path: str | os.PathLike, device: str | torch.device = "cpu",
                   master_dtype: torch.dtype = torch.float32) -> DeepseekV41:
    """A checkpoint directory (or embedded alias) -> its trainable model (masters dequantized)."""
    from sglang_dsv41.checkpoint.loader import load_model

    return make_trainable(load_model(path, device=device, progress=False), master_dtype)


def trainable_parameters(model: DeepseekV41) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every master that gets a gradient (frozen tensors excluded)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def forward_train(model: DeepseekV41, token_ids: torch.Tensor, replay: Decisions | None = None,
                  tail_replay: bool = False) -> ForwardOutput:
    """THE forward over a dense KV with autograd: token_ids int [T] (one sequence from position 0)
    -> fp32 logits [T, vocab] (+ positions, decisions). `replay` forces decisions, e.g. R3:
    `Decisions(routed_experts={layer: int32 [T, top_k]})` (gating weights stay the router's)."""
    ids = token_ids.to(model.embed.weight.device).long()
    return model(ids, DenseKV(model.cfg, ids.numel(), ids.device, tail_replay=tail_replay), replay)


def token_logprobs(model: DeepseekV41, token_ids: torch.Tensor, replay: Decisions | None = None) -> torch.Tensor:
    """fp32 [T-1]: log p(token_ids[t+1] | token_ids[:t+1]) from `forward_train` (differentiable)."""
    out = forward_train(model, token_ids, replay)
    ids = token_ids.to(out.logits.device).long()
    return torch.log_softmax(out.logits[:-1], dim=-1).gather(1, ids[1:, None]).squeeze(1)


def sequence_loss(model: DeepseekV41, token_ids: torch.Tensor, loss_mask: torch.Tensor,
                  replay: Decisions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed token cross-entropy of the positions where loss_mask [T] (bool, per target token
    token_ids[t]) is True -> (fp32 sum, number of tokens). t = 0 is never a target."""
    out = forward_train(model, token_ids, replay)
    ids = token_ids.to(out.logits.device).long()
    mask = loss_mask.to(out.logits.device)[1:]
    ce = F.cross_entropy(out.logits[:-1], ids[1:], reduction="none")
    return (ce * mask).sum(), mask.sum()
