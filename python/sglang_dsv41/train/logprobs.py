"""Trainer-side log-probabilities of a sampled response: the ONE forward (`DeepseekV41.forward`) over a
dense KV, teacher-forced on the rollout's tokens, optionally with the rollout's routed experts forced
(R3). With autograd when the model's parameters require grad; callers that only measure wrap it in
`torch.no_grad()`.

Rows: the forward runs on `prompt + response[:-1]` (the tokens the server ran a forward on, so the
replayed experts cover exactly its rows); the logits of row `len(prompt) - 1 + j` score response
token j.
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.reference.dense_kv import DenseKV


def replay_of(routed_experts: torch.Tensor) -> Decisions:
    """int32 [tokens, layers, top_k] (a rollout's routed experts) -> Decisions forcing every layer."""
    return Decisions(routed_experts={layer: routed_experts[:, layer].contiguous() for layer in range(routed_experts.shape[1])})


def routed_table(decisions: Decisions) -> torch.Tensor:
    """A forward's recorded routing -> int32 [rows, layers, top_k] (the rollout's layout)."""
    return torch.stack([decisions.routed_experts[layer].to(torch.int32) for layer in sorted(decisions.routed_experts)], dim=1)


def response_logprobs(model: DeepseekV41, prompt: list[int], response: list[int],
                      routed_experts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, Decisions]:
    """-> (fp32 [len(response)] log p(response_j | prefix), fp32 [len(response), vocab] the
    log-softmax rows they came from, the forward's decisions). `routed_experts` (int32 [len(prompt) +
    len(response) - 1, layers, top_k]) forces the rollout's routing; the gate weights still come from
    the model's own router, so the router keeps its gradient."""
    if not prompt or not response:
        raise ValueError("response_logprobs needs a non-empty prompt and response")
    device = model.embed.weight.device
    seq = torch.tensor(prompt + response[:-1], dtype=torch.int64, device=device)
    replay = None
    if routed_experts is not None:
        if routed_experts.shape[0] != seq.numel():
            raise ValueError(f"routed_experts cover {routed_experts.shape[0]} tokens; the forward runs {seq.numel()}")
        replay = replay_of(routed_experts.to(device))
    out = model(seq, DenseKV(model.cfg, seq.numel(), device), replay)
    rows = torch.log_softmax(out.logits[len(prompt) - 1:].float(), dim=-1)
    target = torch.tensor(response, dtype=torch.int64, device=device)
    return rows.gather(1, target[:, None]).squeeze(1), rows, out.decisions
