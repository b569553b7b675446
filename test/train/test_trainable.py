"""CPU: the QAT trainable model (train/trainable.py) and export (train/export.py) on the tiny preset.

Oracles: `ReferenceModel` (the serving forward) on the source checkpoint and on the exported one,
bitwise; the loss after optimizer steps is compared with the loss before them.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.train import export_checkpoint, forward_train, load_trainable, trainable_parameters

T = 14


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(3, 1000, (T,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    """Two AdamW steps on one sequence, then an export. Records what the tests below check."""
    model = load_trainable(tiny_dir)
    ids = _ids(11)
    opt = torch.optim.AdamW([p for _, p in trainable_parameters(model)], lr=2e-3)
    first, losses, grads = None, [], None
    for _ in range(2):
        out = forward_train(model, ids)
        first = first or out
        loss = F.cross_entropy(out.logits[:-1], ids[1:])
        loss.backward()
        grads = grads or {n: 0.0 if p.grad is None else p.grad.abs().sum().item() for n, p in trainable_parameters(model)}
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    final = forward_train(model, ids)
    losses.append(F.cross_entropy(final.logits[:-1], ids[1:]).item())
    path = export_checkpoint(model, tmp_path_factory.mktemp("export") / "ckpt", tiny_dir)
    return {"model": model, "ids": ids, "first": first, "final": final, "losses": losses, "grads": grads, "path": path}


def test_qat_forward_equals_serving_forward_bitwise(run, tiny_reference):
    ref = tiny_reference.forward(run["ids"])
    out = run["first"]
    assert out.logits.requires_grad  # the autograd forward, not an inference-mode one
    assert torch.equal(out.logits.detach(), ref.logits)
    for layer, ids in ref.decisions.routed_experts.items():
        assert torch.equal(out.decisions.routed_experts[layer], ids)
    for layer, sel in ref.decisions.topk.items():
        assert torch.equal(out.decisions.topk[layer], sel)


def test_optimizer_steps_reduce_the_loss(run):
    losses = run["losses"]
    assert losses[-1] < losses[0] - 0.05, losses


def test_gradients_reach_every_master_but_the_indexer(run):
    """The LM loss reaches every trained tensor except the indexer's (its scores only select top-k;
    docs/training.md). Frozen tensors (router bias, Engram tables) are not trainable at all."""
    grads = run["grads"]
    routed = run["first"].decisions.routed_experts  # the last row's output reaches no loss term
    unused = {f"layers.{lid}.ffn.experts.{e}." for lid, ids in routed.items() for e in range(8) if not (ids[:-1] == e).any()}
    zero = sorted(n for n, g in grads.items() if g == 0)
    expert = lambda n: (m := re.match(r"layers\.\d+\.ffn\.experts\.\d+\.", n)) and m.group(0)  # noqa: E731
    assert zero and all(".indexer." in n or expert(n) in unused for n in zero), zero
    assert any(".indexer." in n for n in zero)
    names = set(grads)
    assert not any(n.endswith(".gate.bias") or ".engram.embed." in n for n in names)
    assert any(".ffn.experts.3.w2." in n for n in names) and any(n.endswith("attn_sink") for n in names)


def test_export_load_reference_equals_trainer_bitwise(run, tiny_dir):
    ref = ReferenceModel(load_model(run["path"], progress=False)).forward(run["ids"])
    assert not torch.equal(ref.logits, run["first"].logits.detach())  # the steps changed the model
    assert torch.equal(ref.logits, run["final"].logits.detach())
    # frozen tensors are copied unchanged
    src, exp = load_file(str(next(tiny_dir.glob("*.safetensors")))), load_file(str(next(run["path"].glob("*.safetensors"))))
    for name in [n for n in src if ".engram.embed." in n or n.endswith(".gate.bias")]:
        assert torch.equal(src[name].view(torch.uint8), exp[name].view(torch.uint8)), name


def test_r3_forced_routing_export_equals_trainer_and_router_learns(run):
    model, ids = run["model"], run["ids"]
    other = forward_train(model, _ids(12))  # another sequence's routing, as a rollout would return
    forced = Decisions(routed_experts=dict(other.decisions.routed_experts))
    model.zero_grad()
    out = forward_train(model, ids, replay=forced)
    for layer, e in forced.routed_experts.items():
        assert torch.equal(out.decisions.routed_experts[layer], e)
    assert any(not torch.equal(run["final"].decisions.routed_experts[layer], e) for layer, e in forced.routed_experts.items())
    F.cross_entropy(out.logits[:-1], ids[1:]).backward()
    gate = dict(model.named_parameters())["layers.5.ffn.gate.parametrizations.weight.original"]
    assert gate.grad is not None and gate.grad.abs().sum() > 0  # gating weights come from the router
    ref = ReferenceModel(load_model(run["path"], progress=False)).forward(ids, replay=forced)
    assert torch.equal(ref.logits, out.logits.detach())
    assert not torch.equal(ref.logits, run["final"].logits.detach())


def test_bf16_masters_forward_equals_serving_forward_bitwise(tiny_dir, tiny_reference):
    model = load_trainable(tiny_dir, master_dtype=torch.bfloat16)
    assert {p.dtype for _, p in trainable_parameters(model)} == {torch.bfloat16, torch.float32}  # fp32: mHC, sinks
    ids = _ids(13)[:6]
    out = forward_train(model, ids)
    assert torch.equal(out.logits.detach(), tiny_reference.forward(ids).logits)
    F.cross_entropy(out.logits[:-1], ids[1:]).backward()
    w = dict(trainable_parameters(model))["layers.3.attn.wq_b.weight"]
    assert w.grad.dtype == torch.bfloat16 and w.grad.abs().sum() > 0
