"""CPU: the fast training numerics (train/fast_numerics.py).

Oracles: the exact quantizers of `sglang_dsv41.quant` (the few-op fake quants must give the same
bits), the exact QAT forward (set_fast(False) must restore it bit for bit; the fast attention must
match `BatchDenseKV.attend` up to the bf16 rounding of the probabilities), and the loss before a few
fast optimizer steps.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.quant import (
    dequant_fp8_weight,
    dequant_mxfp4,
    index_fp4_qdq,
    kv_fp4_qdq,
    mxfp8_qdq,
    quant_fp8_weight,
    quant_mxfp4,
)
from sglang_dsv41.train import fast_numerics as fn
from sglang_dsv41.train.batch_kv import BatchDenseKV
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters


def _wide(shape, seed: int) -> torch.Tensor:
    """Normal values scaled over many binades per column (exercises every scale and tie)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.logspace(-7, 4, shape[-1])


@pytest.mark.parametrize("shape", [(128, 96), (100, 70), (64, 640)])
def test_fp8_weight_qdq_bitwise(shape):
    w = _wide(shape, 1)
    assert torch.equal(fn.fp8_weight_qdq(w), dequant_fp8_weight(*quant_fp8_weight(w)))


def test_activation_and_kv_qdq_bitwise():
    x = _wide((40, 256), 2).bfloat16()
    x[0, :32] = 0.0
    x[1, :32] = -0.0
    x[2, :32] = 1e-7
    for fast, exact in ((fn.mxfp8_qdq, mxfp8_qdq), (fn.kv_fp4_qdq, kv_fp4_qdq), (fn.index_fp4_qdq, index_fp4_qdq)):
        a, b = fast(x), exact(x)
        assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b)), fast.__name__


def test_mxfp4_qdq_bitwise_with_ties():
    w = _wide((3, 64, 128), 3)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -1.75, -5.0, 6.0, 5.9, 0.0, -0.75, 3.0, 0.5])
    w[0, 0, :32] = ties.repeat(2)  # amax 6: scale 1, so the values are the ties themselves
    q, s = quant_mxfp4(w)
    assert torch.equal(fn.mxfp4_qdq(w), dequant_mxfp4(q, s))


def test_ste_gradient_is_identity():
    w = _wide((64, 64), 4).requires_grad_(True)
    g = torch.randn(64, 64)
    (fn._ste(w, fn.fp8_weight_qdq(w)) * g).sum().backward()
    assert torch.equal(w.grad, g)


@pytest.fixture(scope="module")
def batch(tiny_dir):
    model = load_trainable(tiny_dir)
    b, t = 3, 12
    ids = torch.randint(3, 900, (b * t,), generator=torch.Generator().manual_seed(5))
    return model, ids, b, t


def test_set_fast_round_trip_restores_exact_forward(batch):
    model, ids, b, t = batch
    with torch.no_grad():
        before = model(ids, BatchDenseKV(model.cfg, b, t, "cpu")).logits
        fn.set_fast(model, True)
        assert fn.is_fast(model)
        fast = model(ids, fn.FastBatchDenseKV(model.cfg, b, t, "cpu")).logits
        fn.set_fast(model, False)
        assert not fn.is_fast(model)
        after = model(ids, BatchDenseKV(model.cfg, b, t, "cpu")).logits
    assert torch.equal(before, after)
    assert torch.isfinite(fast).all()


def test_fast_attention_matches_sparse_attention(batch, monkeypatch):
    """Every layer's attention output: fast masked softmax vs the block-64 online softmax on the same
    inputs, equal up to the bf16 rounding of the probabilities (<= 2 bf16 ulps of the output scale)."""
    model, ids, b, t = batch
    exact_attend, seen = BatchDenseKV.attend, []

    def both(self, attn, q, topk):
        a = exact_attend(self, attn, q, topk)
        f = fn.FastBatchDenseKV.attend(self, attn, q, topk)
        seen.append(((a.float() - f.float()).abs().max() / a.float().abs().max()).item())
        return a

    monkeypatch.setattr(BatchDenseKV, "attend", both)
    with torch.no_grad():
        model(ids, BatchDenseKV(model.cfg, b, t, "cpu"))
    assert len(seen) == model.cfg.num_layers
    assert max(seen) <= 2 * 2**-8


def test_fast_steps_reduce_loss(batch):
    model, ids, b, t = batch
    fn.set_fast(model, True)
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=2e-3)
    losses = []
    for _ in range(3):
        logits = model(ids, fn.FastBatchDenseKV(model.cfg, b, t, "cpu")).logits.view(b, t, -1)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids.view(b, t)[:, 1:].flatten())
        loss.backward()
        # as in the exact forward, only the indexer (discrete top-k) gets no gradient
        assert all(p.grad is not None for n, p in trainable_parameters(model) if ".indexer." not in n)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    fn.set_fast(model, False)
    assert losses[-1] < losses[0] - 0.1
