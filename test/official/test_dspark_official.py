"""The DSpark drafter == DeepSeek's `forward_spec`, bit for bit, decode step after decode step
(oracle: the official V4.1 reference in `../shared/official`, run by official_capture.py `spec`;
skipped, naming the folder, when it is absent).

The official loop (temperature 0): prefill P tokens (seeding every stage's context window), then per
position i = P .. T-1 one target decode step and one `forward_spec` (adds context row i, drafts
positions i+1 .. i+gamma). Ours: `ReferenceDrafter` (one dense target forward with the drafter's
capture, every row as context, all steps drafted at once over `DenseDraftKV`). Compared per step:
the target's logits, the draft ids (anchor + gamma drafts), the step logits (Markov bias included)
and the confidence logits.

Checkpoints: `tiny` (2 stages, gamma 5, window 128; P = 130 so the window ring has wrapped and its
slot order differs from position order) and the official small test model (1 stage, gamma 2, window
16, P = 24, 12 steps: the ring wraps during the steps). P >= window on both: below the window the
official backbone lists fewer window slots than ours (docs/numerics.md choice 1).
"""

from __future__ import annotations

import pytest
import torch

import official_capture as oc

pytestmark = pytest.mark.skipif(not oc.official_available(), reason=oc.skip_reason())

CASES = {"tiny": (130, 136), "official-small": (24, 36)}  # (prefill P, total T)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    from sglang_dsv41.checkpoint.loader import load_model

    name, (P, T) = request.param, CASES[request.param]
    tmp = tmp_path_factory.mktemp(f"dspark-{name}")
    threads = torch.get_num_threads()
    ckpt = tmp / "ckpt"
    if name == "official-small":
        oc.write_official_small(ckpt, T, threads)
    else:
        from sglang_dsv41.tiny import write_tiny_checkpoint

        write_tiny_checkpoint(ckpt, name, seed=0)
    model = load_model(ckpt, progress=False)
    assert model.cfg.dspark is not None and len(model.mtp) == model.cfg.dspark.n_stages
    ids = torch.randint(3, model.cfg.vocab_size - 2, (T,), generator=torch.Generator().manual_seed(31)).tolist()
    run = oc.OfficialSpec(ckpt, ids, P, tmp, threads)
    yield name, model, ids, P, run
    if run.worker.proc.poll() is None:
        run.worker.proc.kill()
        run.worker.proc.wait()


def test_drafter_equals_official_forward_spec(case):
    from sglang_dsv41.reference.model import ReferenceDrafter

    name, model, ids, P, run = case
    T = len(ids)
    ours, target = ReferenceDrafter(model).forward(torch.tensor(ids), torch.arange(P, T))
    off = run.result()
    g = model.cfg.dspark.block_size
    assert off["ids"].shape == (T - P, g + 1) and off["logits"].shape == (T - P, g, model.cfg.vocab_size)
    assert torch.equal(target.logits[P:], off["target"]), "target decode logits differ"
    for step in range(T - P):
        where = f"{name}: step at position {P + step}"
        assert torch.equal(ours.ids[step], off["ids"][step]), (where, ours.ids[step].tolist(), off["ids"][step].tolist())
        d = (ours.logits[step] - off["logits"][step]).abs().amax()
        assert torch.equal(ours.logits[step], off["logits"][step]), (where, "step logits", float(d))
        assert torch.equal(ours.confidence[step], off["confidence"][step]), (where, "confidence")
    # the test has teeth: a wrapped ring (slot order != position order) and drafts that differ by step
    assert P + 1 > model.cfg.attention.window_size
    assert len({tuple(r) for r in ours.ids[:, 1:].tolist()}) > 1
