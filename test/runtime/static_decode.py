"""Shared by the decode-graph-set tests (CPU and GPU): one static decode row per sequence, and a step run
from the current pool state with that state restored afterwards."""

from __future__ import annotations

import torch

from sglang_dsv41.runtime.batch import Batch


def static_batch(drv, seqs, capacity: int) -> Batch:
    """One decode row per sequence at its cached length, as the SGLang adapter builds it (decode_batch.py),
    on the driver's device."""
    hw, dev = drv.history_width, drv.device
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    pos = t([s.cached for s in seqs])
    rows = torch.arange(len(seqs), device=dev)
    # pages for the rows' real lengths only (as SGLang's pool gives them); -1 out to the capacity
    for s in seqs:
        drv._table([s], s.cached + 1)  # Driver._table gives every row of a call the call's longest length
    table = drv._table(seqs, 0)[:, :capacity]
    table = torch.nn.functional.pad(table, (0, capacity - table.shape[1]), value=-1)
    return Batch(input_ids=t([s.tokens[s.cached] for s in seqs]), positions=pos, req_index=rows,
                 req_slots=t([s.req_slot for s in seqs]), prefix_lens=pos, extend_lens=torch.ones_like(pos),
                 token_table=table.to(dev),
                 history=t([s.tokens[s.cached - hw: s.cached] for s in seqs]), logits_rows=rows,
                 seq_capacity=capacity, static=True)


def pool_tensors(drv) -> list[torch.Tensor]:
    p = drv.pools
    return [*p.window, *p.compressed.values(), *p.index_keys.values(), *p.pending.values()]


def run_restoring(drv, fn):
    """fn() from the current pool state -> (logits, {layer: routed experts}, the pools after it), all
    copies; the pool state is restored."""
    saved = [x.clone() for x in pool_tensors(drv)]
    out = fn()
    logits = out.logits.clone()
    routed = {k: v.clone() for k, v in out.decisions.routed_experts.items()}
    after = [x.clone() for x in pool_tensors(drv)]
    for now, was in zip(pool_tensors(drv), saved):
        now.copy_(was)
    return logits, routed, after
