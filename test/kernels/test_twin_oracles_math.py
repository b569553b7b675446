"""CPU: the float twins of dsv41_kernels against independent oracles (none of them our own code).

| op                     | oracle                                                               | rule      |
|------------------------|----------------------------------------------------------------------|-----------|
| rms_norm               | official RMSNorm                                                     | bitwise   |
| rope_rotate            | official apply_rotary_emb (complex64 multiply), forward and inverse  | bitwise   |
| sparse_attention_paged | official sparse_attn over keys decoded by hand from the pool bytes   | bitwise   |
|                        | float64 softmax with sink                                            | FP64_ATTN |
| engram_gate            | official Engram.forward (its table and wkv bypassed: kv fed in)      | bitwise   |
| engram_hash            | plain-Python integers; official NgramHashState.forward               | bitwise   |
| mhc_gates              | official rsqrt(mean(x^2) + eps) then kernel_cpu.hc_split_sinkhorn    | bitwise   |
| mhc_collapse / expand  | official Block.hc_pre / Block.hc_post                                | bitwise   |
| candidate_blocks       | official select_candidate_blocks (tie-free rows)                     | bitwise   |
| fp32_linear            | float64 dot products: |twin - exact| <= K * 2^-24 * sum_k |x w|       | FP32_GEMM |
"Official": DeepSeek's model.py / kernel_cpu.py / engram.py from ../shared/official
(test/kernels/official.py; skipped, naming the folder, when absent).

Tolerances (float oracles only):
  FP64_ATTN  1 - cos(twin, exact) <= 5e-6 per row and |twin - exact| <= 2^-7 max|exact| + 2^-8 |exact|
             elementwise: bf16 probabilities (relative error 2^-9 each) and the bf16 output rounding
             (2^-9), on O(1) keys
  FP32_GEMM  gamma_K = K u bounds any fp32 summation order of K products (u = 2^-24), Higham 3.1
"""

from __future__ import annotations

import pytest
import torch
from kernel_compare import assert_match
from official import engram, kernel_cpu, model, rope

from dsv41_kernels import ops
from sglang_dsv41.quant import kv_fp4_pack, window_kv_pack

INF = float("inf")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _wide(*shape: int, seed: int) -> torch.Tensor:
    """fp32 with per-row magnitudes over 1e-3..1e3 (rows = all but the last dim)."""
    g = _g(seed)
    return torch.randn(*shape, generator=g) * torch.pow(10.0, torch.rand(*shape[:-1], 1, generator=g) * 6 - 3)


