"""CPU: twins of dsv41_kernels against hand-worked cases and plain-Python formulations (bitwise).

  topk_select             a plain-Python sort, hand-worked rows (ties, NaN, -inf, signed zeros,
                          subnormals), and layers.indexer.select_topk (a separate formulation:
                          a stable sort, where the twin ranks composite integer keys)
  candidate_blocks        hand-worked rows, and layers.indexer.select_candidate_blocks (a stable
                          sort of block maxima, where the twin ranks composite integer keys)
  sparse_attention_paged  one valid key and sink = -inf: the output is that key, exactly
  engram_gather           the E4M3 / UE8M0 bytes decoded by hand in float64
  engram_gate             gates worked out by hand (d = +-2, d = 0, a masked row)
The official-code and float64 oracles of every op are in test_twin_oracles_quant.py and
test_twin_oracles_math.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_compare import assert_match

from dsv41_kernels import ops
from sglang_dsv41.layers.indexer import select_candidate_blocks, select_topk
from sglang_dsv41.quant import window_kv_pack, window_kv_unpack

NAN, INF = float("nan"), float("inf")


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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
    got = ops.topk_select(s, 512)
    assert_match(got, select_topk(s, 512), what="topk fp32")
    assert got.tolist() == [_python_topk(r, 512) for r in s.tolist()]


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
