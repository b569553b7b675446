"""The fixed-shape DSpark step (runtime/spec_graph.py) against the eager one (runtime/spec_step.py).

On the CPU the graph's step runs eagerly through its fixed buffers (`Driver.graph_capture = False`):
static verify (every row through the compressed-KV path), one-group drafter attention once every
request fills the window, static commit. Oracle: the eager `SpecDecoder` on a second driver with the
same model: emitted tokens, accept counts, and every pool (window KV of the backbone and the drafter's
stages, compressed KV, index keys, ratio-2 pending pairs) byte for byte, poisoned pools included, so
a write the eager step does not make shows up. Prompts of 110, 131 and 200 tokens: the first steps
draft before request 0 fills the 128-token window (the eager draft through the graph's buffers), the
later ones with the one-group draft; the model's own drafts (mostly rejected on random weights) and
forced accept counts (`simulate_accept` 3.5: 2 and 3; 6: all gamma) cover the accept lengths.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.runtime.driver import Driver, random_prompts
from sglang_dsv41.runtime.speculative import SpecDecoder

NEW = 24


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return load_model(write_tiny_checkpoint(tmp_path_factory.mktemp("specgraph") / "ckpt", "tiny"), progress=False)


def _prompts(model, n: int) -> list[list[int]]:
    lens = [110, 131, 200, 118][:n]
    return [p[:k] for p, k in zip(random_prompts(model.cfg.vocab_size, n, max(lens), 5), lens)]


def _run(model, prompts, graphs: bool, simulate):
    drv = Driver(model, 8192, len(prompts), page_size=64, poison=True, speculative=True)
    drv.graph_capture = False
    new, stats = SpecDecoder(drv, graphs=graphs).generate(prompts, NEW, simulate_accept=simulate)
    return new, stats, drv.pools


def _pool_tensors(pools):
    yield from (("window", i, t) for i, t in enumerate(pools.window))
    for name in ("compressed", "index_keys", "pending"):
        yield from ((name, k, t) for k, t in getattr(pools, name).items())


@pytest.mark.parametrize("simulate", [None, 3.5, 6.0])
def test_fixed_shape_step_equals_the_eager_step(model, simulate):
    prompts = _prompts(model, 3)
    new_e, st_e, pools_e = _run(model, prompts, False, simulate)
    new_g, st_g, pools_g = _run(model, prompts, True, simulate)
    assert new_g == new_e
    assert (st_g.verifies, st_g.committed, st_g.accepted_at) == (st_e.verifies, st_e.committed, st_e.accepted_at)
    if simulate is not None:
        assert st_e.accept_length > 0.9 * simulate  # the schedule ran (cut only at max_new)
    for (name, key, a), (_, _, b) in zip(_pool_tensors(pools_e), _pool_tensors(pools_g)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{name}[{key}]"


def test_graph_rejects_inputs_it_was_not_built_for(model):
    from sglang_dsv41.runtime.spec_graph import SpecGraph
    from sglang_dsv41.runtime.spec_step import DSparkStep

    cfg = model.cfg
    hw = (cfg.engram.max_ngram_size - 1) if cfg.engram else 1
    spec = DSparkStep(Driver(model, 1024, 4, page_size=64, speculative=True).runtime)
    g = SpecGraph(spec, 2, 256, hw, capture=False)
    ok = dict(anchors=[5, 6], cached=[130, 140], req_slots=[0, 1], history=[[1] * hw, [2] * hw])
    with pytest.raises(ValueError, match="no token table"):
        g.check(**ok)
    with pytest.raises(ValueError, match=r"batch size 2, got a token table \(3, 256\)"):
        g.set_table(torch.zeros(3, 256, dtype=torch.int64))
    g.set_table(torch.arange(512, dtype=torch.int64).view(2, 256))
    g.check(**ok)
    bad = [
        (dict(ok, anchors=[5]), "requests"),
        (dict(ok, cached=[130, 251]), "cached lengths must be 1 .. 250"),
        (dict(ok, anchors=[5, cfg.vocab_size]), "token id outside"),
        (dict(ok, req_slots=[1, 1]), "distinct"),
        (dict(ok, req_slots=[0, 4]), "distinct and in"),
        (dict(ok, history=[[1] * (hw + 1)] * 2), "history row"),
    ]
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg) as e:
            g.step(**kwargs)
        assert "DSpark graph captured for batch size 2, contexts up to 256 tokens" in str(e.value)
    with pytest.raises(ValueError, match="capacity must be at least"):
        SpecGraph(spec, 2, 64, hw, capture=False)
    with pytest.raises(ValueError, match="CUDA"):
        SpecGraph(spec, 2, 256, hw, capture=True)
