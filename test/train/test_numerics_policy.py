"""CPU: the numerics policy (sglang_dsv41/numerics.py) applied to a built model.

Oracles: the exact forward (the class defaults; `apply_numerics(model, exact())` after any other
policy must give its logits bit for bit), the reference forward (the kernels policy with the twin op
table equals it bit for bit on CPU), the block-64 online softmax of the exact attention (the fast
formulation equals it up to the bf16 rounding of the probabilities), and the exact forward's logits
under its own decisions (the fast forward, with those decisions replayed, stays within the bound
docs/training.md states), and the loss before a few fast optimizer steps.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.dense_attention import list_attention, masked_attention
from sglang_dsv41.numerics import Mode, NumericsPolicy, apply_numerics, numerics_of, slotted
from sglang_dsv41.reference.dense_kv import DenseKV
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters

FAST_ROW_BOUND = 0.15
"""max |fast - exact| / max |exact| per logits row, decisions replayed (docs/training.md)."""


def _instance_slots(model) -> set:
    return {(id(m), a) for m in slotted(model) for a in type(m).numerics_slots if a in m.__dict__}


def test_policy_is_frozen_with_named_constructors():
    p = NumericsPolicy.exact()
    assert not p.trains and not p.is_fast and p.table is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.gemm = Mode.FAST
    with pytest.raises(ValueError, match="no op table"):
        NumericsPolicy(gemm=Mode.KERNEL)
    assert NumericsPolicy.train().trains and not NumericsPolicy.train().is_fast
    fast = NumericsPolicy.train(fast=True)
    assert fast.is_fast and fast.quant is Mode.TRAIN and fast.rope is Mode.EXACT


def test_training_policy_refuses_a_serving_model(tiny_model):
    with pytest.raises(ValueError, match="make_trainable"):
        apply_numerics(tiny_model, NumericsPolicy.train(fast=True))
    assert _instance_slots(tiny_model) == set()


def test_kernels_policy_refuses_a_trainable_model(batch):
    from dsv41_kernels.op_table import OpTable

    model = batch[0]
    before = _instance_slots(model)
    with pytest.raises(ValueError, match="trainable model"):
        apply_numerics(model, NumericsPolicy.kernels(OpTable.twins()))
    assert _instance_slots(model) == before


def test_kernels_policy_with_twins_equals_exact_and_exact_restores(tiny_model, tiny_reference):
    from dsv41_kernels.op_table import OpTable

    ids = torch.randint(3, tiny_model.cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(2))
    table = OpTable.twins()
    with torch.inference_mode():
        want = tiny_reference.forward(ids)
        try:
            apply_numerics(tiny_model, NumericsPolicy.kernels(table))
            set_slots = [(m, a, s.kernel) for m in slotted(tiny_model) for a, s in type(m).numerics_slots.items() if s.kernel]
            assert set_slots and all(m.__dict__.get(a) is getattr(table, op) for m, a, op in set_slots)
            got = tiny_reference.forward(ids)
        finally:
            apply_numerics(tiny_model, NumericsPolicy.exact())
        again = tiny_reference.forward(ids)
    assert _instance_slots(tiny_model) == set() and numerics_of(tiny_model) == NumericsPolicy.exact()
    for out in (got, again):
        assert torch.equal(out.logits.view(torch.int32), want.logits.view(torch.int32))
        assert all(torch.equal(out.decisions.routed_experts[k], v) for k, v in want.decisions.routed_experts.items())


@pytest.fixture(scope="module")
def batch(tiny_dir):
    model = load_trainable(tiny_dir)
    b, t = 3, 12
    ids = torch.randint(3, 900, (b * t,), generator=torch.Generator().manual_seed(5))
    return model, ids, b, t


def _logits(model, ids, b, t, replay=None):
    return model(ids, DenseKV(model.cfg, t, "cpu", batch=b), replay)


def test_exact_policy_after_fast_restores_the_exact_forward(batch):
    model, ids, b, t = batch
    with torch.no_grad():
        before = _logits(model, ids, b, t).logits
        trained_slots = _instance_slots(model)
        apply_numerics(model, NumericsPolicy.train(fast=True))
        apply_numerics(model, NumericsPolicy.train(fast=True))  # idempotent
        assert numerics_of(model).is_fast and _instance_slots(model) > trained_slots
        apply_numerics(model, NumericsPolicy.train())
        after = _logits(model, ids, b, t).logits
    assert _instance_slots(model) == trained_slots
    assert torch.equal(before.view(torch.int32), after.view(torch.int32))


def test_fast_logits_within_bound_of_exact_with_decisions_replayed(batch):
    model, ids, b, t = batch
    with torch.no_grad():
        exact = _logits(model, ids, b, t)
        apply_numerics(model, NumericsPolicy.train(fast=True))
        try:
            fast = _logits(model, ids, b, t, exact.decisions).logits
        finally:
            apply_numerics(model, NumericsPolicy.train())
    assert not torch.equal(fast, exact.logits)  # really another formulation
    rel = (fast - exact.logits).abs().amax(-1) / exact.logits.abs().amax(-1)
    assert rel.max().item() <= FAST_ROW_BOUND, rel.max().item()


def test_fast_attention_matches_the_block64_online_softmax(batch):
    """Every layer's attention output: the FAST masked softmax vs the EXACT block-64 online softmax on
    the same inputs, equal up to the bf16 rounding of the probabilities (<= 2 bf16 ulps of the
    output scale)."""
    model, ids, b, t = batch
    seen = []

    def both(q, keys, idx, sink, scale):
        a = list_attention(q, keys, idx, sink, scale)
        f = masked_attention(q, keys, idx, sink, scale)
        seen.append(((a.float() - f.float()).abs().max() / a.float().abs().max()).item())
        return a

    attns = [m for m in model.modules() if isinstance(m, Attention)]
    try:
        for m in attns:
            m.attention = both
        with torch.no_grad():
            _logits(model, ids, b, t)
    finally:
        apply_numerics(model, NumericsPolicy.train())
    assert len(seen) == model.cfg.num_layers
    assert max(seen) <= 2 * 2**-8


def test_fast_steps_have_finite_gradients_and_reduce_loss(batch):
    model, ids, b, t = batch
    apply_numerics(model, NumericsPolicy.train(fast=True))
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=2e-3)
    losses = []
    try:
        for _ in range(3):
            logits = _logits(model, ids, b, t).logits.view(b, t, -1)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids.view(b, t)[:, 1:].flatten())
            loss.backward()
            # as in the exact forward, only the indexer (discrete top-k) gets no gradient
            assert all(p.grad is not None for n, p in trainable_parameters(model) if ".indexer." not in n)
            assert all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        apply_numerics(model, NumericsPolicy.train())
    assert losses[-1] < losses[0] - 0.1
