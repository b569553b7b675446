"""GRPO with DAPO's changes (Yu et al. 2025, "DAPO: an open-source LLM RL system at scale"):

- group-relative advantages: A_i = (r_i - mean(r)) / (std(r) + eps) over the n samples of a prompt;
- asymmetric clip ("clip-higher"): the ratio rho = pi_theta / pi_old is clipped to
  [1 - eps_low, 1 + eps_high] with eps_high > eps_low, so low-probability tokens can still rise;
- dynamic sampling: a group whose rewards are all equal has zero advantage everywhere and is dropped
  (the loop samples more prompts to refill the batch);
- token-level loss: the clipped objective is summed over every response token of the batch and divided
  by the batch's token count (long responses weigh per token, not per sample);
- overlong reward shaping ("soft overlong punishment"): a response longer than max_len - buffer gets a
  penalty rising linearly to -factor at max_len (and -factor beyond);
- no KL penalty to a reference policy.

pi_old is the behavior policy: the logprobs the server sampled with. The trainer's recompute equals them
on the CPU (train/mismatch.py), and rho corrects for any residual mismatch elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DAPOConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28
    overlong_buffer: int = 4
    """tokens before max_new_tokens where the overlong penalty starts (0: off)."""
    overlong_factor: float = 1.0
    adv_eps: float = 1e-6

    def __post_init__(self):
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(f"clip range needs 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0, got {self.overlong_buffer}")


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fp [G] rewards of one prompt's samples -> fp32 [G] advantages (r - mean) / (std + eps); the
    population std (all G samples are the group), so an all-equal group gives zeros."""
    r = rewards.double()
    return ((r - r.mean()) / (r.std(unbiased=False) + eps)).float()


def informative(rewards: torch.Tensor) -> bool:
    """Dynamic sampling: a group is kept only if its rewards are not all equal."""
    return bool((rewards != rewards[0]).any())


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment for a response of `length` tokens (0 when buffer == 0):
    0 up to max_len - buffer, then ((max_len - buffer) - length) / buffer * factor, -factor beyond."""
    if buffer <= 0:
        return 0.0
    start = max_len - buffer
    if length <= start:
        return 0.0
    if length > max_len:
        return -factor
    return (start - length) / buffer * factor


def clipped_token_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantage: float | torch.Tensor,
                       eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss of one response: logp [T] (differentiable), logp_old [T] (behavior policy),
    one advantage -> (fp32 [T] -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A), bool [T]
    whether the clip was active (the clipped term was the smaller one))."""
    ratio = torch.exp(logp - logp_old.to(logp))
    adv = torch.as_tensor(advantage, dtype=ratio.dtype, device=ratio.device)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def token_level_loss(per_token: list[torch.Tensor]) -> torch.Tensor:
    """DAPO's token-level aggregation: sum over every token of every response / total token count."""
    total = sum(int(t.numel()) for t in per_token)
    if total == 0:
        raise ValueError("token_level_loss over no tokens")
    return torch.stack([t.sum() for t in per_token]).sum() / total
