"""Interleaved-pair RoPE with optional YaRN frequency blending (spec attention 1.5).

Pairs (x[2i], x[2i+1]) of the last `rope_head_dim` dims rotate by pos * theta_i. Ratio-0 layers use
`rope_theta` without YaRN; compressed layers use `compress_rope_theta` with YaRN. Angles are
fp32(pos) * fp32(theta_i); the rotation is a complex64 multiply, and the result is rounded once to
the input dtype (the reference rotates bf16 tensors this way).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from sglang_dsv41.config import ModelConfig


@lru_cache(maxsize=8)
def _inv_freq(dim: int, base: float, original_max_pos: int, factor: float, beta_fast: float, beta_slow: float) -> torch.Tensor:
    """fp32 [dim/2] rotation frequencies; YaRN-blended when original_max_pos > 0."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if original_max_pos > 0:
        def corr(rotations: float) -> float:
            return dim * math.log(original_max_pos / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(beta_fast)), 0)
        high = min(math.ceil(corr(beta_slow)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


class Rotary:
    """RoPE for one layer kind ('plain' or 'yarn'); stateless apart from its constants."""

    def __init__(self, cfg: ModelConfig, kind: str):
        r = cfg.rope
        self.dim = r.rope_head_dim
        if kind == "plain":
            self._key = (self.dim, r.theta, 0, 1.0, r.beta_fast, r.beta_slow)
        elif kind == "yarn":
            self._key = (self.dim, r.compress_theta, r.yarn_original_max_pos, r.yarn_factor, r.beta_fast, r.beta_slow)
        else:
            raise ValueError(f"unknown rope kind {kind!r}")

    def freqs(self, positions: torch.Tensor) -> torch.Tensor:
        """positions int [T] -> complex64 [T, dim/2]."""
        inv = _inv_freq(*self._key).to(positions.device)
        angles = positions.to(torch.float32).unsqueeze(-1) * inv
        return torch.polar(torch.ones_like(angles), angles)

    def apply(self, x: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """Rotate the last `dim` dims of x [T, d] or [T, h, d] (out of place; other dims copied)."""
        rd = self.dim
        xc = torch.view_as_complex(x[..., -rd:].float().unflatten(-1, (-1, 2)).contiguous())
        f = freqs.conj() if inverse else freqs
        if x.dim() == 3:
            f = f.unsqueeze(1)
        rot = torch.view_as_real(xc * f).flatten(-2).to(x.dtype)
        return torch.cat([x[..., :-rd], rot], dim=-1) if x.size(-1) > rd else rot
