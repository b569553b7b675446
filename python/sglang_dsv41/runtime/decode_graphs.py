"""Decode CUDA graphs keyed by (batch bucket, capacity bucket), with an eager fallback: the serving path's
captured decode, engine-agnostic (the SGLang adapter only translates its batch into a `Batch`).

    graphs = DecodeGraphSet(runtime, GraphBuckets.default(max_batch=48, max_capacity=req_to_token_width),
                            history_width, scratch_slots=page_size)
    out = graphs.forward(batch, max_seq_len)   # a static decode Batch of n requests -> ForwardOutput of n rows

A step of n requests whose longest holds `max_seq_len` tokens after it runs through the graph of the
smallest batch bucket B >= n and the smallest capacity bucket C >= max_seq_len (captured on first use
or by `capture_all`): `DecodeGraph.load` copies the batch into the graph's buffers on the device (no
host read), rows n..B-1 are padding rows that repeat row 0 and store nothing (`Batch.real_rows`). The
returned output holds the first n rows (logits, positions, routed experts), slices of graph-owned
tensors overwritten by the next replay. A step no bucket covers (more requests than the largest batch
bucket, a context past the largest capacity, a batch that is not a static decode batch) runs eagerly
through `runtime.forward`; `fallbacks` counts the reasons and `plan` says which applies.

Bits: a row's logits do not depend on the padding rows (every op of the step is row-wise; padding rows
only lose their stores), nor on B in deterministic mode (batch-invariant kernels); they do depend on C
only through the indexer's C // ratio slot-table width, which the eager step of the same capacity shares
(test/runtime/test_decode_graphs.py: the set equals the eager step of the same batch bit for bit, pools
included). Outside deterministic mode a few decode kernels pick their split by row count (docs/numerics.md),
so the B-row graph and an n-row eager step may differ in the last bits.

Warm-up and capture write only the scratch slots 0..scratch_slots-1 (the first page, which the
allocator never hands out) and leave every request's pending pair state as it was (runtime/graph.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import ForwardOutput
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.graph import DecodeGraph, capture_mode

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
"""Default batch buckets (SGLang's decode graph sizes follow the same shape: dense at small sizes)."""
CAPACITY_FLOOR = 256
"""Smallest capacity bucket: one graph for every context up to it."""


@dataclass(frozen=True)
class GraphBuckets:
    batch_sizes: tuple[int, ...]
    """ascending, distinct, >= 1."""
    capacities: tuple[int, ...]
    """ascending, distinct, >= 2: token-table columns of each capacity bucket (= the largest seq end)."""

    def __post_init__(self):
        for name, values, low in (("batch_sizes", self.batch_sizes, 1), ("capacities", self.capacities, 2)):
            if not values or list(values) != sorted(set(values)) or values[0] < low:
                raise ValueError(f"GraphBuckets.{name} must be ascending distinct integers >= {low}, got {values}")

    @staticmethod
    def default(max_batch: int, max_capacity: int, batch_sizes: tuple[int, ...] | None = None,
                floor: int = CAPACITY_FLOOR) -> "GraphBuckets":
        """Batch buckets `batch_sizes` (default BATCH_BUCKETS) up to `max_batch` (included even when not
        a default size); capacities: powers of two from `floor` up to `max_capacity`, which is always the
        last one (e.g. the width of the engine's token table, which bounds every request)."""
        if max_batch < 1 or max_capacity < 2:
            raise ValueError(f"GraphBuckets.default: max_batch >= 1 and max_capacity >= 2, got {max_batch}, {max_capacity}")
        sizes = sorted({b for b in (batch_sizes or BATCH_BUCKETS) if b <= max_batch} | {max_batch})
        caps, c = [], floor
        while c < max_capacity:
            caps.append(c)
            c *= 2
        return GraphBuckets(tuple(sizes), tuple(caps + [max_capacity]))

    def choose(self, batch_size: int, max_seq_len: int) -> tuple[int, int] | str:
        """(B, C) of the smallest buckets covering the step, or why none does."""
        if batch_size < 1 or max_seq_len < 1:
            return f"empty step ({batch_size} requests, longest {max_seq_len} tokens)"
        b = next((x for x in self.batch_sizes if x >= batch_size), None)
        if b is None:
            return f"{batch_size} requests > the largest batch bucket {self.batch_sizes[-1]}"
        c = next((x for x in self.capacities if x >= max_seq_len), None)
        if c is None:
            return f"a context of {max_seq_len} tokens > the largest capacity bucket {self.capacities[-1]}"
        return b, c


class DecodeGraphSet:
    def __init__(self, runtime, buckets: GraphBuckets, history_width: int, capture: bool | None = None,
                 scratch_slots: int = 2):
        """`runtime`: a `Runtime` over per-token window pools. `capture`: None = on CUDA only; False runs
        the same fixed-shape steps eagerly (the CPU tests). `scratch_slots`: token slots 0.. the warm-up may
        write (a page the allocator never hands out)."""
        if buckets.batch_sizes[-1] > runtime.pools.num_req_slots:
            raise ValueError(f"decode graph buckets up to {buckets.batch_sizes[-1]} requests but the pools have "
                             f"{runtime.pools.num_req_slots} request slots")
        self.runtime, self.buckets, self.hw = runtime, buckets, history_width
        self.capture = capture_mode(torch.device(runtime.pools.device), capture)
        self.scratch_slots = scratch_slots
        self.graphs: dict[tuple[int, int], DecodeGraph] = {}
        self.fallbacks: Counter = Counter()
        """reason -> eager steps taken for it."""
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None

    def graph(self, batch_size: int, capacity: int) -> DecodeGraph:
        """The graph of bucket (batch_size, capacity), captured now if it was not."""
        key = (batch_size, capacity)
        if key not in self.graphs:
            self.graphs[key] = DecodeGraph(self.runtime, batch_size, capacity, self.hw, capture=self.capture,
                                           pool=self._pool, scratch_slots=self.scratch_slots, padding=True)
        return self.graphs[key]

    def capture_all(self, max_capacity: int | None = None) -> int:
        """Capture every bucket up to `max_capacity` (default: all), largest first (they share one memory
        pool). -> the number of graphs held."""
        for c in reversed(self.buckets.capacities):
            if max_capacity is None or c <= max_capacity:
                for b in reversed(self.buckets.batch_sizes):
                    self.graph(b, c)
        return len(self.graphs)

    def plan(self, batch: Batch, max_seq_len: int) -> tuple[int, int] | str:
        """The bucket `forward` would use for this step, or why it runs eagerly."""
        if not batch.static or batch.req_slots.numel() != batch.num_rows or batch.real_rows is not None:
            return "not a static decode batch (one row per request, no padding of its own)"
        if batch.history.size(1) != self.hw:
            return f"history width {batch.history.size(1)} != {self.hw}"
        if max_seq_len > batch.seq_capacity:
            return f"a context of {max_seq_len} tokens past the batch's capacity {batch.seq_capacity}"
        return self.buckets.choose(batch.num_rows, max_seq_len)

    def forward(self, batch: Batch, max_seq_len: int) -> ForwardOutput:
        """One decode step. `max_seq_len`: the longest request's tokens after the step, a host int the
        caller already holds (never read from the device)."""
        key = self.plan(batch, max_seq_len)
        if isinstance(key, str):
            self.fallbacks[key] += 1
            return self.runtime.forward(batch)
        g = self.graph(*key)
        g.load(batch)
        out = g.replay()
        n = batch.num_rows
        return ForwardOutput(logits=out.logits[:n], positions=out.positions[:n],
                             decisions=Decisions(routed_experts={k: v[:n] for k, v in out.decisions.routed_experts.items()}))
