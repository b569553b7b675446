"""A fixed-shape decode step of the paged runtime, captured once in a CUDA graph and replayed.

    g = DecodeGraph(runtime, batch_size=8, capacity=8448, history_width=2, capture=True)
    g.set_table(token_table)                          # int64 [B, <= capacity] pool slots (page changes)
    out = g.step(input_ids, positions, req_slots, history)   # host ints -> ForwardOutput
    g.next_tokens                                     # int64 [B] greedy argmax of out.logits (device)

One decode step = one new row per request (row b = request b, `prefix_lens == positions`). Every
shape is fixed when the object is built: B rows, `capacity` token-table columns (so the indexer's
compressed slot tables are capacity // ratio wide: `Batch.seq_capacity`), B logits rows, and the
step has no host read (`Batch.static`: the compressed-KV path runs on every row, rows that close no
group write slot -1). The inputs live in fixed device buffers: one packed int64 staging buffer
[B, 3 + history_width] (token id, position, request slot, n-gram history) copied from the host with
one non-blocking copy per step, unpacked inside the graph; the token table [B, capacity] is set
only when pages change. Outputs (logits, decisions, `next_tokens`) are tensors of the graph's own
memory pool, overwritten by the next replay: read or copy them before the next step.

`capture=False` runs the same fixed-shape step eagerly through the same buffers (any device; the
CPU tests use it). `step` rejects input it was not built for (batch size, contexts past the
capacity, token ids outside the vocabulary, request slots out of range or repeated, history width)
with a ValueError naming the captured shape, before anything is copied.

Capture runs the step on harmless scratch inputs first (warm-up: Triton compilation, allocator):
every scratch row sits at position 1 of a token table that points into the driver's reserved
scratch page 0 (slots 0..page_size-1), so the warm-up writes window / compressed KV only there and
rewrites the pending pair state with its own values (position 1 closes a pair; nothing is parked).
Pools must be per-token window pools (no encoder-replay rings: their workspace can grow).
"""

from __future__ import annotations

from typing import Sequence

import torch

from sglang_dsv41.layers.transformer import ForwardOutput
from sglang_dsv41.runtime.batch import Batch

WARMUP_STEPS = 2


def capture_mode(device: torch.device, capture: bool | None) -> bool:
    """Whether a fixed-shape step captures a CUDA graph: `capture` None = on CUDA only; True elsewhere
    is an error."""
    mode = device.type == "cuda" if capture is None else capture
    if mode and device.type != "cuda":
        raise ValueError("CUDA graph capture needs a CUDA device")
    return mode


def check_requests(what: str, ids: Sequence[int], vocab: int, req_slots: Sequence[int], num_req_slots: int,
                   history: Sequence[Sequence[int]], history_width: int, table_set: bool) -> None:
    """The input checks every fixed-shape step shares (DecodeGraph, spec_graph.SpecGraph): ids in the
    vocabulary, distinct request slots in range, full history rows, a token table set. Raises ValueError
    starting with `what` (the captured shape)."""
    if any(t < 0 or t >= vocab for t in ids):
        raise ValueError(f"{what}: token id outside [0, {vocab})")
    if any(r < 0 or r >= num_req_slots for r in req_slots) or len(set(req_slots)) != len(req_slots):
        raise ValueError(f"{what}: request slots must be distinct and in [0, {num_req_slots})")
    if any(len(h) != history_width for h in history):
        raise ValueError(f"{what}: every history row needs {history_width} token ids")
    if not table_set:
        raise ValueError(f"{what}: no token table set (call set_table)")


