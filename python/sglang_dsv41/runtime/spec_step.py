"""One DSpark step over tables of requests: draft, chain verify, accept, commit (runtime/speculative.py
describes the step; docs/dspark.md what is rolled back how).

Engine-agnostic: the offline `SpecDecoder` and the SGLang worker (sglang/model/dspark_worker.py) both
call it with their own slot tables. A request b is described by
  anchors[b]    int64, the token the target produced last, not yet in the pools (position cached[b])
  cached[b]     int64, its committed tokens (positions 0 .. cached - 1 are in the pools)
  table[b]      int64 [>= cached + gamma + 1] pool slot of every position (the verify's slots allocated)
  req_slots[b]  int64, its request slot (ratio-2 pending pair, window ring)
  history[b]    int64 [width] the ids before position cached (Engram), oldest first
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dsv41.layers.dspark import DraftOutput, add_context, draft
from sglang_dsv41.runtime.acceptance import accept_greedy, accept_sampled, distribution
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.paged_draft_kv import PagedDraftKV
from sglang_dsv41.runtime.paged_kv import PagedKV
from sglang_dsv41.runtime.paged_runtime import Runtime


@dataclass(frozen=True)
class RowSampling:
    """Per-request sampling parameters, fp32 / int64 tensors [B]. A request samples when its
    temperature is > 0 and its top_k is not 1; the others are greedy (SGLang's rule)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def uniform(cls, batch: int, device, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0) -> "RowSampling":
        full = lambda v, dt: torch.full((batch,), v, dtype=dt, device=device)  # noqa: E731
        return cls(full(temperature, torch.float32), full(top_k, torch.int64), full(top_p, torch.float32),
                   full(min_p, torch.float32))

    @property
    def sampled(self) -> torch.Tensor:
        """bool [B]: requests that sample (the others take the argmax)."""
        return (self.temperature > 0) & (self.top_k != 1)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 [B, ..., V] -> the distributions the target's sampler draws from (greedy rows: at
        temperature 1, unused)."""
        t = torch.where(self.sampled, self.temperature, 1.0)
        return distribution(logits, t, self.top_k, self.top_p, self.min_p)


@dataclass
class Verified:
    batch: Batch
    logits: torch.Tensor
    """fp32 [B, gamma + 1, V]: row i is the target's distribution of position cached + i + 1."""
    hidden: torch.Tensor
    """bf16 [B * (gamma + 1), H * n_targets]: each row's drafter input."""
    kv: PagedKV