def _rope_table(n: int, r: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ang = torch.randint(0, 1 << 20, (n, 1), generator=_g(seed)).float() * (1.0 / 1e4 ** (torch.arange(r).float() / r))
    f = torch.polar(torch.ones_like(ang), ang)
    return f.real.contiguous(), f.imag.contiguous()


# ------------------------------------------------------------------ norm, rope
@pytest.mark.parametrize("shape, dtype", [((7, 4096), torch.bfloat16), ((3, 5, 512), torch.bfloat16),
                                          ((9, 129), torch.float32), ((4, 7), torch.bfloat16)])
def test_rms_norm_equals_official(shape, dtype):
    x = _wide(*shape, seed=shape[-1]).to(dtype)
    x.view(-1, shape[-1])[0] = 0
    w = (torch.rand(shape[-1], generator=_g(1)) + 0.5).bfloat16()
    norm = model().RMSNorm(shape[-1], 1e-6)
    norm.weight.data = w
    with torch.no_grad():
        assert_match(ops.rms_norm.torch(x, w, 1e-6), norm(x), what=f"rms_norm {shape}")


@pytest.mark.parametrize("shape, r, dtype", [((9, 64, 512), 32, torch.bfloat16), ((11, 96), 16, torch.bfloat16),
                                             ((5, 3, 64), 32, torch.float32), ((6, 2, 64), 32, torch.bfloat16)])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_rotate_equals_official(shape, r, dtype, inverse):
    x = _wide(*shape, seed=r).to(dtype)
    cos, sin = _rope_table(shape[0], r, shape[-1])
    assert_match(ops.rope_rotate.torch(x, cos, sin, inverse), rope(x, cos, sin, inverse), what=f"rope {shape}")


def test_rope_hand_worked():
    """The last pair of (1, 2, 3, 5) rotated by +90 degrees is (-5, 3), by -90 degrees (5, -3)."""
    x = torch.tensor([[1.0, 2.0, 3.0, 5.0]], dtype=torch.bfloat16)
    c, s = torch.tensor([[0.0]]), torch.tensor([[1.0]])
    assert ops.rope_rotate.torch(x, c, s).tolist() == [[1.0, 2.0, -5.0, 3.0]]
    assert ops.rope_rotate.torch(x, c, s, True).tolist() == [[1.0, 2.0, 5.0, -3.0]]


# ------------------------------------------------------------------ attention
def _decode_window(pool: torch.Tensor) -> torch.Tensor:
    """uint8 [S, D + D/32] -> bf16 [S, D] by hand: E4M3 byte (torch's float8 decode) x 2^(e - 127)."""
    d = pool.size(1) * 32 // 33
    vals = pool[:, :d].contiguous().view(torch.float8_e4m3fn).double()
    return (vals * torch.pow(2.0, pool[:, d:].double() - 127).repeat_interleave(32, 1)).bfloat16()


def _decode_fp4(pool: torch.Tensor) -> torch.Tensor:
    """uint8 [S, D/2 + D/16] -> bf16 [S, D] by hand: E2M1 code (low nibble first) x E4M3 scale per 16."""
    d = pool.size(1) * 16 // 9
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    b = pool[:, : d // 2].long()
    vals = table[torch.stack([b & 15, b >> 4], -1).flatten(1)]
    scale = pool[:, d // 2 :].contiguous().view(torch.float8_e4m3fn).double().repeat_interleave(16, 1)
    return (vals * scale).bfloat16()


def _attention_case(t, h, d, w, k, seed):
    g = _g(seed)
    q = torch.randn(t, h, d, generator=g).bfloat16()
    n_w, n_c = 2 * w + 3, 2 * k + 3
    wpool = window_kv_pack((torch.randn(n_w, d, generator=g) * (0.5 + 1.5 * torch.rand(n_w, 1, generator=g))).bfloat16())
    cpool = kv_fp4_pack((torch.randn(n_c, d, generator=g) * (0.5 + 1.5 * torch.rand(n_c, 1, generator=g))).bfloat16())
    ws = torch.randint(0, n_w, (t, w), generator=g)
    cs = torch.randint(0, n_c, (t, k), generator=g)
    ws[torch.rand(t, w, generator=g) < 0.15] = -1
    cs[torch.rand(t, k, generator=g) < 0.2] = -1
    ws[0], cs[0] = -1, -1  # a row with no valid key: zeros
    sink = torch.randn(h, generator=g)
    kv = torch.cat([_decode_window(wpool), _decode_fp4(cpool)])
    idx = torch.cat([ws, torch.where(cs >= 0, cs + n_w, -1)], dim=1)
    return (q, wpool, ws, cpool if k else None, cs if k else None, sink, d**-0.5), kv, idx


@pytest.mark.parametrize("t, h, d, w, k", [(6, 4, 128, 128, 64), (5, 3, 512, 70, 130), (4, 16, 64, 5, 0)])
def test_sparse_attention_paged_equals_official(t, h, d, w, k):
    args, kv, idx = _attention_case(t, h, d, w, k, seed=w + k)
    got = ops.sparse_attention_paged.torch(*args)
    q, sink, scale = args[0], args[5], args[6]
    want = kernel_cpu().sparse_attn(q[None], kv[None], sink, idx[None].int(), scale)[0]
    assert_match(got, want, what="paged attention vs official")
    assert bool((got[0] == 0).all())
    # FP64_ATTN
    exact = torch.zeros(t, h, d, dtype=torch.float64)
    for i in range(t):
        keys = kv[idx[i][idx[i] >= 0]].double()
        if keys.numel():
            s = (q[i].double() @ keys.T) * scale
            mx = torch.maximum(s.max(-1).values, sink.double())
            p = torch.exp(s - mx[:, None])
            exact[i] = (p @ keys) / (p.sum(-1) + torch.exp(sink.double() - mx))[:, None]
    err = (got.double() - exact).abs()
    assert bool((err <= 2.0**-7 * exact.abs().amax() + 2.0**-8 * exact.abs()).all()), float(err.max())
    live = exact.flatten(0, 1).norm(dim=-1) > 0
    cos = torch.nn.functional.cosine_similarity(got.double().flatten(0, 1)[live], exact.flatten(0, 1)[live], dim=-1)
    assert float((1 - cos).max()) <= 5e-6


# ------------------------------------------------------------------ Engram
def _official_gate(streams, kv, qw, kw, eps, mask):
    """Official Engram.forward with `embed` and `wkv` bypassed, so that kv is the given tensor."""
    m = model()
    eng = m.Engram.__new__(m.Engram)
    torch.nn.Module.__init__(eng)
    eng.dim, eng.hc_mult, eng.clamp_value, eng.eps = streams.size(2), streams.size(1), 1e-6, eps
    eng.q_weight, eng.k_weight = torch.nn.Parameter(qw, requires_grad=False), torch.nn.Parameter(kw, requires_grad=False)
    eng.embed, eng.wkv = torch.nn.Identity(), torch.nn.Identity()
    with torch.no_grad():  # hash_ids [1, T, 1, (n+1)H]: embed(.).flatten(-2) gives kv back
        out = eng(streams[None], kv[None, :, None, :], None if mask is None else mask[None])
    return out[0]


@pytest.mark.parametrize("t, n, hid, masked", [(9, 4, 300, True), (64, 4, 1024, False), (3, 2, 4096, True),
                                               (512, 4, 1000, True)])
def test_engram_gate_equals_official(t, n, hid, masked):
    g = _g(t + hid)
    st = torch.randn(t, n, hid, generator=g)
    keys = torch.randn(t, n, hid, generator=g) + 3 * st * torch.randn(t, n, 1, generator=g).sign()  # |d| up to ~sqrt(H)
    kv = torch.cat([keys.flatten(1), torch.randn(t, hid, generator=g) * 100], dim=-1).bfloat16()
    st = st.bfloat16()
    qw, kw = (torch.rand(2, n, hid, generator=g) + 0.5).bfloat16()
    mask = (torch.rand(t, generator=g) > 0.3) if masked else None
    assert_match(ops.engram_gate.torch(st, kv, qw, kw, 1e-6, mask), _official_gate(st, kv, qw, kw, 1e-6, mask),
                 what="engram gate")


def _hash_by_hand(windows, positions, mult, primes, offsets, pad) -> list:
    """Plain Python integers: blocked columns (dead, or p < s, from newer to older) take pad; then for
    each layer l, n-gram size i + 1 and head h: (XOR of class_s * mult[l][s], s <= i) % prime + offset."""
    out = []
    for win, p in zip(windows, positions):
        cls, blocked = [], False
        for s, c in enumerate(win):
            blocked = blocked or c < 0 or p < s
            cls.append(pad if blocked else c)
        row = []
        for l in range(len(mult)):
            r, rows = cls[0] * mult[l][0], []
            for i in range(1, len(win)):
                r ^= cls[i] * mult[l][i]
                rows += [r % pr + off for pr, off in zip(primes[l][i - 1], offsets[l][i - 1])]
            row.append(rows)
        out.append(row)
    return out


def test_engram_hash_equals_python_integers_and_official_multipliers(tiny_model):
    from sglang_dsv41.engram_hash import EngramHasher

    hs = EngramHasher(tiny_model.cfg.engram, tiny_model.engram_token_map)
    g = _g(5)
    win = torch.randint(0, int(hs.token_map.max()) + 1, (60, hs.max_ngram_size), generator=g)
    win[5:][torch.rand(55, hs.max_ngram_size, generator=g) < 0.25] = -1  # dead tokens (rows 0-4 have none)
    pos = torch.randint(0, 6, (60,), generator=g)
    pos[:5] = 100
    _, mult, primes, offsets = hs._tables(torch.device("cpu"))
    got = ops.engram_hash.torch(win, pos, mult, primes, offsets, hs.pad_class)
    want = _hash_by_hand(win.tolist(), pos.tolist(), mult.tolist(), primes.tolist(), offsets.tolist(), hs.pad_class)
    assert got.dtype == torch.int64 and got.tolist() == want
    cfg = tiny_model.cfg.engram
    official = engram().compute_hash_multipliers(cfg.layer_ids, cfg.max_ngram_size, cfg.compressed_vocab_size)
    assert torch.equal(mult, official)


def test_engram_hash_equals_official_ngram_state(tiny_model):
    """Official NgramHashState.forward (its tables set from ours, its tokenizer-built token map skipped)
    over a sequence with dead tokens, against the twin on the windows that sequence gives."""
    from sglang_dsv41.engram_hash import EngramHasher

    hs = EngramHasher(tiny_model.cfg.engram, tiny_model.engram_token_map)
    n, e = hs.max_ngram_size, engram()
    state = e.NgramHashState.__new__(e.NgramHashState)
    torch.nn.Module.__init__(state)
    state.layout = type("Layout", (), {"max_ngram_size": n})()
    state.pad_id = hs.pad_class
    state.primes, state.offsets = hs.primes, hs.offsets.flatten(1)
    state.multipliers, state.token_map = hs.multipliers, hs.token_map
    state.cache = torch.empty(1, 64, dtype=torch.int64)
    g = _g(6)
    ids = torch.randint(0, hs.token_map.numel(), (1, 40), generator=g)
    live = torch.rand(1, 40, generator=g) > 0.15
    want = state(ids, 0, live)[0]  # [T, L, cols]
    cls = torch.where(live[0], hs.token_map[ids[0]], -1)
    pos = torch.arange(40)
    win = torch.stack([cls[(pos - s).clamp_min(0)] for s in range(n)], dim=1)
    _, mult, primes, offsets = hs._tables(torch.device("cpu"))
    assert torch.equal(ops.engram_hash.torch(win, pos, mult, primes, offsets, hs.pad_class), want)


# ------------------------------------------------------------------ mHC
@pytest.mark.parametrize("t, n, h, iters, dtype", [(13, 4, 128, 20, torch.bfloat16), (7, 4, 5120, 20, torch.bfloat16),
                                                   (9, 3, 64, 7, torch.float32), (5, 1, 96, 1, torch.float32)])
def test_mhc_gates_equal_official(t, n, h, iters, dtype):
    g = _g(t * n)
    x = _wide(t, n * h, seed=h).to(dtype)
    x[0] = 0
    rms = x.float().square().mean(-1, keepdim=True).sqrt().clamp_min(1e-3)
    mix = torch.randn(t, (2 + n) * n, generator=g) * 3 * rms
    base, scale = torch.randn((2 + n) * n, generator=g), torch.rand(3, generator=g) * 2 + 0.05
    got = ops.mhc_gates.torch(x, mix, base, scale, iters, 1e-6, 1e-6)
    mixes = mix * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6)  # official Block.hc_mixes
    want = kernel_cpu().hc_split_sinkhorn(mixes, scale, base, n, iters, 1e-6)
    for a, b, name in zip(got, want, ("pre", "post", "comb")):
        assert_match(a, b, what=f"mhc {name}")


@pytest.mark.parametrize("t, n, h, dtype", [(11, 4, 256, torch.bfloat16), (6, 3, 100, torch.float32)])
def test_mhc_collapse_expand_equal_official(t, n, h, dtype):
    g = _g(t + n)
    streams = _wide(t, n, h, seed=h).to(dtype)
    y = _wide(t, h, seed=h + 1).to(dtype)
    pre, post = torch.rand(t, n, generator=g) * 2, torch.rand(t, n, generator=g) * 2
    comb = torch.rand(t, n, n, generator=g)
    streams[1], pre[2] = -0.0, -pre[2]  # signed zeros, negative weights
    blk = model().Block
    want_c = blk.hc_pre(None, streams[None], pre[None])[0]
    want_e = blk.hc_post(None, y[None], streams[None], post[None], comb[None])[0]
    assert_match(ops.mhc_collapse.torch(streams, pre), want_c, what="collapse")
    assert_match(ops.mhc_expand.torch(y, streams, post, comb), want_e, what="expand")


# ------------------------------------------------------------------ candidate blocks, fp32 GEMM
@pytest.mark.parametrize("t, n, kb, bs", [(6, 203, 5, 8), (4, 4100, 64, 64), (3, 10, 9, 4)])
def test_candidate_blocks_equal_official(t, n, kb, bs):
    """Distinct scores (torch.topk's order among ties is unspecified, the twin's is the lower block)."""
    g = _g(n)
    s = torch.randperm(t * n, generator=g).float().view(t, n) / 7 - 100
    visible = torch.randint(1, n + 1, (t,), generator=g)
    visible[0] = n
    s = s.masked_fill(torch.arange(n) >= visible[:, None], -INF)
    want = model().select_candidate_blocks(s, visible.unsqueeze(-1), kb, bs)
    assert_match(ops.candidate_blocks.torch(s, visible, kb, bs), want, what="candidate blocks")


@pytest.mark.parametrize("m, n, k", [(1, 70, 4096), (65, 33, 513), (130, 8, 64)])
def test_fp32_linear_within_fp32_bound_of_float64(m, n, k):
    x = _wide(m, k, seed=m).bfloat16()
    w = _wide(n, k, seed=n).bfloat16()
    got = ops.fp32_linear.torch(x, w)
    assert got.dtype == torch.float32
    exact = x.double() @ w.double().T
    bound = k * 2.0**-24 * (x.double().abs() @ w.double().abs().T)
    err = (got.double() - exact).abs()
    assert bool((err <= bound).all()), float((err / bound.clamp_min(1e-300)).max())
