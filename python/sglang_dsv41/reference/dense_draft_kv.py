"""The DSpark drafter's dense KV (layers/dspark.py `DraftKV`): the context rows of one sequence (the
oracle) or of B sequences of T rows each (training), kept per stage as bf16 tensors, and any set of
draft steps over them at once.

Context rows are positions 0 .. n-1 in order (`add_context` appends); with `seq_len=T`, row
b * T + q is position q of sequence b and a step names its sequence. A step whose last context
position is p drafts positions p+1 .. p+gamma; each of its gamma rows attends to DeepSeek's list
(shared/spec/dspark.md; the reference keeps a ring of `window` slots, slot j holding the newest
position = j mod window):
    [slot 0 .. min(window, p+1) - 1 of the ring | the step's gamma block rows]
exactly that long (the last 64-block partial: `sparse_attention(..., full_tiles=False)`), so steps
are attended in groups of equal list length.
"""

from __future__ import annotations

import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.sparse_attention import sparse_attention


def ring_positions(last: torch.Tensor, window: int) -> torch.Tensor:
    """last int64 [S] -> int64 [S, window]: per step, the position each ring slot holds (slot j: the
    newest position <= last congruent to j mod window), -1 for slots not yet written (last < j)."""
    j = torch.arange(window, device=last.device)
    pos = last.unsqueeze(-1) - torch.remainder(last.unsqueeze(-1) - j, window)
    return torch.where(j <= last.unsqueeze(-1), pos, -1)


class DenseDraftKV:
    def __init__(self, cfg: ModelConfig, device: torch.device | str, seq_len: int | None = None):
        self.window, self.gamma, self.seq_len = cfg.attention.window_size, cfg.dspark.block_size, seq_len
        self.seq = torch.zeros(0, dtype=torch.int64, device=device)
        self.context: dict[int, torch.Tensor] = {}  # stage layer id -> bf16 [n, D], positions 0..n-1
        self.last = torch.zeros(0, dtype=torch.int64, device=device)
        self.positions = self.last
        self._block: torch.Tensor | None = None

    def freqs(self, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.freqs(self.positions)

    def add_context(self, attn, kv: torch.Tensor, freqs) -> None:
        lid, keys = attn.role.layer_id, attn.window_keys(kv, freqs)
        self.context[lid] = keys if lid not in self.context else torch.cat([self.context[lid], keys])

    def steps(self, last: torch.Tensor, seq: torch.Tensor | None = None) -> "DenseDraftKV":
        """The draft steps of the next `draft` call: int64 [S] last context position of each (and its
        sequence, with `seq_len`)."""
        self.last = last.long()
        self.seq = torch.zeros_like(self.last) if seq is None else seq.long()
        self.positions = (self.last.unsqueeze(-1) + 1 + torch.arange(self.gamma, device=last.device)).flatten()
        return self

    def store_window(self, attn, kv: torch.Tensor, freqs) -> None:
        self._block = attn.window_keys(kv, freqs)  # [S * gamma, D]

    def attend(self, attn, q: torch.Tensor, topk: None) -> torch.Tensor:
        g, ctx = self.gamma, self.context[attn.role.layer_id]
        n_ctx = torch.clamp(self.last + 1, max=self.window)
        length = self.seq_len if self.seq_len is not None else ctx.size(0)
        if int(self.last.max()) >= length:
            raise ValueError(f"a step ends at position {int(self.last.max())} but only {length} context rows exist")
        ring = ring_positions(self.last, self.window)
        slots = torch.where(ring >= 0, ring + (self.seq * (self.seq_len or 0)).unsqueeze(-1), -1)
        out = torch.empty_like(q)
        for n in torch.unique(n_ctx).tolist():
            steps = torch.nonzero(n_ctx == n).flatten()
            rows = (steps.unsqueeze(-1) * g + torch.arange(g, device=q.device)).flatten()
            # keys: the context rows, then every block row of these steps; each step's list is
            # [its n ring slots | its own g block rows]
            keys = torch.cat([ctx, self._block[rows]])
            own = ctx.size(0) + torch.arange(steps.numel() * g, device=q.device).view(-1, g)
            lists = torch.cat([slots[steps, :n], own], dim=-1)  # [s, n + g]
            idx = lists.repeat_interleave(g, dim=0)
            out[rows] = sparse_attention(q[rows], keys, attn.attn_sink, idx, attn.softmax_scale, full_tiles=False)
        return out
