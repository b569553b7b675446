"""GPU: zero train/serve mismatch by construction. Rollouts sampled step by step by the offline driver with the
Triton op table in deterministic mode; the trainer with serving values (train/serving_values.py) scores them
with exactly their logprobs, with and without R3, while its gradient is its own torch forward's (within the
tolerance below: CUDA's backward sums in atomics' order). The trainer's plain torch forward is NOT
bit-equal to these rollouts (benchmark/results: the mismatch rows), which is why the values exist.
CPU twin of this file: test_serving_values.py."""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.determinism import DETERMINISTIC_ENV

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (Triton rollouts)")

GRAD_REL_L2 = 1e-5
"""|g_st - g_twin| / |g_twin| per parameter: the same math, summed in a different order by CUDA atomics."""


@pytest.fixture(scope="module")
def setup(tiny_dir):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.runtime.kernels import kernel_table
    from sglang_dsv41.train.driver_rollouts import sample_rollouts
    from sglang_dsv41.train.mismatch import random_prompts
    from sglang_dsv41.train.serving_values import ServingValues
    from sglang_dsv41.train.trainable import load_trainable

    mp = pytest.MonkeyPatch()
    mp.setenv(DETERMINISTIC_ENV, "1")
    table = kernel_table("cuda")
    serving = load_model(tiny_dir, device="cuda", progress=False)
    prompts = random_prompts(8, 24, serving.cfg.vocab_size, 2)
    rollouts, calls = sample_rollouts(serving, table, prompts, 12, "cuda", 5)
    trainer = load_trainable(tiny_dir, device="cuda")
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


def test_gradient_matches_the_twin_forward(setup):
    from sglang_dsv41.train.policy import batch_response_logprobs
    from sglang_dsv41.train.trainable import trainable_parameters

    trainer, values, rollouts, _ = setup

    def grads(v):
        trainer.zero_grad(set_to_none=True)
        out = batch_response_logprobs(trainer, rollouts, r3=v is None, values=v)
        sum(lp.sum() for lp in out.logprobs).backward()
        return {n: p.grad.double() for n, p in trainable_parameters(trainer) if p.grad is not None}

    st = grads(values.logits(rollouts))
    twin = grads(None)  # the rollouts' experts forced: the decisions the values were computed with
    assert st.keys() == twin.keys() and len(st) > 10
    for name in st:
        rel = (st[name] - twin[name]).norm() / twin[name].norm().clamp_min(1e-30)
        assert rel <= GRAD_REL_L2, f"{name}: relative L2 {rel:.3e}"
    trainer.zero_grad(set_to_none=True)
