"""DSpark, the speculative drafter shipped in V4.1 checkpoints (`mtp.<k>.*`, shared/spec/dspark.md).

A stage is a backbone `Block` (window-only role, layer id num_layers + k, the stages' expert counts)
plus, on stage 0, `main_proj` / `main_norm` and, on the last stage, `norm`, the Markov head and the
confidence head. The backbone's embedding and head are shared (no `mtp.<k>.embed/head` tensors).

One draft step for B requests whose last committed position is p (per request):
  context   main_x = main_norm(main_proj(main_hidden)) of committed rows; each stage keeps
            FP8(rope(kv_norm(wkv(main_x)))) at the row's position in its own window (`add_context`)
  block     ids [anchor, noise x (gamma - 1)] at positions p+1 .. p+gamma, embedded, n equal streams,
            one-hot pre; every stage runs `Block.forward` over the block rows; each block row
            attends to [the stage's context window (ring slot order) | all gamma block rows]
  head      x = collapse(streams, pre); logits = head(norm(x)) fp32 [B, gamma, V]
  Markov    for i in 0..gamma-1: logits[:, i] += markov.head(markov.embed[out_i]); out_{i+1} = choose(.)
  confidence  proj(cat(x, markov embeds)) fp32 [B, gamma] (raw logits)
The draft KV (`DraftKV`) is the `layers/kv.py` interface a stage's attention needs (positions,
store_window, attend) plus `add_context`; reference/dense_draft_kv.py and runtime/paged_draft_kv.py
implement it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import nn

from sglang_dsv41.config import LayerRole, ModelConfig
from sglang_dsv41.layers.block import Block
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.linear import FP32_GEMM_SLOT, FP8Linear, fp32_linear
from sglang_dsv41.layers.mhc import identity_pre
from sglang_dsv41.layers.norm import RMSNorm

Choose = Callable[[torch.Tensor, int], torch.Tensor]
"""(step logits fp32 [B, V], position i in the block) -> next draft ids int64 [B]."""


def greedy(logits: torch.Tensor, _i: int) -> torch.Tensor:
    return logits.argmax(dim=-1)


class DraftKV(Protocol):
    positions: torch.Tensor
    """int64 [B * gamma] positions of the block rows (request-major)."""

    def freqs(self, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) fp32 [B * gamma, rd/2] of the block rows' positions (`layers/kv.py`)."""

    def add_context(self, attn, kv: torch.Tensor, freqs) -> None:
        """kv bf16 [n, D] = attn.wkv(main_x) of the KV's context rows (store like window keys: kv_norm,
        RoPE at the rows' positions `freqs`, FP8), for the stage whose attention is `attn`."""

    def store_window(self, attn, kv: torch.Tensor, freqs) -> None:
        """The block rows' own keys (wkv(x) -> kv_norm, RoPE, FP8); never cached."""

    def attend(self, attn, q: torch.Tensor, topk: None) -> torch.Tensor:
        """q bf16 [B * gamma, h, D] -> bf16 over [context window (ring slot order) | block rows]."""


def stream_mean(streams: torch.Tensor) -> torch.Tensor:
    """[T, n, H] bf16 -> [T, H] bf16: the mean over the residual streams (fp32 sum from +0 in stream
    order, divided by n, one rounding), the capture before each DSpark target layer."""
    acc = torch.zeros(streams.size(0), streams.size(2), dtype=torch.float32, device=streams.device)
    for j in range(streams.size(1)):
        acc = acc + streams[:, j].float()
    return (acc / streams.size(1)).to(streams.dtype)


