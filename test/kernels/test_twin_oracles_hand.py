"""CPU: each torch twin of dsv41_kernels equals the reference math of sglang_dsv41 bit for bit.

The twins are the kernel package's own implementation (it imports nothing from `layers`); every
test compares a twin with something else:
  stores, index queries   the layer functions composed as the reference does: layers.norm.rms_norm,
                          layers.rope.apply_rope, then the quant round trips (tiny-model weights)
  index_scores            layers.indexer.index_scores (dense keys), -inf where not visible
  topk_select             layers.indexer.select_topk, a plain-Python sort, and hand-worked rows
  candidate_blocks        layers.indexer.select_candidate_blocks and hand-worked rows
  sparse_attention_paged  layers.sparse_attention.sparse_attention over the dequantized pools, and a
                          hand-worked single-key case
  engram_gather           EngramTable (the layer) and a hand decode of the E4M3 / UE8M0 bytes
  engram_gate             layers.engram.engram_gate and hand-worked gates
  engram_hash             EngramHasher.hash_windows
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_compare import assert_match

from dsv41_kernels import ops
from sglang_dsv41.layers.engram import engram_gate as ref_engram_gate
from sglang_dsv41.layers.indexer import index_scores as ref_index_scores
from sglang_dsv41.layers.indexer import select_candidate_blocks, select_topk
from sglang_dsv41.layers.norm import rms_norm
from sglang_dsv41.layers.rope import apply_rope
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.quant import (
    index_fp4_nbytes,
    index_fp4_pack,
    index_fp4_qdq,
    index_fp4_unpack,
    kv_fp4_nbytes,
    kv_fp4_pack,
    kv_fp4_qdq,
    kv_fp4_unpack,
    window_kv_nbytes,
    window_kv_pack,
    window_kv_qdq,
    window_kv_unpack,
)

NAN, INF = float("nan"), float("inf")


def _layer(model, pred):
    return next(b for b in model.layers if pred(b.attn.role))


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(n: int, d: int, seed: int) -> torch.Tensor:
    """bf16 [n, d] with per-row scales over 1e-3..1e2 and, for n >= 4, a zero row and a huge row."""
    g = _g(seed)
    x = torch.randn(n, d, generator=g) * torch.pow(10.0, torch.rand(n, 1, generator=g) * 5 - 3)
    if n >= 4:
        x[1] = 0
        x[2] *= 1e4
    return x.bfloat16()


def _untouched(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    keep = torch.ones(pool.size(0), dtype=torch.bool)
    keep[slots[slots >= 0]] = False
    return pool[keep]


# ------------------------------------------------------------------ cache stores, index queries
@pytest.mark.parametrize("seed", [0, 1])
def test_window_kv_store_equals_norm_rope_mxfp8(tiny_model, seed):
    attn = tiny_model.layers[0].attn
    t, d = 37, attn.head_dim
    kv = _rows(t, d, seed)
    cos, sin = attn.rotary.freqs(torch.arange(t) * 5 + seed)
    pool = torch.full((t + 4, window_kv_nbytes(d)), 0xAB, dtype=torch.uint8)
    slots = torch.randperm(t + 4, generator=_g(seed))[:t]
    slots[3] = -1  # not written
    ops.window_kv_store(kv, attn.kv_norm.weight, attn.kv_norm.eps, cos, sin, slots, pool)
    want = window_kv_qdq(apply_rope(rms_norm(kv, attn.kv_norm.weight, attn.kv_norm.eps), cos, sin))
    w = slots >= 0
    assert_match(window_kv_unpack(pool[slots[w]]), want[w], what="window kv")
    assert bool((_untouched(pool, slots) == 0xAB).all())


@pytest.mark.parametrize("seed", [0, 1])
def test_compressed_and_index_key_stores_equal_rope_fp4(tiny_model, seed):
    attn = _layer(tiny_model, lambda r: r.is_kv_source and r.is_index_source).attn
    n, ratio = 24, attn.role.compress_ratio
    latent = _rows(n, attn.head_dim, seed + 10)
    cos, sin = attn.rotary.freqs(torch.arange(n) * ratio)
    slots = torch.randperm(n + 3, generator=_g(seed))[:n]
    slots[0] = -1
    w = slots >= 0
    kv_pool = torch.full((n + 3, kv_fp4_nbytes(latent.size(1))), 0x5C, dtype=torch.uint8)
    ops.compressed_kv_store(latent, cos, sin, slots, kv_pool)
    assert_match(kv_fp4_unpack(kv_pool[slots[w]]), kv_fp4_qdq(apply_rope(latent, cos, sin))[w], what="compressed kv")
    assert bool((_untouched(kv_pool, slots) == 0x5C).all())
    ix = attn.indexer
    k = ix.k_norm(ix.wk(latent))
    ik_pool = torch.zeros(n + 3, index_fp4_nbytes(ix.head_dim), dtype=torch.uint8)
    ops.index_key_store(k, cos, sin, slots, ik_pool)
    want = index_fp4_qdq(apply_rope(k, cos, sin))
    assert_match(index_fp4_unpack(ik_pool[slots[w]], torch.bfloat16), want[w], what="index keys")


def test_index_query_quant_equals_rope_fp4(tiny_model):
    attn = _layer(tiny_model, lambda r: r.is_index_source).attn
    ix, t = attn.indexer, 19
    cos, sin = attn.rotary.freqs(torch.arange(t) * 3 + 1)
    q = _rows(t * ix.n_heads, ix.head_dim, 3).unflatten(0, (t, ix.n_heads))
    assert_match(ops.index_query_quant(q, cos, sin), index_fp4_qdq(apply_rope(q, cos, sin)), what="index queries")


def test_twin_rope_hand_worked_and_equal_to_layer_rope():
    """Hand-worked: the last pair of (1, 2, 3, 5) rotated by 90 degrees gives (1, 2, -5, 3); then the
    twin's RoPE equals layers.rope.apply_rope on [T, d] and [T, h, d], bf16 and fp32."""
    from dsv41_kernels.twin_math import rope_last_dims

    x = torch.tensor([[1.0, 2.0, 3.0, 5.0]], dtype=torch.bfloat16)
    got = rope_last_dims(x, torch.tensor([[0.0]]), torch.tensor([[1.0]]))
    assert got.dtype == torch.bfloat16 and got.tolist() == [[1.0, 2.0, -5.0, 3.0]]
    g = _g(2)
    angles = torch.rand(9, 16, generator=g) * 100
    cos, sin = torch.cos(angles), torch.sin(angles)
    for shape in ((9, 40), (9, 3, 32)):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(*shape, generator=g).to(dtype)
            assert_match(rope_last_dims(x, cos, sin), apply_rope(x, cos, sin), what=f"rope {shape} {dtype}")


