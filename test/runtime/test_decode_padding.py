"""Padding rows of a static decode batch (`Batch.real_rows`): a step captured for 4 rows running 2
requests. Oracle: the same step without the padding rows, run from the same pool state: the real
rows' logits bit for bit, and every pool byte (window KV, compressed KV, index keys, pending pair
state). A control run of the same padded batch without `real_rows` shows the padding rows do point
at real state (it changes)."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.driver import Driver, Sequence

CAPACITY = 128


@pytest.fixture(scope="module")
def ids(tiny_model) -> list[int]:
    g = torch.Generator().manual_seed(13)
    return torch.randint(3, tiny_model.cfg.vocab_size, (200,), generator=g).tolist()


def _static(drv: Driver, rows: list[tuple[Sequence, int, int, int]], real_rows: torch.Tensor | None = None) -> Batch:
    """rows: (sequence whose token table the row reads, request slot, position, token id)."""
    hw = drv.model.cfg.engram.max_ngram_size - 1
    table = drv._table([s for s, *_ in rows], CAPACITY)[:, :CAPACITY]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    pos = t([p for _, _, p, _ in rows])
    index = torch.arange(len(rows))
    return Batch(input_ids=t([tok for *_, tok in rows]), positions=pos, req_index=index,
                 req_slots=t([r for _, r, _, _ in rows]), prefix_lens=pos, extend_lens=torch.ones_like(pos),
                 token_table=table, history=t([s.tokens[p - hw : p] for s, _, p, _ in rows]), logits_rows=index,
                 seq_capacity=CAPACITY, static=True, real_rows=real_rows)


def _pools(drv: Driver) -> dict[str, list[torch.Tensor]]:
    p = drv.pools
    return {"window": list(p.window), "compressed": list(p.compressed.values()),
            "index_keys": list(p.index_keys.values()), "pending": list(p.pending.values())}


def _state(drv: Driver) -> dict[str, list[torch.Tensor]]:
    return {k: [x.clone() for x in v] for k, v in _pools(drv).items()}


def _restore(drv: Driver, state: dict[str, list[torch.Tensor]]) -> None:
    for k, tensors in _pools(drv).items():
        for now, saved in zip(tensors, state[k]):
            now.copy_(saved)


def _differs(a: dict, b: dict) -> dict[str, bool]:
    return {k: any(not torch.equal(x, y) for x, y in zip(a[k], b[k])) for k in a}


def test_padding_rows_store_nothing(tiny_model, ids):
    """Requests A (slot 0, 40 cached: parks this step) and B (slot 1, 53 cached: closes a pair) are
    real; C (slot 2, 41 cached, a parked even token) waits. Padding row 2 names C's slot and table at
    an even position (it would overwrite C's window KV and park into C's pending state); padding row
    3 names B's request slot (a duplicate of a real row) and A's table at an odd position (it would
    overwrite A's window KV and close A's pair: compressed KV and index keys)."""
    drv = Driver(tiny_model, 1024, 3, page_size=64, poison=True)
    a, b, c = Sequence(0, ids[:41], 40), Sequence(1, ids[50:104], 53), Sequence(2, ids[120:161], 41)
    for s in (a, b, c):
        drv.pools.clear_request(s.req_slot)
        drv.step([s], [s.prefill_len])
    real = [(a, 0, 40, ids[40]), (b, 1, 53, ids[103])]
    pad = [(c, 2, 20, 7), (a, 1, 21, 8)]  # tokens other than the cached ones at those positions
    before = _state(drv)

    want = drv.runtime.forward(_static(drv, real)).logits
    after = _state(drv)
    assert any(_differs(before, after).values())  # the real rows did write

    _restore(drv, before)
    got = drv.runtime.forward(_static(drv, real + pad, real_rows=torch.tensor(2))).logits
    assert got.shape[0] == 4 and torch.equal(got[:2], want)
    assert not any(_differs(_state(drv), after).values())

    _restore(drv, before)  # control: unmasked, the same padding rows overwrite real state of every kind
    drv.runtime.forward(_static(drv, real + pad))
    assert _differs(_state(drv), after) == {"window": True, "compressed": True, "index_keys": True, "pending": True}


def test_real_rows_needs_a_static_decode_batch(tiny_model, ids):
    drv = Driver(tiny_model, 256, 2, page_size=64)
    a = Sequence(0, ids[:10], 10)
    drv.step([a], [10])
    batch = _static(drv, [(a, 0, 10, 5)], real_rows=torch.tensor(1))
    with pytest.raises(ValueError, match="static decode batch"):
        drv.runtime.forward(Batch(**{**vars(batch), "static": False}))
