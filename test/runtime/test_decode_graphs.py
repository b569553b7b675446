"""The bucketed decode graph set (runtime/decode_graphs.py) on the CPU: the fixed-shape steps run eagerly
(capture=False), through the same buffers, padding and bucket choice a CUDA replay uses.

Oracle: the eager step of the same static decode batch (`Runtime.forward`, n rows, no padding) from the
same pool state: the set's n rows of logits and routed experts bit for bit, and every pool byte after
the step. Steps outside the buckets run that eager step, with the reason counted. GPU (captured graphs):
test/runtime/test_decode_graphs_gpu.py."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.runtime.decode_graphs import DecodeGraphSet, GraphBuckets
from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.runtime.graph import DecodeGraph
from static_decode import run_restoring as _run
from static_decode import static_batch as _batch

BUCKETS = GraphBuckets(batch_sizes=(1, 2, 4), capacities=(128, 256))
LENGTHS = (40, 97, 130, 61, 200)


@pytest.fixture(scope="module")
def setup(tiny_model):
    g = torch.Generator().manual_seed(21)
    ids = torch.randint(3, tiny_model.cfg.vocab_size, (sum(LENGTHS) + 8,), generator=g).tolist()
    drv = Driver(tiny_model, 4096, 6, page_size=64, poison=True)
    seqs, at = [], 0
    for i, n in enumerate(LENGTHS):
        s = Sequence(i, ids[at: at + n + 1], n)  # the token after the prompt is the decode step's input
        at += n + 1
        drv.pools.clear_request(s.req_slot)
        drv.step([s], [n])
        seqs.append(s)
    return drv, seqs


@pytest.mark.parametrize("pick,capacity,bucket", [
    ((0,), 128, (1, 128)),            # one request, exact batch bucket
    ((0, 1, 3), 128, (4, 128)),       # 3 requests in the 4-row graph: one padding row
    ((0, 2, 3), 256, (4, 256)),       # a context past 128: the next capacity bucket
    ((1, 3), 256, (2, 128)),          # the adapter's table is wider than the bucket: columns dropped
])
def test_graph_set_equals_the_eager_step(setup, pick, capacity, bucket):
    drv, seqs = setup
    chosen = [seqs[i] for i in pick]
    batch = _batch(drv, chosen, capacity)
    longest = max(s.cached + 1 for s in chosen)
    graphs = DecodeGraphSet(drv.runtime, BUCKETS, drv.history_width, capture=False, scratch_slots=64)
    assert graphs.plan(batch, longest) == bucket
    want, want_routed, pools_want = _run(drv, lambda: drv.runtime.forward(batch))
    got, got_routed, pools_got = _run(drv, lambda: graphs.forward(batch, longest))
    assert not graphs.fallbacks and set(graphs.graphs) == {bucket}
    assert torch.equal(got, want) and got.shape[0] == len(chosen)
    for layer, ids in want_routed.items():
        assert torch.equal(got_routed[layer], ids)
    assert all(torch.equal(a, b) for a, b in zip(pools_got, pools_want))


def test_steps_outside_the_buckets_run_eagerly(setup):
    drv, seqs = setup
    graphs = DecodeGraphSet(drv.runtime, BUCKETS, drv.history_width, capture=False, scratch_slots=64)
    wide = _batch(drv, seqs, 512)  # 5 requests > 4
    want = _run(drv, lambda: drv.runtime.forward(wide))[0]
    got = _run(drv, lambda: graphs.forward(wide, max(s.cached + 1 for s in seqs)))[0]
    assert torch.equal(got, want)
    long = _batch(drv, [seqs[4]], 512)  # 201 tokens fit 256; claim 300 to pass the largest bucket
    assert graphs.plan(long, 300) == "a context of 300 tokens > the largest capacity bucket 256"
    _run(drv, lambda: graphs.forward(long, 300))
    prefill = drv.build_batch([Sequence(5, [5, 6, 7], 3)], [3])
    assert graphs.plan(prefill, 3).startswith("not a static decode batch")
    assert dict(graphs.fallbacks) == {"5 requests > the largest batch bucket 4": 1,
                                      "a context of 300 tokens > the largest capacity bucket 256": 1}
    assert not graphs.graphs


def test_buckets():
    b = GraphBuckets.default(max_batch=48, max_capacity=8448)
    assert b.batch_sizes == (1, 2, 4, 8, 12, 16, 24, 32, 48)
    assert b.capacities == (256, 512, 1024, 2048, 4096, 8192, 8448)
    assert GraphBuckets.default(max_batch=5, max_capacity=200).batch_sizes == (1, 2, 4, 5)
    assert GraphBuckets.default(max_batch=5, max_capacity=200).capacities == (200,)
    assert b.choose(9, 257) == (12, 512) and b.choose(48, 8448) == (48, 8448)
    assert b.choose(49, 10) == "49 requests > the largest batch bucket 48"
    for bad in ((), (2, 1), (0, 1), (1, 1)):
        with pytest.raises(ValueError, match="ascending distinct"):
            GraphBuckets(batch_sizes=bad, capacities=(256,))


def test_load_needs_a_padding_graph_and_enough_request_slots(setup):
    drv, seqs = setup
    g = DecodeGraph(drv.runtime, 2, 128, drv.history_width, capture=False, scratch_slots=64)
    with pytest.raises(ValueError, match="padding=True"):
        g.load(_batch(drv, seqs[:2], 128))
    with pytest.raises(ValueError, match="request slots"):
        DecodeGraphSet(drv.runtime, GraphBuckets((1, 8), (128,)), drv.history_width, capture=False)
