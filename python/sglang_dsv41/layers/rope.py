"""Interleaved-pair RoPE with optional YaRN frequency blending (spec attention 1.5).

Pairs (x[2i], x[2i+1]) of the last `rope_head_dim` dims rotate by pos * theta_i. Ratio-0 layers use
`rope_theta` without YaRN; compressed layers use `compress_rope_theta` with YaRN. Angles are
fp32(pos) * fp32(theta_i); cos/sin tables are fp32 [T, rd/2], taken from `torch.polar` on the CPU as
DeepSeek's `precompute_freqs_cis` does. The rotation is written out as
y0 = x0*c - x1*s, y1 = x0*s + x1*c in fp32 (each product and sum rounded separately, no FMA), then
rounded once to the input dtype. DeepSeek's reference uses a complex64 multiply: the same four
products and two sums, bitwise equal on the CPU; the explicit form is what kernels reproduce bit for
bit (they read the same cos/sin tables and disable FMA contraction).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.shared_math import apply_rope


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
        self.max_positions = r.max_position_embeddings
        if kind == "plain":
            self._key = (self.dim, r.theta, 0, 1.0, r.beta_fast, r.beta_slow)
        elif kind == "yarn":
            self._key = (self.dim, r.compress_theta, r.yarn_original_max_pos, r.yarn_factor, r.beta_fast, r.beta_slow)
        else:
            raise ValueError(f"unknown rope kind {kind!r}")
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def table_key(self) -> tuple:
        """Equal for Rotary objects with equal tables (layers of one kind share one table)."""
        return self._key

    def position_table(self, n: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) fp32 [n, dim/2] of positions 0..n-1 on `device`: rows equal `freqs` bit for bit."""
        return rope_table(torch.arange(n, device=device), _inv_freq(*self._key))

    def use_table(self, table: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Transformation: `freqs` indexes this `position_table` on its device (no host round trip,
        no host sync) instead of building rows on the CPU per call; None restores the CPU build."""
        self._table = table

    def freqs(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions int [T] -> (cos, sin), fp32 [T, dim/2] each."""
        tab = self._table
        if tab is not None and tab[0].device == positions.device:
            return tab[0][positions], tab[1][positions]
        return rope_table(positions, _inv_freq(*self._key))

    def apply(self, x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor], inverse: bool = False) -> torch.Tensor:
        """Rotate the last `dim` dims of x [T, d] or [T, h, d] (out of place; other dims copied)."""
        return apply_rope(x, freqs[0], freqs[1], inverse)


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int [T], inv_freq fp32 [rd/2] -> (cos, sin) fp32 [T, rd/2] on the positions' device.

    DeepSeek's tables: fp32 angles, then `torch.polar` on the CPU (its cos/sin round differently
    from `torch.cos` / `torch.sin` in a few % of the entries). Built on the CPU on every device, so
    every device and kernel reads the same table bits (docs/numerics.md)."""
    angles = positions.cpu().to(torch.float32).unsqueeze(-1) * inv_freq.cpu()
    f = torch.polar(torch.ones_like(angles), angles)
    return f.real.contiguous().to(positions.device), f.imag.contiguous().to(positions.device)


class RopeRows:
    """The (cos, sin) rows of a forward's current positions per RoPE kind, looked up once per kind instead of
    once per layer (a KV object holds one; a new positions tensor, after a narrowing or a replay's
    re-rowing, starts a new memo)."""

    def __init__(self):
        self.positions: torch.Tensor | None = None
        self._rows: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, rotary: Rotary, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions is not self.positions:
            self.positions, self._rows = positions, {}
        key = rotary.table_key
        if key not in self._rows:
            self._rows[key] = rotary.freqs(positions)
        return self._rows[key]
