"""The batch descriptor of one forward.

Index spaces (glossary):
  row        one new token of this forward; rows are packed request-major, positions ascending
  request    0..B-1 within this batch; `req_slots[b]` is its persistent request slot (pending state)
  position   absolute token position within its request (0-based)
  slot       full-token pool slot (`token_table[b, position]`); allocated in pages so that the two
             positions of a ratio-2 pair share `slot // 2` (page size a multiple of 2)
  c-slot     compressed pool slot = slot // ratio of any token of the group

SWA bounded replay (spec attention 7) adds three optional per-request fields:
  replay_lens   encoder replay: leading rows that recompute cached tokens for their window KV only
                (no compressed KV / index keys / logits); the request's cached prefix ends at
                prefix_lens + replay_lens
  window_floor  first position any row of the request may read window KV from (the replay start)
  full_rows     decoder replay: True = the whole extend runs the late layers (prompt logprobs);
                None = derived from `logits_rows`
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor
    """int64 [N] new token ids."""
    positions: torch.Tensor
    """int64 [N] absolute position of each row."""
    req_index: torch.Tensor
    """int64 [N] request (0..B-1) of each row."""
    req_slots: torch.Tensor
    """int64 [B] persistent request slot of each request."""
    prefix_lens: torch.Tensor
    """int64 [B] tokens already in the cache before this forward."""
    extend_lens: torch.Tensor
    """int64 [B] new tokens of each request (1 for a decode step)."""
    token_table: torch.Tensor
    """int64 [B, >= max(prefix+extend)] pool slot of every position; -1 past the end."""
    history: torch.Tensor
    """int64 [B, max_ngram-1] token ids right before each request's first new token, oldest first
    (Engram n-gram history; ignored where the position would be negative)."""
    logits_rows: torch.Tensor
    """int64 [R] rows whose logits are computed (e.g. the last row of every request)."""
    replay_lens: torch.Tensor | None = None
    """int64 [B] leading encoder-replay rows of each request (None = 0)."""
    window_floor: torch.Tensor | None = None
    """int64 [B] first readable window position of each request (None = 0)."""
    full_rows: torch.Tensor | None = None
    """bool [B] requests whose whole extend runs the late layers under decoder replay (None: those
    with a logits row before their tail)."""
    seq_capacity: int | None = None
    """Host int >= every request's seq end (prefix + extend): compressed slot tables (index scores,
    top-k candidates) are `seq_capacity // ratio` wide. `build` sets the batch's largest seq end (the
    widths a device read of the positions would give, without the read); a captured decode step sets
    its fixed capacity. None: derived from the positions on the device (one host read)."""
    static: bool = False
    """Fixed-shape step (CUDA-graph capture, runtime/graph.py): no data-dependent shapes or host
    reads. Every row runs the compressed-KV path and rows that complete no group write slot -1.
    Needs replay_lens / window_floor / full_rows None and pools without window rings."""
    real_rows: torch.Tensor | None = None
    """int64 [] (or [1]) on the batch's device: rows at or past it are padding (a step captured for a larger
    batch than it runs; static decode batches only: one row per request, so it also counts the real
    requests, which come first). Padding rows still run (fixed shapes) but store nothing: no window
    KV, compressed KV or index keys (slot -1) and no pending pair state (they repeat row 0's write).
    Needs at least one real row. None: every row is real."""
    verify: bool = False
    """A DSpark chain verify (runtime/speculative.py): gamma + 1 rows per request, some of which will
    be rejected. It parks no ratio-2 pending pair (the commit parks the last committed even row's,
    from `PagedKV.pair_state`) and never narrows to a decoder tail (its rows are decode rows)."""

    @property
    def seq_ends(self) -> torch.Tensor:
        """int64 [B] tokens of each request after this forward."""
        return self.prefix_lens + self.extend_lens

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.numel())

    @property
    def out_slots(self) -> torch.Tensor:
        """int64 [N] pool slot each new row writes."""
        return self.token_table[self.req_index, self.positions]

    @staticmethod
    def build(
        new_tokens: list[list[int]],
        prefix_lens: list[int],
        token_table: torch.Tensor,
        req_slots: list[int],
        history: list[list[int]],
        all_logits: bool = False,
        device: torch.device | str = "cpu",
        history_width: int = 0,
        replay_lens: list[int] | None = None,
    ) -> "Batch":
        """Pack per-request new tokens. `history[b]` are the ids before prefix_lens[b]; rows are
        left-padded with 0 to `history_width` (at least) columns. `replay_lens[b]` leading tokens of
        request b are encoder-replay rows (window floored at prefix_lens[b]; no logits)."""
        ext = [len(t) for t in new_tokens]
        rows_ids = [t for toks in new_tokens for t in toks]
        pos = [p0 + i for p0, n in zip(prefix_lens, ext) for i in range(n)]
        req = [b for b, n in enumerate(ext) for _ in range(n)]
        width = max([history_width] + [len(h) for h in history])
        hist = torch.tensor([[0] * (width - len(h)) + list(h) for h in history], dtype=torch.int64)
        ends = torch.tensor(ext, dtype=torch.int64).cumsum(0)
        rows = torch.arange(sum(ext)) if all_logits else ends - 1
        if all_logits and replay_lens:
            rows = rows[torch.tensor([i >= r for r, n in zip(replay_lens, ext) for i in range(n)], dtype=torch.bool)]
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
        replay = {}
        ends_host = [p + n for p, n in zip(prefix_lens, ext) if n > 0]
        if replay_lens and any(replay_lens):
            replay = dict(replay_lens=t(replay_lens), window_floor=t([p if r else 0 for p, r in zip(prefix_lens, replay_lens)]))
        return Batch(
            input_ids=t(rows_ids),
            positions=t(pos),
            req_index=t(req),
            req_slots=t(req_slots),
            prefix_lens=t(prefix_lens),
            extend_lens=t(ext),
            token_table=token_table.to(device),
            history=hist.to(device),
            logits_rows=rows.to(device),
            seq_capacity=max(ends_host, default=0),
            **replay,
        )


def writer_rows(real_rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """int64 [num_rows]: each row's own index, 0 for a padding row (at or past `real_rows`, see
    `Batch.real_rows`). Indexing a scatter's (destination, value) pairs with it makes every padding row
    repeat row 0's write: same address, same bytes, so the write changes nothing whatever the order
    of duplicate indices, with fixed shapes and no host read."""
    rows = torch.arange(num_rows, device=real_rows.device)
    return torch.where(rows < real_rows, rows, 0)
