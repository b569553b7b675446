"""Engram tables in host memory (spec model 5.5 mode 2, `SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1`).

    settings.py     the two environment variables, validated
    host_memory.py  the mapping: memfd (shared) or anonymous (per_rank), MADV_HUGEPAGE, smaps coverage,
                    cudaHostRegister
    rank_group.py   broadcast / barrier / integer all-reduce of the tensor-parallel group
    table.py        EngramHostTables: every Engram layer's rows + scales in one region, row shards
    lookup.py       HostEngramTable (the model's table module over host memory) + place_host_tables
    loader.py       streaming rows from safetensors (chunked slices, or an engine's weight iterator)
    prefetch.py     EngramPrefetch: all layers' rows gathered on a side stream at step start
See docs/engram.md. Engine-agnostic: nothing here imports SGLang.
"""

from sglang_dsv41.engram_host.lookup import HostEngramTable, place_host_tables, table_tensor_names
from sglang_dsv41.engram_host.prefetch import EngramPrefetch
from sglang_dsv41.engram_host.rank_group import RankGroup
from sglang_dsv41.engram_host.settings import ENABLE_ENV, LAYOUT_ENV, HostTableSettings, HostTableSettingsError
from sglang_dsv41.engram_host.table import EngramHostTables, shard_range

__all__ = ["ENABLE_ENV", "LAYOUT_ENV", "EngramHostTables", "EngramPrefetch", "HostEngramTable", "HostTableSettings",
           "HostTableSettingsError", "RankGroup", "place_host_tables", "shard_range", "table_tensor_names"]
