"""Standalone offline driver over the engine-agnostic runtime (no SGLang): paged allocation,
chunked prefill, batched greedy decode. Used by benchmarks on the GPU machine and by tests.

    python -m sglang_dsv41.runtime.driver --model deepseek-v4.1-tiny --prompts 4 --prompt-len 300 \
        --decode 16 --chunk 128 [--out tokens.json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

import torch

from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.runtime.batch import Batch
from sglang_dsv41.runtime.paged_runtime import Runtime
from sglang_dsv41.runtime.pools import KVPools


class PageAllocator:
    """Hands out whole pages of `page_size` consecutive slots (page_size even, so ratio-2 pairs
    share `slot // 2`). Slot 0..page_size-1 (page 0) is reserved as a scratch page."""

    def __init__(self, num_slots: int, page_size: int):
        if page_size % 2:
            raise ValueError("page_size must be even (ratio-2 pairs share a compressed slot)")
        self.page_size = page_size
        self.free = list(range(num_slots // page_size - 1, 0, -1))

    def alloc(self) -> int:
        if not self.free:
            raise RuntimeError("out of KV pages")
        return self.free.pop() * self.page_size

    def release(self, base: int) -> None:
        self.free.append(base // self.page_size)


@dataclass
class Sequence:
    req_slot: int
    tokens: list[int]
    prefill_len: int
    pages: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose KV is in the pools


class Driver:
    def __init__(self, model: DeepseekV41, max_tokens: int, max_requests: int, page_size: int = 64,
                 device: str | torch.device = "cpu", poison: bool = False, ops=None):
        """`ops`: the paged KV's op table (default: registry ops). Kernels for the model's own slots
        are the caller's choice (`runtime.kernels.use_kernels`), as `main` does on CUDA."""
        self.model, self.device = model, device
        self.page_size = page_size
        num_slots = -(-max_tokens // page_size) * page_size + page_size
        self.pools = KVPools(model.cfg, num_slots, max_requests, device, poison=poison)
        self.alloc = PageAllocator(num_slots, page_size)
        self.runtime = Runtime(model, self.pools, ops)
        self.max_requests = max_requests

    def _table(self, seqs: list[Sequence], length: int) -> torch.Tensor:
        for s in seqs:
            while len(s.pages) * self.page_size < length:
                s.pages.append(self.alloc.alloc())
        width = max(len(s.pages) for s in seqs) * self.page_size
        table = torch.full((len(seqs), width), -1, dtype=torch.int64)
        for i, s in enumerate(seqs):
            slots = torch.tensor(s.pages).repeat_interleave(self.page_size) + torch.arange(len(s.pages) * self.page_size) % self.page_size
            table[i, : slots.numel()] = slots
        return table

    def step(self, seqs: list[Sequence], counts: list[int], all_logits: bool = False, replay=None):
        """Run `counts[i]` new tokens of each sequence (a prefill chunk or a decode step);
        `replay` (Decisions) forces routing / top-k / candidate decisions for these rows."""
        ngram = (self.model.cfg.engram.max_ngram_size - 1) if self.model.cfg.engram else 1
        table = self._table(seqs, max(s.cached + c for s, c in zip(seqs, counts)))
        batch = Batch.build(
            [s.tokens[s.cached : s.cached + c] for s, c in zip(seqs, counts)],
            [s.cached for s in seqs],
            table,
            [s.req_slot for s in seqs],
            [s.tokens[max(0, s.cached - ngram) : s.cached] for s in seqs],
            all_logits=all_logits,
            device=self.device,
            history_width=ngram,
        )
        out = self.runtime.forward(batch, replay)
        for s, c in zip(seqs, counts):
            s.cached += c
        return out

    def generate(self, prompts: list[list[int]], max_new: int, chunk: int = 8192, teacher: list[list[int]] | None = None,
                 replays: list | None = None, trace: list | None = None) -> tuple[list[list[int]], dict]:
        """Greedy: chunked prefill of all prompts together, then batched decode. Returns new tokens.

        Cross-device comparison hooks (guides/numerics.md steps 2-3); the step schedule depends only
        on the prompts, `max_new` and `chunk`, so step i of two runs covers the same rows:
        `teacher[r]` is fed as request r's new tokens instead of the argmax (teacher forcing); `replays[i]`
        (Decisions) forces step i's decisions; `trace`, if a list, gets one `StepTrace` per step.
        """
        steps = iter(replays or ())
        if len(prompts) > self.max_requests:
            raise ValueError(f"{len(prompts)} prompts exceed max_requests={self.max_requests}")
        seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
        for s in seqs:
            self.pools.clear_request(s.req_slot)
        sync = torch.cuda.synchronize if str(self.device).startswith("cuda") else (lambda: None)
        t0 = time.perf_counter()
        last = {}
        while any(s.cached < s.prefill_len for s in seqs):
            active = [s for s in seqs if s.cached < s.prefill_len]
            budget, counts = chunk, []
            for s in active:
                counts.append(min(s.prefill_len - s.cached, max(budget, 0)))
                budget -= counts[-1]
            active, counts = zip(*[(s, c) for s, c in zip(active, counts) if c > 0])
            out = self.step(list(active), list(counts), replay=next(steps, None))
            self._trace(trace, active, out)
            for s, row in zip(active, out.logits):
                if s.cached == s.prefill_len:
                    last[s.req_slot] = row
        sync()
        t_prefill = time.perf_counter() - t0
        new = [[] for _ in seqs]
        t0 = time.perf_counter()
        for i in range(max_new):
            for s in seqs:
                tok = int(last[s.req_slot].argmax()) if teacher is None else teacher[s.req_slot][i]
                new[s.req_slot].append(tok)
                s.tokens.append(tok)
            if i == max_new - 1:
                break
            out = self.step(seqs, [1] * len(seqs), replay=next(steps, None))
            self._trace(trace, seqs, out)
            for s, row in zip(seqs, out.logits):
                last[s.req_slot] = row
        sync()
        t_decode = time.perf_counter() - t0
        for s in seqs:
            for base in s.pages:
                self.alloc.release(base)
        stats = {"prefill_s": t_prefill, "decode_s": t_decode,
                 "prefill_tok_s": sum(len(p) for p in prompts) / max(t_prefill, 1e-9),
                 "decode_tok_s": len(seqs) * max(max_new - 1, 0) / max(t_decode, 1e-9)}
        return new, stats


    @staticmethod
    def _trace(trace: list | None, seqs, out) -> None:
        if trace is not None:
            cpu = lambda d: {k: v.cpu() for k, v in d.items()}  # noqa: E731
            d = out.decisions
            trace.append(StepTrace([s.req_slot for s in seqs], out.logits.float().cpu(), cpu(d.routed_experts),
                                   cpu(d.topk), cpu(d.candidates)))


@dataclass
class StepTrace:
    """One forward of `Driver.generate`, on the CPU: which requests ran, the logits rows they sampled
    from and the decisions of all the forward's rows (the fields of `Decisions`)."""

    req_slots: list[int]
    logits: torch.Tensor  # fp32 [len(req_slots), vocab]
    routed_experts: dict[int, torch.Tensor]
    topk: dict[int, torch.Tensor]
    candidates: dict[int, torch.Tensor]

    def replay(self) -> Decisions:
        return Decisions(self.routed_experts, self.topk, self.candidates)


def random_prompts(vocab_size: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of `length` uniform token ids in [3, vocab) (0-2 are bos / eos / pad): the prompts
    of every driver benchmark, the same on every machine for a given seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (n, length), generator=g).tolist()


def main(argv: list[str] | None = None) -> None:
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.runtime.kernels import kernel_table, use_kernels

    ap = argparse.ArgumentParser(description="Offline prefill + greedy decode over the paged runtime.")
    ap.add_argument("--model", default="deepseek-v4.1-tiny")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--page-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the generated token ids as json")
    a = ap.parse_args(argv)
    model = load_model(a.model, device=a.device, progress=False)
    table = kernel_table(a.device)
    use_kernels(model, table)
    prompts = random_prompts(model.cfg.vocab_size, a.prompts, a.prompt_len, a.seed)
    drv = Driver(model, a.prompts * (a.prompt_len + a.decode) + a.prompts * a.page_size, a.prompts, a.page_size,
                 a.device, ops=table)
    new, stats = drv.generate(prompts, a.decode, a.chunk)
    print(json.dumps({k: round(v, 4) for k, v in stats.items()}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"prompts": prompts, "tokens": new, "stats": stats}, f)


if __name__ == "__main__":
    main()
