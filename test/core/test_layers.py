"""Layer-function tests. Oracles: independent float64 formulations and hand-worked cases."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.layers.indexer import mask_invisible, select_candidate_blocks, select_topk
from sglang_dsv41.layers.linear import fp32_linear
from sglang_dsv41.layers.mhc import collapse, expand, gates, sinkhorn
from sglang_dsv41.reduction import mean_square
from sglang_dsv41.layers.rope import Rotary, _inv_freq
from sglang_dsv41.layers.sparse_attention import sparse_attention
from sglang_dsv41.reference.model import window_indices


def _dense_attention(q, kv, sink, idx, scale):
    """float64: softmax over the valid indices with exp(sink) added to the denominator."""
    t, h, d = q.shape
    out = torch.zeros(t, h, d, dtype=torch.float64)
    for i in range(t):
        valid = idx[i][idx[i] >= 0].long()
        if valid.numel() == 0:
            continue
        k = kv[valid].double()
        s = (q[i].double() @ k.T) * scale
        m = torch.maximum(s.max(-1).values, sink.double())
        p = torch.exp(s - m[:, None])
        out[i] = (p @ k) / (p.sum(-1) + torch.exp(sink.double() - m))[:, None]
    return out


@pytest.mark.parametrize("seed, t, n, k", [(0, 5, 40, 70), (1, 3, 200, 130), (2, 1, 7, 64)])
def test_sparse_attention_matches_dense_softmax(seed, t, n, k):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, 3, 64, generator=g).bfloat16()
    kv = torch.randn(n, 64, generator=g).bfloat16()
    sink = torch.randn(3, generator=g)
    idx = torch.randint(-1, n, (t, k), generator=g, dtype=torch.int32)
    if t > 1:
        idx[0, :] = -1  # a row with nothing to attend gives zeros
    got = sparse_attention(q, kv, sink, idx, 64**-0.5).double()
    want = _dense_attention(q, kv, sink, idx, 64**-0.5)
    if t > 1:
        assert got[0].abs().max() == 0
    assert torch.allclose(got, want, rtol=2.01 / 128, atol=1e-2)
    cos = torch.nn.functional.cosine_similarity(got[t - 1 :].flatten(), want[t - 1 :].flatten(), dim=0)
    assert cos > 1 - 1e-4


def test_sparse_attention_sink_only_scales_denominator():
    q = torch.zeros(1, 1, 32).bfloat16()
    kv = torch.ones(4, 32).bfloat16()
    idx = torch.tensor([[0, 1, -1, -1]], dtype=torch.int32)
    out = sparse_attention(q, kv, torch.tensor([0.0]), idx, 1.0)  # two keys at logit 0, sink e^0
    assert torch.allclose(out.float(), torch.full((1, 1, 32), 2 / 3), atol=4e-3)


def test_window_indices_hand_cases():
    idx = window_indices(torch.tensor([0, 3]), window=4, floor=0, first_row=0)
    assert idx.tolist() == [[0, -1, -1, -1], [0, 1, 2, 3]]
    idx = window_indices(torch.tensor([10, 11]), window=4, floor=9, first_row=9)  # floored tail rows
    assert idx.tolist() == [[0, 1, -1, -1], [0, 1, 2, -1]]


def test_select_topk_ties_and_invalid():
    s = torch.tensor([[1.0, 3.0, 3.0, float("-inf"), 3.0, float("nan")]])
    assert select_topk(s, 2).tolist() == [[1, 2]]  # equal scores: lower positions win
    assert select_topk(s, 5).tolist() == [[0, 1, 2, 4, -1]]  # -inf / NaN never selected
    vis = mask_invisible(torch.ones(2, 4), torch.tensor([1, 3]))
    assert select_topk(vis, 4).tolist() == [[0, -1, -1, -1], [0, 1, 2, -1]]


def test_candidate_blocks_pin_newest_and_keep_top():
    # 12 positions, blocks of 4: block maxima 9, 1, 5; the row sees 10 positions -> newest block 2
    s = torch.tensor([[9.0, 0, 0, 0, 1, 0, 0, 0, 5, 0, float("-inf"), float("-inf")]])
    keep = select_candidate_blocks(s, torch.tensor([10]), topk_blocks=2, block_size=4)
    assert keep.int().tolist() == [[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]]
    s2 = s.clone()
    s2[0, 8] = 0.5  # newest block now scores lowest, but stays pinned
    keep = select_candidate_blocks(s2, torch.tensor([10]), topk_blocks=2, block_size=4)
    assert keep.int().tolist() == [[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]]


def test_yarn_bands_for_compress_theta():
    plain = _inv_freq(64, 160000.0, 0, 1.0, 32, 1)
    yarn = _inv_freq(64, 160000.0, 65536, 16.0, 32, 1)
    assert torch.equal(yarn[:16], plain[:16])  # low = 15: pairs 0..15 unscaled
    assert torch.allclose(yarn[25:], plain[25:] / 16, rtol=1e-6)  # high = 25: divided by 16
    assert ((yarn[16:25] < plain[16:25]) & (yarn[16:25] > plain[16:25] / 16)).all()


def test_rope_rotates_pairs_and_inverts(tiny_dir):
    cfg = ModelConfig.from_pretrained(tiny_dir)
    rot = Rotary(cfg, "plain")
    x = torch.randn(3, 2, 128, dtype=torch.float32)
    f = rot.freqs(torch.tensor([0, 1, 70]))
    y = rot.apply(x, f)
    assert torch.equal(y[0], x[0]) and torch.equal(y[..., :64], x[..., :64])
    theta0 = 1.0  # pair 0 rotates by pos * 10000^0
    a, b = x[1, 0, 64], x[1, 0, 65]
    assert torch.allclose(y[1, 0, 64], a * math.cos(theta0) - b * math.sin(theta0), atol=1e-6)
    assert torch.allclose(rot.apply(y, f, inverse=True), x, atol=1e-5)


def test_sinkhorn_is_doubly_stochastic():
    m = sinkhorn(torch.randn(10, 4, 4), iters=20, eps=1e-6)
    assert torch.allclose(m.sum(-1), torch.ones(10, 4), atol=1e-2)  # rows converge last
    assert torch.allclose(m.sum(-2), torch.ones(10, 4), atol=1e-5)


def _torch_sum_sinkhorn(c, iters, eps):
    """The Sinkhorn as written before the sums were made explicit: torch's `.sum(-1)` / `.sum(-2)`."""
    m = torch.exp(c - c.amax(dim=-1, keepdim=True))
    m = m / m.sum(dim=-1, keepdim=True) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m