class MarkovHead(nn.Module):
    numerics_slots = {"fp32_gemm": FP32_GEMM_SLOT}
    fp32_gemm = staticmethod(fp32_linear)

    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, rank, dtype=torch.bfloat16).requires_grad_(False)
        self.head = nn.Linear(rank, vocab, bias=False, dtype=torch.bfloat16).requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids int64 [B] -> (logit bias fp32 [B, V], embedding bf16 [B, rank])."""
        e = self.embed.weight[ids]
        return self.fp32_gemm(e, self.head.weight), e


class ConfidenceHead(nn.Module):
    numerics_slots = {"fp32_gemm": FP32_GEMM_SLOT}
    fp32_gemm = staticmethod(fp32_linear)

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1, bias=False, dtype=torch.bfloat16).requires_grad_(False)

    def forward(self, x: torch.Tensor, markov: torch.Tensor) -> torch.Tensor:
        """x bf16 [T, H], markov bf16 [T, rank] -> fp32 [T] raw confidence logits."""
        return self.fp32_gemm(torch.cat([x, markov], dim=-1).float(), self.proj.weight)[:, 0]


class DraftStage(Block):
    """One DSpark stage (`mtp.<k>`): a window-only Block with the stages' experts, plus the stage-0
    input projection and the last stage's heads."""

    def __init__(self, cfg: ModelConfig, role: LayerRole):
        ds = cfg.dspark
        super().__init__(cfg.draft_config, role)
        k, H = role.layer_id - cfg.num_layers, cfg.hidden_size
        if k == 0:
            self.main_proj = FP8Linear(H * len(ds.target_layer_ids), H, cfg.weight_block_size)
            self.main_norm = RMSNorm(H, cfg.rms_norm_eps)
        if k == ds.n_stages - 1:
            self.norm = RMSNorm(H, cfg.rms_norm_eps)
            self.markov_head = MarkovHead(cfg.vocab_size, ds.markov_rank)
            self.confidence_head = ConfidenceHead(H + ds.markov_rank)


@dataclass
class DraftOutput:
    ids: torch.Tensor
    """int64 [B, gamma + 1]: the anchor, then the gamma drafted ids."""
    logits: torch.Tensor
    """fp32 [B, gamma, V]: step i's logits (Markov bias included), the distribution of ids[:, i + 1]."""
    confidence: torch.Tensor
    """fp32 [B, gamma]: the confidence head's raw logits."""


def draft_input(stages: nn.ModuleList, main_hidden: torch.Tensor) -> torch.Tensor:
    """main_hidden bf16 [n, H * n_targets] (stream means before the target layers) -> main_x [n, H]."""
    s0 = stages[0]
    return s0.main_norm(s0.main_proj(main_hidden))


def add_context(stages: nn.ModuleList, main_hidden: torch.Tensor, positions: torch.Tensor, kv: DraftKV) -> None:
    """Committed rows become context rows of every stage's window."""
    main_x = draft_input(stages, main_hidden)
    for stage in stages:
        kv.add_context(stage.attn, stage.attn.wkv(main_x), stage.attn.rotary.freqs(positions))


def draft(model, anchors: torch.Tensor, kv: DraftKV, choose: Choose = greedy) -> DraftOutput:
    """model: the `DeepseekV41` (its `mtp` stages, embedding, head); anchors int64 [B] (the token the
    target produced at each request's next position) -> DraftOutput. `kv.positions` are the block rows'."""
    cfg, stages = model.cfg, model.mtp
    ds = cfg.dspark
    B, g, n = anchors.numel(), ds.block_size, cfg.hc.hc_mult
    ids = torch.full((B, g), ds.noise_token_id, dtype=torch.int64, device=anchors.device)
    ids[:, 0] = anchors
    streams = model.embed(ids.flatten()).unsqueeze(1).repeat(1, n, 1)
    pre = identity_pre(B * g, n, anchors.device)
    dec = Decisions()
    for stage in stages:
        streams, pre = stage(streams, pre, kv, dec)
    last = stages[-1]
    x = last.mhc_collapse(streams, pre)  # [B * g, H] bf16
    base = model.head(last.norm(x)).view(B, g, -1)
    out, steps, embeds = [anchors.long()], [], []
    for i in range(g):  # the Markov chain: step i's bias depends on the id chosen at step i - 1
        bias, e = last.markov_head(out[i])
        steps.append(base[:, i] + bias)
        embeds.append(e)
        out.append(choose(steps[i], i))
    markov = torch.stack(embeds, dim=1).flatten(0, 1)
    confidence = last.confidence_head(x, markov).view(B, g)
    return DraftOutput(ids=torch.stack(out, dim=1), logits=torch.stack(steps, dim=1), confidence=confidence)


__all__ = ["ConfidenceHead", "DraftKV", "DraftOutput", "DraftStage", "MarkovHead", "add_context", "draft",
           "draft_input", "greedy", "stream_mean"]
