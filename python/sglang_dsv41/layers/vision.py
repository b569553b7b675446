"""The vision tower (spec model 6.4): ViT over pixel patches, then the aligner into LLM positions.
Parameters are named as the checkpoint (`vision.*`, `aligner.*`; the span markers live on the model).

    features = Aligner(ViT(patches, n_h, n_w), n_h, n_w)   # bf16 [ceil(n_h/r) * ceil(n_w/r), hidden]

ViT, per image (no batching across images: every image attends only to itself):
  patch embed   bf16 [n_h * n_w, 3 * p * p] -> Linear(+bias) -> [N, dim]
  block x L     x + Attention(RMSNorm(x)); x + MLP(RMSNorm(x)); RMSNorm with fp32 weights (eps 1e-6,
                statistic in fp32); attention: fused qkv Linear(+bias), 2D RoPE on q and k (head_dim/2
                pairs: the first half of the angles from the patch row, the second from the column;
                split-half rotation in fp32), full bidirectional softmax attention, output Linear(+bias);
                MLP: w1 [2 * inter, dim] (gate rows first, then up), SiLU(gate) * up, w2
  final RMSNorm
Aligner: the [n_h, n_w, dim] grid zero-padded to multiples of r, every r x r window flattened
channel-major (dim x r x r) -> Linear(+bias) -> exact GELU -> Linear(+bias) -> [windows, hidden],
windows in reading order. All GEMMs bf16 in, bf16 out (torch's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_dsv41.config import VisionConfig
from sglang_dsv41.shared_math import rms_norm

VISION_NORM_EPS = 1e-6


class VisionLinear(nn.Module):
    """bf16 weight [out, in] (+ bf16 bias [out]) -> F.linear in bf16."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=torch.bfloat16), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=torch.bfloat16), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class VisionNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, VISION_NORM_EPS)


def grid_angles(n_h: int, n_w: int, rope_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [n_h * n_w, 1, rope_dim] of the patch grid in reading order: rope_dim / 2 inverse
    frequencies theta^(-2i / rope_dim) times the patch row, then the same times the patch column."""
    inv = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32, device=device) / rope_dim))
    rows = torch.arange(n_h, device=device).repeat_interleave(n_w).float()
    cols = torch.arange(n_w, device=device).repeat(n_h).float()
    angles = torch.cat([rows[:, None] * inv, cols[:, None] * inv], dim=-1)
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, 2r]; cos, sin fp32 [N, 1, r]: (a, b) halves -> (a cos - b sin, b cos + a sin) in fp32."""
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, v: VisionConfig):
        super().__init__()
        self.n_heads, self.head_dim = v.n_heads, v.head_dim
        self.wqkv = VisionLinear(v.dim, 3 * v.dim)
        self.wo = VisionLinear(v.dim, v.dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n = x.size(0)
        q, k, v = (t.view(n, self.n_heads, self.head_dim) for t in self.wqkv(x).chunk(3, dim=-1))
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))  # [heads, N, d]
        return self.wo(o.transpose(0, 1).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, v: VisionConfig):
        super().__init__()
        self.w1 = VisionLinear(v.dim, 2 * v.inter_dim, bias=False)
        self.w2 = VisionLinear(v.inter_dim, v.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class VisionBlock(nn.Module):
    def __init__(self, v: VisionConfig):
        super().__init__()
        self.norm1, self.attn = VisionNorm(v.dim), VisionAttention(v)
        self.norm2, self.mlp = VisionNorm(v.dim), VisionMLP(v)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, v: VisionConfig):
        super().__init__()
        self.proj = VisionLinear(v.patch_dim, v.dim)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.proj(patches.flatten(1))


class ViT(nn.Module):
    def __init__(self, v: VisionConfig):
        super().__init__()
        self.cfg = v
        self.patch_embed = PatchEmbed(v)
        self.blocks = nn.ModuleList(VisionBlock(v) for _ in range(v.n_layers))
        self.norm = VisionNorm(v.dim)

    def forward(self, patches: torch.Tensor, n_h: int, n_w: int) -> torch.Tensor:
        """patches bf16 [n_h * n_w, 3, p, p] (reading order) -> bf16 [n_h * n_w, dim]."""
        x = self.patch_embed(patches)
        cos, sin = grid_angles(n_h, n_w, self.cfg.rope_dim, self.cfg.rope_theta, x.device)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)


class Aligner(nn.Module):
    def __init__(self, v: VisionConfig, hidden: int):
        super().__init__()
        self.r = v.downsample_ratio
        self.w1 = VisionLinear(v.window_dim, hidden)
        self.w2 = VisionLinear(hidden, hidden)

    def forward(self, x: torch.Tensor, n_h: int, n_w: int) -> torch.Tensor:
        """ViT output bf16 [n_h * n_w, dim] -> bf16 [ceil(n_h/r) * ceil(n_w/r), hidden]."""
        r, dim = self.r, x.size(-1)
        grid = F.pad(x.view(n_h, n_w, dim), (0, 0, 0, -n_w % r, 0, -n_h % r))
        gh, gw = grid.size(0) // r, grid.size(1) // r
        windows = grid.view(gh, r, gw, r, dim).permute(0, 2, 4, 1, 3).reshape(gh * gw, dim * r * r)
        return self.w2(F.gelu(self.w1(windows)))
