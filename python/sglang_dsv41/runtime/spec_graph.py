"""A DSpark step with fixed shapes, captured as CUDA graphs and replayed (runtime/spec_step.py has the step).

    g = SpecGraph(DSparkStep(runtime), batch_size=8, capacity=2048, history_width=2)
    g.set_table(token_table)                                   # int64 [B, <= capacity]; on page changes
    accepted, tokens = g.step(anchors, cached, req_slots, history, forced=None)   # host ints -> device

Two graphs per (batch size, capacity), both greedy:
  draft   the drafter over every request's anchor + noise block (`PagedDraftKV.for_draft(full_window=True)`:
          valid once every request has at least W = window committed tokens, where its key lists are
          exactly the eager ones); before that the same buffers run the eager draft
  verify  ONE static chain verify (`Batch(static=True, verify=True)`: gamma + 1 rows per request, every
          row through the compressed-KV path, rows that close no group store nothing), greedy
          acceptance (or the `forced` accept counts of a speed run), and the static commit (context
          rows of every verify row, the rejected ones stored nowhere; the pending pairs through a where)
Every value is the eager step's: the static paths are row-wise (test/runtime/test_spec_graph.py).
Inputs go through one packed int64 staging buffer [B, 4 + history_width] (anchor, cached, request
slot, forced or -1, n-gram history), one non-blocking copy per step. The outputs `accepted` int64 [B]
and `tokens` int64 [B, gamma + 1] are the graph's own tensors, overwritten by the next step.

`capture=False` runs the same fixed-shape step eagerly (any device; the CPU tests). Capture warms up
on scratch inputs: every request at position W + 1 of a token table into the reserved scratch slots
0 .. scratch_slots - 1, forced to accept nothing, so nothing but scratch slots is written and the
pending pairs are rewritten with their own values. Pools must be per-token window pools.
"""

from __future__ import annotations

from typing import Sequence

import torch

from sglang_dsv41.layers.dspark import draft
from sglang_dsv41.runtime.acceptance import accept_greedy
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.graph import capture_mode, check_requests, copy_table
from sglang_dsv41.runtime.paged_draft_kv import PagedDraftKV
from sglang_dsv41.runtime.spec_step import DSparkStep, Verified

WARMUP_STEPS = 2


