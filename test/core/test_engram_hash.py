"""Engram hashing: pinned multipliers, plain-int reference, chunking, blocking, row ranges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_dsv41.config import EngramConfig
from sglang_dsv41.engram_hash import EngramHasher, engram_hash_sequence, hash_multipliers
from sglang_dsv41.engram_layout import EngramLayout

# Released V4.1 config: engram_layer_ids (1, 14), max_ngram_size 4, compressed vocab 99092.
# Computed once with numpy 2.3.5 (np.random.default_rng(10007 * L).integers(0, B, (4,), int64),
# B = (INT64_MAX // 99092) // 2 = 46539438283891; multiplier = 2v + 1).
PINNED_MULTIPLIERS = [
    [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    [67716810739261, 51510806800915, 30921347202721, 82619226485591],
]


def make_config(layer_ids=(1, 3), n=3, heads=2, vocab=50, cvs=20, pad=2) -> EngramConfig:
    layout = EngramLayout.build(len(layer_ids), n, heads, vocab)
    return EngramConfig(
        layer_ids=tuple(layer_ids),
        num_embeddings=layout.num_embeddings,
        max_ngram_size=n,
        vocab_size=vocab,
        n_heads=heads,
        head_dim=32,
        pad_token_id=pad,
        compressed_vocab_size=cvs,
    )


def np_multipliers(layer_ids, n, cvs) -> list[list[int]]:
    """Independent plain-numpy re-derivation of the multipliers."""
    bound = max(1, ((2**63 - 1) // cvs) // 2)
    return [
        [2 * int(v) + 1 for v in np.random.default_rng(10007 * l).integers(low=0, high=bound, size=(n,), dtype=np.int64)]
        for l in layer_ids
    ]


def ref_hash(classes, mults, primes, offsets, pad, n, heads, start=0, cumulative=True):
    """Plain Python reference. classes: per position from 0 (None = dead); returns rows for
    positions start..len-1 as nested lists [T][layer][col]."""
    out = []
    for p in range(start, len(classes)):
        per_layer = []
        for li in range(len(mults)):
            cs, blocked = [], False
            for s in range(n):
                here = p - s < 0 or classes[p - s] is None
                blocked = (blocked or here) if cumulative else here
                cs.append(pad if blocked else classes[p - s])
            r = cs[0] * mults[li][0]
            rows = []
            for i in range(1, n):
                r ^= cs[i] * mults[li][i]
                for h in range(heads):
                    rows.append(r % primes[li][i - 1][h] + offsets[li][(i - 1) * heads + h])
            per_layer.append(rows)
        out.append(per_layer)
    return out


@pytest.fixture(scope="module")
def tiny_setup():
    cfg = make_config()
    gen = torch.Generator().manual_seed(0)
    token_map = torch.randint(0, cfg.compressed_vocab_size, (60,), generator=gen)
    token_map[2] = 7  # pad class
    return cfg, token_map, EngramHasher(cfg, token_map)


# ------------------------------------------------------------------ multipliers
def test_pinned_multipliers():
    got = hash_multipliers((1, 14), 4, 99092)
    assert got.dtype == torch.long and tuple(got.shape) == (2, 4)
    assert got.tolist() == PINNED_MULTIPLIERS
    assert np_multipliers((1, 14), 4, 99092) == PINNED_MULTIPLIERS
    assert all(m % 2 == 1 for row in PINNED_MULTIPLIERS for m in row)


def test_tiny_layout_by_hand():
    layout = make_config().layout
    # vocab 50: primes > 49, restarting per n-gram size, never reused across sizes/layers
    assert layout.primes == (((53, 59), (61, 67)), ((71, 73), (79, 83)))
    assert layout.offsets == ((0, 53, 112, 173), (0, 71, 144, 223))


# ------------------------------------------------------------------ reference equality
def test_hand_worked_first_tokens(tiny_setup):
    cfg, tm, hasher = tiny_setup
    mults = np_multipliers(cfg.layer_ids, 3, cfg.compressed_vocab_size)
    ids = [5, 9, 11, 5]
    c = [int(tm[i]) for i in ids]
    pad = 7
    got = hasher.hash_sequence(torch.tensor(ids)).tolist()
    # position 0: both predecessors before the start -> pad
    m = mults[0]
    r1 = (c[0] * m[0]) ^ (pad * m[1])
    r2 = r1 ^ (pad * m[2])
    assert got[0][0] == [r1 % 53, 53 + r1 % 59, 112 + r2 % 61, 173 + r2 % 67]
    # position 2, layer 1: full window (c2, c1, c0)
    m = mults[1]
    r1 = (c[2] * m[0]) ^ (c[1] * m[1])
    r2 = r1 ^ (c[0] * m[2])
    assert got[2][1] == [r1 % 71, 71 + r1 % 73, 144 + r2 % 79, 223 + r2 % 83]


def test_matches_reference_random(tiny_setup):
    cfg, tm, hasher = tiny_setup
    layout = cfg.layout
    mults = np_multipliers(cfg.layer_ids, 3, cfg.compressed_vocab_size)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 60, (40,), generator=gen)
    dead = torch.zeros(40, dtype=torch.bool)
    dead[[0, 7, 8, 20]] = True
    classes = [None if d else int(tm[i]) for i, d in zip(ids.tolist(), dead.tolist())]
    expect = ref_hash(classes, mults, layout.primes, layout.offsets, 7, 3, 2)
    assert hasher.hash_sequence(ids, dead_mask=dead).tolist() == expect
    assert engram_hash_sequence(cfg, tm, ids, dead_mask=dead).tolist() == expect


def test_large_multipliers_no_overflow():
    """Released-scale multipliers (compressed vocab 99092, N=4, 8 heads) against Python big ints."""
    cfg = make_config(layer_ids=(1, 14), n=4, heads=8, vocab=1000, cvs=99092)
    gen = torch.Generator().manual_seed(2)
    tm = torch.randint(0, 99092, (3000,), generator=gen)
    tm[:64] = torch.arange(99092 - 64, 99092)  # largest classes present
    hasher = EngramHasher(cfg, tm)
    assert hasher.multipliers.tolist() == PINNED_MULTIPLIERS
    ids = torch.cat([torch.arange(64), torch.randint(0, 3000, (100,), generator=gen)])
    got = hasher.hash_sequence(ids)
    layout = cfg.layout
    classes = [int(tm[i]) for i in ids.tolist()]
    assert got.tolist() == ref_hash(classes, PINNED_MULTIPLIERS, layout.primes, layout.offsets, int(tm[2]), 4, 8)
    # rows lie inside their column's [offset, offset + prime) and below the layer's table size
    assert tuple(got.shape) == (164, 2, 24)
    for li in range(2):
        primes = torch.tensor(layout.flat_primes(li))
        offs = torch.tensor(layout.offsets[li])
        rows = got[:, li, :]
        assert bool((rows >= offs).all()) and bool((rows < offs + primes).all())
        assert int(rows.max()) < layout.num_embeddings[li] == cfg.num_embeddings[li]


# ------------------------------------------------------------------ chunking / history
def test_chunked_equals_one_shot(tiny_setup):
    cfg, tm, hasher = tiny_setup
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 60, (50,), generator=gen)
    dead = torch.rand(50, generator=gen) < 0.15
    full = hasher.hash_sequence(ids, dead_mask=dead)
    bounds = [0, 1, 2, 9, 10, 23, 25, 50]
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        hist = ids[max(0, a - 2):a]
        hdead = dead[max(0, a - 2):a]
        parts.append(hasher.hash_ids(ids[a:b], start_pos=a, history=hist, dead_mask=dead[a:b], history_dead_mask=hdead))
    assert torch.equal(torch.cat(parts), full)

    # packed: all chunks in one call with [B, N-1] histories (garbage where position < 0)
    seq_lens = [b - a for a, b in zip(bounds, bounds[1:])]
    hist = torch.stack([torch.cat([torch.full((2,), -99), ids])[a:a + 2] for a in bounds[:-1]])
    hdead = torch.stack([torch.cat([torch.zeros(2, dtype=torch.bool), dead])[a:a + 2] for a in bounds[:-1]])
    packed = hasher.hash_packed(ids, seq_lens, bounds[:-1], hist, dead_mask=dead, history_dead_mask=hdead)
    assert torch.equal(packed, full)


def test_decode_equals_packed(tiny_setup):
    """hash_decode (one token per sequence) == hash_packed with sequence lengths 1: positions 0, 1 and
    later (history entries before the start are garbage, -99 or out of vocabulary), dead and
    out-of-vocabulary ids in the token and in its history. A shifted history column fails it."""
    _, _, hasher = tiny_setup
    gen = torch.Generator().manual_seed(5)
    b = 64
    ids = torch.randint(-3, 63, (b,), generator=gen)  # < 0 and >= 60: out of vocabulary (dead)
    positions = torch.randint(0, 6, (b,), generator=gen)
    positions[:4] = torch.tensor([0, 1, 2, 0])
    hist = torch.randint(-3, 63, (b, 2), generator=gen)
    hist[positions == 0] = -99
    hist[positions == 1, 0] = 12345
    want = hasher.hash_packed(ids, torch.ones(b, dtype=torch.long), positions, hist)
    assert torch.equal(hasher.hash_decode(ids, positions, hist), want)
    assert not torch.equal(hasher.hash_decode(ids, positions, hist.roll(1, dims=1)), want)
    # every row against the one-sequence form
    rows = [hasher.hash_ids(ids[i:i + 1], int(positions[i]), hist[i][2 - min(2, int(positions[i])):])
            for i in range(b)]
    assert torch.equal(torch.cat(rows), want)


def test_packed_independent_sequences(tiny_setup):
    _, _, hasher = tiny_setup
    a = torch.tensor([3, 4, 5, 6, 7])
    b = torch.tensor([10, 11, 12])
    packed = hasher.hash_packed(torch.cat([a, b]), [5, 3])
    assert torch.equal(packed, torch.cat([hasher.hash_sequence(a), hasher.hash_sequence(b)]))


def test_history_required_and_ignored_before_start(tiny_setup):
    _, _, hasher = tiny_setup
    ids = torch.tensor([4, 8, 15, 16, 23, 42 % 60])
    full = hasher.hash_sequence(ids)
    with pytest.raises(ValueError):
        hasher.hash_ids(ids[2:], start_pos=2)
    with pytest.raises(ValueError):
        hasher.hash_ids(ids[2:], start_pos=2, history=ids[1:2])
    # position 1 needs one history token; a garbage older entry (position -1) is ignored
    assert torch.equal(hasher.hash_ids(ids[1:], start_pos=1, history=torch.tensor([12345, 4])), full[1:])
    assert torch.equal(hasher.hash_ids(ids[1:], start_pos=1, history=ids[:1]), full[1:])
    # a longer history keeps only its last N-1 entries
    assert torch.equal(hasher.hash_ids(ids[4:], start_pos=4, history=ids[:4]), full[4:])


# ------------------------------------------------------------------ blocking
def test_sequence_start_uses_pad(tiny_setup):
    cfg, tm, hasher = tiny_setup
    ids = torch.tensor([5, 9, 11])
    got = hasher.hash_sequence(ids)
    pad_id = cfg.pad_token_id
    # the pad *token* in place of the missing predecessors gives the same rows at position >= 2
    assert torch.equal(got[0], hasher.hash_ids(torch.tensor([pad_id, pad_id, 5]))[2])
    assert torch.equal(got[1], hasher.hash_ids(torch.tensor([pad_id, 5, 9]))[2])


def test_dead_blocking_is_cumulative(tiny_setup):
    cfg, tm, hasher = tiny_setup
    layout = cfg.layout
    mults = np_multipliers(cfg.layer_ids, 3, cfg.compressed_vocab_size)
    ids = torch.tensor([5, 9, 11, 13, 17])
    assert int(tm[5]) != 7 and int(tm[9]) != 7
    dead = torch.tensor([False, False, True, False, False])
    got = hasher.hash_sequence(ids, dead_mask=dead).tolist()
    classes = [int(tm[i]) for i in ids.tolist()]
    classes[2] = None
    assert got == ref_hash(classes, mults, layout.primes, layout.offsets, 7, 3, 2)
    # token 3: column 1 is dead, so column 2 (token 1, alive) must be padded too
    non_cum = ref_hash(classes, mults, layout.primes, layout.offsets, 7, 3, 2, cumulative=False)
    assert got[3] != non_cum[3]
    assert torch.equal(torch.tensor(got[3]), hasher.hash_ids(torch.tensor([2, 2, 13]))[2])
    # a dead token pads its whole window, including itself
    assert torch.equal(torch.tensor(got[2]), hasher.hash_ids(torch.tensor([2, 2, 2]))[2])
    # dead via dead_token_ids or via out-of-vocab ids is the same thing
    by_id = EngramHasher(cfg, tm, dead_token_ids=[11]).hash_sequence(ids)
    oov = hasher.hash_sequence(torch.tensor([5, 9, 10**6, 13, 17]))
    assert by_id.tolist() == got and oov.tolist() == got


def test_rejects_bad_token_map():
    cfg = make_config(cvs=10)
    with pytest.raises(ValueError):
        EngramHasher(cfg, torch.tensor([0, 1, 2, 10]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    cfg = make_config(layer_ids=(1, 14), n=4, heads=8, vocab=1000, cvs=99092)
    gen = torch.Generator().manual_seed(4)
    tm = torch.randint(0, 99092, (3000,), generator=gen)
    hasher = EngramHasher(cfg, tm)
    ids = torch.randint(0, 3000, (300,), generator=gen)
    dead = torch.rand(300, generator=gen) < 0.1
    cpu = hasher.hash_sequence(ids, dead_mask=dead)
    gpu = hasher.hash_sequence(ids.cuda(), dead_mask=dead.cuda())
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
    part = hasher.hash_ids(ids[100:].cuda(), 100, ids[97:100].cuda(), dead[100:].cuda(), dead[97:100].cuda())
    assert torch.equal(part.cpu(), cpu[100:])
