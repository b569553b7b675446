"""Standalone offline driver over the engine-agnostic runtime (no SGLang): paged allocation,
chunked prefill, batched greedy decode. Used by benchmarks on the GPU machine and by tests.

    python -m sglang_dsv41.runtime.driver --model deepseek-v4.1-tiny --prompts 4 --prompt-len 300 \
        --decode 16 --chunk 128 [--out tokens.json]
    torchrun --nproc-per-node 2 -m sglang_dsv41.runtime.driver --tp 2 --ep 2 ...   (docs/parallel.md)
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
from sglang_dsv41.runtime.graph import DecodeGraph
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
    shared_pages: int = 0  # leading pages borrowed from another sequence (a prefix-cache hit)
    window_ready: bool = True  # encoder replay: the request slot's window ring holds this sequence


class Driver:
    def __init__(self, model: DeepseekV41, max_tokens: int, max_requests: int, page_size: int = 64,
                 device: str | torch.device = "cpu", poison: bool = False, ops=None,
                 decoder_replay: bool = False, encoder_replay: bool = False, graphs: bool = False,
                 speculative: bool = False):
        """`ops`: the paged KV's op table (default: registry ops). Kernels for the model's own slots
        are the caller's choice (`apply_numerics(model, NumericsPolicy.kernels(table))`), as `main` does on CUDA.
        `decoder_replay` / `encoder_replay`: the SWA bounded-replay modes (spec attention 7).
        `graphs`: decode steps run as fixed-shape `DecodeGraph`s, one per (batch size, capacity),
        captured on CUDA (run eagerly elsewhere); False: the eager step with the batch's own shapes.
        `speculative`: pools for DSpark (KVPools(speculative=True)); runtime/speculative.py drives them."""
        if graphs and encoder_replay:
            raise ValueError("decode graphs (the default; --no-graph turns them off) need per-token window "
                             "pools: --encoder-replay runs with --no-graph")
        self.model, self.device = model, device
        self.page_size = page_size
        num_slots = -(-max_tokens // page_size) * page_size + page_size
        self.pools = KVPools(model.cfg, num_slots, max_requests, device, poison=poison, window_rings=encoder_replay,
                             speculative=speculative)
        self.alloc = PageAllocator(num_slots, page_size)
        self.runtime = Runtime(model, self.pools, ops, decoder_replay=decoder_replay)
        self.max_requests = max_requests
        self.encoder_replay = encoder_replay
        self.graphs: dict[tuple[int, int], DecodeGraph] | None = {} if graphs else None
        self._graph_pool = None
        self.graph_capture: bool | None = None  # None: capture on CUDA; False: run the fixed-shape step eagerly
        self.history_width = (model.cfg.engram.max_ngram_size - 1) if model.cfg.engram else 1
        """Engram n-gram history columns of a batch (1 without Engram)."""

    def history(self, seqs: list[Sequence]) -> list[list[int]]:
        """Per sequence, the `history_width` ids before its cached length, left-padded with 0."""
        w = self.history_width
        return [[0] * max(0, w - s.cached) + s.tokens[max(0, s.cached - w) : s.cached] for s in seqs]

    def fork(self, src: Sequence, req_slot: int, new_tokens: list[int]) -> Sequence:
        """A new request whose prompt starts with `src`'s cached tokens: a prefix-cache hit on the
        whole pages of `src` (shared, not copied), then `new_tokens`."""
        usable = src.cached
        if self.runtime.decoder_replay and not self.encoder_replay:
            # late-layer window KV of a cached prefix exists only for its tail rows: leave the last
            # window of the prompt to recompute (spec attention 6.4)
            usable = min(usable, src.cached + len(new_tokens) - self.model.cfg.attention.window_size)
        pages = max(usable, 0) // self.page_size
        hit = pages * self.page_size
        tokens = src.tokens[:src.cached] + list(new_tokens)
        self.pools.clear_request(req_slot)
        return Sequence(req_slot, tokens, len(tokens), list(src.pages[:pages]), cached=hit, shared_pages=pages,
                        window_ready=hit == 0)

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

    def build_batch(self, seqs: list[Sequence], counts: list[int], all_logits: bool = False,
                    rows: list[list[int]] | None = None) -> Batch:
        """The batch of `counts[i]` new tokens of each sequence from its cached length (`rows[i]`: those
        tokens given explicitly, e.g. a DSpark verify's chain, instead of s.tokens); pages are allocated
        for them. An encoder-replay hit's first forward also recomputes its last min(P, window) cached
        tokens."""
        ngram = self.history_width
        table = self._table(seqs, max(s.cached + c for s, c in zip(seqs, counts)))
        W = self.model.cfg.attention.window_size
        rep = [min(s.cached, W) if self.encoder_replay and not s.window_ready else 0 for s in seqs]
        starts = [s.cached - r for s, r in zip(seqs, rep)]
        if rows is None:
            rows = [s.tokens[a : s.cached + c] for s, a, c in zip(seqs, starts, counts)]
        elif any(rep):
            raise ValueError("explicit rows need sequences whose window is ready (no encoder-replay rows)")
        return Batch.build(
            rows,
            starts,
            table,
            [s.req_slot for s in seqs],
            [s.tokens[max(0, a - ngram) : a] for s, a in zip(seqs, starts)],
            all_logits=all_logits,
            device=self.device,
            history_width=ngram,
            replay_lens=rep,
        )

    def step(self, seqs: list[Sequence], counts: list[int], all_logits: bool = False, replay=None, image_rows=None):
        """Run `counts[i]` new tokens of each sequence (a prefill chunk or a decode step);
        `replay` (Decisions) forces routing / top-k / candidate decisions for these rows; `image_rows`:
        image spans inside these rows (`DeepseekV41.image_rows`, rows counted across the batch)."""
        out = self.runtime.forward(self.build_batch(seqs, counts, all_logits), replay, image_rows)
        for s, c in zip(seqs, counts):
            s.cached += c
            s.window_ready = True
        return out

    def generate(self, prompts: list[list[int]], max_new: int, chunk: int = 8192, teacher: list[list[int]] | None = None,
                 replays: list | None = None, trace: list | None = None) -> tuple[list[list[int]], dict]:
        """Greedy: chunked prefill of all prompts together, then batched decode. Returns new tokens.

        Cross-device comparison hooks (guides/numerics.md steps 2-3); the step schedule depends only
        on the prompts, `max_new` and `chunk`, so step i of two runs covers the same rows:
        `teacher[r]` is fed as request r's new tokens instead of the argmax (teacher forcing); `replays[i]`
        (Decisions) forces step i's decisions; `trace`, if a list, gets one `StepTrace` per step.
        """
        if len(prompts) > self.max_requests:
            raise ValueError(f"{len(prompts)} prompts exceed max_requests={self.max_requests}")
        seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
        for s in seqs:
            self.pools.clear_request(s.req_slot)
        return self.run(seqs, max_new, chunk, teacher, replays, trace)

    def run(self, seqs: list[Sequence], max_new: int, chunk: int = 8192, teacher: list[list[int]] | None = None,
            replays: list | None = None, trace: list | None = None, release: bool = True) -> tuple[list[list[int]], dict]:
        """`generate` over given sequences (new ones or `fork`s); `release=False` keeps their pages
        (a prefix for later forks). `teacher` is indexed by request slot."""
        steps = iter(replays or ())
        prompt_tokens = sum(s.prefill_len - s.cached for s in seqs)
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
        new = {s.req_slot: [] for s in seqs}
        t0 = time.perf_counter()  # pages for every step + the graph of this batch size (captured once)
        graph = self.decode_graph(seqs, max_new) if self.graphs is not None and replays is None and max_new > 1 else None
        sync()
        t_graph = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(max_new):
            if teacher is None:  # one host read per step: the greedy tokens of every request
                toks = torch.stack([last[s.req_slot] for s in seqs]).argmax(-1).tolist()
            else:
                toks = [teacher[s.req_slot][i] for s in seqs]
            for s, tok in zip(seqs, toks):
                new[s.req_slot].append(tok)
                s.tokens.append(tok)
            if i == max_new - 1:
                break
            out = self.graph_step(graph, seqs) if graph is not None else self.step(seqs, [1] * len(seqs), replay=next(steps, None))
            self._trace(trace, seqs, out)
            for s, row in zip(seqs, out.logits):
                last[s.req_slot] = row
        sync()
        t_decode = time.perf_counter() - t0
        if release:
            self.release(seqs)
        stats = {"prefill_s": t_prefill, "decode_s": t_decode, "graph_s": t_graph,
                 "prefill_tok_s": prompt_tokens / max(t_prefill, 1e-9),
                 "decode_tok_s": len(seqs) * max(max_new - 1, 0) / max(t_decode, 1e-9)}
        return [new[s.req_slot] for s in seqs], stats

    def decode_graph(self, seqs: list[Sequence], max_new: int) -> DecodeGraph:
        """The decode graph for `max_new - 1` decode steps of `seqs` (prefilled): pages for every step
        are allocated now, the capacity is the largest seq end rounded up to a page, and a graph of
        that (batch size, capacity) is captured on first use (CUDA) and reused after."""
        need = max(s.cached + max_new - 1 for s in seqs)
        cap = -(-need // self.page_size) * self.page_size
        key = (len(seqs), cap)
        if key not in self.graphs:
            if not self.graphs and str(self.device).startswith("cuda"):
                # graphs of one dict share a memory pool; a fresh dict gets a fresh pool (a handle whose
                # graphs were all freed must not be captured into again: allocator assert, H200 run)
                self._graph_pool = torch.cuda.graph_pool_handle()
            self.graphs[key] = DecodeGraph(self.runtime, len(seqs), cap, self.history_width, capture=self.graph_capture,
                                           pool=self._graph_pool, scratch_slots=self.page_size)
        g = self.graphs[key]
        g.set_table(self._table(seqs, cap))
        return g

    def graph_step(self, graph: DecodeGraph, seqs: list[Sequence]):
        """One decode step of `seqs` through `graph` (its table set by `decode_graph`)."""
        out = graph.step([s.tokens[s.cached] for s in seqs], [s.cached for s in seqs], [s.req_slot for s in seqs],
                         self.history(seqs))
        for s in seqs:
            s.cached += 1
            s.window_ready = True
        return out

    def release(self, seqs: list[Sequence]) -> None:
        """Free the sequences' own pages (borrowed prefix pages stay with their owner)."""
        for s in seqs:
            for base in s.pages[s.shared_pages:]:
                self.alloc.release(base)
            s.pages = []


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
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
    from sglang_dsv41.runtime.kernels import kernel_table

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
    ap.add_argument("--decoder-replay", action="store_true", help="decoder SWA bounded replay (tail-only prefill)")
    ap.add_argument("--encoder-replay", action="store_true", help="encoder SWA bounded replay (window KV in request rings)")
    ap.add_argument("--no-graph", action="store_true", help="eager decode steps (default: one CUDA graph per batch size)")
    ap.add_argument("--tp", type=int, default=1, help="attention heads, shared expert, vocab, Engram rows over the "
                    "torchrun ranks (1 or the rank count; docs/parallel.md)")
    ap.add_argument("--ep", type=int, default=1, help="routed experts over the torchrun ranks (1 or the rank count)")
    a = ap.parse_args(argv)
    from sglang_dsv41.parallel import ParallelError, ParallelPlan, load_sharded_model
    from sglang_dsv41.parallel.launch import finish, init_from_env

    comm, a.device = init_from_env(a.device)  # torchrun: one rank per process (NCCL on CUDA, gloo on CPU)
    try:
        plan = ParallelPlan(comm.size, comm.rank, a.tp, a.ep)
        model = load_sharded_model(a.model, plan, comm, a.device, progress=False)
    except ParallelError as e:
        ap.error(str(e))
    a.no_graph |= comm.size > 1  # the sharded MoE reads its routed pairs on the host: eager steps
    table = kernel_table(a.device)
    apply_numerics(model, NumericsPolicy.kernels(table))
    prompts = random_prompts(model.cfg.vocab_size, a.prompts, a.prompt_len, a.seed)
    drv = Driver(model, a.prompts * (a.prompt_len + a.decode) + a.prompts * a.page_size, a.prompts, a.page_size,
                 a.device, ops=table, decoder_replay=a.decoder_replay, encoder_replay=a.encoder_replay,
                 graphs=not a.no_graph and not a.encoder_replay)
    new, stats = drv.generate(prompts, a.decode, a.chunk)
    if comm.rank == 0:  # every rank generated the same tokens
        print(json.dumps({k: round(v, 4) for k, v in stats.items()}))
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"prompts": prompts, "tokens": new, "stats": stats}, f)
    finish()


if __name__ == "__main__":
    main()
