"""SGLang's ForwardBatch -> our runtime `Batch`, and our fp32 logits -> SGLang's LogitsProcessorOutput.

Index spaces match one to one: SGLang's token slots (`out_cache_loc`, rows of
`req_to_token_pool.req_to_token`) are our pool slots, and `req_pool_indices` are our request slots
(ratio-2 pending state). Extend, mixed (decode rows are extends of length 1) and decode all map to
the same packed `Batch`.

Engram needs the N-1 token ids before each request's first new token, which a ForwardBatch does not
carry; `TokenStore` keeps the id of every token slot (written from `input_ids` at `out_cache_loc` on
every forward), so the history of a radix-cache hit is read from the slots of the shared prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dsv41.runtime.batch import Batch, writer_rows


class TokenStore:
    """int64 [num_slots]: the token id held by each pool slot."""

    def __init__(self, num_slots: int, device: torch.device | str):
        self.ids = torch.zeros(num_slots, dtype=torch.int64, device=device)

    def write(self, slots: torch.Tensor, ids: torch.Tensor, real_rows: torch.Tensor | None = None) -> None:
        """ids[i] -> slot slots[i]. `real_rows` (int64 [] on the device, `Batch.real_rows`): rows at or
        past it are padding and repeat row 0's write, so they change nothing (no host read)."""
        slots, ids = slots.long(), ids.long()
        if real_rows is not None:
            src = writer_rows(real_rows, slots.numel())
            slots, ids = slots[src], ids[src]
        self.ids[slots] = ids

    def history(self, token_table: torch.Tensor, prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
        """int64 [B, width]: ids at positions prefix-width .. prefix-1 (0 where negative)."""
        pos = prefix_lens.unsqueeze(1) - width + torch.arange(width, device=prefix_lens.device)
        slots = token_table.gather(1, pos.clamp_min(0))
        return torch.where(pos >= 0, self.ids[slots], 0)


@dataclass
class LogitsPlan:
    """Which packed rows get logits, and (for input logprobs) how SGLang indexes them."""

    rows: torch.Tensor
    input_logprobs: bool = False
    sample_indices: list[int] | None = None
    input_logprob_indices: list[int] | None = None
    token_to_seq_idx: list[int] | None = None


def plan_logits(extend_lens: list[int], logprob_starts: list[int] | None, device) -> LogitsPlan:
    """Rows whose logits SGLang needs: the last row of each request, or, when input logprobs are
    requested, every row from each request's logprob start (at least its last row). The index lists
    follow SGLang's LogitsProcessor (sample row per request, rows that carry an input logprob)."""
    ends = torch.tensor(extend_lens, dtype=torch.int64).cumsum(0)
    if logprob_starts is None:
        return LogitsPlan(rows=(ends - 1).to(device))
    rows, sample, lp_idx, seq_of = [], [], [], []
    pt = 0
    for b, (n, start) in enumerate(zip(extend_lens, logprob_starts)):
        first = start - 1 if n == start else start  # a chunk with no logprob rows still samples its last
        base = len(rows)
        rows.extend(range(pt + first, pt + n))
        seq_of.extend([b] * (n - first))
        sample.append(len(rows) - 1)
        lp_idx.extend(base + i for i in range(n - start))
        pt += n
    return LogitsPlan(torch.tensor(rows, dtype=torch.int64, device=device), True, sample, lp_idx, seq_of)


def build_batch(fb, req_to_token: torch.Tensor, store: TokenStore, history_width: int, plan_rows: torch.Tensor,
                replay_lens: list[int] | None = None, input_ids: torch.Tensor | None = None) -> Batch:
    """Map one (non-idle) ForwardBatch onto a `Batch` (`req_to_token`: SGLang's [req slots, context]
    slot table); writes this forward's ids into `store`. `replay_lens[b]` (encoder SWA bounded
    replay) cached tokens are recomputed in front of request b's new tokens: their ids are read back
    from `store`, the request's rows start that much earlier, and `plan_rows` (indices into the
    forward's own rows) move with them. `input_ids`: the forward's ids when they differ from
    `fb.input_ids` (image pad ids mapped back, image_rows.remap_pad_ids)."""
    device = fb.input_ids.device
    if fb.forward_mode.is_decode():
        seq = fb.seq_lens.to(torch.int64)
        prefix = seq - 1
        ext = torch.ones_like(seq)
    else:
        prefix = torch.tensor(fb.extend_prefix_lens_cpu, dtype=torch.int64, device=device)
        ext = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int64, device=device)
    width = int((prefix + ext).max())
    req_slots = fb.req_pool_indices.to(torch.int64)
    token_table = req_to_token[req_slots, :width].to(torch.int64)
    ids = (fb.input_ids if input_ids is None else input_ids).to(torch.int64)
    store.write(fb.out_cache_loc, ids)
    positions = fb.positions.to(torch.int64)
    extra = {}
    if replay_lens is not None and any(replay_lens):
        rep = torch.tensor(replay_lens, dtype=torch.int64, device=device)
        starts = prefix - rep
        ids, positions = _fold(ids, positions, ext.tolist(), starts.tolist(), replay_lens, token_table, store)
        row_req = torch.repeat_interleave(torch.arange(len(replay_lens), device=device), ext)
        plan_rows = plan_rows + torch.cumsum(rep, 0)[row_req[plan_rows]]
        prefix, ext = starts, ext + rep
        extra = dict(replay_lens=rep, window_floor=torch.where(rep > 0, starts, 0))
    return Batch(
        input_ids=ids,
        positions=positions,
        req_index=torch.repeat_interleave(torch.arange(len(ext), device=device), ext),
        req_slots=req_slots,
        prefix_lens=prefix,
        extend_lens=ext,
        token_table=token_table,
        history=store.history(token_table, prefix, history_width),
        logits_rows=plan_rows,
        **extra,
    )


def _fold(ids, positions, ext: list[int], starts: list[int], replay: list[int], token_table, store: TokenStore):
    """Prepend each request's replay tokens (positions start..start+r-1, ids from their slots)."""
    out_ids, out_pos, off = [], [], 0
    for b, (n, a, r) in enumerate(zip(ext, starts, replay)):
        if r:
            out_ids.append(store.ids[token_table[b, a : a + r]])
            out_pos.append(torch.arange(a, a + r, device=ids.device))
        out_ids.append(ids[off : off + n])
        out_pos.append(positions[off : off + n])
        off += n
    return torch.cat(out_ids), torch.cat(out_pos)


def identity_logits(states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """`get_logits_fn` for SGLang's input-logprob processor: our rows already are fp32 logits."""
    return states
