"""The Engram table module over host memory, and the transformation that puts it into a model.

`HostEngramTable` replaces a model's `EngramTable` (layers/engram.py) with the same call
(row ids int64 [T, cols] -> bf16 [T, cols, head_dim]) and the same kernel slot (`gather` ->
the `engram_gather` op: on CUDA the Triton gather reads the pinned host rows in place, elsewhere
the torch twin). The rows are plain attributes, not parameters or buffers, so nothing that moves a
model's tensors (`.to`, `.cuda`) copies the table to a device.

    shared     gather(weight, scale, ids) over the whole table: no collective
    per_rank   local = ids - shard start; rows this rank does not own read row 0 of the shard and
               are zeroed after dequantization; then an all-reduce (sum) over the group on the
               int32 view of the bf16 rows assembles every row. Exactly one rank contributes a
               non-zero word per row, so the sum is exact bit for bit (-0.0 included).

`place_host_tables(model, tables)` swaps the modules; `prefetch` (engram_host/prefetch.py) may hand a
row set staged earlier in the step instead of gathering inline.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_dsv41.engram_host.table import EngramHostTables
from sglang_dsv41.layers.engram import EngramTable
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.numerics import Slot
from sglang_dsv41.quant import dequant_engram_rows


def host_gather(weight: torch.Tensor, scale: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """Torch default of the `gather` slot: rows of a host table (any device ids) -> bf16 on ids' device."""
    ids = row_ids.to(weight.device)
    return dequant_engram_rows(weight[ids], scale[ids]).to(row_ids.device)


class HostEngramTable(nn.Module):
    numerics_slots = {"gather": Slot("engram", kernel="engram_gather")}  # sglang_dsv41/numerics.py
    gather = staticmethod(host_gather)

    def __init__(self, tables: EngramHostTables, k: int):
        super().__init__()
        self.tables, self.k = tables, k
        sec = tables.sections[k]
        self.host_weight, self.host_scale = tables.weight(k), tables.scale(k)
        self.stored_lo, self.stored_rows = sec.stored_lo, sec.stored_rows
        self.sharded = tables.layout == "per_rank"
        self.prefetch = None  # set by EngramPrefetch.attach

    def lookup(self, row_ids: torch.Tensor) -> torch.Tensor:
        """This rank's part: every row (shared) or its own rows with zeros elsewhere (per_rank)."""
        if not self.sharded:
            return self.gather(self.host_weight, self.host_scale, row_ids)
        local = row_ids - self.stored_lo
        owned = (local >= 0) & (local < self.stored_rows)
        rows = self.gather(self.host_weight, self.host_scale, torch.where(owned, local, torch.zeros_like(local)))
        return rows.masked_fill_(~owned.unsqueeze(-1), 0)

    def forward(self, row_ids: torch.Tensor) -> torch.Tensor:
        """row_ids int64 [...] -> bf16 [..., head_dim]."""
        rows = self.prefetch.take(self.k, row_ids) if self.prefetch is not None else None
        if rows is None:
            rows = self.lookup(row_ids)
        if self.sharded and self.tables.group.size > 1:
            self.tables.group.all_reduce_sum(rows.view(torch.int32))
        return rows

    def extra_repr(self) -> str:
        return f"layer={self.tables.sections[self.k].layer_id}, layout={self.tables.layout}, rows={self.stored_rows}"


def place_host_tables(model: DeepseekV41, tables: EngramHostTables, ops=None) -> list[HostEngramTable]:
    """Swap every Engram layer's `EngramTable` for a `HostEngramTable` over `tables`. Call before
    loading the other weights with `load_state_dict(strict=True)` (the table names leave the state
    dict) and before the kernels policy (`apply_numerics`) (which then points the new modules' gather slots at the ops);
    on a model that has its kernels already, pass the op table as `ops`."""
    e = model.cfg.engram
    placed = []
    for layer in model.layers:
        if layer.engram is None:
            continue
        if not isinstance(layer.engram.embed, EngramTable):
            raise TypeError(f"layer {layer.role.layer_id}: Engram table already replaced by {type(layer.engram.embed).__name__}")
        mod = HostEngramTable(tables, e.layer_ids.index(layer.role.layer_id))
        if ops is not None:
            mod.gather = ops.engram_gather
        layer.engram.embed = mod
        placed.append(mod)
    return placed


def table_tensor_names(model_or_cfg) -> dict[str, tuple[int, str]]:
    """Checkpoint names of the Engram table tensors -> (layer index k, 'weight' | 'scale')."""
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    e = cfg.engram
    if e is None:
        return {}
    return {f"layers.{lid}.engram.embed.{part}": (k, part) for k, lid in enumerate(e.layer_ids) for part in ("weight", "scale")}
