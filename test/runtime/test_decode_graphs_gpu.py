"""GPU: the bucketed decode graph set (runtime/decode_graphs.py) captured and replayed with the Triton op
table, in deterministic mode. Oracle: the eager step of the same static decode batch from the same pool
state: logits, routed experts and every pool byte bit for bit, through padding rows (3 requests in the
4-row graph), a capacity bucket narrower than the batch's table, and the eager fallback. A request's
logits are the same whether it decodes alone, among 7 (the 8-row graph) or among 64.
CPU twin (the same steps without capture): test_decode_graphs.py."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.determinism import DETERMINISTIC_ENV
from static_decode import run_restoring as _run
from static_decode import static_batch as _batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (graph capture)")

LENGTHS = [40 + 37 * i for i in range(64)]  # 40 .. 2371 tokens


@pytest.fixture(scope="module")
def setup(tiny_dir):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
    from sglang_dsv41.runtime.driver import Driver, Sequence
    from sglang_dsv41.runtime.kernels import kernel_table

    mp = pytest.MonkeyPatch()
    mp.setenv(DETERMINISTIC_ENV, "1")
    model = load_model(tiny_dir, device="cuda", progress=False)
    table = kernel_table("cuda")
    apply_numerics(model, NumericsPolicy.kernels(table))
    g = torch.Generator().manual_seed(5)
    drv = Driver(model, sum(LENGTHS) + 64 * 70, 64, page_size=64, device="cuda", ops=table)
    seqs = []
    for i, n in enumerate(LENGTHS):
        s = Sequence(i, torch.randint(3, model.cfg.vocab_size, (n + 1,), generator=g).tolist(), n)
        drv.pools.clear_request(s.req_slot)
        drv.step([s], [n])
        seqs.append(s)
    yield drv, seqs
    mp.undo()


def _graphs(drv, batch_sizes, capacities):
    from sglang_dsv41.runtime.decode_graphs import DecodeGraphSet, GraphBuckets

    return DecodeGraphSet(drv.runtime, GraphBuckets(batch_sizes, capacities), drv.history_width, scratch_slots=64)


@pytest.mark.parametrize("pick,capacity", [((0,), 256), ((0, 5, 9), 512), ((3, 20), 2048), (tuple(range(64)), 4096)])
def test_replay_equals_eager(setup, pick, capacity):
    drv, seqs = setup
    chosen = [seqs[i] for i in pick]
    batch = _batch(drv, chosen, capacity)
    longest = max(s.cached + 1 for s in chosen)
    graphs = _graphs(drv, (1, 4, 64), (256, 512, 1024, 4096))
    key = graphs.plan(batch, longest)
    assert isinstance(key, tuple) and graphs.graph(*key).graph is not None  # captured
    want = _run(drv, lambda: drv.runtime.forward(batch))
    got = _run(drv, lambda: graphs.forward(batch, longest))
    assert not graphs.fallbacks
    assert torch.equal(got[0], want[0])
    assert all(torch.equal(got[1][k], want[1][k]) for k in want[1])
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2]))


def test_fallback_and_batch_invariance(setup):
    drv, seqs = setup
    graphs = _graphs(drv, (1, 8, 64), (4096,))
    alone = _run(drv, lambda: graphs.forward(_batch(drv, seqs[:1], 256), seqs[0].cached + 1))[0]
    among7 = _run(drv, lambda: graphs.forward(_batch(drv, seqs[:7], 512), seqs[6].cached + 1))[0]
    among64 = _run(drv, lambda: graphs.forward(_batch(drv, seqs, 4096), seqs[-1].cached + 1))[0]
    assert set(graphs.graphs) == {(1, 4096), (8, 4096), (64, 4096)}
    assert torch.equal(alone[0], among7[0]) and torch.equal(alone[0], among64[0])
    small = _graphs(drv, (1, 4), (256,))
    eager = _run(drv, lambda: drv.runtime.forward(_batch(drv, seqs[:5], 512)))[0]
    got = _run(drv, lambda: small.forward(_batch(drv, seqs[:5], 512), seqs[4].cached + 1))[0]
    assert torch.equal(got, eager) and sum(small.fallbacks.values()) == 1
