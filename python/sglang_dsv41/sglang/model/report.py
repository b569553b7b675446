"""The startup report: one log block with the layer-role table, KV bytes, pool sizes and the SWA
bounded-replay modes (with the prefix-cache capacity each placement of the window KV gives)."""

from __future__ import annotations

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.runtime.pools import KVPools


def startup_report(cfg: ModelConfig, num_slots: int, num_req_slots: int, page_size: int, max_context: int,
                   engram_host=None, replay=None, generic_pool=None, speculative: bool = False) -> str:
    """`engram_host`: the `EngramHostPlacement` when the Engram tables live in host memory (its block
    follows). `replay`: the resolved `ReplayModes` (None: both off). `generic_pool`: (class name, bytes
    per token slot, fixed bytes) of SGLang's generic KV pool as allocated (kv_budget.generic_pool_facts).
    `speculative`: --speculative-algorithm DSPARK (the drafter's stages and their window KV are listed)."""
    rings = bool(replay and replay.encoder)
    b = KVPools.bytes_per_token(cfg, window_rings=rings, speculative=speculative)
    W = cfg.attention.window_size
    per_req = KVPools.bytes_per_request_slot(cfg, window_rings=rings)
    pool_bytes = b["total"] * num_slots + per_req * num_req_slots
    slots_b = KVPools.bytes_per_token(cfg)["total"]
    rings_b = KVPools.bytes_per_token(cfg, window_rings=True)["total"]
    ring_req = KVPools.bytes_per_request_slot(cfg, True) - KVPools.bytes_per_request_slot(cfg)
    budget = pool_bytes  # what these pools take: the cacheable prefix tokens it buys either way
    lines = [
        "DeepSeek-V4.1 (sglang-dsv41) serving report",
        f"  layers {cfg.num_layers}, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, window {W}",
        "  layer roles:",
        *("    " + r.describe() for r in cfg.layer_roles),
        "  SWA bounded replay:",
        f"    decoder (tail-only prefill from layer {cfg.late_layer_start}): {'on' if replay and replay.decoder else 'off'}",
        f"    encoder (window KV in request rings, rebuilt on prefix hits): {'on' if rings else 'off'}",
        "  KV bytes per cached token:",
        f"    compressed KV + index keys (KV sources, prefix-cacheable): {b['compressed']:g} B",
        f"    FP8 window KV ({cfg.window_kv_bytes_per_token} B x {cfg.num_layers} layers"
        f"{f' + {cfg.dspark.n_stages} drafter stage(s)' if speculative else ''}): "
        + ("none (request rings)" if rings else f"{b['window']:g} B, kept for every cached token"),
        f"    total per cached token: {b['total']:g} B (encoder replay off: {slots_b:g} B, on: {rings_b:g} B)",
        f"  window ring per request slot (last {W} tokens x {cfg.num_layers} layers): {ring_req} B"
        + ("" if rings else " (not allocated: encoder replay off)"),
        f"  fixed bytes per request slot (ratio-2 pending pair{', ring' if rings else ''}): {per_req} B",
        f"  pools: {num_slots} token slots (page {page_size}), {num_req_slots} request slots, "
        f"{pool_bytes / 2**20:.1f} MiB",
        f"  cacheable prefix tokens for these {budget / 2**20:.1f} MiB: encoder replay off "
        f"{int(budget // slots_b)}, on {int(max(budget - ring_req * num_req_slots, 0) // rings_b)} "
        f"(per GiB: {int(2**30 // slots_b)} vs {int(2**30 // rings_b)})",
        f"  max context tokens: {max_context}",
    ]
    if speculative:
        ds = cfg.dspark
        lines += [
            f"  DSPARK drafter (checkpoint mtp.*): {ds.n_stages} window-only stage(s), reading the stream mean before "
            f"layers {list(ds.target_layer_ids)}; gamma {ds.block_size} drafts, chain verify of {ds.block_size + 1} "
            f"rows per request",
        ]
    if generic_pool is not None:
        name, per_token, fixed = generic_pool
        lines.append(f"  SGLang generic KV pool ({name}, never read): {per_token:g} B per token slot, {fixed} B fixed")
    if engram_host is not None:
        lines += engram_host.report_lines(b["total"])
    return "\n".join(lines)
