"""One decoder layer's parameters: Engram (optional), attention, MoE, their norms and mHC sites.

Parameter names follow the checkpoint: `attn_norm`, `ffn_norm`, `hc_{attn,ffn}_{fn,base,scale}`,
`attn.*`, `ffn.*`, `engram.*`. `forward` runs the attention and MoE sites in paper order with the
lagged mHC schedule (a sublayer's input is collapsed with the previous site's `pre`, spec model
3.4); the Engram step before them needs the row ids and runs in `DeepseekV41.forward`. The mHC math
goes through the numerics slots `mhc_gates`, `mhc_collapse`, `mhc_expand` (defaults: layers.mhc), the
mix GEMM through `fp32_gemm` (default: layers.linear.fp32_linear); sglang_dsv41/numerics.py.
A site's entry (`enter`: mix GEMM, gates, collapse, norm) runs as the one op `mhc_enter` of the policy's
table when fp32_gemm, mhc and norm all run kernels (`apply_numerics`; same bits as the four slots).
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import LayerRole, ModelConfig
from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.engram import Engram
from sglang_dsv41.layers.kv import KV
from sglang_dsv41.layers.linear import FP32_GEMM_SLOT, fp32_linear
from sglang_dsv41.layers.mhc import collapse, expand, gates, gates_plain
from sglang_dsv41.layers.moe import MoE
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.numerics import Mode, Slot


class Block(nn.Module):
    numerics_slots = {"mhc_gates": Slot("mhc", kernel="mhc_gates", fast=gates_plain),
                      "mhc_collapse": Slot("mhc", kernel="mhc_collapse"), "mhc_expand": Slot("mhc", kernel="mhc_expand"),
                      "fp32_gemm": FP32_GEMM_SLOT}
    fp32_gemm = staticmethod(fp32_linear)  # (x [T, n*H], fn [(2+n)n, n*H] fp32) -> mix fp32 [T, (2+n)n]
    mhc_gates = staticmethod(gates)  # (x, mix, base, scale, iters, hc_eps, norm_eps) -> (pre, post, comb)
    mhc_collapse = staticmethod(collapse)  # (streams [T,n,H], pre [T,n]) -> [T,H]
    mhc_expand = staticmethod(expand)  # (y [T,H], streams [T,n,H], post [T,n], comb [T,n,n]) -> [T,n,H]

    def __init__(self, cfg: ModelConfig, role: LayerRole):
        super().__init__()
        hc, H = cfg.hc, cfg.hidden_size
        self.role = role
        self.hc_iters, self.hc_eps, self.norm_eps = hc.sinkhorn_iters, hc.hc_eps, cfg.rms_norm_eps
        self.engram = Engram(cfg, role.layer_id) if role.has_engram else None
        self.attn_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.attn = Attention(cfg, role)
        self.ffn_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.ffn = MoE(cfg)
        for site in ("attn", "ffn"):
            self.register_parameter(f"hc_{site}_fn", nn.Parameter(torch.zeros(hc.mix_dim, hc.hc_mult * H, dtype=torch.float32), requires_grad=False))
            self.register_parameter(f"hc_{site}_base", nn.Parameter(torch.zeros(hc.mix_dim, dtype=torch.float32), requires_grad=False))
            self.register_parameter(f"hc_{site}_scale", nn.Parameter(torch.zeros(3, dtype=torch.float32), requires_grad=False))

    def hc_mix(self, site: str, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pre, post, comb) of site 'attn' or 'ffn' computed from that site's input streams [T, n, H]:
        the fp32 GEMM in the `fp32_gemm` slot, the rest in the `mhc_gates` slot (layers.mhc.gates)."""
        x = streams.flatten(1)
        mix = self.fp32_gemm(x, getattr(self, f"hc_{site}_fn"))
        return self.mhc_gates(
            x,
            mix,
            getattr(self, f"hc_{site}_base"),
            getattr(self, f"hc_{site}_scale"),
            self.hc_iters,
            self.hc_eps,
            self.norm_eps,
        )

    def attn_input(self, streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """streams [N, n, H] bf16, pre [N, n] fp32 (previous site's) -> attention input x [N, H] bf16."""
        return self.attn_norm(self.mhc_collapse(streams, pre))

    def enter(self, site: str, streams: torch.Tensor, prev_pre: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Entering site 'attn' or 'ffn': (pre, post, comb) of the site from its input streams [N, n, H] and
        the sublayer input x [N, H] = norm(collapse(streams, prev_pre)) (prev_pre: the previous site's)."""
        norm = self.attn_norm if site == "attn" else self.ffn_norm
        fused = self.__dict__.get("_enter")
        if fused is not None:
            return fused(streams, getattr(self, f"hc_{site}_fn"), getattr(self, f"hc_{site}_base"),
                         getattr(self, f"hc_{site}_scale"), self.hc_iters, self.hc_eps, self.norm_eps, prev_pre,
                         norm.weight)
        return (*self.hc_mix(site, streams), norm(self.mhc_collapse(streams, prev_pre)))

    def apply_numerics(self, policy, shared: dict) -> None:
        """Policy hook (numerics.apply_numerics), same bits: with fp32_gemm, mhc and norm all on kernels,
        `enter` runs the table's `mhc_enter` (one op for the four slots' work)."""
        self.__dict__.pop("_enter", None)
        if all(getattr(policy, f) is Mode.KERNEL for f in ("fp32_gemm", "mhc", "norm")):
            self.__dict__["_enter"] = policy.table.mhc_enter

    def forward(
        self, streams: torch.Tensor, pre: torch.Tensor, kv: KV, dec: Decisions, replay: Decisions | None = None,
        image_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(streams [N, n, H] bf16, pre [N, n] fp32) -> the same after attention and MoE.
        Records routed experts (and the attention's decisions) in `dec`; `replay` forces them.
        `image_rows` bool [N]: rows inside image spans (their own router bias)."""
        lid = self.role.layer_id
        attn_pre, attn_post, attn_comb, x = self.enter("attn", streams, pre)
        y = self.attn(x, kv, dec, replay)
        streams = self.mhc_expand(y, streams, attn_post, attn_comb)
        ffn_pre, ffn_post, ffn_comb, x = self.enter("ffn", streams, attn_pre)
        forced = replay.forced("routed_experts", lid) if replay is not None else None
        y, dec.routed_experts[lid] = self.ffn(x, forced, image_rows)
        return self.mhc_expand(y, streams, ffn_post, ffn_comb), ffn_pre
