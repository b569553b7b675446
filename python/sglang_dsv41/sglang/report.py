"""The startup report: one log block with the layer-role table, KV bytes and pool sizes."""

from __future__ import annotations

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.runtime.pools import KVPools


def startup_report(cfg: ModelConfig, num_slots: int, num_req_slots: int, page_size: int, max_context: int,
                   engram_host=None) -> str:
    """`engram_host`: the `EngramHostPlacement` when the Engram tables live in host memory (its block follows)."""
    b = KVPools.bytes_per_token(cfg)
    W = cfg.attention.window_size
    window_req = cfg.window_kv_bytes_per_token * cfg.num_layers * W
    pool_bytes = b["total"] * num_slots + KVPools.bytes_per_request_slot(cfg) * num_req_slots
    lines = [
        "DeepSeek-V4.1 (sglang-dsv41) serving report",
        f"  layers {cfg.num_layers}, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, window {W}",
        "  layer roles:",
        *("    " + r.describe() for r in cfg.layer_roles),
        "  KV bytes per context token:",
        f"    compressed KV + index keys (KV sources, prefix-cacheable): {b['compressed']:g} B",
        f"    FP8 window KV, kept for every cached token ({cfg.window_kv_bytes_per_token} B x {cfg.num_layers} layers): "
        f"{b['window']:g} B",
        f"    total held per token slot: {b['total']:g} B",
        f"  window KV a request needs (last {W} tokens x {cfg.num_layers} layers): {window_req} B",
        f"  ratio-2 pending state per request slot: {KVPools.bytes_per_request_slot(cfg)} B",
        f"  pools: {num_slots} token slots (page {page_size}), {num_req_slots} request slots, "
        f"{pool_bytes / 2**20:.1f} MiB",
        f"  max context tokens: {max_context}",
    ]
    if engram_host is not None:
        lines += engram_host.report_lines(b["total"])
    return "\n".join(lines)
