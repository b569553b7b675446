"""kv_budget.py without a server: the token-budget rule by hand, the pool-class choice for our model only,
the load-time check of the pool SGLang built, and the generic pool's bytes measured on SGLang's own
NoOpMHATokenToKVPool. The server test (test/server/test_kv_budget_server.py) checks the same on a live
scheduler."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.sglang.model import kv_budget
from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM


def test_token_budget_by_hand():
    # (10_000 - 1_000) // (100 x 8) = 11 pages of 8 tokens
    assert kv_budget.token_budget(10_000, 100, 1_000, 8) == 88
    assert kv_budget.token_budget(10_000, 100.5, 0, 1) == 99  # fractional bytes per token (ratio-2 compressed KV)
    assert kv_budget.token_budget(1_000, 100, 2_000, 8) == 0  # fixed bytes exceed the budget: SGLang then refuses
    # release config, 100 GiB, 2049 request rows x 12 KiB + 5 MiB placeholders
    assert kv_budget.token_budget(100 * 2**30, 22018, 2049 * 12288 + 5 * 2**20, 64) == 4875264


def _kvc(model):
    return SimpleNamespace(model=model, is_draft_worker=False)


def _ours():
    return DeepseekV41ForCausalLM.__new__(DeepseekV41ForCausalLM)  # no __init__: only the type matters here


def test_no_op_pool_for_our_model_only():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, NoOpMHATokenToKVPool

    original = lambda kvc, *, kind, default: default  # noqa: E731 (SGLang's answer: the in-tree default)
    hook = kv_budget.use_no_op_generic_pool
    ours = hook(original, _kvc(_ours()), kind="mha", default=MHATokenToKVPool)
    assert issubclass(ours, NoOpMHATokenToKVPool) and ours is hook(original, _kvc(_ours()), kind="mha", default=None)
    # no KV copy (its warmup is a Triton kernel), also where SGLang asks for it (speculative decoding)
    assert _pool(ours, enable_kv_cache_copy=True)._kv_copy_config is None
    assert hook(original, _kvc(_ours()), kind="mla", default=MLATokenToKVPool) is MLATokenToKVPool
    assert hook(original, _kvc(torch.nn.Linear(1, 1)), kind="mha", default=MHATokenToKVPool) is MHATokenToKVPool
    draft = SimpleNamespace(model=_ours(), is_draft_worker=True)
    assert hook(original, draft, kind="mha", default=MHATokenToKVPool) is MHATokenToKVPool


def _pool(cls, size=128, layers=2, **kwargs):
    return cls(size, page_size=64, dtype=torch.bfloat16, head_num=1, head_dim=128, v_head_dim=128, layer_num=layers,
               device="cpu", enable_memory_saver=False, start_layer=0, end_layer=layers, **kwargs)


def test_generic_pool_bytes_measured():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, NoOpMHATokenToKVPool

    # no-op: 2 layers x (K + V) x [64, 1, 128] bf16 placeholders, nothing per token
    assert kv_budget.generic_pool_facts(_pool(NoOpMHATokenToKVPool)) == ("NoOpMHATokenToKVPool", 0, 2 * 2 * 64 * 128 * 2)
    name, per_token, _ = kv_budget.generic_pool_facts(_pool(MHATokenToKVPool))
    assert name == "MHATokenToKVPool" and per_token >= 2 * 2 * 128 * 2  # what the no-op pool saves


def test_load_time_allocation_refuses_another_pool():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    result = SimpleNamespace(token_to_kv_pool=_pool(MHATokenToKVPool), req_to_token_pool=None)
    with pytest.raises(RuntimeError, match="expected NoOpMHATokenToKVPool"):
        kv_budget.allocate_at_load(result, _kvc(_ours()))
    other = _kvc(torch.nn.Linear(1, 1))
    assert kv_budget.allocate_at_load(result, other) is result
