"""Prefetch: every Engram layer's rows are gathered as soon as the step's row ids exist.

Engram row ids depend only on token ids, so the forward computes them for all Engram layers first
(`kv.engram_ids` -> the hasher's `window_hash` slot), before the embedding and the first layer.
`EngramPrefetch.attach(model)` wraps that slot: right after the ids are computed it issues, on a
side CUDA stream, each Engram layer's host gather (+ dequantization) into that layer's staging
buffer and records one event per layer. The Engram layer (`HostEngramTable.forward`) then waits on
its event and takes the staged rows, so the PCIe reads overlap the layers before it (layer 1's
with the embedding and layer 0, layer 14's with layers 0-13 in the release). The layer itself only
projects and gates (and for `per_rank` all-reduces).

    staging[k]   bf16 [max_tokens, cols, head_dim] on the device, allocated once: a fixed address,
                 so a decode step captured in a CUDA graph replays into the same buffer
    take(k, ids) the staged rows [T, cols, head_dim] if `ids` is the very view the prefetch used
                 (same storage address, shape and strides: `hash_ids[:, k]` of this forward),
                 else None and the layer gathers inline (more than max_tokens rows, rows narrowed
                 before the layer, a table called outside the forward)

On the CPU there is no side stream: the gathers run synchronously when the ids are computed, with
the same gather function, so staged rows equal the inline gather bit for bit.
"""

from __future__ import annotations

import torch

from sglang_dsv41.engram_host.lookup import HostEngramTable
from sglang_dsv41.layers.transformer import DeepseekV41


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride(), t.device


class EngramPrefetch:
    def __init__(self, modules: list[HostEngramTable], max_tokens: int, device: torch.device | str):
        self.device = torch.device(device)
        self.max_tokens = int(max_tokens)
        self.modules = {m.k: m for m in modules}
        e = next(iter(modules)).tables.cfg.engram
        self.staging = {k: torch.empty(self.max_tokens, e.n_hash_cols, e.head_dim, dtype=torch.bfloat16, device=self.device)
                        for k in self.modules}
        cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.events = {k: torch.cuda.Event() for k in self.modules} if cuda else {}
        self.pending: dict[int, tuple] = {}
        self._ids: torch.Tensor | None = None  # keeps this step's ids alive until the next step

    @property
    def staging_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.staging.values())

    # ------------------------------------------------------------------ transformation
    def attach(self, model: DeepseekV41) -> "EngramPrefetch":
        """Wrap the model's hasher slot and point its host tables here. Apply after the kernels policy (`apply_numerics`)
        (which resets slots); `detach` undoes it."""
        hasher = model.hasher
        if hasher is None:
            raise RuntimeError("attach the Engram prefetch after the token map is set (the hasher exists)")
        inner = hasher.window_hash

        def window_hash(*args, **kwargs):
            ids = inner(*args, **kwargs)
            self.issue(ids)
            return ids

        window_hash.prefetch_inner = inner
        hasher.window_hash = window_hash
        for m in self.modules.values():
            m.prefetch = self
        return self

    def detach(self, model: DeepseekV41) -> None:
        slot = model.hasher.__dict__.get("window_hash")
        if slot is not None and hasattr(slot, "prefetch_inner"):
            model.hasher.window_hash = slot.prefetch_inner
            if model.hasher.window_hash is type(model.hasher).window_hash:
                del model.hasher.window_hash
        for m in self.modules.values():
            m.prefetch = None

    # ------------------------------------------------------------------ per step
    def issue(self, ids: torch.Tensor) -> None:
        """ids int64 [T, n_engram_layers, cols] (the forward's row ids): stage every layer's rows."""
        if self.stream is not None and self.pending and not torch.cuda.is_current_stream_capturing():
            main = torch.cuda.current_stream(self.device)
            for k in self.pending:  # staged but never taken: its reads must end before the ids are freed
                main.wait_event(self.events[k])
        self.pending.clear()
        self._ids = None
        t = ids.size(0)
        if t == 0 or t > self.max_tokens:
            return
        self._ids = ids
        if self.stream is None:
            for k, m in self.modules.items():
                self.staging[k][:t].copy_(m.lookup(ids[:, k]))
                self.pending[k] = _key(ids[:, k])
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the ids are ready
        with torch.cuda.stream(self.stream):
            for k, m in self.modules.items():
                self.staging[k][:t].copy_(m.lookup(ids[:, k]))
                self.events[k].record(self.stream)
                self.pending[k] = _key(ids[:, k])

    def take(self, k: int, row_ids: torch.Tensor) -> torch.Tensor | None:
        key = self.pending.pop(k, None)
        if key is None or key != _key(row_ids):
            return None
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self.events[k])
        return self.staging[k][: row_ids.size(0)]
