"""Our forward == DeepSeek's own forward, bit for bit (docs/numerics.md "Checked against DeepSeek's
forward"). Oracle: the official V4.1 reference in `../shared/official` (imported by a subprocess per
checkpoint, official_capture.py; skipped, naming the folder, when it is absent).

Three checkpoints, each loaded by our loader and by the official loader (run_official.build):
  tiny            `sglang_dsv41.tiny` preset tiny (seed 0), 144 tokens
  small           preset small (seed 0), 144 tokens
  official-small  the official test model (testing.build_small_model(small_model_args(), seed=7))
                  written by check_run_official.write_checkpoint / to_hf / write_tokenizer, 64 tokens
For each, ReferenceModel (one dense prefill) and the paged runtime (Driver over PagedKV: chunks of 57
tokens, then token-by-token decode of the last 3) must give the official fp32 logits of every position
and its decisions: routed experts of every layer, top-k of every index source, candidate blocks.

Lengths: the official prefill lists min(T, window) window slots per query where ours always lists
`window` (docs/numerics.md choice 1), which moves the block-64 softmax boundaries for T < window, so
T >= window (128 on the presets). 144 tokens cross the window and drop positions in every index
top-k; candidate blocks drop positions on tiny (16 x 4) and official-small (3 x 4), not on small
(32 x 8 = 256 > 144, its candidate mask is still compared). `test_case_crosses_boundaries` states it.

Seeded random prompts (RANDOM: torch.randint(3, vocab - 2, (B, T)), seed 29) on tiny (8 x 144) and
official-small (12 x 40), one batched official prefill each: every prompt's fp32 logits from
ReferenceModel equal the official ones bit for bit. The official worker pins the two things DeepSeek's
forward leaves to the implementation to our documented rules (official_capture.py): top-k ties and
the order inside each FP8 / FP4 GEMM block partial (docs/numerics.md choices 2 and 4b). With MKL's
block partials left as they are, tiny prompt 4 and official-small prompt 6 differ (a one-ulp partial
that moves an output onto a bf16 rounding tie): those are the cases this test would catch.
"""

from __future__ import annotations

import pytest
import torch

import official_capture as oc

pytestmark = pytest.mark.skipif(not oc.official_available(), reason=oc.skip_reason())

CASES = {"tiny": 144, "small": 144, "official-small": 64}
RANDOM = {"tiny": (8, 144), "official-small": (12, 40)}
"""Seeded random prompts per case: (prompts, tokens); T above the window (16 on official-small)."""
CHUNK, DECODE = 57, 3
KINDS = ("routed_experts", "topk", "candidates")


