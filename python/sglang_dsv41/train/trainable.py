"""The trainable model: a transformation of a built `DeepseekV41` (QAT with master weights).

`make_trainable(model)` rewrites the parameters of a loaded (or randomly built) model in place, in
the spirit of a quantization pass over nn.Linear modules, then applies the training numerics policy
(`numerics.NumericsPolicy.train()`: every serving rounding straight-through, with the serving value):

| serving tensor (checkpoint dtype)                 | trainable form                                         |
|---------------------------------------------------|--------------------------------------------------------|
| FP8Linear weight E4M3 + scale UE8M0 (32x32)       | `QATFP8Linear`: master [N, K] (dequantized), `gemm`    |
|                                                   |   slot = `quant.fp8_linear_ste` of the master          |
| MXFP4Linear (routed experts) I8 + UE8M0 (1x32)    | `QATMXFP4Linear`: master [N, K]; the MoE `routed` slot |
|                                                   |   takes the stacked masters (layers/moe.py)            |
| BF16 tensors (embed, head, norms, router, compressor, indexer wk / weights_proj, Engram q/k) |   |
|                                                   | fp32 master, forward reads bf16(master) (parametrize)  |
| F32 tensors (mHC fn/base/scale, attention sink)   | trained as they are (fp32)                             |
| router bias (noaux_tc, selects only), Engram tables (FP8 rows) | frozen                                    |
Window KV, compressed KV and indexer q/k roundings are the layers' `quant` slots (their STE forms in
`sglang_dsv41.quant`). Everything else (fp32 mHC / Sinkhorn / router / compressor gates / Engram
gate / sink, the block-64 softmax, top-k and candidate selection) is the unchanged layer code, run
with autograd. `apply_numerics(model, NumericsPolicy.train(fast=True))` switches to the fast forms
(plain GEMMs and reductions, dense experts, one masked softmax; same parameters) and back.

The forward is THE forward, `DeepseekV41.forward`, over a `reference.DenseKV` (`forward_train`); on the
CPU its logits equal `ReferenceModel` on `export.checkpoint_tensors(model)` bit for bit.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.linear import FP8Linear, MXFP4Linear
from sglang_dsv41.layers.transformer import DeepseekV41, ForwardOutput
from sglang_dsv41.numerics import NumericsPolicy, Slot, apply_numerics
from sglang_dsv41.quant import (
    dequant_fp8_weight,
    dequant_mxfp4,
    fp4_linear_ste,
    fp8_linear_plain_ste,
    fp8_linear_ste,
    fp8_weight_qdq_ste,
    quant_fp8_weight,
    quant_mxfp4,
)
from sglang_dsv41.reference.dense_kv import DenseKV

FROZEN_SUFFIXES = (".gate.bias", ".engram.embed.weight", ".engram.embed.scale")
"""Checkpoint tensors that never get a gradient: the noaux_tc router bias (it only selects experts;
load balancing adjusts it outside the loss) and the Engram tables (frozen, never synced)."""


class QATFP8Linear(nn.Module):
    """Master weight [N, K] (fp32 or bf16) of a dense FP8 linear; forward = the `gemm` slot (the
    serving GEMM of the re-quantized master, STE; FAST: one plain matmul of the same roundings)."""

    numerics_slots = {"gemm": Slot("gemm", fast=fp8_linear_plain_ste)}
    gemm = staticmethod(fp8_linear_ste)  # (x bf16 [..., K], master [N, K], block) -> bf16 [..., N]

    def __init__(self, src: FP8Linear, master_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features, self.block = src.in_features, src.out_features, src.block
        w = dequant_fp8_weight(src.weight.detach(), src.scale.detach(), src.block)
        self.weight = nn.Parameter(w.to(master_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, self.weight, self.block)

    def dequantized(self) -> torch.Tensor:
        """bf16 [N, K] on the FP8 grid (wo_a runs as a bf16 einsum on it), STE gradient."""
        return fp8_weight_qdq_ste(self.weight, self.block).to(torch.bfloat16)

    def quantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (E4M3 [N, K], UE8M0 [ceil(N/32), ceil(K/32)]): the exported bytes."""
        return quant_fp8_weight(self.weight.detach().float(), self.block)


class QATMXFP4Linear(nn.Module):
    """Master weight [N, K] of a routed-expert MXFP4 linear; forward = the serving W4A8 GEMM (STE).
    In the model the MoE runs the stacked masters through its `routed` slot."""

    def __init__(self, src: MXFP4Linear, master_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = src.in_features, src.out_features
        w = dequant_mxfp4(src.weight.detach().view(torch.uint8), src.scale.detach())
        self.weight = nn.Parameter(w.to(master_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp4_linear_ste(x, self.weight)

    def quantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (I8 packed E2M1 [N, K/2], UE8M0 [N, K/32]): the exported bytes."""
        q, s = quant_mxfp4(self.weight.detach().float())
        return q.view(torch.int8), s


class _AsBF16(nn.Module):
    """Parametrization: the layer reads bf16(master); the cast's gradient is the identity."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.to(torch.bfloat16)


def _is_frozen(name: str) -> bool:
    return name.endswith(FROZEN_SUFFIXES)


def make_trainable(model: DeepseekV41, master_dtype: torch.dtype = torch.float32, part: str = "backbone") -> DeepseekV41:
    """Turn a built `DeepseekV41` (serving parameters, e.g. from `load_model`) into its QAT trainable
    form IN PLACE, apply `NumericsPolicy.train()` and return it. `master_dtype` (fp32 or bf16) holds
    every trained weight; bf16 checkpoint tensors with fp32 masters are read through a bf16 cast.
    `part`: which masters get gradients: "backbone" (default: everything but the DSpark stages
    `mtp.*`, which the LM loss never reaches, so an optimizer's weight decay cannot drift them),
    "drafter" (only `mtp.*`; the backbone, its embedding and head included, stays frozen) or "all"
    (both, for a loss that has a drafter term).
    The model must run the exact numerics (no kernels policy applied)."""
    if part not in ("all", "backbone", "drafter"):
        raise ValueError(f"part must be 'all', 'backbone' or 'drafter', got {part!r}")
    if master_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"master_dtype must be torch.float32 or torch.bfloat16, got {master_dtype}")
    apply_numerics(model, NumericsPolicy.exact())
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            if type(child) is FP8Linear:
                setattr(mod, cname, QATFP8Linear(child, master_dtype))
            elif type(child) is MXFP4Linear:
                setattr(mod, cname, QATMXFP4Linear(child, master_dtype))
        if hasattr(mod, "_stacked"):
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
    if part != "all":
        for name, p in model.named_parameters():
            if name.startswith("mtp.") != (part == "drafter"):
                p.requires_grad_(False)
    model.trainable = True
    apply_numerics(model, NumericsPolicy.train())
    model.train()
    return model


def load_trainable(path: str | os.PathLike, device: str | torch.device = "cpu",
                   master_dtype: torch.dtype = torch.float32, part: str = "backbone") -> DeepseekV41:
    """A checkpoint directory (or embedded alias) -> its trainable model (masters dequantized)."""
    from sglang_dsv41.checkpoint.loader import load_model

    return make_trainable(load_model(path, device=device, progress=False), master_dtype, part)


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
