"""CPU, no server: one RL update (`train.policy_update`, what `train.rl` runs every step) moves the policy in
the direction of the reward. Rollouts of fixed token ids on the tiny checkpoint, their logprobs the trainer's
own (a server with zero mismatch returns exactly these), two groups of four samples with 0/1 rewards.

Oracles: at the first update the ratio is exactly 1, so the DAPO loss is -sum_i A_i len_i / sum_i len_i (A_i
the group-relative advantages, len_i the response lengths); after it every rewarded sample's log-probability
rose and every other one fell, and with the rewards swapped the moves swap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.train.grpo import DAPOConfig, group_advantages
from sglang_dsv41.train.policy import batch_response_logprobs
from sglang_dsv41.train.policy_update import policy_update
from sglang_dsv41.train.rollout import Rollout
from sglang_dsv41.train.trainable import load_trainable, trainable_parameters

LENGTHS = [(3, 5, 4, 2), (4, 2, 3, 5)]
REWARDS = [(1.0, 0.0, 0.0, 1.0), (0.0, 1.0, 0.0, 0.0)]


def _rollouts(model) -> list[Rollout]:
    g = torch.Generator().manual_seed(0)
    out = []
    for lengths in LENGTHS:
        prompt = torch.randint(10, 500, (6,), generator=g).tolist()
        out += [Rollout(prompt, torch.randint(10, 500, (n,), generator=g).tolist(), [], "stop") for n in lengths]
    for r, lp in zip(out, _logprobs(model, out)):
        r.logprobs = lp.tolist()
    return out


def _logprobs(model, rollouts) -> list[torch.Tensor]:
    with torch.no_grad():
        return batch_response_logprobs(model, rollouts).logprobs


def _update(tiny_dir, rewards):
    model = load_trainable(tiny_dir)
    rollouts = _rollouts(model)
    groups = [SimpleNamespace(rollouts=rollouts[4 * i: 4 * i + 4], shaped=torch.tensor(r)) for i, r in enumerate(rewards)]
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    before = torch.tensor([lp.sum() for lp in _logprobs(model, rollouts)])
    stats = policy_update(model, opt, params, groups, DAPOConfig())
    after = torch.tensor([lp.sum() for lp in _logprobs(model, rollouts)])
    return rollouts, stats, after - before


@pytest.mark.parametrize("swap", [False, True], ids=["rewards", "swapped"])
def test_one_update_moves_the_policy_toward_the_reward(tiny_dir, swap):
    rewards = [tuple(1.0 - x for x in r) for r in REWARDS] if swap else REWARDS
    rollouts, stats, moved = _update(tiny_dir, rewards)
    adv = torch.cat([group_advantages(torch.tensor(r)) for r in rewards]).double()
    lengths = torch.tensor([len(r.response) for r in rollouts], dtype=torch.float64)
    assert stats["loss"] == pytest.approx(float(-(adv * lengths).sum() / lengths.sum()), rel=1e-6, abs=1e-7)
    assert stats["clip_frac"] == 0.0 and stats["tokens"] == int(lengths.sum())
    assert stats["kl_max"] == 0.0 and stats["dlogp_max"] == 0.0  # the rollouts' logprobs are the trainer's own
    rewarded = torch.tensor([x for r in rewards for x in r]) > 0
    assert (moved[rewarded] > 0).all() and (moved[~rewarded] < 0).all(), (moved, rewarded)
