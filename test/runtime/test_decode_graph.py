"""The fixed-shape decode step (runtime/graph.py) run eagerly on the CPU: the same math as the reference
(bitwise, with capacities far past the contexts, so the padded slot tables / top-k widths are
exercised), the driver's graph path gives the eager path's tokens, and the entry point rejects
shapes it was not built for. CUDA capture and replay are checked on the GPU (driver_bench.py)."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.runtime.graph import DecodeGraph


@pytest.fixture(scope="module")
def ids(tiny_model) -> list[int]:
    g = torch.Generator().manual_seed(11)
    return torch.randint(3, tiny_model.cfg.vocab_size, (96,), generator=g).tolist()


def _prefill(drv: Driver, seq: Sequence) -> None:
    while seq.cached < seq.prefill_len:
        drv.step([seq], [min(64, seq.prefill_len - seq.cached)])


def _hw(model) -> int:
    return model.cfg.engram.max_ngram_size - 1


def test_static_decode_equals_reference(tiny_model, tiny_reference, ids):
    """Two requests of different lengths (pairs closing and parking on alternate steps), from short
    contexts (fewer compressed positions than index_topk) on, in one graph whose capacity is 4x the
    longest context: every decode row equals the reference's logits bit for bit."""
    a_ids, b_ids = ids[:60], ids[::-1][:75]
    drv = Driver(tiny_model, 2048, 2, page_size=64, poison=True, graphs=True)
    a, b = Sequence(0, list(a_ids), 21), Sequence(1, list(b_ids), 36)
    for s in (a, b):
        drv.pools.clear_request(s.req_slot)
        _prefill(drv, s)
    cap = 4 * 75
    g = DecodeGraph(drv.runtime, 2, cap, _hw(tiny_model), capture=False, scratch_slots=64)
    g.set_table(drv._table([a, b], cap))
    got_a, got_b = [], []
    for _ in range(39):
        out = drv.graph_step(g, [a, b])
        got_a.append(out.logits[0].clone())
        got_b.append(out.logits[1].clone())
    assert torch.equal(torch.stack(got_a), tiny_reference.forward(torch.tensor(a_ids)).logits[21:60])
    assert torch.equal(torch.stack(got_b), tiny_reference.forward(torch.tensor(b_ids)).logits[36:75])


def test_driver_graph_path_equals_eager(tiny_model, ids):
    """`Driver(graphs=True).generate` (fixed-shape steps) gives the eager driver's tokens and logits."""
    prompts = [ids[:40], ids[40:65]]
    traces = {}
    for graphs in (False, True):
        trace: list = []
        new, _ = Driver(tiny_model, 1024, 2, page_size=64, graphs=graphs).generate(prompts, 8, chunk=64, trace=trace)
        traces[graphs] = (new, trace)
    assert traces[True][0] == traces[False][0]
    eager, static = traces[False][1], traces[True][1]
    assert len(eager) == len(static)
    for e, s in zip(eager, static):
        assert torch.equal(e.logits, s.logits)
        for lid, t in e.topk.items():  # same selections; the static step's rows may be -1 padded wider
            assert torch.equal(s.topk[lid][:, : t.size(1)], t) and bool((s.topk[lid][:, t.size(1):] == -1).all())


def test_graph_rejects_shapes_it_was_not_built_for(tiny_model):
    drv = Driver(tiny_model, 512, 4, page_size=64)
    g = DecodeGraph(drv.runtime, 2, 128, _hw(tiny_model), capture=False)
    ok = dict(input_ids=[5, 6], positions=[10, 20], req_slots=[0, 1], history=[[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="no token table"):
        g.check(**ok)
    with pytest.raises(ValueError, match=r"batch size 2, got a token table \(3, 128\)"):
        g.set_table(torch.zeros(3, 128, dtype=torch.int64))
    g.set_table(torch.arange(256, dtype=torch.int64).view(2, 128))
    g.check(**ok)
    bad = [
        (dict(ok, input_ids=[5, 6, 7], positions=[1, 2, 3], req_slots=[0, 1, 2], history=[[1, 2]] * 3), "got 3 requests"),
        (dict(ok, positions=[10, 128]), "reaches 129 tokens"),
        (dict(ok, input_ids=[5, tiny_model.cfg.vocab_size]), "token id outside"),
        (dict(ok, req_slots=[1, 1]), "distinct"),
        (dict(ok, req_slots=[0, 4]), "distinct and in"),
        (dict(ok, history=[[1], [2]]), "history row"),
        (dict(ok, positions=[3]), "lengths differ"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg) as e:
            g.step(**kwargs)
        assert "captured for batch size 2, contexts up to 128 tokens" in str(e.value)
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraph(drv.runtime, 2, 128, _hw(tiny_model), capture=True)
    with pytest.raises(ValueError, match="--no-graph"):
        Driver(tiny_model, 512, 2, page_size=64, encoder_replay=True, graphs=True)


def test_pools_sized_from_a_memory_budget(tiny_model):
    from sglang_dsv41.runtime.pools import KVPools

    cfg = tiny_model.cfg
    per_token = KVPools.bytes_per_token(cfg)["total"]
    fixed = 3 * KVPools.bytes_per_request_slot(cfg)
    slots = KVPools.slots_for_budget(cfg, int(fixed + 10.5 * 64 * per_token), 3, 64)
    assert slots == 10 * 64
    drv = Driver(tiny_model, slots - 64, 3, page_size=64)  # the driver adds its scratch page
    used = sum(t.numel() * t.element_size() for t in [*drv.pools.window, *drv.pools.compressed.values(),
                                                       *drv.pools.index_keys.values(), *drv.pools.pending.values()])
    assert used <= fixed + 10.5 * 64 * per_token
    with pytest.raises(ValueError, match="holds no page of 64 tokens for 3 request slots"):
        KVPools.slots_for_budget(cfg, int(fixed + 64 * per_token), 3, 64)
