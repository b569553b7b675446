"""The fixed-shape decode entry of the adapter (sglang/model/decode_batch.py) without a server: the real tiny
model, `Runtime`, `KVPools` and `TokenStore`, fed by a stand-in ForwardBatch that carries only the
tensors the builders read. Oracles: the dynamic `forward.build_batch` path (logits and every pool
byte, bitwise), hand-computed capacity buckets, and a guard that makes any host read raise."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.runtime import KVPools, Runtime
from sglang_dsv41.sglang.model.decode_batch import CAPACITY_FLOOR, build_decode_batch, decode_capacity, host_max_seq_len
from sglang_dsv41.sglang.model.forward import TokenStore, build_batch, plan_logits

PAGE = 16
TABLE_WIDTH = 512
REQ_SLOTS = 6


class Mode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


def _hw(model) -> int:
    return model.cfg.engram.max_ngram_size - 1


class Server:
    """What the adapter holds for one replica (pools, token store, SGLang's req_to_token), with
    requests laid out on scattered pages the way SGLang's paged allocator would."""

    def __init__(self, model, lengths: list[int], req_slots: list[int]):
        self.model, self.req_slots = model, req_slots
        num_slots = 64 * PAGE
        self.pools = KVPools(model.cfg, num_slots, REQ_SLOTS, poison=True)
        self.runtime = Runtime(model, self.pools)
        self.store = TokenStore(num_slots, "cpu")
        self.req_to_token = torch.zeros(REQ_SLOTS, TABLE_WIDTH, dtype=torch.int32)
        pages = iter(torch.randperm(63, generator=torch.Generator().manual_seed(3)).add(1).tolist())  # page 0 unused
        for slot, n in zip(req_slots, lengths):
            for p in range(0, n, PAGE):
                base = next(pages) * PAGE
                self.req_to_token[slot, p : p + PAGE] = torch.arange(base, base + PAGE, dtype=torch.int32)
        self.rows = torch.arange(REQ_SLOTS)

    def fb(self, ids: list[list[int]], starts: list[int], decode: bool) -> SimpleNamespace:
        """A ForwardBatch stand-in: request b gets ids[b] at positions starts[b]..."""
        slots = torch.tensor(self.req_slots)
        pos = [s + i for s, t in zip(starts, ids) for i in range(len(t))]
        req = [b for b, t in enumerate(ids) for _ in t]
        seq = torch.tensor([s + len(t) for s, t in zip(starts, ids)])
        return SimpleNamespace(
            forward_mode=Mode(decode), batch_size=len(ids),
            input_ids=torch.tensor([i for t in ids for i in t]), positions=torch.tensor(pos),
            seq_lens=seq, seq_lens_cpu=seq.clone(), req_pool_indices=slots,
            out_cache_loc=self.req_to_token[slots[req], torch.tensor(pos)].long(),
            extend_prefix_lens_cpu=list(starts), extend_seq_lens_cpu=[len(t) for t in ids])

    def prefill(self, prompts: list[list[int]]) -> None:
        fb = self.fb(prompts, [0] * len(prompts), decode=False)
        plan = plan_logits(fb.extend_seq_lens_cpu, None, "cpu")
        self.runtime.forward(build_batch(fb, self.req_to_token, self.store, _hw(self.model), plan.rows))

    def decode(self, fb, fixed: bool, capacity: int | None = None) -> torch.Tensor:
        if fixed:
            cap = capacity or decode_capacity(host_max_seq_len(fb), TABLE_WIDTH)
            batch = build_decode_batch(fb, self.req_to_token, self.store, _hw(self.model), self.rows, cap)
        else:
            rows = plan_logits([1] * fb.batch_size, None, "cpu").rows
            batch = build_batch(fb, self.req_to_token, self.store, _hw(self.model), rows)
        return self.runtime.forward(batch).logits


def _state(s: Server) -> list[torch.Tensor]:
    p = s.pools
    return [*p.window, *p.compressed.values(), *p.index_keys.values(), *p.pending.values(), s.store.ids]


def test_decode_capacity_buckets_and_caps():
    assert CAPACITY_FLOOR == 256
    assert decode_capacity(1, 4096) == decode_capacity(256, 4096) == 256  # the floor: one bucket for short contexts
    assert decode_capacity(257, 4096) == decode_capacity(512, 4096) == 512  # next power of two
    assert decode_capacity(513, 4096) == 1024
    assert decode_capacity(3000, 4096) == 4096
    assert decode_capacity(3000, 3500) == 3500  # capped at the table width (SGLang's context bound)
    assert decode_capacity(3500, 3500) == 3500
    assert decode_capacity(10, 100) == 100  # a table narrower than the floor
    assert decode_capacity(5, 4096, floor=2) == 8 and decode_capacity(8, 4096, floor=2) == 8
    assert decode_capacity(None, 777) == 777  # no host lengths: the whole table
    for n in range(1, 1100):  # always >= the longest request, at most twice it (or the floor)
        c = decode_capacity(n, 1 << 20)
        assert n <= c <= max(2 * n - 1, 256)
    for bad in (0, 3501):
        with pytest.raises(ValueError, match="token table 3500 wide"):
            decode_capacity(bad, 3500)
    assert host_max_seq_len(SimpleNamespace(seq_lens_cpu=torch.tensor([7, 300, 12]))) == 300
    assert host_max_seq_len(SimpleNamespace(seq_lens_cpu=None)) is None


@pytest.mark.parametrize("capacity", ["bucket", "tight", "table"])
def test_fixed_shape_decode_equals_dynamic_build(tiny_model, capacity):
    """Three requests in scattered request slots and pages (page 16), decoded 5 steps each way: every
    step crosses a ratio-2 pair (closing and parking alternate), each request crosses a page boundary
    (32, 48, 64), Engram history comes from the token store. The fixed-shape batch (capacity: the
    power-of-two bucket, the longest request exactly, or the whole table) gives the dynamic path's
    logits and leaves every pool byte and the token store as it does."""
    g = torch.Generator().manual_seed(5)
    lengths, steps = [29, 46, 62], 5
    tokens = [torch.randint(3, tiny_model.cfg.vocab_size, (n + steps,), generator=g).tolist() for n in lengths]
    servers = [Server(tiny_model, [n + steps for n in lengths], [4, 1, 2]) for _ in range(2)]
    for s in servers:
        s.prefill([t[:n] for t, n in zip(tokens, lengths)])
    for step in range(steps):
        starts = [n + step for n in lengths]
        ids = [[t[p]] for t, p in zip(tokens, starts)]
        cap = {"bucket": None, "tight": max(starts) + 1, "table": TABLE_WIDTH}[capacity]
        dynamic = servers[0].decode(servers[0].fb(ids, starts, decode=True), fixed=False)
        fixed = servers[1].decode(servers[1].fb(ids, starts, decode=True), fixed=True, capacity=cap)
        assert fixed.shape == (3, tiny_model.cfg.vocab_size)
        assert torch.equal(fixed, dynamic), f"step {step}"
    for a, b in zip(_state(servers[0]), _state(servers[1])):
        assert torch.equal(a, b)


@contextlib.contextmanager
def _no_host_reads(monkeypatch):
    """Every way a tensor's value reaches Python raises (on a GPU each is a device sync)."""
    def refuse(name):
        def raiser(*args, **kwargs):
            raise AssertionError(f"host read of device data: Tensor.{name}")
        return raiser

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__index__", "__float__"):
            m.setattr(torch.Tensor, name, refuse(name))
        m.setattr(torch, "tensor", refuse("torch.tensor (host list -> device)"))
        yield


def _decode_fb(tiny_model, device: str = "cpu"):
    s = Server(tiny_model, [40, 70], [3, 0])
    fb = s.fb([[5], [9]], [30, 65], decode=True)
    cap = decode_capacity(host_max_seq_len(fb), TABLE_WIDTH)  # host lengths: read before the guard
    if device != "cpu":
        for k, v in vars(fb).items():
            if isinstance(v, torch.Tensor) and k != "seq_lens_cpu":
                setattr(fb, k, v.to(device))
        s.req_to_token, s.rows = s.req_to_token.to(device), s.rows.to(device)
        s.store.ids = s.store.ids.to(device)
    return s, fb, cap


def test_decode_build_reads_nothing_back_from_the_device(tiny_model, monkeypatch):
    """The decode batch is built with every host read refused, and again on the meta device (where
    any data-dependent shape raises: boolean masks, nonzero, repeat_interleave without output_size).
    The dynamic `build_batch` fails both guards (it reads the batch width on the host), so the guards
    do catch a sync."""
    s, fb, cap = _decode_fb(tiny_model)
    hw, plan_rows = _hw(tiny_model), torch.arange(2)
    with _no_host_reads(monkeypatch):
        batch = build_decode_batch(fb, s.req_to_token, s.store, hw, s.rows, cap)
    assert batch.static and batch.seq_capacity == cap == 256 and batch.token_table.shape == (2, 256)
    with pytest.raises(AssertionError, match="host read"), _no_host_reads(monkeypatch):
        build_batch(fb, s.req_to_token, s.store, hw, plan_rows)

    s, fb, cap = _decode_fb(tiny_model, "meta")
    batch = build_decode_batch(fb, s.req_to_token, s.store, hw, s.rows, cap)
    assert batch.token_table.shape == (2, cap) and batch.history.shape == (2, hw)
    with pytest.raises((RuntimeError, NotImplementedError), match="(?i)meta"):
        build_batch(fb, s.req_to_token, s.store, hw, plan_rows.to("meta"))


def test_token_store_padding_rows_write_nothing():
    """Rows at or past `real_rows` repeat row 0's write, even when they name a real row's slot."""
    store = TokenStore(8, "cpu")
    store.ids[:] = torch.arange(100, 108)
    store.write(torch.tensor([2, 5, 2, 6]), torch.tensor([11, 12, 13, 14]), real_rows=torch.tensor(2))
    assert store.ids.tolist() == [100, 101, 11, 103, 104, 12, 106, 107]