def test_index_scores_paged_equal_dense_scores(tiny_model):
    attn = _layer(tiny_model, lambda r: r.is_index_source).attn
    ix, t = attn.indexer, 19
    x = _rows(t, tiny_model.cfg.hidden_size, 3)
    q = index_fp4_qdq(_rows(t * ix.n_heads, ix.head_dim, 4).unflatten(0, (t, ix.n_heads)))
    keys = index_fp4_qdq(_rows(40, ix.head_dim, 5))
    slot_of = torch.randperm(45, generator=_g(6))[:40]
    pool = torch.zeros(45, index_fp4_nbytes(ix.head_dim), dtype=torch.uint8)
    pool[slot_of] = index_fp4_pack(keys)
    visible = torch.randint(0, 41, (t,), generator=_g(7))
    table = torch.where(torch.arange(40) < visible[:, None], slot_of, -1)
    w = ix.head_weights(x)
    want = ref_index_scores(q, w, keys).float().masked_fill(table < 0, -INF)
    assert_match(ops.index_scores(q, w, pool, table), want, what="paged scores")


# ------------------------------------------------------------------ top-k
def _python_topk(row: list[float], k: int) -> list[int]:
    ok = [i for i, v in enumerate(row) if v == v and v > -INF]
    best = sorted(ok, key=lambda i: (-row[i], i))[:k]
    return sorted(best) + [-1] * (min(k, len(row)) - len(best))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_select_equals_reference(dtype):
    g = _g(5)
    s = ((torch.randn(6, 300, generator=g) * 2).round() / 2).to(dtype)  # many ties
    s[1, 100:] = -INF
    s[2, 7], s[2, 50], s[2, 51] = NAN, INF, INF
    s[3] = -INF
    s[4, ::3] = -0.0
    s[5] = 0.0
    for k in (0, 1, 64, 299, 300, 512):
        got = ops.topk_select(s, k)
        assert_match(got, select_topk(s, k), what=f"topk k={k}")
        assert got.tolist() == [_python_topk(r, k) for r in s.float().tolist()]


