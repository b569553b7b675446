"""CPU: the trainer's logprobs with serving values (train/serving_values.py): the value is the rollouts' own
forward over the exported bytes of the trainer's masters, the gradient the trainer's.

Oracles: rollouts sampled by the offline driver step by step (`train.driver_rollouts.sample_rollouts`, the
paged runtime with the CPU op table), whose per-step logprobs the values must equal bit for bit, with and
without R3; the trainer's own forward under the same decisions, whose gradient the straight-through one
must equal. After an optimizer step the serving copy is stale until `sync()`: the values stay the
rollouts' while the trainer's own logprobs have moved, and `sync()` brings them back together.
GPU (Triton rollouts, deterministic mode): test/train/test_serving_values_gpu.py."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.checkpoint.loader import load_model
from sglang_dsv41.runtime.kernels import kernel_table
from sglang_dsv41.train.driver_rollouts import sample_rollouts
from sglang_dsv41.train.grpo import DAPOConfig
from sglang_dsv41.train.mismatch import random_prompts
from sglang_dsv41.train.policy import batch_response_logprobs
from sglang_dsv41.train.policy_update import policy_update
from sglang_dsv41.train.serving_values import ServingValues
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters


@pytest.fixture(scope="module")
def setup(tiny_dir):
    table = kernel_table("cpu")
    serving = load_model(tiny_dir, progress=False)
    rollouts, _ = sample_rollouts(serving, table, random_prompts(4, 12, serving.cfg.vocab_size, 1), 6, "cpu", 3)
    trainer = load_trainable(tiny_dir)
    return trainer, ServingValues(trainer, tiny_dir, table, max_tokens=512, max_requests=8), rollouts


def _flat(xs):
    return torch.cat([x.detach().cpu() for x in xs])


@pytest.mark.parametrize("r3", [False, True], ids=["own-routing", "r3"])
def test_values_are_the_rollouts_logprobs(setup, r3):
    trainer, values, rollouts = setup
    v = values.logits(rollouts, r3)
    out = batch_response_logprobs(trainer, rollouts, r3=r3, values=v)
    want = torch.cat([torch.tensor(r.logprobs, dtype=torch.float32) for r in rollouts])
    assert torch.equal(_flat(out.logprobs), want)
    for got, r in zip(v.routed, rollouts):  # the value forward's routing is the rollouts' (own) or forced (R3)
        assert torch.equal(got, r.routed_experts)
    if not r3:
        assert all(torch.equal(a, b) for a, b in zip(out.routed, v.routed))


def _grads(trainer, rollouts, values):
    trainer.zero_grad(set_to_none=True)
    v = values.logits(rollouts) if values is not None else None
    out = batch_response_logprobs(trainer, rollouts, r3=values is None, values=v, temperature=1.5)
    (sum(lp.sum() for lp in out.tempered) - sum(lp.sum() for lp in out.logprobs)).backward()
    return {n: p.grad.clone() for n, p in trainable_parameters(trainer) if p.grad is not None}


def test_gradient_is_the_trainers_own(setup):
    trainer, values, rollouts = setup
    st = _grads(trainer, rollouts, values)
    own = _grads(trainer, rollouts, None)  # the rollouts' experts forced: the routing the values used
    assert st.keys() == own.keys() and len(st) > 10
    for name in st:
        assert torch.equal(st[name], own[name]), name
    trainer.zero_grad(set_to_none=True)


def test_values_follow_the_masters_after_sync(tiny_dir, setup):
    _, _, rollouts = setup
    trainer = load_trainable(tiny_dir)
    values = ServingValues(trainer, tiny_dir, kernel_table("cpu"), max_tokens=512, max_requests=8)
    params = [p for _, p in trainable_parameters(trainer)]
    opt = torch.optim.SGD(params, lr=1e-2)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    stats = policy_update(trainer, opt, params, [SimpleNamespace(rollouts=rollouts, shaped=rewards)],
                          DAPOConfig(), values=values)
    assert stats["kl_max"] == 0.0 and stats["dlogp_max"] == 0.0  # scored with the rollouts' own values
    with torch.no_grad():
        moved = _flat(batch_response_logprobs(trainer, rollouts).logprobs)
        synced = _flat(batch_response_logprobs(trainer, rollouts, values=values.logits(rollouts)).logprobs)
    served = torch.cat([torch.tensor(r.logprobs, dtype=torch.float32) for r in rollouts])
    assert not torch.equal(moved, served)  # the update moved the trainer
    assert torch.equal(synced, moved)  # policy_update synced the serving copy: its values are the new weights'
    with torch.no_grad():
        for p in params:
            p.add_(0.01)
        stale = _flat(batch_response_logprobs(trainer, rollouts, values=values.logits(rollouts)).logprobs)
        values.sync()
        fresh = _flat(batch_response_logprobs(trainer, rollouts, values=values.logits(rollouts)).logprobs)
        own = _flat(batch_response_logprobs(trainer, rollouts).logprobs)
    assert torch.equal(stale, synced) and torch.equal(fresh, own) and not torch.equal(fresh, stale)


def test_refuses_a_serving_model_and_oversized_batches(tiny_dir, setup):
    trainer, values, rollouts = setup
    with pytest.raises(ValueError, match="trainable"):
        ServingValues(load_model(tiny_dir, progress=False), tiny_dir, kernel_table("cpu"))
    with pytest.raises(ValueError, match="exceed"):
        values.logits(rollouts * 3)
    with pytest.raises(ValueError, match="R3 needs routed experts"):
        values.logits([replace(rollouts[0], routed_experts=None)], r3=True)