class SpecGraph:
    def __init__(self, spec: DSparkStep, batch_size: int, capacity: int, history_width: int,
                 capture: bool | None = None, pool=None, scratch_slots: int = 2):
        pools = spec.pools
        g1 = spec.gamma + 1
        W = spec.cfg.attention.window_size
        if pools.window_rings:
            raise ValueError("DSpark graphs need per-token window pools (no encoder-replay rings)")
        if batch_size < 1 or batch_size > pools.num_req_slots or history_width < 1 or scratch_slots < 2:
            raise ValueError(f"DSpark graph: 1 <= batch_size <= {pools.num_req_slots}, history_width >= 1 and "
                             f"scratch_slots >= 2 required, got {batch_size}, {history_width}, {scratch_slots}")
        if capacity < W + 1 + g1:
            raise ValueError(f"DSpark graph: capacity must be at least window + gamma + 2 = {W + 1 + g1}, got {capacity}")
        self.spec, self.B, self.capacity, self.hw, self.g1, self.window = spec, batch_size, capacity, history_width, g1, W
        dev = torch.device(pools.device)
        self.device = dev
        self.capture = capture_mode(dev, capture)
        B = batch_size
        with torch.inference_mode():
            i64 = dict(dtype=torch.int64, device=dev)
            self.staging = torch.zeros(B, 4 + history_width, **i64)
            self._host = torch.zeros(B, 4 + history_width, dtype=torch.int64, pin_memory=dev.type == "cuda")
            self.anchors, self.cached, self.req_slots, self.forced = (torch.zeros(B, **i64) for _ in range(4))
            self.history = torch.zeros(B, history_width, **i64)
            self.token_table = torch.full((B, capacity), -1, **i64)
            self.ids = torch.zeros(B, g1, **i64)
            self.positions = torch.zeros(B * g1, **i64)
            self.batch = Batch(input_ids=self.ids.view(-1), positions=self.positions,
                               req_index=torch.arange(B, **i64).repeat_interleave(g1), req_slots=self.req_slots,
                               prefix_lens=self.cached, extend_lens=torch.full((B,), g1, **i64),
                               token_table=self.token_table, history=self.history,
                               logits_rows=torch.arange(B * g1, **i64), seq_capacity=capacity, static=True, verify=True)
            self._table_set = False
            self.draft_graph = self.verify_graph = None
            self.accepted = self.tokens = None
            if self.capture:
                self._capture(pool, scratch_slots)

    # ------------------------------------------------------------------ inputs
    def check(self, anchors: Sequence[int], cached: Sequence[int], req_slots: Sequence[int],
              history: Sequence[Sequence[int]]) -> None:
        """Raise ValueError unless these host inputs fit the captured shape (no device work)."""
        B, cap, g1 = self.B, self.capacity, self.g1
        what = f"DSpark graph captured for batch size {B}, contexts up to {cap} tokens, history width {self.hw}"
        if not (len(anchors) == len(cached) == len(req_slots) == len(history) == B):
            raise ValueError(f"{what}: got {len(anchors)} / {len(cached)} / {len(req_slots)} / {len(history)} requests")
        if any(c < 1 or c + g1 > cap for c in cached):
            raise ValueError(f"{what}: cached lengths must be 1 .. {cap - g1}, got {min(cached)} .. {max(cached)}")
        check_requests(what, anchors, self.spec.cfg.vocab_size, req_slots, self.spec.pools.num_req_slots, history,
                       self.hw, self._table_set)

    @torch.inference_mode()
    def set_table(self, token_table: torch.Tensor) -> None:
        """token_table int64 [B, w] pool slot of every position (-1 past the end); columns past the
        capacity are dropped, missing ones become -1. Call again whenever a request gets new pages."""
        copy_table(self.token_table, token_table, f"DSpark graph captured for batch size {self.B}")
        self._table_set = True

    @torch.inference_mode()
    def step(self, anchors: Sequence[int], cached: Sequence[int], req_slots: Sequence[int],
             history: Sequence[Sequence[int]], forced: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One greedy draft + verify + commit -> (accepted int64 [B], tokens int64 [B, gamma + 1]) on the
        device; request b emits tokens[b, :accepted[b] + 1]. `forced`: every request accepts exactly
        that many drafts (speed runs)."""
        self.check(anchors, cached, req_slots, history)
        h = self._host
        h[:, 0] = torch.tensor(list(anchors), dtype=torch.int64)
        h[:, 1] = torch.tensor(list(cached), dtype=torch.int64)
        h[:, 2] = torch.tensor(list(req_slots), dtype=torch.int64)
        h[:, 3] = -1 if forced is None else min(forced, self.g1 - 1)
        h[:, 4:] = torch.tensor([list(r) for r in history], dtype=torch.int64)
        self.staging.copy_(h, non_blocking=True)
        full = min(cached) >= self.window
        if full and self.draft_graph is not None:
            self.draft_graph.replay()
        else:
            self._draft(full)
        if self.verify_graph is not None:
            self.verify_graph.replay()
        else:
            self._verify()
        return self.accepted, self.tokens

    # ------------------------------------------------------------------ the step
    def _draft(self, full_window: bool) -> None:
        s, spec = self.staging, self.spec
        self.anchors.copy_(s[:, 0])
        self.cached.copy_(s[:, 1])
        self.req_slots.copy_(s[:, 2])
        self.forced.copy_(s[:, 3])
        self.history.copy_(s[:, 4:])
        dkv = PagedDraftKV.for_draft(spec.pools, self.token_table, self.req_slots, spec.ops, self.cached - 1,
                                     full_window=full_window)
        self.ids.copy_(draft(spec.model, self.anchors, dkv).ids)

    def _verify(self) -> None:
        spec, g1 = self.spec, self.g1
        step = torch.arange(g1, device=self.device)
        self.positions.copy_((self.cached.unsqueeze(1) + step).flatten())
        out, kv = spec.runtime.run(self.batch, capture_draft=True)
        logits = out.logits.view(self.B, g1, -1)
        accepted, tokens = accept_greedy(self.ids, logits)
        # forced accept counts (>= 0): the drafts themselves are committed, then the target's next token
        forced = self.forced
        best = logits.argmax(-1)
        ftok = torch.where(step.unsqueeze(0) == forced.unsqueeze(1), best, torch.cat([self.ids[:, 1:], best[:, -1:]], 1))
        use = forced >= 0
        self.accepted = torch.where(use, forced, accepted)
        self.tokens = torch.where(use.unsqueeze(1), ftok, tokens)
        spec.commit(Verified(self.batch, logits, out.draft_hidden, kv), self.accepted, static=True)

    def _capture(self, pool, scratch_slots: int) -> None:
        B, W = self.B, self.window
        h = torch.zeros(B, 4 + self.hw, dtype=torch.int64)
        h[:, 1] = W + 1  # odd: the commit of 0 accepted drafts parks nothing (the pair closes at W + 1)
        h[:, 2] = torch.arange(B)
        h[:, 3] = 0
        self.staging.copy_(h)
        self.token_table.copy_((torch.arange(self.capacity, device=self.device) % scratch_slots).expand(B, -1))
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._draft(True)
                self._verify()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.draft_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.draft_graph, pool=pool):
            self._draft(True)
        self.verify_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.verify_graph, pool=pool):
            self._verify()
        self.token_table.fill_(-1)
