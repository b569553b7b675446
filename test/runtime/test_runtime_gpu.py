"""GPU: the paged runtime with kernels applied calls every op of the op table as its Triton kernel
(the Engram hash / gather / gate included), and its logits stay at the twins' values once the
Triton run's decisions are replayed into the twin run (guides/numerics.md step 3)."""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels.op_table import OpTable
from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
from sglang_dsv41.runtime.kernels import kernel_table

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")


def test_runtime_calls_every_kernel_and_matches_twins(tiny_dir):
    model = load_model(tiny_dir, device="cuda", progress=False)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, model.cfg.vocab_size, (200,), generator=g).tolist()

    def run(table, replay=None):
        drv = Driver(model, 1024, 1, page_size=64, device="cuda", ops=table)
        seq = Sequence(0, list(ids), 150)
        first = drv.step([seq], [150], all_logits=True, replay=replay[0] if replay else None)
        steps = [drv.step([seq], [1], replay=replay[1 + i] if replay else None) for i in range(4)]
        return [first] + steps

    table, calls = kernel_table("cuda").counting()
    apply_numerics(model, NumericsPolicy.kernels(table))
    fast = run(table)
    assert {name for name, impl in calls if impl == "torch"} == set()
    # every op the runtime routes through ran, Engram too; routed experts run as the grouped `moe_experts`
    # op, so the per-linear MXFP4 slot `fp4_linear` (MXFP4Linear outside the grouped path) is not called,
    # a site's gates run inside `mhc_enter` (Block.enter) and the router inside `moe_gate` (Gate), so
    # `mhc_gates` and `moe_route` are not called on their own
    assert {name for name, _ in calls} == set(OpTable.kernels().names()) - {"fp4_linear", "mhc_gates", "moe_route"}

    apply_numerics(model, NumericsPolicy.exact())
    twins = run(OpTable.twins(), replay=[o.decisions for o in fast])
    for a, b in zip(fast, twins):
        cos = torch.nn.functional.cosine_similarity(a.logits.float(), b.logits.float(), dim=-1)
        assert float(cos.min()) > 0.99, float(cos.min())
