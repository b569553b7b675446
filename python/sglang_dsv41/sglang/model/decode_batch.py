"""The fixed-shape decode batch: a pure-decode ForwardBatch -> `Batch(static=True, seq_capacity=C)`
with no host read of device data (docs/sglang.md "CUDA graphs").

It is the step `runtime/graph.py` `DecodeGraph` runs, built from SGLang's tensors instead of host
lists: one row per request (row b = request b, position = prefix_lens = seq_lens - 1), the token
table `req_to_token[req_pool_indices, :C]` (C columns whatever the lengths, so the indexer's
compressed slot tables are C // ratio wide), `req_index = logits_rows = rows[:B]` (a slice of an
arange made once, at load) and the Engram n-gram history gathered from the `TokenStore` (fixed
width). Every output shape is fixed by B and C, nothing is read back to the host and no Python list
is copied to the device. C is a host int chosen outside the build (`decode_capacity`, from the host
lengths SGLang already holds).

`DeepseekV41ForCausalLM` uses it for every pure-decode forward, on every device, unless encoder SWA
replay is on (its per-request Python state changes every step; that path keeps `forward.build_batch`,
as do extend and mixed forwards).
"""

from __future__ import annotations

import torch

from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.decode_graphs import CAPACITY_FLOOR  # smallest token-table width: one bucket for short contexts
from sglang_dsv41.sglang.model.forward import TokenStore



def decode_capacity(max_seq_len: int | None, table_width: int, floor: int = CAPACITY_FLOOR) -> int:
    """Token-table columns C of a decode batch whose longest request holds `max_seq_len` tokens after
    the step: the next power of two at or above it, at least `floor`, at most `table_width` (the width
    of SGLang's req_to_token, which bounds every request). C >= every seq end, as
    `Batch.seq_capacity` requires; powers of two keep the number of distinct widths small while the
    indexer's C // ratio columns stay under twice the longest request's. These are the capacity
    buckets of the decode graphs (`GraphBuckets.default`), so a replay runs the eager step's width.
    None (no host lengths): the whole table."""
    if max_seq_len is None:
        return table_width
    if not 0 < max_seq_len <= table_width:
        raise ValueError(f"decode batch: a request of {max_seq_len} tokens in a token table {table_width} wide")
    return min(max(floor, 1 << (max_seq_len - 1).bit_length()), table_width)


def host_max_seq_len(fb) -> int | None:
    """The longest `seq_lens` entry of a ForwardBatch, from SGLang's host copy `seq_lens_cpu` (a CPU
    tensor: reading it waits for no device). None when there is none on the host."""
    lens = getattr(fb, "seq_lens_cpu", None)
    if lens is None or lens.device.type != "cpu" or lens.numel() == 0:
        return None
    return int(lens.max())


def build_decode_batch(fb, req_to_token: torch.Tensor, store: TokenStore, history_width: int, rows: torch.Tensor,
                       capacity: int, real_rows: torch.Tensor | None = None) -> Batch:
    """Map a pure-decode ForwardBatch (one new token per request; fields read: input_ids,
    seq_lens, req_pool_indices, out_cache_loc) onto a fixed-shape `Batch`, and write the new ids into
    `store`.

    req_to_token  int [req slots, >= capacity] SGLang's slot table (entries past a request's end are
                  never read: the runtime masks by position)
    rows          int64 [>= B] arange on the device, made once: rows[:B] are the row and logits indices
    capacity      token-table columns (`decode_capacity`), >= every seq_lens entry
    real_rows     int64 [] on the device (`Batch.real_rows`): rows at or past it are padding and
                  store nothing, the token store included; None = every row is real
    """
    num_reqs = fb.input_ids.numel()
    if num_reqs > rows.numel() or capacity > req_to_token.size(1):
        raise ValueError(f"decode batch of {num_reqs} requests, capacity {capacity}: built for at most "
                         f"{rows.numel()} requests and {req_to_token.size(1)} columns")
    prefix = fb.seq_lens.to(torch.int64) - 1  # tokens cached before the step = the new row's position
    req_slots = fb.req_pool_indices.to(torch.int64)
    token_table = req_to_token[req_slots, :capacity].to(torch.int64)  # [B, capacity]
    store.write(fb.out_cache_loc, fb.input_ids, real_rows)
    index = rows[:num_reqs]
    return Batch(
        input_ids=fb.input_ids.to(torch.int64),
        positions=prefix,
        req_index=index,
        req_slots=req_slots,
        prefix_lens=prefix,
        extend_lens=torch.ones_like(prefix),
        token_table=token_table,
        history=store.history(token_table, prefix, history_width),
        logits_rows=index,
        seq_capacity=capacity,
        static=True,
        real_rows=real_rows,
    )
