"""DSpark acceptance: which drafted tokens a chain verify keeps (shared/spec/dspark.md).

A verify of request b runs the target over [anchor, d_1 .. d_g] (g = gamma) at positions
p .. p+g; target row i is the distribution of position p+i+1, the place of d_{i+1}.
  greedy   accept the longest prefix with d_{i+1} == argmax(row i); the emitted tokens are then
           exactly argmax(rows 0 .. k): the k accepted drafts and the bonus token.
  sampled  chain rejection sampling: accept d_{i+1} with probability min(1, p_i(d) / q_i(d)); at the
           first rejection emit a sample of normalize(max(p_i - q_i, 0)); if all g are accepted, emit
           a sample of p_g. The emitted tokens are distributed exactly as the target's own samples.
Both return (accepted int64 [B] in 0..g, tokens int64 [B, g+1]): request b emits tokens[b, :k_b + 1].
"""

from __future__ import annotations

import torch


def _per_row(value, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A scalar, or a tensor [B] over dim 0 of `like`, shaped to broadcast against `like`."""
    t = torch.as_tensor(value, dtype=dtype, device=like.device)
    return t if t.dim() == 0 else t.view(-1, *([1] * (like.dim() - 1)))


def distribution(logits: torch.Tensor, temperature, top_k=0, top_p=1.0, min_p=0.0) -> torch.Tensor:
    """fp32 logits [B, ..., V] -> fp32 probabilities [B, ..., V], as SGLang's sampler draws from them
    (`top_k_top_p_min_p_sampling_from_probs_torch`): softmax(logits / temperature); in descending
    order (ties: lower index first), ranks >= top_k (0: none) and entries whose mass strictly before
    them exceeds top_p are dropped, then those below min_p x the largest; renormalized. Each
    parameter is a scalar or a tensor [B] (one value per request). Temperatures must be > 0."""
    if not torch.is_tensor(temperature) and temperature <= 0:
        raise ValueError("temperature must be positive for sampling (use greedy acceptance at 0)")
    p = torch.softmax(logits.float() / _per_row(temperature, logits, torch.float32), dim=-1)
    sp, order = torch.sort(p, dim=-1, descending=True, stable=True)
    before = torch.cumsum(sp, dim=-1) - sp
    k = _per_row(top_k, logits, torch.int64)
    rank = torch.arange(p.size(-1), device=p.device)
    drop = ((k > 0) & (rank >= k)) | (before > _per_row(top_p, logits, torch.float32))
    sp = sp.masked_fill(drop, 0.0)
    sp = sp.masked_fill(sp < sp[..., :1] * _per_row(min_p, logits, torch.float32), 0.0)
    p = torch.zeros_like(p).scatter(-1, order, sp)
    return p / p.sum(dim=-1, keepdim=True)


def accept_greedy(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids int64 [B, g+1] (anchor first), target_logits fp32 [B, g+1, V]."""
    best = target_logits.argmax(dim=-1)
    match = (draft_ids[:, 1:] == best[:, :-1]).long()
    return torch.cumprod(match, dim=1).sum(dim=1), best


def accept_sampled(draft_ids: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_ids int64 [B, g+1]; q fp32 [B, g, V] the distributions the drafts were sampled from;
    p fp32 [B, g+1, V] the target's at the same temperature / top-k / top-p."""
    B, g = q.size(0), q.size(1)
    dev = q.device
    tokens = torch.zeros(B, g + 1, dtype=torch.int64, device=dev)
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    rows = torch.arange(B, device=dev)
    for i in range(g):
        d = draft_ids[:, i + 1]
        pd, qd = p[rows, i, d], q[rows, i, d]
        u = torch.rand(B, generator=generator, device=dev)
        ok = alive & (u * qd < pd)  # u < p/q without dividing (q(d) > 0: d was sampled from q)
        rejected = alive & ~ok
        residual = (p[:, i] - q[:, i]).clamp_min(0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[:, i])  # p == q: resample p
        fix = torch.multinomial(residual / residual.sum(-1, keepdim=True), 1, generator=generator)[:, 0]
        tokens[:, i] = torch.where(ok, d, torch.where(rejected, fix, tokens[:, i]))
        accepted += ok.long()
        alive &= ok
    bonus = torch.multinomial(p[:, g], 1, generator=generator)[:, 0]
    tokens[:, g] = torch.where(alive, bonus, tokens[:, g])
    return accepted, tokens
