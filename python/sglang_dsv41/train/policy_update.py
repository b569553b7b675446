"""One policy-gradient update of the trainable model on groups of rollouts (GRPO with DAPO's parts,
train/grpo.py): the trainer's forward over every rollout of the batch, group-relative advantages of the
shaped rewards, the asymmetrically clipped token-level objective, one optimizer step.

The policy being trained is the sampling policy: softmax(logits / T) at the rollouts' temperature T. The
ratio's old value is the trainer's own tempered logprob before this (single) update, so the ratio starts at
1 and the loss value is -sum_i A_i len_i / sum_i len_i (i over samples, len_i its response tokens). The
untempered logprobs are compared with the server's (what it returns under SGLANG_RETURN_ORIGINAL_LOGPROB):
the mismatch columns of every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from sglang_dsv41.train.grpo import DAPOConfig, clipped_token_loss, group_advantages
from sglang_dsv41.train.mismatch import same_expert_sets, summarize
from sglang_dsv41.train.policy import batch_response_logprobs
from sglang_dsv41.train.rollout import Rollout

if TYPE_CHECKING:
    from sglang_dsv41.train.serving_values import ServingValues


class RolloutGroup(Protocol):
    rollouts: list[Rollout]
    shaped: torch.Tensor
    """fp32 [len(rollouts)]: task reward + overlong shaping per sample."""


def policy_update(model, opt: torch.optim.Optimizer, params: Sequence[torch.Tensor], groups: Sequence[RolloutGroup],
                  dapo: DAPOConfig, *, temperature: float = 1.0, r3: bool = False, clip_grad: float = 1.0,
                  values: ServingValues | None = None) -> dict:
    """One update of `params` (the model's trainable masters) by `opt` on `groups` (each an informative group
    of samples of one prompt). -> {loss, clip_frac, grad_norm, tokens} and the train/serve mismatch of the
    batch (kl_mean, kl_p99, kl_max, dlogp_mean, dlogp_max, routing_agreement) against the rollouts' logprobs.
    `values` (train/serving_values.py): the logprobs' values come from the rollouts' own forward (the serving
    op table over a serving copy of the weights), the gradient from the trainer's; synced after the step."""
    rollouts = [r for g in groups for r in g.rollouts]
    advs = [a for g in groups for a in group_advantages(g.shaped, dapo.adv_eps).tolist()]
    model.train()
    value = values.logits(rollouts, r3) if values is not None else None
    out = batch_response_logprobs(model, rollouts, r3=r3, temperature=temperature, values=value)
    served = [torch.tensor(r.logprobs, dtype=torch.float32, device=lp.device) for r, lp in zip(rollouts, out.logprobs)]
    policy, policy_old = out.logprobs, served
    if out.tempered is not None:
        policy, policy_old = out.tempered, [t.detach() for t in out.tempered]
    terms, clipped = [], []
    for lp, lp_old, adv in zip(policy, policy_old, advs):
        t, c = clipped_token_loss(lp, lp_old, adv, dapo.eps_low, dapo.eps_high)
        terms.append(t)
        clipped.append(c)
    tokens = sum(t.numel() for t in terms)
    loss = torch.cat(terms).sum() / tokens  # DAPO's token-level aggregation
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip_grad))
    opt.step()
    if values is not None:
        values.sync()
    agree = None
    if out.routed is not None and all(r.routed_experts is not None for r in rollouts):
        agree = torch.cat([same_expert_sets(own, r.routed_experts) for own, r in zip(out.routed, rollouts)])
    mm = summarize(torch.cat([s.cpu() for s in served]), torch.cat([lp.detach().cpu() for lp in out.logprobs]), agree,
                   len(rollouts), r3)
    return {"loss": float(loss.detach()), "clip_frac": float(torch.cat(clipped).float().mean()), "grad_norm": grad_norm,
            "tokens": tokens, "kl_mean": mm.kl_mean, "kl_p99": mm.kl_p99, "kl_max": mm.kl_max,
            "dlogp_mean": mm.dlogp_mean, "dlogp_max": mm.dlogp_max, "routing_agreement": mm.routing_agreement}


__all__ = ["RolloutGroup", "policy_update"]
