"""CPU: each torch twin of dsv41_kernels equals the reference math of sglang_dsv41 bit for bit.
Oracles: Attention.window_kv / compressed_kv, Indexer.keys / queries, layers.indexer.index_scores
and select_topk, layers.sparse_attention.sparse_attention, EngramTable, EngramHasher.hash_windows,
layers.engram.engram_gate (tiny checkpoint layers, random activations)."""

from __future__ import annotations

import pytest
import torch
from kernel_compare import assert_match

from dsv41_kernels import ops
from sglang_dsv41.layers.indexer import index_scores as ref_index_scores
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.quant import index_fp4_nbytes, index_fp4_unpack, kv_fp4_nbytes, kv_fp4_unpack, window_kv_nbytes, window_kv_unpack


def _layer(model, pred):
    return next(b for b in model.layers if pred(b.attn.role))


def _x(model, t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, model.cfg.hidden_size, generator=g).bfloat16()


@pytest.mark.parametrize("seed", [0, 1])
def test_window_kv_store_unpacks_to_attention_window_kv(tiny_model, seed):
    attn = tiny_model.layers[0].attn
    t, d = 37, attn.head_dim
    x = _x(tiny_model, t, seed)
    freqs = attn.rotary.freqs(torch.arange(t) * 5 + seed)
    pool = torch.full((t + 4, window_kv_nbytes(d)), 0xAB, dtype=torch.uint8)
    slots = torch.randperm(t + 4)[:t]
    ops.window_kv_store(attn.wkv(x), attn.kv_norm.weight, attn.kv_norm.eps, *freqs, slots, pool)
    assert_match(window_kv_unpack(pool[slots]), attn.window_kv(x, freqs), what="window kv")
    untouched = torch.ones(t + 4, dtype=torch.bool)
    untouched[slots] = False
    assert bool((pool[untouched] == 0xAB).all())


@pytest.mark.parametrize("seed", [0, 1])
def test_compressed_and_index_key_stores_match_reference(tiny_model, seed):
    attn = _layer(tiny_model, lambda r: r.is_kv_source and r.is_index_source).attn
    x = _x(tiny_model, 24, seed)
    latent = attn.compressor(x)
    n, ratio = latent.size(0), attn.role.compress_ratio
    gfreqs = attn.rotary.freqs(torch.arange(n) * ratio)
    slots = torch.randperm(n + 3)[:n]
    kv_pool = torch.zeros(n + 3, kv_fp4_nbytes(latent.size(1)), dtype=torch.uint8)
    ops.compressed_kv_store(latent, *gfreqs, slots, kv_pool)
    assert_match(kv_fp4_unpack(kv_pool[slots]), attn.compressed_kv(latent, gfreqs), what="compressed kv")
    ix = attn.indexer
    ik_pool = torch.zeros(n + 3, index_fp4_nbytes(ix.head_dim), dtype=torch.uint8)
    ops.index_key_store(ix.k_norm(ix.wk(latent)), *gfreqs, slots, ik_pool)
    want = ix.keys(latent, lambda t: attn.rotary.apply(t, gfreqs))
    assert_match(index_fp4_unpack(ik_pool[slots], torch.bfloat16), want, what="index keys")