def test_topk_select_fp32_distinct_and_negative():
    s = torch.randn(4, 5000, generator=_g(8)) - 3  # all negative, fp32
    assert_match(ops.topk_select(s, 512), select_topk(s, 512), what="topk fp32")


@pytest.mark.parametrize("row, k, want", [
    ([1.0, 3.0, 3.0, 2.0, 3.0], 2, [1, 2]),               # tie among three 3.0: the lower positions
    ([3.0, 1.0, 3.0, 2.0, 3.0], 3, [0, 2, 4]),
    ([NAN, -INF, 5.0, -INF, NAN], 3, [2, -1, -1]),          # NaN / -inf never chosen, -1 padding
    ([-INF, -INF, -INF], 2, [-1, -1]),
    ([-0.0, 0.0, -1.0], 1, [0]),                          # -0 == +0: the lower position
    ([0.0, -0.0, -1.0], 1, [0]),
    ([INF, 1.0, INF], 2, [0, 2]),                          # +inf is a score like any other
    ([-1.0, -3.0, -2.0], 2, [0, 2]),
    ([2.0, 1.0], 4, [0, 1]),                              # k > n: n columns
    ([1.0, 2.0, 3.0], 0, []),
    ([1e-45, -1e-45, 0.0, 1e-44], 2, [0, 3]),             # subnormals ordered by value
])
def test_topk_select_hand_worked(row, k, want):
    got = ops.topk_select(torch.tensor([row], dtype=torch.float32), k)
    assert got.dtype == torch.int32 and got.tolist() == [want]


# ------------------------------------------------------------------ candidate blocks
def test_candidate_blocks_equal_reference():
    g = _g(11)
    t, n, bs = 8, 203, 8
    s = ((torch.randn(t, n, generator=g) * 2).round() / 2).float()
    visible = torch.tensor([203, 150, 1, 0, 64, 65, 203, 17])
    s = s.masked_fill(torch.arange(n) >= visible[:, None], -INF)
    s[6, 10], s[6, 30], s[6, 100] = NAN, INF, -0.0
    s[7, 3] = NAN
    for kb in (1, 2, 5, 26, 30):
        assert_match(ops.candidate_blocks(s, visible, kb, bs), select_candidate_blocks(s, visible, kb, bs),
                     what=f"candidates kb={kb}")
    assert_match(ops.candidate_blocks(s[:, :0], visible * 0, 4, bs), select_candidate_blocks(s[:, :0], visible * 0, 4, bs))


def _mask(blocks: list[int], n: int = 10, bs: int = 4) -> list[bool]:
    return [j // bs in blocks for j in range(n)]


@pytest.mark.parametrize("row, visible, kb, want_blocks", [
    # n = 10, block_size 4: blocks {0-3}, {4-7}, {8-9}
    ([1, 9, 0, 0, 5, 5, 5, 5, 0, 0], 10, 2, [0, 2]),           # newest block 2 pinned, then the max 9
    ([4, 0, 0, 0, 0, 4, 0, 0, 7, -INF], 9, 2, [0, 2]),        # blocks 0 and 1 tie at 4: the lower block
    ([9, 9, 9, 9, 1, -INF, -INF, -INF, -INF, -INF], 5, 1, [1]),  # pinned beats a higher block
    ([-INF] * 10, 0, 2, []),                                  # nothing visible: nothing kept
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 10, 5, [0, 1, 2]),      # kb >= blocks: all kept
    ([1, NAN, 0, 0, 5, 5, 5, 5, 0, 0], 10, 2, [2]),           # a NaN block ranks first and is never kept
    ([1, 2, -INF, -INF, -INF, -INF, -INF, -INF, -INF, -INF], 2, 3, [0]),  # -inf blocks never kept
])
def test_candidate_blocks_hand_worked(row, visible, kb, want_blocks):
    got = ops.candidate_blocks(torch.tensor([row], dtype=torch.float32), torch.tensor([visible]), kb, 4)
    assert got.dtype == torch.bool and got.tolist() == [_mask(want_blocks)]