def _wide_logits(t: int, n: int, seed: int) -> torch.Tensor:
    """[t, n, n] fp32 logits at per-matrix scales 1e-3..1e3 (exp underflows in the large ones), with ties."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(t, n, n, generator=g) * torch.pow(10.0, torch.rand(t, 1, 1, generator=g) * 6 - 3)
    c[0] = 0.5
    return c


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sinkhorn_explicit_sums_equal_torch_sum(n):
    """On the CPU (ATEN_CPU_CAPABILITY=default) torch adds n <= 4 entries left to right, so the explicit
    sequential sums change no bit for the model's hc_mult = 4 (for n >= 5 torch's vectorized order differs)."""
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        pytest.skip("torch's CPU sum order is pinned under ATEN_CPU_CAPABILITY=default")
    for seed, iters in ((0, 20), (1, 1), (2, 3)):
        c = _wide_logits(3000, n, seed + 10 * n)
        got, want = sinkhorn(c, iters, 1e-6), _torch_sum_sinkhorn(c, iters, 1e-6)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (n, seed)


def test_gates_equal_mix_stats_formulation():
    """fp32_linear + `gates` (x bf16 streams, as `Block.hc_mix` calls it) equals the former one-piece
    `mix_stats` (x converted to fp32 first, torch sums in the Sinkhorn) bit for bit."""
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        pytest.skip("torch's CPU sum order is pinned under ATEN_CPU_CAPABILITY=default")
    g = torch.Generator().manual_seed(4)
    t, n, h = 70, 4, 64
    streams = (torch.randn(t, n, h, generator=g) * torch.pow(10.0, torch.rand(t, 1, 1, generator=g) * 4 - 2)).bfloat16()
    fn = torch.randn((2 + n) * n, n * h, generator=g) * 0.05
    base, scale = torch.randn((2 + n) * n, generator=g), torch.rand(3, generator=g) * 4
    x = streams.flatten(1).float()
    mix = fp32_linear(x, fn) * torch.rsqrt(mean_square(x) + 1e-6)
    want_pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + 1e-6
    want_post = 2 * torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    want_comb = _torch_sum_sinkhorn((mix[:, 2 * n :] * scale[2] + base[2 * n :]).unflatten(-1, (n, n)), 20, 1e-6)
    xb = streams.flatten(1)
    pre, post, comb = gates(xb, fp32_linear(xb, fn), base, scale, 20, 1e-6, 1e-6)
    for a, b in ((pre, want_pre), (post, want_post), (comb, want_comb)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_gates_backward_reaches_mix_base_and_scale():
    """`gates` stays differentiable (the trainer runs it under autograd)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4 * 32, generator=g)
    mix = torch.randn(3, 24, generator=g, requires_grad=True)
    base = torch.randn(24, generator=g, requires_grad=True)
    scale = torch.rand(3, generator=g).requires_grad_()
    pre, post, comb = gates(x, mix, base, scale, 20, 1e-6, 1e-6)
    (pre.sum() + post.sum() + (comb * torch.arange(16.0).view(4, 4)).sum()).backward()
    for p in (mix, base, scale):
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and p.grad.abs().sum() > 0


def test_collapse_expand_use_transposed_comb():
    R = torch.randn(2, 4, 8).bfloat16()
    pre, post, comb = torch.rand(2, 4), torch.rand(2, 4), torch.rand(2, 4, 4)
    y = torch.randn(2, 8).bfloat16()
    want_c = sum(pre[:, j, None] * R[:, j].float() for j in range(4))
    assert torch.equal(collapse(R, pre), want_c.bfloat16())
    out = expand(y, R, post, comb).float()
    for k in range(4):
        want = post[:, k, None] * y.float() + sum(comb[:, j, k, None] * R[:, j].float() for j in range(4))
        assert torch.allclose(out[:, k], want, rtol=1 / 128, atol=1e-2)


def test_fp32_linear_is_batch_invariant():
    x, w = torch.randn(300, 96), torch.randn(40, 96)
    full = fp32_linear(x, w)
    for n in (1, 3, 64, 65, 200):
        assert torch.equal(fp32_linear(x[:n], w), full[:n])
    assert torch.allclose(full, (x.double() @ w.double().T).float(), rtol=1e-5, atol=1e-4)
