"""DSpark speculative decoding over the paged runtime (shared/spec/dspark.md; docs/dspark.md).

    spec = SpecDecoder(driver)                       # driver = Driver(model, ..., speculative=True)
    new, stats = spec.generate(prompts, max_new)     # the same tokens as driver.generate (greedy)

One step per batch of requests, each with `cached` tokens in the pools and its anchor (the token
the target produced last, not yet in the pools) at position p = cached:
  draft    the drafter over the anchor + gamma - 1 noise ids at p .. p+gamma-1 (block positions
           p+1 ..; its context ends at p - 1): gamma drafted ids and their distributions
  verify   ONE target forward over [anchor, d_1 .. d_gamma] at p .. p+gamma (Batch.verify), logits
           of every row and the drafter's input of every row
  accept   greedy or chain rejection sampling (runtime/acceptance.py): k drafts accepted, k + 1 tokens
           emitted (truncated at EOS and at max_new)
  commit   rows 0 .. k are the request's: cached += k + 1; each ratio-2 KV source parks the pair
           state of the last committed even position (Batch.verify parks none); the committed rows'
           drafter inputs become context rows of every stage. Rejected rows' window KV, compressed
           KV and index keys stay in slots past the committed length, where no row reads before a
           later forward rewrites them; rings hold window + gamma + 1 positions, so a rejected row
           never overwrites a position a committed row still reads (KVPools(speculative=True)).
After any sequence of steps the pools hold, at every committed position, the bytes a plain decode
of the same tokens writes (test/runtime/test_speculative.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from sglang_dsv41.runtime.acceptance import distribution
from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.runtime.spec_graph import SpecGraph
from sglang_dsv41.runtime.spec_step import DSparkStep, RowSampling

Propose = Callable[[list[Sequence], torch.Tensor], torch.Tensor]
"""(sequences, drafted ids int64 [B, gamma + 1]) -> the ids to verify (a scripted drafter, tests)."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    """0: greedy (argmax drafts, greedy acceptance)."""
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class SpecStats:
    verifies: int = 0
    committed: int = 0
    """Tokens emitted by verifies (accepted drafts + bonus tokens)."""
    accepted_at: list[int] = field(default_factory=list)
    """accepted_at[i]: verifies whose draft i + 1 was accepted."""
    decode_s: float = 0.0

    @property
    def accept_length(self) -> float:
        """Committed tokens per verify, bonus included (SGLang's `accept len`)."""
        return self.committed / max(self.verifies, 1)


def forced_accepts(mean: float, step: int) -> int:
    """Drafts accepted at verify `step` so that the first n steps accept floor(n * mean) in all: a
    deterministic schedule with the given mean (2.5 -> 2, 3, 2, 3, ...)."""
    return int((step + 1) * mean + 1e-9) - int(step * mean + 1e-9)


class SpecDecoder:
    def __init__(self, driver: Driver, graphs: bool | None = None):
        """`graphs`: greedy steps run as fixed-shape `SpecGraph`s, one per (batch size, capacity),
        captured on CUDA (`driver.graph_capture` False: run eagerly through the same buffers); None:
        as the driver's decode (`Driver(graphs=)`)."""
        cfg = driver.model.cfg
        if cfg.dspark is None or driver.pools.draft_stages != cfg.dspark.n_stages:
            raise ValueError("speculative decoding needs a DSpark checkpoint and Driver(..., speculative=True)")
        self.drv, self.model, self.cfg = driver, driver.model, cfg
        self.gamma = cfg.dspark.block_size
        self.spec = DSparkStep(driver.runtime)
        use = driver.graphs is not None if graphs is None else graphs
        self.graphs: dict[tuple[int, int], SpecGraph] | None = {} if use else None
        self._graph_pool = None

    def spec_graph(self, seqs: list[Sequence], max_new: int) -> SpecGraph:
        """The graph for these prefilled sequences' remaining steps: pages for max_new more tokens and a
        verify's overshoot are allocated now; capacity = the largest seq end, rounded up to a page."""
        page = self.drv.page_size
        need = max(s.cached + max_new + self.gamma + 1 for s in seqs)
        cap = -(-max(need, self.cfg.attention.window_size + self.gamma + 2) // page) * page
        key = (len(seqs), cap)
        if key not in self.graphs:
            if self._graph_pool is None and str(self.drv.device).startswith("cuda"):
                self._graph_pool = torch.cuda.graph_pool_handle()
            self.graphs[key] = SpecGraph(self.spec, len(seqs), cap, self.drv.history_width, capture=self.drv.graph_capture,
                                         pool=self._graph_pool, scratch_slots=page)
        g = self.graphs[key]
        g.set_table(self.drv._table(seqs, cap))
        return g

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], chunk: int) -> dict[int, torch.Tensor]:
        """Chunked prefill with the drafter's capture -> last logits row per request slot."""
        last = {}
        while any(s.cached < s.prefill_len for s in seqs):
            active, counts, budget = [], [], chunk
            for s in seqs:
                c = min(s.prefill_len - s.cached, max(budget, 0))
                if c > 0:
                    active.append(s)
                    counts.append(c)
                    budget -= c
            out = self.spec.prefill(self.drv.build_batch(active, counts))
            for s, c, row in zip(active, counts, out.logits):
                s.cached += c
                s.window_ready = True
                if s.cached == s.prefill_len:
                    last[s.req_slot] = row
        return last

    @torch.inference_mode()
    def step(self, seqs: list[Sequence], sampling: Sampling, gen: torch.Generator | None,
             propose: Propose | None, forced: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft + verify + commit of `seqs` (each with its anchor as tokens[cached]) -> (accepted
        [B], tokens [B, gamma + 1]). `forced`: every request accepts exactly that many drafts whatever
        they are (speed measurements on random weights, `simulate_accept`)."""
        g, dev = self.gamma, self.drv.device
        ends = [s.cached + g + 1 for s in seqs]
        table = self.drv._table(seqs, max(ends)).to(dev)
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
        anchors, cached, slots = t([s.tokens[s.cached] for s in seqs]), t([s.cached for s in seqs]), t([s.req_slot for s in seqs])
        history = t(self.drv.history(seqs))
        rows = None
        if sampling.temperature > 0:
            if propose is not None:
                raise ValueError("a scripted drafter has no draft distribution: sample with the model's drafter")
            rows = RowSampling.uniform(len(seqs), dev, sampling.temperature, sampling.top_k, sampling.top_p)
        d = self.spec.draft(anchors, cached, table, slots, rows, gen)
        ids = d.ids if propose is None else propose(seqs, d.ids).to(dev)
        v = self.spec.verify(ids, cached, table, slots, history, capacity=max(ends))
        accepted, tokens = self.spec.accept(ids, d, v, rows, gen)
        if forced is not None:  # the drafts themselves are committed, then the target's next token
            forced = min(forced, g)
            accepted = torch.full_like(accepted, forced)
            tokens = torch.cat([ids[:, 1:], tokens[:, -1:]], 1)
            tokens[:, forced] = v.logits[:, forced].argmax(-1)
        self.spec.commit(v, accepted)
        return accepted, tokens

    # ------------------------------------------------------------------ the loop
    def generate(self, prompts: list[list[int]], max_new: int, chunk: int = 8192, sampling: Sampling = Sampling(),
                 eos: tuple[int, ...] = (), propose: Propose | None = None,
                 simulate_accept: float | None = None) -> tuple[list[list[int]], SpecStats]:
        """Like Driver.generate (greedy: the same tokens); generation of a request stops after
        `max_new` tokens or after an `eos` id (included)."""
        seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
        for s in seqs:
            self.drv.pools.clear_request(s.req_slot)
        return self.run(seqs, max_new, chunk, sampling, eos, propose, simulate_accept=simulate_accept)

    def run(self, seqs: list[Sequence], max_new: int, chunk: int = 8192, sampling: Sampling = Sampling(),
            eos: tuple[int, ...] = (), propose: Propose | None = None, release: bool = True,
            simulate_accept: float | None = None):
        """`generate` over given sequences (`Driver.run`). `simulate_accept=X`: every verify commits
        exactly the accept lengths of `forced_accepts(X - 1, ...)` (mean X tokens per verify, the bonus
        included) whatever the drafts are: decode speed apart from draft quality."""
        if max_new < 1:
            raise ValueError(f"max_new must be at least 1, got {max_new}")
        g1 = self.gamma + 1
        if simulate_accept is not None and not 1.0 <= simulate_accept <= g1:
            raise ValueError(f"simulate_accept must be in 1 .. gamma + 1 = {g1}, got {simulate_accept}")
        gen = torch.Generator(device=self.drv.device).manual_seed(sampling.seed) if sampling.temperature > 0 else None
        stats = SpecStats(accepted_at=[0] * self.gamma)
        last = self.prefill(seqs, chunk)
        new: dict[int, list[int]] = {}
        for s in seqs:
            row = last[s.req_slot]
            if sampling.temperature > 0:
                p = distribution(row.unsqueeze(0), sampling.temperature, sampling.top_k, sampling.top_p)
                tok = int(torch.multinomial(p, 1, generator=gen))
            else:
                tok = int(row.argmax())
            s.tokens.append(tok)
            new[s.req_slot] = [tok]
        live = [s for s in seqs if max_new > 1 and new[s.req_slot][-1] not in eos]
        sync = torch.cuda.synchronize if str(self.drv.device).startswith("cuda") else (lambda: None)
        sync()
        t0, n_step = time.perf_counter(), 0
        use_graphs = self.graphs is not None and sampling.temperature == 0 and propose is None
        graph, graph_seqs = None, None
        while live:
            forced = None if simulate_accept is None else forced_accepts(simulate_accept - 1, n_step)
            n_step += 1
            if use_graphs:
                if graph_seqs != [s.req_slot for s in live]:  # a new batch: its graph and token table
                    graph, graph_seqs = self.spec_graph(live, max_new), [s.req_slot for s in live]
                accepted, tokens = graph.step([s.tokens[s.cached] for s in live], [s.cached for s in live],
                                              [s.req_slot for s in live], self.drv.history(live), forced)
            else:
                accepted, tokens = self.step(live, sampling, gen, propose, forced)
            acc, toks = accepted.tolist(), tokens.tolist()
            stats.verifies += len(live)
            for s, k, row in zip(live, acc, toks):
                for i in range(k):
                    stats.accepted_at[i] += 1
                out = new[s.req_slot]
                emitted = row[: k + 1]
                s.cached += k + 1
                s.window_ready = True
                for tok in emitted:
                    if len(out) >= max_new or (out and out[-1] in eos):
                        break
                    out.append(tok)
                    stats.committed += 1
                s.tokens.extend(emitted)
            live = [s for s in live if len(new[s.req_slot]) < max_new and new[s.req_slot][-1] not in eos]
        sync()
        stats.decode_s = time.perf_counter() - t0
        if release:
            self.drv.release(seqs)
        return [new[s.req_slot] for s in seqs], stats
