"""V4.1 attention layer parameters and its per-token pieces (spec attention 1).

Query:  qr = q_norm(wq_a(x)); q = rope(wq_b(qr)) [T, h, D]            (no per-head norm in V4.1)
Window: kv = FP8(rope(kv_norm(wkv(x))))  [T, D]  (MXFP8 per 32, RoPE dims included)
Compressed KV (KV sources): FP4(rope(latent, group_pos))  (E2M1 + E4M3 scale per 16)
Output: o [T, h, D] -> inverse rope on the last 64 dims -> wo_a per group (bf16) -> wo_b (FP8).

`forward` is the attention site in paper order over a KV interface (layers/kv.py): query, window
keys, [KV source: compressed KV + index keys], [index source: scores -> candidates -> top-k], sparse
attention over [window | selected], output. Which rows/keys exist is the KV's business.

Numerics slots (sglang_dsv41/numerics.py): `rope` (op `rope_rotate`), the window / compressed KV
roundings `window_qdq` / `kv_qdq` (TRAIN: their straight-through forms), and `attention`, the dense
KV's formulation (EXACT `list_attention`, FAST `masked_attention`; layers/dense_attention.py).
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.config import LayerRole, ModelConfig
from sglang_dsv41.determinism import deterministic, row_tiled
from sglang_dsv41.layers.compressor import Compressor
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.dense_attention import list_attention, masked_attention
from sglang_dsv41.layers.indexer import Indexer
from sglang_dsv41.layers.kv import KV
from sglang_dsv41.layers.linear import FP8Linear, FusedRows
from sglang_dsv41.layers.norm import RMSNorm
from sglang_dsv41.layers.rope import Rotary, apply_rope
from sglang_dsv41.numerics import Slot
from sglang_dsv41.quant import kv_fp4_qdq, kv_fp4_qdq_ste, window_kv_qdq, window_kv_qdq_ste


class Attention(nn.Module):
    numerics_slots = {"rope": Slot("rope", kernel="rope_rotate"), "window_qdq": Slot("quant", train=window_kv_qdq_ste),
                      "kv_qdq": Slot("quant", train=kv_fp4_qdq_ste), "attention": Slot("attention", fast=masked_attention)}
    rope = staticmethod(apply_rope)  # (x [T, (h,) d], cos, sin, inverse) -> x rotated (layers/rope.py)
    window_qdq = staticmethod(window_kv_qdq)  # bf16 [T, D] -> FP8 window grid
    kv_qdq = staticmethod(kv_fp4_qdq)  # bf16 [n, D] -> FP4 compressed grid
    attention = staticmethod(list_attention)  # the dense KV's attention (layers/dense_attention.py)

    def __init__(self, cfg: ModelConfig, role: LayerRole):
        super().__init__()
        a, H, blk, eps = cfg.attention, cfg.hidden_size, cfg.weight_block_size, cfg.rms_norm_eps
        self.role = role
        self.n_heads, self.head_dim, self.o_groups, self.o_lora_rank = a.n_heads, a.head_dim, a.o_groups, a.o_lora_rank
        self.softmax_scale = a.softmax_scale
        self.compression = cfg.compression
        self.wq_a = FP8Linear(H, a.q_lora_rank, blk)
        self.q_norm = RMSNorm(a.q_lora_rank, eps)
        self.wq_b = FP8Linear(a.q_lora_rank, a.n_heads * a.head_dim, blk)
        self.wkv = FP8Linear(H, a.head_dim, blk)
        self.kv_norm = RMSNorm(a.head_dim, eps)
        self.wo_a = FP8Linear(a.n_heads * a.head_dim // a.o_groups, a.o_groups * a.o_lora_rank, blk)
        self.wo_b = FP8Linear(a.o_groups * a.o_lora_rank, H, blk)
        self.attn_sink = nn.Parameter(torch.zeros(a.n_heads, dtype=torch.float32), requires_grad=False)
        self.rotary = Rotary(cfg, role.rope_kind)
        if role.is_kv_source:
            self.compressor = Compressor(cfg, role.compress_ratio)
        if role.is_index_source:
            self.indexer = Indexer(cfg, owns_keys=role.is_kv_source)

    def forward(self, x: torch.Tensor, kv: KV, dec: Decisions, replay: Decisions | None = None) -> torch.Tensor:
        """x [N, H] bf16 (normed attention input of the KV's current rows) -> [N, H] bf16.
        Records this layer's top-k / candidates in `dec` (index sources); `replay` forces them."""
        role = self.role
        freqs = kv.freqs(self.rotary)
        qa, kv_x = self.project(x)
        q, qr = self.query(qa, freqs)
        kv.store_window(self, kv_x, freqs)
        topk = None
        if role.compress_ratio:
            if role.is_kv_source:
                kv.store_compressed(self, x)
            if role.is_index_source:
                self.select(x, qr, freqs, kv, dec, replay)
            topk = dec.topk[role.index_source]
        return self.output(kv.attend(self, q, topk), freqs)

    def select(self, x, qr, freqs, kv: KV, dec: Decisions, replay: Decisions | None) -> None:
        """Index source: score the visible compressed positions, apply / publish candidate blocks,
        keep the top-k (spec attention 4.3-4.4)."""
        role, ix, c = self.role, self.indexer, self.compression
        lid = role.layer_id
        scores, visible = kv.index_scores(self, ix.queries(qr, freqs), ix.head_weights(x))
        forced = replay.forced("candidates", lid) if replay is not None else None
        if role.is_candidate_source:
            if forced is None:
                forced = ix.select_candidates(scores, visible, c.candidate_topk_blocks, c.candidate_block_size)
            dec.candidates[lid] = _fit_width(forced.to(scores.device), scores.size(-1))
        elif role.uses_candidates:
            scores = scores.masked_fill(~dec.candidates[role.candidate_source], float("-inf"))
        sel = replay.forced("topk", lid) if replay is not None else None
        dec.topk[lid] = ix.select_topk(scores, c.index_topk) if sel is None else sel.to(scores.device, torch.int32)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] bf16 -> (wq_a(x) [T, q_lora], wkv(x) [T, D]) bf16: one GEMM over [wq_a; wkv] where the
        kernels policy fused them (`apply_numerics`, `linear.FusedRows`; same bits per column), else two."""
        fused = self.__dict__.get("_qkv")
        if fused is not None and fused.holds():
            return fused(x)
        return self.wq_a(x), self.wkv(x)

    def query(self, qa: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """qa [T, q_lora] bf16 = wq_a(x) -> (q [T, h, D] bf16 rotated, qr [T, q_lora] bf16 normed)."""
        qr = self.q_norm(qa)
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        return self.rope(q, *freqs), qr

    def window_kv(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> bf16 [T, D] window K(=V), already on the FP8 grid."""
        return self.window_keys(self.wkv(x), freqs)

    def window_keys(self, kv: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """kv [T, D] bf16 = wkv(x) -> bf16 [T, D] window K(=V) on the FP8 grid."""
        return self.window_qdq(self.rope(self.kv_norm(kv), *freqs))

    def compressed_kv(self, latent: torch.Tensor, group_freqs: torch.Tensor) -> torch.Tensor:
        """latent [n, D] bf16 pre-RoPE -> bf16 [n, D] on the FP4 (E4M3/16) grid."""
        return self.kv_qdq(self.rope(latent, *group_freqs))

    def apply_numerics(self, policy, shared: dict) -> None:
        """Policy hook (numerics.apply_numerics), same bits: under kernels `wo_a` is kept dequantized and
        wq_a / wkv run as one GEMM (`project`);
        with `policy.rope_table` on CUDA the RoPE rows come from one device table per kind (shared
        by the layers: `shared`), over positions 0 .. max_position_embeddings - 1."""
        if hasattr(self.wo_a, "keep_dequantized"):
            self.wo_a.keep_dequantized(policy.table is not None)
        self.__dict__.pop("_qkv", None)
        fused = FusedRows.of([self.wq_a, self.wkv]) if policy.table is not None else None
        if fused is not None:
            self.__dict__["_qkv"] = fused
        dev = self.attn_sink.device
        if not policy.rope_table or dev.type != "cuda":
            self.rotary.use_table(None)
            return
        key = ("rope", self.rotary.table_key)
        if key not in shared:
            shared[key] = self.rotary.position_table(self.rotary.max_positions, dev)
        self.rotary.use_table(shared[key])

    def output(self, o: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """o [T, h, D] bf16 -> [T, H] bf16."""
        o = self.rope(o, *freqs, inverse=True)
        wo_a = self.wo_a.dequantized().view(self.o_groups, self.o_lora_rank, -1)
        og = o.flatten(1).unflatten(-1, (self.o_groups, -1))
        if deterministic():  # batch-invariant: fixed 64-row products (sglang_dsv41/determinism.py)
            y = row_tiled(lambda t: torch.einsum("tgd,grd->tgr", t, wo_a), og)
        else:
            y = torch.einsum("tgd,grd->tgr", og, wo_a)
        return self.wo_b(y.flatten(1))


def _fit_width(mask: torch.Tensor, n: int) -> torch.Tensor:
    """A forced candidate mask [N, m] recorded by another KV (dense: the whole sequence; paged: the
    batch's widest row) cut or False-padded to n columns; columns past a row's visible are unused."""
    if mask.size(-1) >= n:
        return mask[:, :n]
    return torch.nn.functional.pad(mask, (0, n - mask.size(-1)), value=False)
