"""DSpark speculative decoding in the paged runtime (runtime/speculative.py) against plain decoding.

Oracles: the plain Driver's greedy tokens and its pools (a non-speculative run of the same committed
tokens); the dense DSpark drafter (ReferenceDrafter, itself equal to DeepSeek's forward_spec in
test/official/test_dspark_official.py); for sampling, the target distribution by a chi-square test.

A scripted drafter (`Scripted`) proposes the true greedy continuation for the first `a` drafts and a
wrong id after them, `a` cycling through 0 .. gamma per step and request, so every accept length
occurs; the prompts (120-126 tokens, pages of 64) make the steps cross the 128-token window and page
boundaries. Pools are poisoned (0xFF = NaN) so a read of a rejected or unwritten row shows up.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.runtime.acceptance import accept_sampled
from sglang_dsv41.runtime.driver import Driver, Sequence, random_prompts
from sglang_dsv41.runtime.speculative import Sampling, SpecDecoder

NEW = 24  # tokens per request: steps cross position 128 and the page boundary at 128


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return load_model(write_tiny_checkpoint(tmp_path_factory.mktemp("spec") / "ckpt", "tiny"), progress=False)


def prompts_for(model, n: int, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(120, 127, (n,), generator=g).tolist()
    return [p[:length] for p, length in zip(random_prompts(model.cfg.vocab_size, n, 127, seed), lens)]


class Scripted:
    """Drafts: the reference continuation for the first a ids, then a wrong id (a cycles 0..gamma)."""

    def __init__(self, full: dict[int, list[int]], gamma: int, vocab: int):
        self.full, self.gamma, self.vocab, self.calls = full, gamma, vocab, {}

    def __call__(self, seqs, ids):
        out = ids.clone()
        for b, s in enumerate(seqs):
            n = self.calls.get(s.req_slot, 0)
            self.calls[s.req_slot] = n + 1
            a = (n + s.req_slot) % (self.gamma + 1)
            true = self.full[s.req_slot][s.cached + 1: s.cached + 1 + self.gamma]
            true += [0] * (self.gamma - len(true))
            row = [s.tokens[s.cached]] + true[:a] + [(t + 1) % self.vocab for t in true[a:]]
            out[b] = torch.tensor(row)
        return out


def _run_both(model, prompts, decoder_replay=False, encoder_replay=False, propose=True, eos=()):
    kw = dict(page_size=64, poison=True, decoder_replay=decoder_replay, encoder_replay=encoder_replay)
    plain = Driver(model, 8192, len(prompts), **kw)
    ref, _ = plain.generate(prompts, NEW)
    drv = Driver(model, 8192, len(prompts), speculative=True, **kw)
    spec = SpecDecoder(drv)
    full = {i: p + r for i, (p, r) in enumerate(zip(prompts, ref))}
    script = Scripted(full, model.cfg.dspark.block_size, model.cfg.vocab_size) if propose else None
    seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
    for s in seqs:
        drv.pools.clear_request(s.req_slot)
    new, stats = spec.run(seqs, NEW, eos=eos, propose=script, release=False)
    return ref, new, stats, plain, drv, seqs


def _pool_rows(drv, seqs, pool_of, positions_of):
    """bytes of each request's committed positions in one pool (per-token-slot placement)."""
    out = []
    for s in seqs:
        slots = torch.tensor(s.pages).repeat_interleave(drv.page_size) + torch.arange(len(s.pages) * drv.page_size) % drv.page_size
        pos = positions_of(s)
        out.append(pool_of()[slots[pos]])
    return out


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_equals_plain_every_accept_length(model, batch):
    prompts = prompts_for(model, batch)
    ref, new, stats, _, drv, seqs = _run_both(model, prompts)
    assert new == ref
    assert all(c > 0 for c in stats.accepted_at), stats.accepted_at  # drafts at every depth were accepted
    assert stats.accept_length > 1.5
    # the pools at every committed position hold what the plain run wrote (re-run the plain one to keep its pages)
    plain = Driver(model, 8192, batch, page_size=64, poison=True)
    pseqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
    for s in pseqs:
        plain.pools.clear_request(s.req_slot)
    plain.run(pseqs, NEW, release=False)
    for s, ps in zip(seqs, pseqs):
        # committed: the prompt and every generated token but the last (which has no KV yet in either)
        n = len(ps.tokens) - 1
        assert s.cached >= n
        for lid in range(model.cfg.num_layers):
            a = _pool_rows(drv, [s], lambda: drv.pools.window[lid], lambda _s: torch.arange(n))[0]
            b = _pool_rows(plain, [ps], lambda: plain.pools.window[lid], lambda _s: torch.arange(n))[0]
            assert torch.equal(a, b), ("window", lid)
        for lid, pool in drv.pools.compressed.items():
            r = model.cfg.layer_roles[lid].compress_ratio
            grp = torch.arange(n // r) * r
            a = _pool_rows(drv, [s], lambda: pool, lambda _s: grp)
            b = _pool_rows(plain, [ps], lambda: plain.pools.compressed[lid], lambda _s: grp)
            sl_a = torch.tensor(s.pages).repeat_interleave(64) + torch.arange(len(s.pages) * 64) % 64
            sl_b = torch.tensor(ps.pages).repeat_interleave(64) + torch.arange(len(ps.pages) * 64) % 64
            assert torch.equal(pool[sl_a[grp] // r], plain.pools.compressed[lid][sl_b[grp] // r]), ("compressed", lid)
            if lid in drv.pools.index_keys:
                assert torch.equal(drv.pools.index_keys[lid][sl_a[grp] // r],
                                   plain.pools.index_keys[lid][sl_b[grp] // r]), ("index keys", lid)
        for lid, pend in drv.pools.pending.items():
            if n % 2 == 1:  # the last committed position is even: its pair waits in the pending state
                assert torch.equal(pend[s.req_slot], plain.pools.pending[lid][ps.req_slot]), ("pending", lid)


def test_greedy_equals_plain_batch_64(model):
    """64 requests of 8-40 tokens, 10 new tokens each, every accept length scripted."""
    g = torch.Generator().manual_seed(19)
    prompts = [p[: int(n)] for p, n in zip(random_prompts(model.cfg.vocab_size, 64, 40, 19),
                                           torch.randint(8, 41, (64,), generator=g))]
    plain = Driver(model, 8192, 64, page_size=64, poison=True)
    ref, _ = plain.generate(prompts, 10)
    drv = Driver(model, 8192, 64, page_size=64, poison=True, speculative=True)
    full = {i: p + r for i, (p, r) in enumerate(zip(prompts, ref))}
    new, stats = SpecDecoder(drv).generate(prompts, 10, propose=Scripted(full, model.cfg.dspark.block_size,
                                                                           model.cfg.vocab_size))
    assert new == ref and all(c > 0 for c in stats.accepted_at)


@pytest.mark.parametrize("mode", ["decoder_replay", "encoder_replay"])
def test_greedy_equals_plain_bounded_replay(model, mode):
    prompts = prompts_for(model, 3, seed=5)
    ref, new, stats, *_ = _run_both(model, prompts, **{mode: True})
    assert new == ref and stats.accept_length > 1.5


def test_eos_inside_a_block(model):
    prompts = prompts_for(model, 2, seed=7)
    plain = Driver(model, 8192, 2, page_size=64, poison=True)
    ref, _ = plain.generate(prompts, NEW)
    eos = ref[0][9]  # request 0 stops there (a later id of request 1 may equal it too)
    want = []
    for r in ref:
        cut = r.index(eos) + 1 if eos in r else len(r)
        want.append(r[:cut])
    _, new, stats, *_ = _run_both(model, prompts, eos=(eos,))
    assert new == want and len(new[0]) == 10


def test_prefix_hit(model):
    """A fork sharing the source's pages (its drafter context included) drafts and verifies like a
    plain fork of the same prefix."""
    src_prompt, tail = prompts_for(model, 1, seed=11)[0], [5, 6, 7, 8, 9, 10, 11, 12]
    outs = []
    for speculative in (False, True):
        drv = Driver(model, 8192, 2, page_size=64, poison=True, speculative=speculative)
        src = Sequence(0, list(src_prompt), len(src_prompt))
        drv.pools.clear_request(0)
        if speculative:
            spec = SpecDecoder(drv)
            spec.run([src], 4, release=False)
            fork = drv.fork(src, 1, tail)
            assert fork.cached >= 64
            outs.append(spec.run([fork], NEW)[0])
        else:
            drv.run([src], 4, release=False)
            outs.append(drv.run([drv.fork(src, 1, tail)], NEW)[0])
    assert outs[0] == outs[1]


def test_paged_drafter_equals_reference(model):
    """The paged drafter's first draft after a prefill == ReferenceDrafter's step at that position."""
    from sglang_dsv41.layers.dspark import draft
    from sglang_dsv41.reference.model import ReferenceDrafter
    from sglang_dsv41.runtime.paged_draft_kv import PagedDraftKV

    prompts = prompts_for(model, 3, seed=13)
    drv = Driver(model, 8192, 3, page_size=64, poison=True, speculative=True)
    spec = SpecDecoder(drv)
    seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
    last = spec.prefill(seqs, chunk=100)
    anchors = torch.stack([last[s.req_slot] for s in seqs]).argmax(-1)
    table = drv._table(seqs, max(s.cached + 6 for s in seqs))
    ends = torch.tensor([s.cached - 1 for s in seqs])
    dkv = PagedDraftKV.for_draft(drv.pools, table, torch.arange(3), drv.runtime.ops, ends)
    with torch.inference_mode():
        paged = draft(model, anchors, dkv)
    for b, p in enumerate(prompts):
        ref, _ = ReferenceDrafter(model).forward(torch.tensor(p), torch.tensor([len(p) - 1]))
        assert torch.equal(paged.ids[b], ref.ids[0]) and torch.equal(paged.logits[b], ref.logits[0])
        assert torch.equal(paged.confidence[b], ref.confidence[0])


def test_rejection_sampling_keeps_the_target_distribution():
    """Chain rejection sampling over V = 6, gamma = 3 with fixed target p and draft q per position:
    the emitted token at each place is distributed as p there (chi-square, 200k chains, seed 0,
    p-value threshold 1e-3; the statistic of a q-distributed output would be in the thousands)."""
    g, V, N = 3, 6, 200_000
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(g + 1, V, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(g, V, generator=gen) * 1.5, -1)
    drafts = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=gen) for i in range(g)], 1)
    ids = torch.cat([torch.zeros(N, 1, dtype=torch.int64), drafts], 1)
    accepted, tokens = accept_sampled(ids, q.expand(N, g, V), p.expand(N, g + 1, V), gen)
    def chisquare(obs, exp):  # Pearson's statistic and its chi-square(df = V - 1) upper tail
        stat = float(((obs - exp) ** 2 / exp).sum())
        return stat, float(torch.special.gammaincc(torch.tensor((V - 1) / 2.0), torch.tensor(stat / 2.0)))

    for i in range(g + 1):
        emitted = tokens[accepted >= i, i]  # place i is emitted iff the first i drafts were accepted
        counts = torch.bincount(emitted, minlength=V).double()
        def expected(d):
            d = d.double()
            return d / d.sum() * counts.sum()

        stat, pval = chisquare(counts, expected(p[i]))
        assert pval > 1e-3, (i, stat, pval)
        q_stat, _ = chisquare(counts, expected(torch.cat([q, p[-1:]])[i]))
        assert i == g or q_stat > 100  # the test can tell p from q


def test_sampled_generation_runs(model):
    prompts = prompts_for(model, 2, seed=17)
    drv = Driver(model, 8192, 2, page_size=64, poison=True, speculative=True)
    new, stats = SpecDecoder(drv).generate(prompts, 8, sampling=Sampling(temperature=1.0, top_k=50, seed=1))
    assert [len(n) for n in new] == [8, 8] and all(0 <= t < model.cfg.vocab_size for n in new for t in n)
