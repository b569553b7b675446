"""The trainer's side of an RL step: response log-probabilities of a batch of rollouts in ONE forward
(the trainable model over a batch `DenseKV`, with autograd), optionally with the rollouts' routed
experts forced (R3).

Layout: each rollout's `prompt + response` is right-padded to one even length T (PAD_TOKEN_ID);
row b*T + p is position p of rollout b. The logits of row b*T + P_b - 1 + j score response token j.
For R3 every layer's forced ids cover all B*T rows: rows 0 .. P_b + R_b - 2 of rollout b take the
server's experts (exactly the tokens the server ran a forward on); the rest (its last sampled token
and the padding) take experts 0..k-1, which only reach rows that are never scored (causal attention).
Padding never changes a real row (reference/dense_kv.py), so the values are those of one DenseKV forward per
rollout, which is what the server computed (train/mismatch.py measures it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.quant.ste import ste
from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.tokenizer.tiny_tokenizer import PAD_TOKEN_ID
from sglang_dsv41.train.rollout import Rollout

if TYPE_CHECKING:
    from sglang_dsv41.train.serving_values import Values


@dataclass
class BatchLogprobs:
    logprobs: list[torch.Tensor]
    """per rollout, fp32 [R_b] log p(response token), differentiable."""
    routed: list[torch.Tensor] | None
    """per rollout, int32 [P_b + R_b - 1, layers, top_k] the trainer's own routing (None under R3)."""
    tempered: list[torch.Tensor] | None = None
    """per rollout, fp32 [R_b] log softmax(logits / T) of the response tokens, differentiable: the
    distribution the server sampled from at temperature T (None when T == 1: equal to `logprobs`)."""


def _padded_length(rollouts: list[Rollout], cfg) -> int:
    t = max(len(r.prompt) + len(r.response) for r in rollouts)
    step = math.lcm(*[r for r in cfg.compression.compress_ratios if r > 1] or [1])
    return -(-t // step) * step


def response_logits(model: DeepseekV41, rollouts: list[Rollout], r3: bool = False
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """The trainer's own forward of the batch (layout above) -> (per rollout fp32 [R_b, vocab] logits of
    its response rows, differentiable; per rollout int32 [P_b + R_b - 1, layers, top_k] its routing,
    None under R3, where the rollouts' `routed_experts` are forced)."""
    cfg, device = model.cfg, model.embed.weight.device
    b, t = len(rollouts), _padded_length(rollouts, model.cfg)
    ids = torch.full((b, t), PAD_TOKEN_ID, dtype=torch.int64)
    for i, r in enumerate(rollouts):
        ids[i, : len(r.prompt) + len(r.response)] = torch.tensor(r.sequence)
    replay = None
    if r3:
        k, layers = cfg.moe.n_activated_experts, cfg.num_layers
        forced = torch.arange(k, dtype=torch.int32).repeat(b, t, layers, 1)  # [B, T, layers, k]
        for i, r in enumerate(rollouts):
            if r.routed_experts is None:
                raise ValueError("R3 needs routed experts from the server (--enable-return-routed-experts)")
            forced[i, : r.routed_experts.shape[0]] = r.routed_experts
        forced = forced.flatten(0, 1).to(device)
        replay = Decisions(routed_experts={layer: forced[:, layer].contiguous() for layer in range(layers)})
    out = model(ids.flatten().to(device), DenseKV(cfg, t, device, batch=b), replay)
    logits = out.logits.view(b, t, -1)
    zs, routed = [], None if r3 else []
    for i, r in enumerate(rollouts):
        p, n = len(r.prompt), len(r.response)
        zs.append(logits[i, p - 1: p - 1 + n].float())
        if not r3:
            routed.append(torch.stack([out.decisions.routed_experts[layer].view(b, t, -1)[i, : p + n - 1]
                                       for layer in sorted(out.decisions.routed_experts)], dim=1).to(torch.int32).cpu())
    return zs, routed


def batch_response_logprobs(model: DeepseekV41, rollouts: list[Rollout], r3: bool = False,
                            temperature: float = 1.0, values: Values | None = None) -> BatchLogprobs:
    """`temperature` != 1 also returns the tempered log-probabilities (the sampling policy's); the
    untempered ones stay what the server reports (SGLANG_RETURN_ORIGINAL_LOGPROB) and what mismatch measures.
    `values` (train/serving_values.py, computed for these rollouts with the same `r3`): the response
    rows' logits take its values (straight-through: the gradient flows through this forward, which
    replays its routed experts) and `routed` is its routing."""
    if not rollouts:
        raise ValueError("batch_response_logprobs needs at least one rollout")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scored = rollouts if values is None else [replace(r, routed_experts=e) for r, e in zip(rollouts, values.routed)]
    zs, routed = response_logits(model, scored, r3 or values is not None)
    if values is not None:
        zs = [ste(z, v) for z, v in zip(zs, values.logits)]
        routed = None if r3 else values.routed
    lps, tempered = [], []
    for z, r in zip(zs, rollouts):
        target = torch.tensor(r.response, dtype=torch.int64, device=z.device)[:, None]
        lps.append(torch.log_softmax(z, dim=-1).gather(1, target).squeeze(1))
        if temperature != 1.0:
            tempered.append(torch.log_softmax(z / temperature, dim=-1).gather(1, target).squeeze(1))
    return BatchLogprobs(lps, routed, tempered if temperature != 1.0 else None)
