"""Every Engram layer's table rows of this rank in one `HostRegion` (spec model 5.4-5.5).

Byte layout of the region, per Engram layer k (in `engram.layer_ids` order), each section aligned
to HUGE_PAGE:
    weight  e4m3 bytes [stored_rows_k, head_dim]
    scale   UE8M0 bytes [stored_rows_k, head_dim / 32]          (264 B per row at head_dim 256)
`shared`: stored rows = all rows of the layer, one region for the node (rank 0 creates it, the other
ranks map it); every rank *writes* only its `shard_range` while loading and *reads* any row.
`per_rank`: stored rows = this rank's `shard_range`; reads go through the zero-fill + all-reduce
lookup (engram_host/lookup.py).

Loading: `write_rows` takes any run of consecutive rows (a whole checkpoint tensor or a slice of
it) and copies the part this rank writes; `finish_load` barriers, reads huge-page coverage (and
for `per_rank` below 98% tries MADV_COLLAPSE), warns when no huge page was obtained, and pins the
region for the GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang_dsv41.config import EngramConfig, ModelConfig
from sglang_dsv41.engram_host.host_memory import HUGE_PAGE, HostRegion, HugePageCoverage
from sglang_dsv41.engram_host.rank_group import RankGroup

logger = logging.getLogger(__name__)

COLLAPSE_BELOW = 0.98
NO_HUGE_PAGES_WARNING = ("Engram host table: no huge pages were obtained ({why}); expect ~10x slower lookups "
                         "(one TLB miss per row)")


def shard_range(e: EngramConfig, k: int, rank: int, size: int) -> tuple[int, int]:
    """Rows [lo, hi) of Engram layer k that `rank` of `size` owns (spec model 5.5): whole
    (n-gram size, head) segments when the hash columns divide evenly, else an equal row split."""
    rows = e.num_embeddings[k]
    cols = e.n_hash_cols
    if cols % size == 0:
        offsets = list(e.layout.offsets[k]) + [rows]
        per = cols // size
        return offsets[rank * per], offsets[(rank + 1) * per]
    return rows * rank // size, rows * (rank + 1) // size


@dataclass(frozen=True)
class TableSection:
    layer_id: int
    rows: int
    """Rows of the layer's whole table (config `engram_num_embeddings`)."""
    stored_lo: int
    stored_hi: int
    """Rows [stored_lo, stored_hi) live in this rank's mapping."""
    write_lo: int
    write_hi: int
    """Rows this rank copies from the checkpoint (its shard)."""
    weight_offset: int
    scale_offset: int
    head_dim: int

    @property
    def stored_rows(self) -> int:
        return self.stored_hi - self.stored_lo

    @property
    def row_bytes(self) -> int:
        return self.head_dim + self.head_dim // 32

    @property
    def end(self) -> int:
        return _align(self.scale_offset + self.stored_rows * (self.head_dim // 32))


def _align(n: int) -> int:
    return -(-n // HUGE_PAGE) * HUGE_PAGE


class EngramHostTables:
    def __init__(self, cfg: ModelConfig, layout: str, group: RankGroup = RankGroup(),
                 device: torch.device | str = "cpu"):
        e = cfg.engram
        if e is None:
            raise ValueError("the Engram host table needs a model with Engram layers")
        if layout not in ("shared", "per_rank"):
            raise ValueError(f"unknown Engram host table layout {layout!r}")
        self.cfg, self.layout, self.group, self.device = cfg, layout, group, torch.device(device)
        self.sections: list[TableSection] = []
        offset = 0
        for k, lid in enumerate(e.layer_ids):
            lo, hi = shard_range(e, k, group.rank, group.size)
            stored = (0, e.num_embeddings[k]) if layout == "shared" else (lo, hi)
            n = stored[1] - stored[0]
            sec = TableSection(lid, e.num_embeddings[k], *stored, lo, hi, offset, _align(offset + n * e.head_dim), e.head_dim)
            self.sections.append(sec)
            offset = sec.end
        if layout == "shared":
            handle = None
            if group.rank == 0:
                self.region = HostRegion(offset, shared=True)
                handle = self.region.handle
            handle = group.broadcast(handle)
            if group.rank != 0:
                self.region = HostRegion(offset, shared=True, attach=handle)
            group.barrier()  # every rank has mapped (and madvised) before any rank writes
        else:
            self.region = HostRegion(offset, shared=False)
            self.region.prefault()
        self.coverage: HugePageCoverage | None = None

    # ------------------------------------------------------------------ views
    def weight(self, k: int) -> torch.Tensor:
        """float8_e4m3fn [stored_rows, head_dim] view of layer k's rows in host memory."""
        s = self.sections[k]
        return self._view(s.weight_offset, s.stored_rows, s.head_dim).view(torch.float8_e4m3fn)

    def scale(self, k: int) -> torch.Tensor:
        """float8_e8m0fnu [stored_rows, head_dim / 32] view of layer k's scales in host memory."""
        s = self.sections[k]
        return self._view(s.scale_offset, s.stored_rows, s.head_dim // 32).view(torch.float8_e8m0fnu)

    def _view(self, offset: int, rows: int, width: int) -> torch.Tensor:
        return self.region.tensor[offset : offset + rows * width].view(rows, width)

    # ------------------------------------------------------------------ sizes
    @property
    def mapped_bytes(self) -> int:
        """Bytes of this rank's mapping (for `shared`: the node's one copy)."""
        return self.region.nbytes

    @property
    def device_bytes_freed(self) -> int:
        """Bytes this rank's device would hold for the tables under the default placement (its
        row shard of every layer, rows + scales): what the host table gives to the KV cache."""
        return sum((s.write_hi - s.write_lo) * s.row_bytes for s in self.sections)

    # ------------------------------------------------------------------ loading
    def write_rows(self, k: int, part: str, rows: torch.Tensor, start: int = 0) -> int:
        """Copy checkpoint rows [start, start + len(rows)) of layer k's `part` ('weight' e4m3 /
        'scale' e8m0, any device) into the mapping, only the rows this rank writes. Returns rows copied."""
        s = self.sections[k]
        lo, hi = max(start, s.write_lo), min(start + rows.size(0), s.write_hi)
        if hi <= lo:
            return 0
        dst = (self.weight(k) if part == "weight" else self.scale(k))[lo - s.stored_lo : hi - s.stored_lo]
        dst.view(torch.uint8).copy_(rows[lo - start : hi - start].view(torch.uint8))
        return hi - lo

    def finish_load(self) -> HugePageCoverage:
        """After every rank wrote its rows: barrier, huge-page coverage, pin for the GPU."""
        self.group.barrier()
        cov = self.region.huge_page_bytes()
        if self.layout == "per_rank" and cov.fraction < COLLAPSE_BELOW and self.region.collapse():
            cov = self.region.huge_page_bytes()
        if cov.huge_bytes == 0:
            why = "shmem_enabled" if self.layout == "shared" else "enabled"
            logger.warning(NO_HUGE_PAGES_WARNING.format(why=f"see /sys/kernel/mm/transparent_hugepage/{why}"))
        self.region.pin(self.device)
        self.coverage = cov
        return cov
