"""Per-token reference logprobs and routed experts for a server result (the numerics oracle), one forward
per request."""

from __future__ import annotations

import torch


def teacher_forced(reference, prompt: list[int], new: list[int]) -> tuple[list[int], list[float], list[float]]:
    """One full-sequence reference forward over prompt + the server's new tokens ->
    (greedy token at each generated position, logprob of each new token, input logprobs of prompt[1:]).
    Equal greedy tokens at every position means the server's greedy continuation is the reference's."""
    seq = list(prompt) + list(new)
    lp = torch.log_softmax(reference.forward(torch.tensor(seq)).logits.float(), -1)
    rows = range(len(prompt) - 1, len(seq) - 1)
    greedy = [int(lp[r].argmax()) for r in rows]
    new_lp = [lp[r, seq[r + 1]].item() for r in rows]
    input_lp = [lp[j - 1, seq[j]].item() for j in range(1, len(prompt))]
    return greedy, new_lp, input_lp


def reference_routed_experts(reference, seq: list[int]) -> torch.Tensor:
    """int32 [len(seq) - 1, layers, top_k]: the reference's routed expert ids (in top-k order) of every
    token that runs a forward when a server generates `seq` (all but the last token)."""
    routed = reference.forward(torch.tensor(seq)).decisions.routed_experts
    return torch.stack([routed[layer] for layer in sorted(routed)], dim=1)[: len(seq) - 1]
