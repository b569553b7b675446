"""CPU: the RL step's batched response log-probabilities (`train.policy.batch_response_logprobs`, one
right-padded forward over a batched DenseKV) against the per-rollout oracle `train.logprobs.response_logprobs`
(one DenseKV forward of `prompt + response[:-1]`, which test_rl_server checks against the server).

Both run the same layer code on the same rows; padding never reaches a real row (causal attention,
reference/dense_kv.py), so the log-probabilities, the trainer's routing and, under R3, the forced log-probabilities
must be equal BIT FOR BIT, for the serving model and for the QAT trainable one. Deterministic mode
(SGLANG_DSV41_DETERMINISTIC=1, as docs/rl.md prescribes for the trainer) keeps the bf16 GEMMs' bits
independent of the batch's row count. The tempered values are log_softmax(logits / T); the oracle only
exposes log_softmax(logits), so they are compared as log_softmax(rows / T) within 2e-6 (fp32 rounding of
the shift by the log-sum-exp, which log_softmax is invariant to in exact arithmetic).
"""

from __future__ import annotations

import pytest
import torch

from sglang_dsv41.determinism import DETERMINISTIC_ENV
from sglang_dsv41.train.logprobs import response_logprobs, routed_table
from sglang_dsv41.train.policy import batch_response_logprobs
from sglang_dsv41.train.rollout import Rollout

# (prompt length, response length) per rollout: a one-token prompt with a one-token response (forward of
# one row: layers of ratio 2 get no compressed row), odd and even totals (padding to the compress ratios'
# multiple), and one rollout several times longer than the rest (most rows of the others are padding);
# a batch of one (no other rollout, padding only to the ratio multiple).
MIXED = [(7, 4), (1, 1), (30, 9), (12, 3), (2, 1)]
ONE = [(9, 5)]


@pytest.fixture(autouse=True)
def deterministic(monkeypatch):
    monkeypatch.setenv(DETERMINISTIC_ENV, "1")


@pytest.fixture(scope="module")
def trainable(tiny_dir):
    from sglang_dsv41.train.trainable import load_trainable

    return load_trainable(tiny_dir)


def _rollouts(shape: list[tuple[int, int]], seed: int) -> list[Rollout]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for p, r in shape:
        ids = torch.randint(3, 1000, (p + r,), generator=g).tolist()
        out.append(Rollout(prompt=ids[:p], response=ids[p:], logprobs=[0.0] * r, finish="length"))
    return out


def _model(request, tiny_model, kind):
    return tiny_model if kind == "serving" else request.getfixturevalue("trainable")


@pytest.mark.parametrize("kind, shape", [("serving", MIXED), ("trainable", ONE)])
@torch.no_grad()
def test_batch_equals_one_forward_per_rollout(request, tiny_model, kind, shape):
    model = _model(request, tiny_model, kind)
    ros = _rollouts(shape, seed=len(shape))
    out = batch_response_logprobs(model, ros, temperature=0.7)
    assert len(out.logprobs) == len(out.routed) == len(out.tempered) == len(ros)
    for ro, lp, routed, tempered in zip(ros, out.logprobs, out.routed, out.tempered):
        want, rows, decisions = response_logprobs(model, ro.prompt, ro.response)
        assert lp.dtype == torch.float32 and lp.shape == (len(ro.response),)
        assert torch.equal(lp, want)
        assert torch.equal(routed, routed_table(decisions).cpu())  # [P + R - 1, layers, top_k]
        torch.testing.assert_close(tempered, torch.log_softmax(rows / 0.7, -1).gather(
            1, torch.tensor(ro.response)[:, None]).squeeze(1), atol=2e-6, rtol=0)


@torch.no_grad()
def test_r3_equals_forced_forward_per_rollout(trainable):
    """The trainable model (the RL trainer's): R3 with its own routing gives the unforced values (and
    those equal the oracle's); with another routing (each token's experts shifted by one) the forced
    values of the oracle, which differ from the unforced ones."""
    model = trainable
    ros = _rollouts(MIXED[:3], seed=5)
    own = batch_response_logprobs(model, ros)
    n_experts = model.cfg.moe.n_routed_experts
    for ro, table in zip(ros, own.routed):
        ro.routed_experts = table
    same = batch_response_logprobs(model, ros, r3=True)
    assert same.routed is None
    for ro, a, b in zip(ros, own.logprobs, same.logprobs):
        assert torch.equal(a, b) and torch.equal(a, response_logprobs(model, ro.prompt, ro.response)[0])
    for ro in ros:
        ro.routed_experts = (ro.routed_experts + 1) % n_experts
    moved = batch_response_logprobs(model, ros, r3=True)
    for ro, lp in zip(ros, moved.logprobs):
        assert torch.equal(lp, response_logprobs(model, ro.prompt, ro.response, ro.routed_experts)[0])
    assert not all(torch.equal(a, b) for a, b in zip(moved.logprobs, own.logprobs))