# ------------------------------------------------------------------ attention
@pytest.mark.parametrize("w, k", [(128, 64), (70, 130), (5, 0)])
def test_sparse_attention_paged_equals_layer_attention(w, k):
    g = _g(w + k)
    t, h, d = 6, 4, 128
    q = torch.randn(t, h, d, generator=g).bfloat16()
    wpool = window_kv_pack(torch.randn(50, d, generator=g).bfloat16())
    cpool = kv_fp4_pack(torch.randn(60, d, generator=g).bfloat16())
    wpool[0], cpool[0] = 0x7F, 0xFF  # NaN rows: only ever gathered for -1 slots, which must not reach the sums
    ws = torch.randint(0, 50, (t, w), generator=g)
    cs = torch.randint(0, 60, (t, k), generator=g)
    ws[ws == 0], cs[cs == 0] = -1, -1
    ws[0], cs[0] = -1, -1  # a row with no valid key -> zeros
    sink = torch.randn(h, generator=g)
    got = ops.sparse_attention_paged(q, wpool, ws, cpool, cs if k else None, sink, d**-0.5)
    kv = torch.cat([window_kv_unpack(wpool), kv_fp4_unpack(cpool)])
    idx = torch.cat([ws, torch.where(cs >= 0, cs + 50, -1)], dim=1)
    assert_match(got, sparse_attention(q, kv, sink, idx, d**-0.5), what="paged attention")
    assert bool((got[0] == 0).all())


def test_sparse_attention_single_key_hand_worked():
    """One valid key and sink = -inf: p = exp(0) = 1, so every head's output is that key (on the
    MXFP8 grid); -1 slots around it contribute nothing."""
    d, h = 64, 3
    key = torch.linspace(-2, 2, d).bfloat16()
    wpool = window_kv_pack(torch.stack([torch.zeros(d), key.float()]).bfloat16())
    want = window_kv_unpack(wpool[1:2])[0]
    q = torch.randn(2, h, d, generator=_g(1)).bfloat16()
    ws = torch.tensor([[-1, 1, -1], [1, -1, -1]])
    got = ops.sparse_attention_paged(q, wpool, ws, None, None, torch.full((h,), -INF), 0.125)
    assert got.shape == (2, h, d) and got.dtype == torch.bfloat16
    assert torch.equal(got, want.expand(2, h, d))