class DSparkStep:
    def __init__(self, runtime: Runtime):
        self.runtime, self.model, self.pools = runtime, runtime.model, runtime.pools
        self.cfg, self.ops = runtime.cfg, runtime.ops
        self.gamma = self.cfg.dspark.block_size

    def context(self, batch: Batch, hidden: torch.Tensor, positions: torch.Tensor, req: torch.Tensor,
                live: torch.Tensor | None = None) -> None:
        """Rows (positions int64 [n] of requests req [n] of `batch`) with drafter inputs `hidden` ->
        every stage's context window (live bool [n]: only those rows; None: all)."""
        dkv = PagedDraftKV.for_context(self.pools, batch.token_table, batch.req_slots, self.ops, positions, req, live)
        add_context(self.model.mtp, hidden, positions, dkv)

    def prefill(self, batch: Batch, image_rows=None):
        """A prefill / extend forward whose rows also become drafter context -> ForwardOutput."""
        out, kv = self.runtime.run(batch, capture_draft=True, image_rows=image_rows)
        self.context(batch, out.draft_hidden, kv.positions, kv.req)
        return out

    def draft(self, anchors: torch.Tensor, cached: torch.Tensor, table: torch.Tensor, req_slots: torch.Tensor,
              sampling: RowSampling | None, gen: torch.Generator | None = None) -> DraftOutput:
        """gamma drafted ids per request (greedy rows: argmax; sampled rows: a sample of `sampling.probs`)."""
        dkv = PagedDraftKV.for_draft(self.pools, table, req_slots, self.ops, cached - 1)
        if sampling is None or not bool(sampling.sampled.any()):
            return draft(self.model, anchors, dkv)

        def choose(logits: torch.Tensor, _i: int) -> torch.Tensor:
            drawn = torch.multinomial(sampling.probs(logits), 1, generator=gen)[:, 0]
            return torch.where(sampling.sampled, drawn, logits.argmax(-1))

        return draft(self.model, anchors, dkv, choose)

    def verify(self, ids: torch.Tensor, cached: torch.Tensor, table: torch.Tensor, req_slots: torch.Tensor,
               history: torch.Tensor, capacity: int | None = None) -> Verified:
        """ONE target forward over ids int64 [B, gamma + 1] (anchor, drafts) at cached .. cached + gamma.
        `capacity`: host int >= every cached + gamma + 1 (`Batch.seq_capacity`; None: read on the device)."""
        B, g1 = ids.shape
        dev = ids.device
        step = torch.arange(g1, device=dev)
        batch = Batch(
            input_ids=ids.flatten(),
            positions=(cached.unsqueeze(1) + step).flatten(),
            req_index=torch.arange(B, device=dev).repeat_interleave(g1),
            req_slots=req_slots,
            prefix_lens=cached,
            extend_lens=torch.full((B,), g1, dtype=torch.int64, device=dev),
            token_table=table,
            history=history,
            logits_rows=torch.arange(B * g1, device=dev),
            seq_capacity=capacity,
            verify=True,
        )
        out, kv = self.runtime.run(batch, capture_draft=True)
        return Verified(batch, out.logits.view(B, g1, -1), out.draft_hidden, kv)

    def accept(self, ids: torch.Tensor, d: DraftOutput, v: Verified, sampling: RowSampling | None,
               gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (accepted int64 [B], tokens int64 [B, gamma + 1]); request b emits tokens[b, :accepted + 1]."""
        accepted, tokens = accept_greedy(ids, v.logits)
        if sampling is not None and bool(sampling.sampled.any()):
            s_acc, s_tok = accept_sampled(ids, sampling.probs(d.logits), sampling.probs(v.logits), gen)
            rows = sampling.sampled
            accepted = torch.where(rows, s_acc, accepted)
            tokens = torch.where(rows.unsqueeze(1), s_tok, tokens)
        return accepted, tokens

    def commit(self, v: Verified, accepted: torch.Tensor, static: bool = False) -> None:
        """Rows 0 .. accepted[b] of request b become its committed positions: they become drafter
        context, and each ratio-2 KV source parks the pair state of the last committed even position
        (a verify parks none). Rejected rows' KV stays in slots no committed row reads. `static`:
        fixed shapes (a captured step): every row runs the drafter's context projection and the
        rejected ones store nothing; the pending state is rewritten through a `where`."""
        batch, g1 = v.batch, self.gamma + 1
        dev = batch.positions.device
        B = batch.req_slots.numel()
        accepted = accepted.to(dev)
        keep = torch.arange(g1, device=dev).unsqueeze(0) <= accepted.unsqueeze(-1)  # [B, g+1]
        if static:
            self.context(batch, v.hidden, batch.positions, batch.req_index, live=keep.flatten())
        else:
            rows = torch.nonzero(keep.flatten()).flatten()
            self.context(batch, v.hidden[rows], batch.positions[rows], batch.req_index[rows])
        end = batch.prefix_lens + accepted  # last committed position per request
        park = torch.where(end % 2 == 0, end, end - 1)  # last committed even position
        ok = park >= batch.prefix_lens  # else parked by an earlier forward
        park_rows = torch.arange(B, device=dev) * g1 + (park - batch.prefix_lens).clamp_min(0)
        for lid, (kvs, score) in v.kv.pair_state.items():
            pending, slots = self.pools.pending[lid], batch.req_slots
            state = torch.stack([kvs[park_rows], score[park_rows]], 1)  # [B, 2, D]
            if static:
                pending[slots] = torch.where(ok.view(-1, 1, 1), state, pending[slots])
            else:
                pending[slots[ok]] = state[ok]
