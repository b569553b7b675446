"""Split schedules through the adapter's batch builders, without a server (issue 29 item 5): two
samples of one prompt where the second is prefilled while the first decodes, then the first
finishes while the second goes on, as SGLang schedules them when the samples arrive apart. Every
logits row the adapter path produces (`forward.build_batch` for prefills, the fixed-shape
`decode_batch.build_decode_batch` for decodes, real `Runtime` / `KVPools` / `TokenStore`, tiny model)
must equal the trainer's dense forward (`DenseKV`) bit for bit.

What a reused request slot or token slot holds from an earlier request is poisoned on purpose: the
ratio-2 pending pair state of each request slot gets random values when a request takes the slot
(the adapter never clears it: it must never be read before the request writes it), and the columns
of SGLang's `req_to_token` past a request's end hold random slot numbers (the static decode batch
reads C >= 256 columns of it and must mask them)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.runtime import KVPools, Runtime
from sglang_dsv41.sglang.model.decode_batch import build_decode_batch, decode_capacity
from sglang_dsv41.sglang.model.forward import TokenStore, build_batch, plan_logits

PAGE, PAGES, REQ_SLOTS, TABLE_WIDTH = 64, 16, 6, 512


class Mode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


class Request:
    def __init__(self, slot: int, prompt: list[int], new_tokens: int):
        self.slot, self.tokens, self.new_tokens, self.prompt_len = slot, list(prompt), new_tokens, len(prompt)
        self.cached = 0  # tokens whose KV the pools hold
        self.logits: dict[int, torch.Tensor] = {}  # position -> fp32 logits row of that forward

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.new_tokens


class AdapterReplica:
    """The adapter's per-replica state (pools, token store, SGLang's req_to_token) and SGLang's part
    of a schedule: page allocation, stand-in ForwardBatches, sampling, freeing."""

    def __init__(self, model, seed: int):
        self.model, self.hw = model, model.cfg.engram.max_ngram_size - 1
        self.num_slots = PAGES * PAGE
        self.pools = KVPools(model.cfg, self.num_slots, REQ_SLOTS)
        self.runtime = Runtime(model, self.pools)
        self.store = TokenStore(self.num_slots, "cpu")
        self.gen = torch.Generator().manual_seed(seed)
        self.req_to_token = self._stale(REQ_SLOTS)
        self.free_pages = list(range(1, PAGES))
        self.rows = torch.arange(REQ_SLOTS)

    def _stale(self, rows: int) -> torch.Tensor:
        return torch.randint(0, self.num_slots, (rows, TABLE_WIDTH), dtype=torch.int32, generator=self.gen)

    def admit(self, slot: int, prompt: list[int], new_tokens: int) -> Request:
        page = self.free_pages.pop(0)
        self.req_to_token[slot, :PAGE] = torch.arange(page * PAGE, (page + 1) * PAGE, dtype=torch.int32)
        for pending in self.pools.pending.values():  # whatever the slot's last request left
            pending[slot] = torch.randn(pending.shape[1:], generator=self.gen) * 100
        return Request(slot, prompt, new_tokens)

    def release(self, r: Request) -> None:
        self.free_pages.append(int(self.req_to_token[r.slot, 0]) // PAGE)
        self.req_to_token[r.slot] = self._stale(1)[0]

    def _sample(self, r: Request, logits: torch.Tensor) -> None:
        r.logits[r.cached - 1] = logits
        r.tokens.append(int(torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=self.gen)))

    def prefill(self, reqs: list[Request]) -> None:
        ext = [len(r.tokens) for r in reqs]
        slots = torch.tensor([r.slot for r in reqs])
        fb = SimpleNamespace(
            forward_mode=Mode(False), input_ids=torch.tensor([t for r in reqs for t in r.tokens]),
            positions=torch.tensor([i for n in ext for i in range(n)]), req_pool_indices=slots,
            extend_prefix_lens_cpu=[0] * len(reqs), extend_seq_lens_cpu=ext,
            out_cache_loc=torch.cat([self.req_to_token[r.slot, :n].long() for r, n in zip(reqs, ext)]))
        rows = plan_logits(ext, None, "cpu").rows
        out = self.runtime.forward(build_batch(fb, self.req_to_token, self.store, self.hw, rows))
        for r, n, lg in zip(reqs, ext, out.logits):
            r.cached = n
            self._sample(r, lg)

    def decode(self, reqs: list[Request]) -> None:
        seq = torch.tensor([r.cached + 1 for r in reqs])
        fb = SimpleNamespace(
            forward_mode=Mode(True), input_ids=torch.tensor([r.tokens[r.cached] for r in reqs]), seq_lens=seq,
            seq_lens_cpu=seq.clone(), req_pool_indices=torch.tensor([r.slot for r in reqs]),
            out_cache_loc=torch.tensor([int(self.req_to_token[r.slot, r.cached]) for r in reqs]))
        cap = decode_capacity(int(seq.max()), TABLE_WIDTH)
        out = self.runtime.forward(build_decode_batch(fb, self.req_to_token, self.store, self.hw, self.rows, cap))
        for r, lg in zip(reqs, out.logits):
            r.cached += 1
            self._sample(r, lg)


def _run_split(replica: AdapterReplica, prompt: list[int], new: tuple[int, int], lead: int, slots: list[int]):
    """Sample A prefills and decodes `lead - 1` steps alone; sample B (same prompt) prefills while A
    decodes; both decode together; each is released as it finishes, the other goes on."""
    a = replica.admit(slots[0], prompt, new[0])
    replica.prefill([a])
    for _ in range(lead - 1):
        if not a.done:
            replica.decode([a])
    b = replica.admit(slots[1], prompt, new[1])
    replica.prefill([b])
    live = [r for r in (a, b) if not r.done]
    for r in (a, b):
        if r.done:
            replica.release(r)
    while live:
        replica.decode(live)
        for r in [r for r in live if r.done]:
            replica.release(r)
        live = [r for r in live if not r.done]
    return a, b


def _dense_logits(model, r: Request) -> torch.Tensor:
    seq = torch.tensor(r.tokens[:-1])
    with torch.no_grad():
        return model(seq, DenseKV(model.cfg, seq.numel(), "cpu"), None).logits.float()


def test_split_schedule_logits_equal_the_trainer(tiny_model, seed=0):
    rnd = random.Random(seed)
    replica = AdapterReplica(tiny_model, seed)
    vocab = tiny_model.cfg.vocab_size
    for trial in range(2):
        prompt = [rnd.randrange(3, vocab - 1) for _ in range(rnd.randint(5, 12))]
        new = (rnd.randint(3, 7), rnd.randint(3, 7))
        a, b = _run_split(replica, prompt, new, lead=rnd.randint(1, 3), slots=rnd.sample(range(REQ_SLOTS), 2))
        for name, r in (("A", a), ("B", b)):
            ref = _dense_logits(tiny_model, r)
            assert sorted(r.logits) == list(range(r.prompt_len - 1, len(r.tokens) - 1))
            bad = [p for p, lg in r.logits.items() if not torch.equal(lg.float(), ref[p])]
            assert not bad, f"trial {trial}, sample {name}: logits differ from the trainer's at positions {bad}"
