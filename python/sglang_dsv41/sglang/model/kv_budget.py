"""SGLang's KV token budget for DeepSeek-V4.1: from our bytes, with SGLang's generic pool emptied.

SGLang builds a generic MHA KV pool for our class (`num_key_value_heads x head_dim x 2 x layers` per
token slot, 80 KiB for the release config) and sizes `max_total_num_tokens` as free memory divided
by that cell. Our model never reads that pool: its KV lives in `runtime.KVPools`, indexed by SGLang's
token slots. Three hooks (registered in hooks.py) make SGLang's memory plan ours, on every device:

1. `use_no_op_generic_pool` (AROUND `KVCacheConfigurator._resolve_kv_pool_class`, the seam SGLang's
   platforms use to pick a pool class): for our model the MHA pool is SGLang's own
   `NoOpMHATokenToKVPool`. It keeps `size` (the allocator's slots and admission), allocates one
   `[page_size, heads, head_dim]` placeholder per layer and K/V (no per-token bytes) and raises if
   anything writes or reads KV through it.
2. `size_from_our_bytes` (AFTER `pool_configurator.create_memory_pool_configurator`, SGLang's
   factory of one configurator per architecture): for our model the configurator is ours. Its rule
   (`token_budget`): token slots = (available bytes - fixed bytes) / bytes per token slot, in whole
   pages, where bytes per token slot = `KVPools` + the token-id store + the generic pool's per-token
   bytes (0), and fixed bytes = request slots x `KVPools.bytes_per_request_slot` + the generic pool's
   placeholders. SGLang then applies `--max-total-tokens` (the smaller wins), PP sync and the
   request count, as for any model.
3. `allocate_at_load` (AFTER `KVCacheConfigurator.configure`): once SGLang has built its pools, our
   model allocates `KVPools` from their sizes (`DeepseekV41ForCausalLM.allocate_pools`), before any
   warmup forward or CUDA-graph capture.

`token_budget` and `TOKEN_STORE_BYTES` import no SGLang; the hooks import it lazily (scheduler only).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

TOKEN_STORE_BYTES = 8
"""The Engram token-id store (`forward.TokenStore`): one int64 per token slot."""
SGLANG_MAX_REQUESTS_CEILING = 4096
"""SGLang 0.5.23's ceiling on request slots when --max-running-requests is unset
(KVCacheConfigurator.resolve_max_num_reqs): the fixed bytes are charged for that many."""
GENERIC_BYTES_PER_TOKEN = 0
"""Per-token bytes of SGLang's generic pool once it is a NoOpMHATokenToKVPool (placeholders only)."""