def copy_table(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    """dst int64 [B, capacity] <- src int64 [B, w] (pool slot of every position, -1 past the end):
    columns past the capacity are dropped (no step reads them), missing ones become -1."""
    if src.dim() != 2 or src.size(0) != dst.size(0):
        raise ValueError(f"{what}, got a token table {tuple(src.shape)}")
    w = min(src.size(1), dst.size(1))
    dst.fill_(-1)
    dst[:, :w].copy_(src[:, :w])


class DecodeGraph:
    def __init__(self, runtime, batch_size: int, capacity: int, history_width: int, capture: bool | None = None,
                 pool=None, scratch_slots: int = 2, padding: bool = False):
        """`runtime`: a `Runtime` (model + pools + op table). `capacity`: the largest seq end (tokens
        after the step) any request may have. `history_width`: Engram n-gram history columns
        (max_ngram_size - 1; 1 without Engram). `capture`: None = on CUDA only. `pool`: a CUDA graph
        memory pool handle to share between graphs. `scratch_slots`: slots 0..scratch_slots-1 may
        be written by the warm-up (>= 2; the driver reserves a whole page). `padding`: the step
        carries `Batch.real_rows` (a device scalar, `load` sets it), so fewer requests than B can
        run through it, the rest padding rows that store nothing."""
        pools = runtime.pools
        if pools.window_rings:
            raise ValueError("decode graphs need per-token window pools; encoder SWA replay (window rings) "
                             "runs eagerly (--no-graph)")
        if batch_size < 1 or capacity < 2 or history_width < 1 or scratch_slots < 2:
            raise ValueError(f"decode graph: batch_size >= 1, capacity >= 2, history_width >= 1 required, "
                             f"got {batch_size}, {capacity}, {history_width}")
        if batch_size > pools.num_req_slots:
            raise ValueError(f"decode graph for {batch_size} requests but the pools have {pools.num_req_slots} request slots")
        self.runtime, self.B, self.capacity, self.hw = runtime, batch_size, capacity, history_width
        self.vocab = runtime.cfg.vocab_size
        dev = torch.device(pools.device)
        self.device = dev
        self.capture = capture_mode(dev, capture)
        B = batch_size
        with torch.inference_mode():
            i64 = dict(dtype=torch.int64, device=dev)
            self.staging = torch.zeros(B, 3 + history_width, **i64)
            self._host = torch.zeros(B, 3 + history_width, dtype=torch.int64, pin_memory=dev.type == "cuda")
            self.input_ids = torch.zeros(B, **i64)
            self.positions = torch.zeros(B, **i64)  # = prefix_lens (one new row per request)
            self.req_slots = torch.zeros(B, **i64)
            self.history = torch.zeros(B, history_width, **i64)
            self.token_table = torch.full((B, capacity), -1, **i64)
            rows = torch.arange(B, **i64)
            self.real_rows = torch.full((), B, **i64) if padding else None
            self.batch = Batch(input_ids=self.input_ids, positions=self.positions, req_index=rows,
                               req_slots=self.req_slots, prefix_lens=self.positions,
                               extend_lens=torch.ones(B, **i64), token_table=self.token_table, history=self.history,
                               logits_rows=rows, seq_capacity=capacity, static=True, real_rows=self.real_rows)
            self._table_set = False
            self.graph = None
            self.out: ForwardOutput | None = None
            self.next_tokens: torch.Tensor | None = None
            if self.capture:
                self._capture(pool, scratch_slots)

    # ------------------------------------------------------------------ validation
    def check(self, input_ids: Sequence[int], positions: Sequence[int], req_slots: Sequence[int],
              history: Sequence[Sequence[int]]) -> None:
        """Raise ValueError unless these host inputs fit the captured shape (no device work)."""
        B, cap = self.B, self.capacity
        what = f"decode graph captured for batch size {B}, contexts up to {cap} tokens, history width {self.hw}"
        if not (len(input_ids) == len(positions) == len(req_slots) == len(history)):
            raise ValueError(f"{what}: input_ids / positions / req_slots / history lengths differ "
                             f"({len(input_ids)}, {len(positions)}, {len(req_slots)}, {len(history)})")
        if len(input_ids) != B:
            raise ValueError(f"{what}: got {len(input_ids)} requests (capture another graph for this batch size)")
        if any(p < 0 or p + 1 > cap for p in positions):
            raise ValueError(f"{what}: a request reaches {max(positions) + 1} tokens (positions must be 0..{cap - 1})")
        check_requests(what, input_ids, self.vocab, req_slots, self.runtime.pools.num_req_slots, history, self.hw,
                       self._table_set)

    # ------------------------------------------------------------------ inputs
    @torch.inference_mode()
    def set_table(self, token_table: torch.Tensor) -> None:
        """token_table int64 [B, w] pool slot of every position (-1 past the end); columns past the
        capacity are dropped (no step reads them), missing ones become -1. Call again whenever a
        request gets new pages."""
        copy_table(self.token_table, token_table, f"decode graph captured for batch size {self.B}")
        self._table_set = True

    @torch.inference_mode()
    def step(self, input_ids: Sequence[int], positions: Sequence[int], req_slots: Sequence[int],
             history: Sequence[Sequence[int]]) -> ForwardOutput:
        """One decode step: row b = request slot req_slots[b], its new token input_ids[b] at
        positions[b] (= tokens cached before), history[b] = the history_width ids before it (any
        value where the position would be negative). Replays the graph (or runs eagerly)."""
        self.check(input_ids, positions, req_slots, history)
        h = self._host
        h[:, 0] = torch.tensor(list(input_ids), dtype=torch.int64)
        h[:, 1] = torch.tensor(list(positions), dtype=torch.int64)
        h[:, 2] = torch.tensor(list(req_slots), dtype=torch.int64)
        h[:, 3:] = torch.tensor([list(r) for r in history], dtype=torch.int64)
        self.staging.copy_(h, non_blocking=True)
        if self.real_rows is not None:
            self._unpack()
            self.real_rows.fill_(self.B)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.out = self._body()
        return self.out

    @torch.inference_mode()
    def load(self, batch: Batch) -> None:
        """Device-side inputs (no host read): a static decode `batch` of n <= B requests (one row each,
        every position < capacity: the caller's bucket choice guarantees it; table columns past the
        capacity are dropped)
        goes into rows 0..n-1; rows n..B-1 repeat row 0 and are padding (`real_rows` = n: they store
        nothing). Then `replay()`. Needs `padding=True`."""
        n = batch.num_rows
        if not batch.static or batch.req_slots.numel() != n or batch.history.size(1) != self.hw:
            raise ValueError("DecodeGraph.load takes a static decode batch (one row per request) of the graph's history width")
        if self.real_rows is None:
            raise ValueError("DecodeGraph.load needs a graph built with padding=True (its inputs live outside the graph)")
        if n > self.B:
            raise ValueError(f"decode graph for batch size {self.B}: got {n} requests")
        rows = self.batch.req_index  # arange(B), made at build
        src = torch.where(rows < n, rows, 0)
        self.input_ids.copy_(batch.input_ids[src])
        self.positions.copy_(batch.positions[src])
        self.req_slots.copy_(batch.req_slots[src])
        self.history.copy_(batch.history[src])
        w = min(batch.token_table.size(1), self.capacity)  # columns past every position are never read
        self.token_table.fill_(-1)
        self.token_table[:, :w].copy_(batch.token_table[src, :w])
        if self.real_rows is not None:
            self.real_rows.fill_(n)
        self._table_set = True

    @torch.inference_mode()
    def replay(self) -> ForwardOutput:
        """Run the step on the inputs `load` left in the buffers (the graph, or eagerly)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.out = self._body()
        return self.out

    # ------------------------------------------------------------------ the step
    def _run(self) -> ForwardOutput:
        out = self.runtime.forward(self.batch)
        self.next_tokens = out.logits.argmax(-1)
        return out

    def _unpack(self) -> None:
        s = self.staging
        self.input_ids.copy_(s[:, 0])
        self.positions.copy_(s[:, 1])
        self.req_slots.copy_(s[:, 2])
        self.history.copy_(s[:, 3:])

    def _forward(self) -> ForwardOutput:
        self._unpack()
        return self._run()

    def _body(self) -> ForwardOutput:
        """What the graph holds: with padding the inputs are loaded outside it (`load`, or `step`'s
        unpack), else the staging unpack is part of it."""
        return self._run() if self.real_rows is not None else self._forward()

    def _capture(self, pool, scratch_slots: int) -> None:
        B = self.B
        h = torch.zeros(B, 3 + self.hw, dtype=torch.int64)
        h[:, 1] = 1  # position 1: closes a ratio-2 pair, parks nothing
        h[:, 2] = torch.arange(B)
        self.staging.copy_(h)
        self.token_table.copy_((torch.arange(self.capacity, device=self.device) % scratch_slots).expand(B, -1))
        if self.real_rows is not None:
            self._unpack()
            self.real_rows.fill_(B)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = self._body()
        self.token_table.fill_(-1)
