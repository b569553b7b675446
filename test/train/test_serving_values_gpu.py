"""GPU: zero train/serve mismatch by construction. Rollouts sampled step by step by the offline driver with the
Triton op table in deterministic mode; the trainer with serving values (train/serving_values.py) scores them
with exactly their logprobs, with and without R3, while its gradient is its own torch forward's Jacobian
applied at those values (within the tolerance below: CUDA's backward sums in atomics' order). The trainer's plain torch forward is NOT
bit-equal to these rollouts (benchmark/results: the mismatch rows), which is why the values exist.
CPU twin of this file: test_serving_values.py."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.determinism import DETERMINISTIC_ENV

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (Triton rollouts)")

GRAD_REL_L2 = 1e-5
"""|g_st - g_oracle| / |g_oracle| over all parameters: the same math, summed in another order by CUDA atomics."""
GRAD_REL_L2_PARAM = 1e-3
"""The same per parameter: the mHC scales' gradients are sums that nearly cancel, where an ulp of the upstream
moves them by up to ~1e-1 relative (measured on the CPU with softmax(V) for exp(log_softmax(V)))."""


@pytest.fixture(scope="module")
def setup(tiny_dir):
    from sglang_dsv41.checkpoint.loader import load_model, replace_tensors
    from sglang_dsv41.runtime.kernels import kernel_table
    from sglang_dsv41.train.driver_rollouts import sample_rollouts
    from sglang_dsv41.train.export import checkpoint_tensors
    from sglang_dsv41.train.mismatch import random_prompts
    from sglang_dsv41.train.serving_values import ServingValues
    from sglang_dsv41.train.trainable import load_trainable

    mp = pytest.MonkeyPatch()
    mp.setenv(DETERMINISTIC_ENV, "1")
    table = kernel_table("cuda")
    trainer = load_trainable(tiny_dir, device="cuda")
    serving = load_model(tiny_dir, device="cuda", progress=False)
    # the rollouts serve the trainer's exported bytes (train.rl pushes them before its first rollout)
    replace_tensors(serving, checkpoint_tensors(trainer, include_frozen=False))
    prompts = random_prompts(8, 24, serving.cfg.vocab_size, 2)
    rollouts, calls = sample_rollouts(serving, table, prompts, 12, "cuda", 5)
    yield trainer, ServingValues(trainer, tiny_dir, table, max_tokens=1024, max_requests=8), rollouts, calls
    mp.undo()


def test_rollouts_ran_triton(setup):
    *_, calls = setup
    impl = {i for (_, i) in calls.elements()}
    assert "triton" in impl, impl


@pytest.mark.parametrize("r3", [False, True], ids=["own-routing", "r3"])
def test_values_equal_triton_rollouts_bit_for_bit(setup, r3):
    from sglang_dsv41.train.policy import batch_response_logprobs

    trainer, values, rollouts, _ = setup
    with torch.no_grad():
        got = batch_response_logprobs(trainer, rollouts, r3=r3, values=values.logits(rollouts, r3))
    want = torch.cat([torch.tensor(r.logprobs, dtype=torch.float32) for r in rollouts])
    assert torch.equal(torch.cat([lp.cpu() for lp in got.logprobs]), want)


def test_gradient_is_the_twin_forwards_at_the_values(setup):
    """Oracle built by hand: the straight-through gradient of sum(log p) is J^T (onehot - softmax(V)), J
    the Jacobian of the twin forward's logits (the values' experts forced), V the values. The plain twin
    gradient J^T (onehot - softmax(L_twin)) is not the oracle: the twin's logits L_twin differ from the
    kernels' V by the kernel tolerance (docs/numerics.md), which the gradient's upstream then carries."""
    from sglang_dsv41.train.policy import batch_response_logprobs, response_logits
    from sglang_dsv41.train.trainable import trainable_parameters

    trainer, values, rollouts, _ = setup
    v = values.logits(rollouts)

    def grads(loss_fn):
        trainer.zero_grad(set_to_none=True)
        loss_fn().backward()
        return {n: p.grad.double() for n, p in trainable_parameters(trainer) if p.grad is not None}

    st = grads(lambda: sum(lp.sum() for lp in batch_response_logprobs(trainer, rollouts, values=v).logprobs))

    def surrogate():
        zs, _ = response_logits(trainer, rollouts, r3=True)  # the rollouts' experts == the values' (bitwise)
        total = 0
        for z, val, r in zip(zs, v.logits, rollouts):
            up = torch.nn.functional.one_hot(torch.tensor(r.response, device=z.device), z.shape[-1]).float()
            # log_softmax's backward forms onehot - exp(log_softmax(V)); the same bits here (softmax(V)
            # differs in the last bits, and the vocab-sum direction of the upstream has a large Jacobian)
            total = total + ((up - torch.log_softmax(val, dim=-1).exp()) * z).sum()
        return total

    oracle = grads(surrogate)
    assert all(torch.equal(a, b) for a, b in zip(v.routed, [r.routed_experts for r in rollouts]))
    assert st.keys() == oracle.keys() and len(st) > 10
    diff = torch.cat([(st[n] - oracle[n]).flatten() for n in st]).norm()
    assert diff <= GRAD_REL_L2 * torch.cat([g.flatten() for g in oracle.values()]).norm()
    for name in st:
        rel = (st[name] - oracle[name]).norm() / oracle[name].norm().clamp_min(1e-30)
        assert rel <= GRAD_REL_L2_PARAM, f"{name}: relative L2 {rel:.3e}"
    trainer.zero_grad(set_to_none=True)
