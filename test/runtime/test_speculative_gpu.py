"""DSpark speculative decoding on CUDA with the kernels numerics policy (Triton stores, paged
attention, GEMMs) in deterministic mode (SGLANG_DSV41_DETERMINISTIC=1, batch-invariant rows): greedy
with DSpark == plain greedy on the same device, every accept length scripted, batch 1 and 8, plain
and with decoder replay. (The fast default mode is not batch invariant: a verify's gamma + 1 rows per
request run GEMM shapes a plain decode step does not, so on random weights an argmax near a tie can
differ, as it can between two plain batch sizes.) Skipped without a CUDA device."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import os

    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.determinism import DETERMINISTIC_ENV
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
    from sglang_dsv41.runtime.kernels import kernel_table
    from sglang_dsv41.tiny import write_tiny_checkpoint

    before = os.environ.get(DETERMINISTIC_ENV)
    os.environ[DETERMINISTIC_ENV] = "1"
    model = load_model(write_tiny_checkpoint(tmp_path_factory.mktemp("spec-gpu") / "ckpt", "tiny"), device="cuda",
                       progress=False)
    table = kernel_table("cuda")
    apply_numerics(model, NumericsPolicy.kernels(table))
    yield model, table
    if before is None:
        del os.environ[DETERMINISTIC_ENV]
    else:
        os.environ[DETERMINISTIC_ENV] = before


@pytest.mark.parametrize("batch, decoder_replay", [(1, False), (8, False), (8, True)])
def test_greedy_equals_plain_on_cuda(setup, batch, decoder_replay):
    from test_speculative import NEW, Scripted, prompts_for

    from sglang_dsv41.runtime.driver import Driver
    from sglang_dsv41.runtime.speculative import SpecDecoder

    model, table = setup
    prompts = prompts_for(model, batch)
    kw = dict(page_size=64, device="cuda", ops=table, poison=True, decoder_replay=decoder_replay)
    ref, _ = Driver(model, 8192, batch, graphs=False, **kw).generate(prompts, NEW)
    drv = Driver(model, 8192, batch, speculative=True, **kw)
    full = {i: p + r for i, (p, r) in enumerate(zip(prompts, ref))}
    new, stats = SpecDecoder(drv).generate(prompts, NEW, propose=Scripted(full, model.cfg.dspark.block_size,
                                                                            model.cfg.vocab_size))
    assert new == ref and all(c > 0 for c in stats.accepted_at)


@pytest.mark.parametrize("simulate", [None, 3.5])
def test_captured_step_equals_the_eager_step_on_cuda(setup, simulate):
    """The CUDA-graph DSpark step (runtime/spec_graph.py: captured draft and verify + commit) against the
    eager step on a second driver: tokens, accept counts and every pool byte for byte."""
    from test_spec_graph import _pool_tensors, _prompts

    from sglang_dsv41.runtime.driver import Driver
    from sglang_dsv41.runtime.speculative import SpecDecoder

    model, table = setup
    prompts = _prompts(model, 4)
    runs = []
    for graphs in (False, True):
        drv = Driver(model, 8192, len(prompts), page_size=64, device="cuda", ops=table, poison=True, speculative=True)
        dec = SpecDecoder(drv, graphs=graphs)
        new, st = dec.generate(prompts, 40, simulate_accept=simulate)
        assert graphs == bool(dec.graphs and all(g.verify_graph is not None for g in dec.graphs.values()))
        runs.append((new, (st.verifies, st.committed, st.accepted_at), drv.pools))
    (new_e, st_e, pools_e), (new_g, st_g, pools_g) = runs
    assert new_g == new_e and st_g == st_e
    ratio = {r.layer_id: r.compress_ratio for r in model.cfg.layer_roles}
    for (name, key, a), (_, _, b) in zip(_pool_tensors(pools_e), _pool_tensors(pools_g)):
        # the capture's warm-up writes the driver's scratch page 0 (slots 0..63): compare the rest
        skip = 0 if name == "pending" else 64 // (ratio[key] if name != "window" else 1)
        assert torch.equal(a[skip:].view(torch.uint8), b[skip:].view(torch.uint8)), f"{name}[{key}]"