# ------------------------------------------------------------------ Engram
def _e4m3_by_hand(b: int) -> float:
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 0x7
    if e == 0xF and m == 0x7:
        return NAN
    return sign * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def test_engram_gather_equals_hand_decode():
    g = _g(9)
    rows, hd = 40, 64
    wbytes = torch.randint(0, 256, (rows, hd), generator=g, dtype=torch.uint8)
    sbytes = torch.randint(100, 150, (rows, hd // 32), generator=g, dtype=torch.uint8)
    sbytes[0, 0], sbytes[1, 1], sbytes[2, 0] = 0, 255, 254  # 2^-127, NaN, 2^127 (overflows to inf)
    ids = torch.randint(0, rows, (7, 3), generator=g)
    ids[0, :] = torch.tensor([0, 1, 2])
    got = ops.engram_gather(wbytes.view(torch.float8_e4m3fn), sbytes.view(torch.float8_e8m0fnu), ids)
    vals = torch.tensor([[_e4m3_by_hand(b) for b in r] for r in wbytes.tolist()], dtype=torch.float64)
    scale = torch.tensor([[NAN if e == 255 else 2.0 ** (e - 127) for e in r] for r in sbytes.tolist()], dtype=torch.float64)
    want = (vals * scale.repeat_interleave(32, dim=-1))[ids].to(torch.float32).to(torch.bfloat16)  # exact in fp32
    assert_match(got, want, what="engram rows by hand")


def test_engram_ops_match_reference(tiny_model):
    from sglang_dsv41.engram_hash import EngramHasher

    layer = next(b for b in tiny_model.layers if b.engram is not None)
    table = layer.engram.embed
    g = _g(9)
    ids = torch.randint(0, table.weight.size(0), (7, 3), generator=g)
    assert_match(ops.engram_gather(table.weight, table.scale, ids), table(ids), what="engram rows")
    hs = EngramHasher(tiny_model.cfg.engram, tiny_model.engram_token_map)
    win = torch.randint(-1, int(hs.token_map.max()) + 1, (50, hs.max_ngram_size), generator=g)
    pos = torch.randint(0, 6, (50,), generator=g)
    got = ops.engram_hash(win, pos, *hs._tables(win.device)[1:], hs.pad_class)
    assert_match(got, hs.hash_windows(win, pos), what="engram hash")
    n, hid = tiny_model.cfg.hc.hc_mult, tiny_model.cfg.hidden_size
    e = layer.engram
    st = _rows(6 * n, hid, 12).unflatten(0, (6, n))
    kv = _rows(6, (n + 1) * hid, 13)
    mask = torch.tensor([True, False, True, True, False, True])
    for m in (None, mask):
        assert_match(ops.engram_gate(st, kv, e.q_weight, e.k_weight, e.eps, m),
                     ref_engram_gate(st, kv, e.q_weight, e.k_weight, e.eps, m), what="engram gate")


def test_engram_gate_hand_worked():
    """n = 2 streams, H = 4, eps = 0, q_w * k_w = 1. Stream 0's key is +1s, stream 1's -1s, so with
    R = c * 1s: d = (sum R * key) / (rms R * rms key) / sqrt(4) = +-2 and gate = sigmoid(+-sqrt(2)),
    whatever c. Row 2 is masked (unchanged); row 3 has q_w * k_w = 0 on stream 1 (d = 0: the gate is
    sigmoid(+sqrt(1e-6)))."""
    hid = 4
    value = [1.0, 0.0, 2.0, -1.0]
    kv = torch.tensor([[1.0] * hid + [-1.0] * hid + value] * 4, dtype=torch.bfloat16)
    st = torch.tensor([[[1.0] * hid] * 2, [[2.0] * hid] * 2, [[3.0] * hid] * 2, [[1.0] * hid] * 2], dtype=torch.bfloat16)
    qw = torch.tensor([[2.0] * hid, [0.5] * hid], dtype=torch.bfloat16)
    kw = torch.tensor([[0.5] * hid, [2.0] * hid], dtype=torch.bfloat16)
    mask = torch.tensor([True, True, False, True])
    got = ops.engram_gate(st, kv, qw, kw, 0.0, mask)
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    gp, gm = sig(math.sqrt(2)), sig(-math.sqrt(2))
    want = [[[c + g * v for v in value] for g in (gp, gm)] for c in (1.0, 2.0)]
    want.append([[3.0] * hid] * 2)
    assert_match(got[:3], torch.tensor(want, dtype=torch.float64).bfloat16(), what="gate +-2")
    kw0 = kw.clone()
    kw0[1] = 0
    got0 = ops.engram_gate(st[3:], kv[3:], qw, kw0, 0.0)
    want0 = [[1.0 + gp * v for v in value], [1.0 + sig(1e-3) * v for v in value]]
    assert_match(got0[0], torch.tensor(want0, dtype=torch.float64).bfloat16(), what="gate d = 0")


def test_engram_gate_many_rows_equals_reference():
    """4M outputs with keys correlated to the streams (|d| up to ~sqrt(H), where the gate is most
    sensitive) and values 100x the streams: large enough that a different fp32 rounding order in the
    gate (grouping of the two rsqrt factors, a different mean square) changes ~50-100 bf16 outputs."""
    g = _g(21)
    t, n, hid = 1024, 4, 1024
    st = torch.randn(t, n, hid, generator=g)
    keys = torch.randn(t, n, hid, generator=g) + 3 * st * torch.randn(t, n, 1, generator=g).sign()
    value = torch.randn(t, hid, generator=g) * 100
    kv = torch.cat([keys.flatten(1), value], dim=-1).bfloat16()
    st = st.bfloat16()
    qw, kw = (torch.rand(2, n, hid, generator=g) + 0.5).bfloat16()
    mask = torch.rand(t, generator=g) > 0.2
    assert_match(ops.engram_gate(st, kv, qw, kw, 1e-6, mask), ref_engram_gate(st, kv, qw, kw, 1e-6, mask), what="gate")
