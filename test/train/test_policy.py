"""CPU: the trainer's batched response log-probabilities (train/policy.py) at a sampling temperature.
The untempered values do not depend on T (they are what mismatch compares with the server's raw
logprobs); the tempered ones are log softmax(logits / T): below the untempered ones' spread at T > 1
and equal to -log(vocab) in the limit of a huge T."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_dsv41.train.policy import batch_response_logprobs
from sglang_dsv41.train.rollout import Rollout


def _rollouts() -> list[Rollout]:
    g = torch.Generator().manual_seed(3)
    out = []
    for p, r in ((7, 4), (5, 6)):
        ids = torch.randint(3, 1000, (p + r,), generator=g).tolist()
        out.append(Rollout(prompt=ids[:p], response=ids[p:], logprobs=[0.0] * r, finish="length"))
    return out


@torch.inference_mode()
def test_temperature_keeps_raw_logprobs_and_adds_tempered(tiny_model):
    ros = _rollouts()
    raw = batch_response_logprobs(tiny_model, ros)
    assert raw.tempered is None
    hot = batch_response_logprobs(tiny_model, ros, temperature=2.0)
    for a, b in zip(raw.logprobs, hot.logprobs):
        assert torch.equal(a, b)  # the raw log-probabilities never depend on T
    for lp, tp in zip(raw.logprobs, hot.tempered):
        assert tp.shape == lp.shape and not torch.equal(tp, lp)
    flat = batch_response_logprobs(tiny_model, ros, temperature=1e9)
    v = tiny_model.cfg.vocab_size
    for tp in flat.tempered:
        torch.testing.assert_close(tp, torch.full_like(tp, -math.log(v)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("t", [0.0, -1.0])
def test_bad_temperature_is_refused(tiny_model, t):
    with pytest.raises(ValueError, match="temperature"):
        batch_response_logprobs(tiny_model, _rollouts(), temperature=t)
