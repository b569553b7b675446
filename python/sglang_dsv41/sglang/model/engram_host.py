"""SGLang wiring of the Engram host table (`SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1`, docs/engram.md).

`DeepseekV41ForCausalLM` builds an `EngramHostPlacement` at construction (the variables are
validated there, so a bad value stops the server at startup naming the variable), and in
`load_weights`:
    weights = placement.stream(weights)        table tensors -> host memory (one tensor at a time),
                                               the rest pass through unchanged
    tensors.update(placement.placeholders())   table headers for the schema check
    tensors = placement.install(model, tensors) EngramTables swapped for HostEngramTables; table
                                               names leave the state dict
    placement.finish(model)                    after the token map: pin, coverage, prefetch
`report_lines(bytes_per_token)` is the startup report's block (moved bytes, KV tokens gained).
"""

from __future__ import annotations

import logging
from typing import Iterable, Iterator

import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_host.loader import TableSink
from sglang_dsv41.engram_host.lookup import HostEngramTable, place_host_tables, table_tensor_names
from sglang_dsv41.engram_host.prefetch import EngramPrefetch
from sglang_dsv41.engram_host.rank_group import RankGroup
from sglang_dsv41.engram_host.settings import HostTableSettings
from sglang_dsv41.engram_host.table import EngramHostTables

logger = logging.getLogger(__name__)

DEFAULT_STAGING_TOKENS = 8192


def _tp_group() -> RankGroup:
    try:
        from sglang.srt.distributed import get_tp_group

        tp = get_tp_group()
    except (ImportError, AssertionError, AttributeError):  # no model-parallel state (single process)
        return RankGroup()
    if tp.world_size == 1:
        return RankGroup()
    return RankGroup.from_torch(tp.device_group, tp.cpu_group)


def _staging_tokens() -> int:
    """Rows one forward can carry: a prefill chunk plus the running decode rows (mixed chunks)."""
    try:
        from sglang.srt.runtime_context import get_schedule

        s = get_schedule()
        chunk = int(s.chunked_prefill_size or 0)
        return (chunk if chunk > 0 else DEFAULT_STAGING_TOKENS) + int(s.max_running_requests or 0)
    except Exception:  # schedule not published in this process (e.g. a bare model build)
        return DEFAULT_STAGING_TOKENS


class EngramHostPlacement:
    def __init__(self, cfg: ModelConfig, settings: HostTableSettings, device: torch.device):
        self.cfg, self.settings, self.device = cfg, settings, torch.device(device)
        self.tables: EngramHostTables | None = None
        self.sink: TableSink | None = None
        self.modules: list[HostEngramTable] = []
        self.prefetch: EngramPrefetch | None = None

    @staticmethod
    def from_env(cfg: ModelConfig, device: torch.device) -> "EngramHostPlacement | None":
        """None when the variable is off or the model has no Engram; raises naming a bad variable."""
        settings = HostTableSettings.from_env()
        if not settings.enabled:
            return None
        if cfg.engram is None:
            logger.warning("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1 but this model has no Engram layers; ignored")
            return None
        return EngramHostPlacement(cfg, settings, device)

    def stream(self, weights: Iterable[tuple[str, torch.Tensor]], where: str = "the checkpoint") -> Iterator[tuple[str, torch.Tensor]]:
        self.tables = EngramHostTables(self.cfg, self.settings.layout, _tp_group(), self.device)
        self.sink = TableSink(self.tables, where)
        return self.sink.filter(weights)

    def placeholders(self) -> dict[str, torch.Tensor]:
        return self.sink.placeholders()

    def install(self, model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.modules = place_host_tables(model, self.tables)
        names = table_tensor_names(self.cfg)
        return {n: t for n, t in tensors.items() if n not in names}

    def finish(self, model) -> None:
        """After every rank wrote its rows and the hasher exists: pin, report coverage, prefetch."""
        cov = self.tables.finish_load()
        logger.info("Engram host table (%s): %.1f MiB mapped, huge pages %.0f%%", self.settings.layout,
                    self.tables.mapped_bytes / 2**20, 100 * cov.fraction)
        self.prefetch = EngramPrefetch(self.modules, _staging_tokens(), self.device).attach(model)

    def report_lines(self, bytes_per_token: float) -> list[str]:
        t = self.tables
        cov = t.coverage
        gained = int(t.device_bytes_freed // bytes_per_token) if bytes_per_token else 0
        return [
            f"  Engram host table ({ENABLE_LINE}, layout {t.layout}, rank {t.group.rank} of {t.group.size}):",
            f"    tables in host memory: {t.mapped_bytes} B mapped ({'one copy per node' if t.layout == 'shared' else 'this rank only'}), "
            f"huge pages {cov.huge_bytes if cov else 0} B ({100 * (cov.fraction if cov else 0):.0f}%), "
            f"pinned for the GPU: {'yes' if self.device.type == 'cuda' else 'no (CPU)'}",
            f"    device memory freed ({self.device.type}): {t.device_bytes_freed} B of Engram rows + scales = "
            f"{gained} more KV tokens at {bytes_per_token:g} B per token slot",
            f"    prefetch staging on {self.device.type}: {self.prefetch.staging_bytes if self.prefetch else 0} B "
            f"({self.prefetch.max_tokens if self.prefetch else 0} tokens)",
        ]


ENABLE_LINE = "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1"