class Case:
    def __init__(self, name: str, tmp):
        from sglang_dsv41.checkpoint.loader import load_model

        threads = torch.get_num_threads()  # the official process runs the same count (numerics.md)
        self.name, self.T = name, CASES[name]
        self.tmp = tmp
        self.ckpt = ckpt = tmp / "ckpt"
        if name == "official-small":
            oc.write_official_small(ckpt, self.T, threads)
        else:
            from sglang_dsv41.tiny import write_tiny_checkpoint

            write_tiny_checkpoint(ckpt, name, seed=0)
        self.model = load_model(ckpt, progress=False)
        g = torch.Generator().manual_seed(29)
        self.ids = torch.randint(3, self.model.cfg.vocab_size - 2, (self.T,), generator=g).tolist()
        # runs in the background while our forwards run (both processes at `threads` threads)
        self.run = oc.OfficialForward(ckpt, self.ids, tmp, threads)

    @property
    def official(self) -> dict:
        return self.run.result()

    def visible(self, layer: int, rows: torch.Tensor, width: int) -> torch.Tensor:
        """bool [rows, width]: compressed positions each row's query can see at `layer`."""
        ratio = self.model.cfg.layer_roles[layer].compress_ratio
        return torch.arange(width) < ((rows + 1) // ratio).unsqueeze(-1)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    c = Case(request.param, tmp_path_factory.mktemp(f"official-{request.param}"))
    yield c
    if c.run.worker.proc.poll() is None:  # a test failed before waiting for it
        c.run.worker.proc.kill()
        c.run.worker.proc.wait()


def _assert_same_layers(ours, official, kind):
    assert sorted(getattr(ours, kind)) == sorted(official[kind]) and official[kind], kind


def test_reference_equals_official(case):
    from sglang_dsv41.reference.model import ReferenceModel

    out = ReferenceModel(case.model).forward(torch.tensor(case.ids))
    off = case.official
    diff = (out.logits - off["logits"]).abs().amax(-1)
    assert torch.equal(out.logits, off["logits"]), (
        f"{int((diff > 0).sum())} of {case.T} logit rows differ, first at {int((diff > 0).nonzero()[0])}, "
        f"max |d| {float(diff.max()):.3g}")
    for kind in KINDS:
        _assert_same_layers(out.decisions, off, kind)
        for layer, want in off[kind].items():
            assert torch.equal(getattr(out.decisions, kind)[layer], want), (kind, layer)


def test_paged_runtime_equals_official(case):
    """Chunked prefill, then decode steps, over paged pools (poisoned), against the official prefill."""
    from sglang_dsv41.runtime.driver import Driver, Sequence

    drv = Driver(case.model, 1024, 2, page_size=64, poison=True)
    seq = Sequence(0, list(case.ids), case.T)
    counts = [min(CHUNK, case.T - DECODE - s) for s in range(0, case.T - DECODE, CHUNK)] + [1] * DECODE
    logits, steps, start = [], [], 0
    for c in counts:
        out = drv.step([seq], [c], all_logits=True)
        logits.append(out.logits)
        steps.append((torch.arange(start, start + c), out.decisions))
        start += c
    off = case.official
    assert torch.equal(torch.cat(logits), off["logits"])
    for kind in ("routed_experts", "topk"):
        for _, d in steps:
            _assert_same_layers(d, off, kind)
    for layer, want in off["routed_experts"].items():
        assert torch.equal(torch.cat([d.routed_experts[layer] for _, d in steps]), want), layer
    # a paged step's top-k is as wide as its widest row can fill (-1 padded); the official one min(K, T // ratio)
    for layer, want in off["topk"].items():
        got = [d.topk[layer] for _, d in steps]
        assert all(g.size(1) <= want.size(1) for g in got), layer
        got = torch.cat([torch.nn.functional.pad(g, (0, want.size(1) - g.size(1)), value=-1) for g in got])
        assert torch.equal(got, want), layer
    # a paged step scores its widest row's visible positions; compare what each row can see
    for layer, want in off["candidates"].items():
        for rows, d in steps:
            got = d.candidates[layer]
            width = max(got.size(1), want.size(1))
            vis = case.visible(layer, rows, width)
            pad = lambda m: torch.nn.functional.pad(m, (0, width - m.size(1)))  # noqa: E731
            assert torch.equal(pad(got) & vis, pad(want[rows]) & vis), (layer, int(rows[0]))


def test_case_crosses_boundaries(case):
    """The prompt is long enough for the comparison to mean something (module docstring)."""
    cfg, off = case.model.cfg, case.official
    assert case.T > cfg.attention.window_size
    k = cfg.compression.index_topk
    for layer, sel in off["topk"].items():
        ratio = cfg.layer_roles[layer].compress_ratio
        assert (sel[-1] >= 0).sum() == k < case.T // ratio, (layer, k)
    (layer, cand), = off["candidates"].items()
    kept = (cand[-1] & case.visible(layer, torch.tensor([case.T - 1]), cand.size(1))[0]).sum()
    c = cfg.compression
    assert kept == min(c.candidate_topk_blocks * c.candidate_block_size, case.T // cfg.layer_roles[layer].compress_ratio)
    assert (kept < case.T) == (case.name != "small")
    assert len(off["routed_experts"]) == cfg.num_layers


def test_random_prompts_equal_official(case):
    """Seeded random prompts (module docstring): the logits of every prompt equal the official ones."""
    if case.name not in RANDOM:
        pytest.skip("random prompts run on tiny and official-small (the small preset's forward is the slowest)")
    from sglang_dsv41.reference.model import ReferenceModel

    batch, seqlen = RANDOM[case.name]
    assert seqlen > case.model.cfg.attention.window_size
    g = torch.Generator().manual_seed(29)
    ids = torch.randint(3, case.model.cfg.vocab_size - 2, (batch, seqlen), generator=g)
    work = case.tmp / "random"
    work.mkdir(exist_ok=True)
    case.official  # noqa: B018 (the case's own official run is over before this one starts)
    # one process at a time: two processes of `threads` threads each oversubscribe a small machine
    off = oc.OfficialLogits(case.ckpt, ids.tolist(), work, torch.get_num_threads()).result()
    ref = ReferenceModel(case.model)
    ours = [ref.forward(ids[b]).logits for b in range(batch)]
    assert off.shape == (batch, seqlen, case.model.cfg.vocab_size)
    bad = {b: int(((ours[b] - off[b]).abs().amax(-1) > 0).nonzero()[0])
           for b in range(batch) if not torch.equal(ours[b], off[b])}
    assert not bad, f"prompts differing from the official forward (prompt: first differing row): {bad}"
