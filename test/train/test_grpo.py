"""GRPO / DAPO loss pieces (train/grpo.py) on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_dsv41.train.grpo import (DAPOConfig, clipped_token_loss, group_advantages, informative, overlong_penalty,
                                     token_level_loss)


def test_group_advantages():
    assert group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0).tolist() == [1.0, -1.0, -1.0, 1.0]
    # mean 0.25, population std sqrt(3)/4: (1 - 0.25) / (sqrt(3)/4) = sqrt(3)
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), eps=0.0)
    assert a[0].item() == pytest.approx(math.sqrt(3), abs=1e-6) and a[1].item() == pytest.approx(-1 / math.sqrt(3), abs=1e-6)
    assert group_advantages(torch.tensor([0.5, 0.5, 0.5])).tolist() == [0.0, 0.0, 0.0]


def test_dynamic_sampling_drops_all_same_groups():
    assert not informative(torch.tensor([1.0, 1.0, 1.0]))
    assert not informative(torch.tensor([0.0, 0.0]))
    assert informative(torch.tensor([0.0, 1.0, 0.0]))


def test_overlong_shaping():
    # max 16 tokens, buffer 4: free up to 12, then -1/4 per token, -1 at and past the limit.
    assert [overlong_penalty(n, 16, 4) for n in (5, 12, 13, 14, 16, 17)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(15, 16, 4, factor=0.5) == -0.375
    assert overlong_penalty(16, 16, 0) == 0.0


def test_asymmetric_clip():
    old = torch.log(torch.full((4,), 0.5))
    new = torch.log(torch.tensor([0.5, 0.7, 0.2, 0.65])).requires_grad_(True)  # ratios 1, 1.4, 0.4, 1.3
    loss, active = clipped_token_loss(new, old, 1.0, eps_low=0.2, eps_high=0.28)
    assert loss.tolist() == pytest.approx([-1.0, -1.28, -0.4, -1.28], abs=1e-6)
    assert active.tolist() == [False, True, False, True]
    loss.sum().backward()  # clipped tokens get no gradient; others d(-rho)/dlogp = -rho
    assert new.grad.tolist() == pytest.approx([-1.0, 0.0, -0.4, 0.0], abs=1e-6)

    loss, active = clipped_token_loss(new.detach(), old, -2.0, eps_low=0.2, eps_high=0.28)
    # A < 0: min(-2 rho, -2 clip(rho)) -> the ratio 0.4 is clipped up to 0.8; 1.4 and 1.3 are not clipped
    assert loss.tolist() == pytest.approx([2.0, 2.8, 1.6, 2.6], abs=1e-6)
    assert active.tolist() == [False, False, True, False]


def test_token_level_aggregation():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5, not the per-sample mean (2 + 4) / 2 = 3
    assert token_level_loss([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0])]).item() == 2.5
    with pytest.raises(ValueError):
        token_level_loss([torch.zeros(0)])


def test_config_checks():
    with pytest.raises(ValueError, match="clip range"):
        DAPOConfig(eps_low=1.0)
    with pytest.raises(ValueError, match="overlong_buffer"):
        DAPOConfig(overlong_buffer=-1)