def token_budget(available_bytes: int, per_token: float, fixed_bytes: int, page_size: int) -> int:
    """Token slots (whole pages) that fit in `available_bytes` after `fixed_bytes`: the rule our
    configurator gives SGLang when --max-total-tokens is unset (SGLang takes the smaller of the two
    when it is set)."""
    free = available_bytes - fixed_bytes
    return max(int(free // (per_token * page_size)), 0) * page_size


def our_bytes_per_token(cfg, window_rings: bool, speculative: bool = False) -> float:
    """Bytes our model holds per SGLang token slot: `KVPools` (window + compressed KV + index keys;
    with DSPARK the drafter stages' window KV too) and the token-id store."""
    from sglang_dsv41.runtime.pools import KVPools

    return KVPools.bytes_per_token(cfg, window_rings, speculative)["total"] + TOKEN_STORE_BYTES


def _ours(kvc) -> bool:
    from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

    return isinstance(kvc.model, DeepseekV41ForCausalLM) and not kvc.is_draft_worker


@functools.cache
def _no_op_pool_class():
    """SGLang's NoOpMHATokenToKVPool without KV copy: it holds no KV, so there is nothing to move between
    slots, and SGLang turns the copy on for speculative decoding, whose warmup launches a Triton kernel
    (no device on our CPU platform)."""
    from sglang.srt.mem_cache.memory_pool import NoOpMHATokenToKVPool

    class Dsv41GenericPool(NoOpMHATokenToKVPool):
        def __init__(self, *args, **kwargs):
            kwargs["enable_kv_cache_copy"] = False
            super().__init__(*args, **kwargs)

    return Dsv41GenericPool


def use_no_op_generic_pool(original, kvc, *args, kind=None, default=None, **kwargs):
    """AROUND hook on KVCacheConfigurator._resolve_kv_pool_class(self, *, kind, default) -> type."""
    if kind == "mha" and _ours(kvc):
        return _no_op_pool_class()
    return original(kvc, *args, kind=kind, default=default, **kwargs)


def generic_placeholder_bytes(kvc) -> int:
    """Bytes of the NoOp pool's placeholders: one [page, heads, head_dim] tensor per layer for K
    and for V (what `NoOpMHATokenToKVPool._create_buffers` allocates)."""
    from sglang.srt.runtime_context import get_parallel

    mc, par = kvc.model_config, get_parallel()
    heads = mc.get_num_kv_heads(par.attn_tp_size, par.attn_dcp_size)
    item = kvc.kv_cache_dtype.itemsize
    page = kvc.pool_page_size
    return kvc.layer_info.num_effective_layers * page * heads * (mc.head_dim + mc.v_head_dim) * item


@functools.cache
def _configurator_class():
    from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig, MemoryPoolConfigurator

    class Dsv41PoolConfigurator(MemoryPoolConfigurator):
        """coeff = our bytes per token slot (+ the generic pool's, 0); bias = fixed bytes."""

        def __init__(self, per_token: float, fixed_bytes: int, detail: str):
            self.per_token, self.fixed_bytes, self.detail = per_token, fixed_bytes, detail

        def calculate_pool_sizes(self, available_bytes: int, page_size: int):
            tokens = token_budget(available_bytes, self.per_token, self.fixed_bytes, page_size)
            logger.info("sglang-dsv41 KV budget: available %d B, fixed %d B (%s), %g B per token slot, "
                        "page %d -> %d token slots", available_bytes, self.fixed_bytes, self.detail,
                        self.per_token, page_size, tokens)
            return MemoryPoolConfig(max_total_num_tokens=tokens)

        def calculate_pool_sizes_from_max_tokens(self, max_total_num_tokens: int, page_size: int):
            return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens // page_size * page_size)

    return Dsv41PoolConfigurator


def size_from_our_bytes(result, kvc, *args, **kwargs):
    """AFTER hook on pool_configurator.create_memory_pool_configurator(kvc) -> configurator."""
    if not _ours(kvc):
        return result
    if kvc.is_hybrid_swa or kvc.use_mla_backend or kvc.mambaish_config is not None:
        raise RuntimeError("sglang-dsv41: SGLang classified DeepSeek-V4.1 as a hybrid-SWA / MLA / Mamba model; "
                           "our KV budget assumes its plain MHA pool (did SGLang 0.5.23's config rules change?)")
    from sglang.srt.runtime_context import get_schedule

    from sglang_dsv41.runtime.pools import KVPools
    from sglang_dsv41.sglang.model.server_args import swa_replay_modes

    cfg, rings = kvc.model.cfg, swa_replay_modes().encoder
    requested = get_schedule().max_running_requests
    req_slots = max(1, requested // kvc.attn_dp_size) if requested else SGLANG_MAX_REQUESTS_CEILING
    per_req = KVPools.bytes_per_request_slot(cfg, rings)
    placeholders = generic_placeholder_bytes(kvc)
    fixed = (req_slots + 1) * per_req + placeholders  # req_to_token has one row more than requests
    from sglang_dsv41.sglang.model.deepseek_v41 import dspark_enabled

    ours = our_bytes_per_token(cfg, rings, dspark_enabled())
    per_token = ours + GENERIC_BYTES_PER_TOKEN
    detail = (f"{req_slots + 1} request slots x {per_req} B + generic pool placeholders {placeholders} B; "
              f"per token: ours {ours:g} B + generic pool {GENERIC_BYTES_PER_TOKEN} B")
    return _configurator_class()(per_token, fixed, detail)


def allocate_at_load(result, kvc, *args, **kwargs):
    """AFTER hook on KVCacheConfigurator.configure(self, *, pre_model_load_memory) -> result."""
    if not _ours(kvc):
        return result
    pool = result.token_to_kv_pool
    if not isinstance(pool, _no_op_pool_class()):
        raise RuntimeError(f"sglang-dsv41: SGLang built {type(pool).__name__} as the generic KV pool of DeepSeek-V4.1 "
                           "(expected NoOpMHATokenToKVPool); --kv-cache-dtype mxfp8 and --enable-kv-cache-sharding "
                           "pick their own pool: remove them to serve DeepSeek-V4.1")
    kvc.model.allocate_pools(pool, result.req_to_token_pool)
    return result


def generic_pool_facts(pool) -> tuple[str, float, int]:
    """(SGLang class name, bytes per token slot, fixed bytes) of SGLang's generic pool as allocated."""
    held = sum(t.numel() * t.element_size() for t in list(getattr(pool, "k_buffer", [])) + list(getattr(pool, "v_buffer", [])))
    per_token = sum(pool.get_kv_size_bytes()) / max(int(pool.size), 1)
    name = next(c.__name__ for c in type(pool).__mro__ if c.__module__.startswith("sglang."))
    return name, per_token, int(held - per_token * int(pool.size))
