"""Paged runtime vs the reference forward. Oracle: `ReferenceModel` full-sequence logits, compared
bitwise (same layer math, same key order; CPU runs scalar ATen kernels, see conftest)."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.runtime.pools import KVPools


@pytest.fixture(scope="module")
def ids(tiny_model) -> list[int]:
    g = torch.Generator().manual_seed(7)
    return torch.randint(3, tiny_model.cfg.vocab_size, (300,), generator=g).tolist()


@pytest.fixture(scope="module")
def ref_out(tiny_reference, ids):
    return tiny_reference.forward(torch.tensor(ids))


@pytest.fixture(scope="module")
def ref_logits(ref_out) -> torch.Tensor:
    return ref_out.logits


def _prefill(driver: Driver, seq: Sequence, chunk: int) -> torch.Tensor:
    out = []
    while seq.cached < seq.prefill_len:
        out.append(driver.step([seq], [min(chunk, seq.prefill_len - seq.cached)], all_logits=True).logits)
    return torch.cat(out)


@pytest.mark.parametrize("chunk", [300, 64, 7])
def test_chunked_prefill_equals_reference(tiny_model, ids, ref_logits, chunk):
    drv = Driver(tiny_model, 1024, 2, page_size=64, poison=True)
    got = _prefill(drv, Sequence(0, list(ids), len(ids)), chunk)
    assert torch.equal(got, ref_logits)


def test_dense_and_paged_kv_take_the_same_decisions(tiny_model, ids, ref_out):
    """The one forward over DenseKV (reference) and over PagedKV (runtime): every routed expert,
    top-k selection and candidate block of a 300-token prefill is the same."""
    drv = Driver(tiny_model, 1024, 2, page_size=64, poison=True)
    got = drv.step([Sequence(0, list(ids), len(ids))], [len(ids)], all_logits=True).decisions
    want = ref_out.decisions
    assert sorted(got.routed_experts) == sorted(want.routed_experts) == list(range(tiny_model.cfg.num_layers))
    for lid, e in want.routed_experts.items():
        assert torch.equal(got.routed_experts[lid], e), lid
    assert sorted(got.topk) == sorted(want.topk) and want.topk
    for lid, sel in want.topk.items():
        assert torch.equal(got.topk[lid], sel), lid
    assert sorted(got.candidates) == sorted(want.candidates) and want.candidates
    for lid, cand in want.candidates.items():
        n = got.candidates[lid].size(1)
        assert n <= cand.size(1) and not cand[:, n:].any()
        assert torch.equal(got.candidates[lid], cand[:, :n]), lid


def test_token_by_token_prefill_equals_reference(tiny_model, tiny_reference, ids):
    n = 45  # crosses ratio-2 pairs at every step, a candidate block boundary and Engram history
    drv = Driver(tiny_model, 256, 2, page_size=64, poison=True)
    got = _prefill(drv, Sequence(0, ids[:n], n), 1)
    assert torch.equal(got, tiny_reference.forward(torch.tensor(ids[:n])).logits)


def test_decode_steps_equal_reference(tiny_model, ids, ref_logits):
    drv = Driver(tiny_model, 1024, 2, page_size=64, poison=True)
    seq = Sequence(0, list(ids), 280)
    _prefill(drv, seq, 128)
    rows = [drv.step([seq], [1]).logits[0] for _ in range(20)]  # teacher-forced decode 280..299
    assert torch.equal(torch.stack(rows), ref_logits[280:])


def test_mixed_batch_equals_reference(tiny_model, tiny_reference, ids):
    other = ids[::-1][:150]
    want_a = tiny_reference.forward(torch.tensor(ids[:201])).logits
    want_b = tiny_reference.forward(torch.tensor(other)).logits
    drv = Driver(tiny_model, 1024, 2, page_size=64, poison=True)
    a, b = Sequence(0, ids[:201], 200), Sequence(1, list(other), 150)
    _prefill(drv, a, 200)
    out = drv.step([a, b], [1, 77], all_logits=True).logits  # one decode row + a prefill chunk
    assert torch.equal(out[0], want_a[200]) and torch.equal(out[1:], want_b[:77])
    out = drv.step([b], [73], all_logits=True).logits
    assert torch.equal(out, want_b[77:])


def test_prefix_hit_equals_recompute(tiny_model, tiny_reference, ids):
    """B shares A's first 128 tokens through the page table (as a radix-cache hit would)."""
    b_ids = ids[:128] + ids[200:260]
    drv = Driver(tiny_model, 1024, 2, page_size=64, poison=True)
    a = Sequence(0, ids[:200], 200)
    _prefill(drv, a, 200)
    b = Sequence(1, b_ids, len(b_ids), pages=a.pages[:2], cached=128)  # 2 pages x 64 = the prefix
    drv.pools.clear_request(1)
    got = _prefill(drv, b, 64)
    assert torch.equal(got, tiny_reference.forward(torch.tensor(b_ids)).logits[128:])


def test_greedy_generate_matches_reference(tiny_model, tiny_reference, ids):
    drv = Driver(tiny_model, 2048, 2, page_size=64)
    prompts = [ids[:100], ids[100:160]]
    new, stats = drv.generate(prompts, max_new=6, chunk=64)
    for p, toks in zip(prompts, new):
        seq = list(p)
        for t in toks:
            assert t == int(tiny_reference.forward(torch.tensor(seq)).logits[-1].argmax())
            seq.append(t)
    assert stats["decode_s"] > 0 and len(drv.alloc.free) == 2048 // 64 + 1 - 1  # every page returned


def test_replayed_decisions_are_used(tiny_model, tiny_reference, ids):
    """The reference's decisions replayed into the runtime reproduce it; different forced experts
    or selections change the logits (so replay really drives the forward)."""
    from sglang_dsv41.runtime import Decisions

    n = 120
    ref = tiny_reference.forward(torch.tensor(ids[:n]))
    d = ref.decisions
    run = lambda replay: Driver(tiny_model, 512, 1, page_size=64).step(  # noqa: E731
        [Sequence(0, ids[:n], n)], [n], all_logits=True, replay=replay)
    same = run(Decisions(routed_experts=d.routed_experts, topk=d.topk, candidates=d.candidates))
    assert torch.equal(same.logits, ref.logits)
    assert torch.equal(same.decisions.routed_experts[3], d.routed_experts[3])
    assert torch.equal(same.decisions.topk[2], d.topk[2])
    moved = run(Decisions(routed_experts={3: d.routed_experts[3].flip(0)}))
    assert not torch.equal(moved.logits, ref.logits)
    sel = d.topk[6].clone()
    sel[sel >= 0] = 0
    assert not torch.equal(run(Decisions(topk={6: sel})).logits, ref.logits)


def test_pool_accounting_release_config():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from test_config import RELEASED_HF

    cfg = ModelConfig.from_hf(RELEASED_HF)
    b = KVPools.bytes_per_token(cfg)
    assert b == {"window": 528 * 40, "compressed": 890, "total": 528 * 40 + 890}
    assert KVPools.bytes_per_request_slot(cfg) == 3 * 2 * 512 * 4