def test_index_query_quant_and_paged_scores_match_reference(tiny_model):
    attn = _layer(tiny_model, lambda r: r.is_index_source).attn
    ix, t = attn.indexer, 19
    x = _x(tiny_model, t, 3)
    freqs = attn.rotary.freqs(torch.arange(t))
    qr = attn.q_norm(attn.wq_a(x))
    q = ops.index_query_quant(ix.wq_b(qr).unflatten(-1, (ix.n_heads, ix.head_dim)), *freqs)
    assert_match(q, ix.queries(qr, lambda v: attn.rotary.apply(v, freqs)), what="index queries")
    # keys of 40 positions in shuffled pool slots; row t sees positions < visible[t]
    keys = ix.keys(attn.compressor(_x(tiny_model, 80, 4)), lambda v: v)
    from sglang_dsv41.quant import index_fp4_pack

    slot_of = torch.randperm(45)[:40]
    pool = torch.zeros(45, index_fp4_nbytes(ix.head_dim), dtype=torch.uint8)
    pool[slot_of] = index_fp4_pack(keys)
    visible = torch.randint(0, 41, (t,))
    table = torch.where(torch.arange(40) < visible[:, None], slot_of, -1)
    w = ix.head_weights(x)
    want = ref_index_scores(q, w, keys).float().masked_fill(table < 0, float("-inf"))
    assert_match(ops.index_scores(q, w, pool, table), want, what="paged scores")


def test_topk_select_is_exact_with_lower_position_ties():
    g = torch.Generator().manual_seed(5)
    s = ((torch.randn(4, 300, generator=g) * 2).round() / 2).float()
    s[1, 100:] = float("-inf")
    s[2, 7] = float("nan")
    got = ops.topk_select(s, 64)
    for r in range(4):
        order = sorted((i for i in range(300) if s[r, i] == s[r, i] and s[r, i] > float("-inf")),
                       key=lambda i: (-float(s[r, i]), i))[:64]
        want = sorted(order) + [-1] * (64 - len(order))
        assert got[r].tolist() == want


@pytest.mark.parametrize("w, k", [(128, 64), (70, 130)])
def test_sparse_attention_paged_equals_layer_attention(w, k):
    from sglang_dsv41.quant import kv_fp4_pack, window_kv_pack

    g = torch.Generator().manual_seed(w + k)
    t, h, d = 6, 4, 128
    q = torch.randn(t, h, d, generator=g).bfloat16()
    wpool = window_kv_pack(torch.randn(50, d, generator=g).bfloat16())
    cpool = kv_fp4_pack(torch.randn(60, d, generator=g).bfloat16())
    ws = torch.randint(-1, 50, (t, w), generator=g)
    cs = torch.randint(-1, 60, (t, k), generator=g)
    ws[0], cs[0] = -1, -1
    sink = torch.randn(h, generator=g)
    got = ops.sparse_attention_paged(q, wpool, ws, cpool, cs, sink, d**-0.5)
    kv = torch.cat([window_kv_unpack(wpool), kv_fp4_unpack(cpool)])
    idx = torch.cat([ws, torch.where(cs >= 0, cs + 50, -1)], dim=1)
    assert_match(got, sparse_attention(q, kv, sink, idx, d**-0.5), what="paged attention")


def test_engram_ops_match_reference(tiny_model):
    from sglang_dsv41.engram_hash import EngramHasher
    from sglang_dsv41.layers.engram import engram_gate

    layer = next(b for b in tiny_model.layers if b.engram is not None)
    table = layer.engram.embed
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, table.weight.size(0), (7, 3), generator=g)
    assert_match(ops.engram_gather(table.weight, table.scale, ids), table(ids), what="engram rows")
    hs = EngramHasher(tiny_model.cfg.engram, tiny_model.engram_token_map)
    win = torch.randint(-1, int(hs.token_map.max()) + 1, (50, hs.max_ngram_size), generator=g)
    pos = torch.randint(0, 6, (50,), generator=g)
    got = ops.engram_hash(win, pos, *hs._tables(win.device)[1:], hs.pad_class)
    assert_match(got, hs.hash_windows(win, pos), what="engram hash")
    n, hid = tiny_model.cfg.hc.hc_mult, tiny_model.cfg.hidden_size
    st = torch.randn(5, n, hid, generator=g).bfloat16()
    kv = torch.randn(5, (n + 1) * hid, generator=g).bfloat16()
    e = layer.engram
    assert_match(ops.engram_gate(st, kv, e.q_weight, e.k_weight, e.eps), engram_gate(st, kv, e.q_weight, e.k_weight, e.eps))
