"""SGLang's seeded sampling (deterministic inference) on our CPU platform (model/seeded_sampling.py). Oracles:
SGLang's MurmurHash Triton kernel run by Triton's interpreter (the hash must be the same, so a seed samples the
same token on the CPU as on the GPU), the Gumbel-max law (sample frequencies equal the probabilities), and
SGLang's own sampling function with our row installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import resolution_harness
import torch

from sglang_dsv41.sglang import hooks
from sglang_dsv41.sglang.model import seeded_sampling

SEEDS = [0, 1, 42, 2**32 - 1, 2**32, 2**40 + 7, 2**63 - 1, -1, -(2**63)]
POSITIONS = [0, 1, 5, 127, 65535, 123456, 2**31 - 1, 2**32 - 1, 3]
TOKENS = 300  # three of the kernel's blocks of 128, the last one partial

_KERNEL = f"""
import json, torch
from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32_kernel
seed, pos = torch.tensor({SEEDS}, dtype=torch.int64), torch.tensor({POSITIONS}, dtype=torch.int64)
out = torch.empty((len(seed), {TOKENS}), dtype=torch.uint32)
murmur_hash32_kernel[(len(seed), 3)](seed, pos, torch.arange({TOKENS}), out, len(seed), {TOKENS}, BLOCK_SIZE=128)
print(json.dumps(out.to(torch.int64).tolist()))
"""


def test_hash_equals_sglangs_kernel():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    res = subprocess.run([sys.executable, "-c", _KERNEL], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    kernel = torch.tensor(json.loads(res.stdout.strip().splitlines()[-1]))
    ours = seeded_sampling.murmur_hash32(torch.tensor(SEEDS), torch.tensor(POSITIONS), torch.arange(TOKENS))
    assert ours.dtype == torch.int64 and ours.shape == (len(SEEDS), TOKENS)
    assert int(ours.min()) >= 0 and int(ours.max()) < 2**32
    assert torch.equal(ours, kernel)


def test_samples_follow_the_probabilities():
    """Gumbel-max: over 20,000 seeds each token is drawn with its probability (binomial sd <= 0.0035)."""
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05, 0.0])
    n = 20_000
    logprobs = probs.log().expand(n, -1)
    tokens = seeded_sampling.seeded_argmax(logprobs, torch.arange(n), torch.full((n,), 7))
    assert tokens.shape == (n, 1) and tokens.dtype == torch.int64
    freq = torch.bincount(tokens[:, 0], minlength=5).double() / n
    assert freq[4] == 0.0  # a -inf logprob is never drawn
    assert torch.allclose(freq, probs.double(), atol=0.015), freq


def test_sglangs_sampler_runs_on_the_cpu_with_the_row(monkeypatch):
    """SGLang's deterministic sampling function, with our AROUND row on multinomial_with_seed: the same
    (seed, position) draws the same token; the draw is seeded_argmax of the log-probabilities."""
    from sglang.srt.layers import sampler

    (row,) = [h for h in hooks.EVERY_PROCESS if h.fn is seeded_sampling.sample_on_cpu]
    resolution_harness.install(monkeypatch, [row])
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(6, 50, generator=g), dim=-1)
    probs[1] = probs[0]
    seed, positions = torch.tensor([3, 3, 3, 4, 5, 6]), torch.tensor([9, 9, 10, 9, 9, 9])
    tokens = sampler.sampling_from_probs_torch(probs, seed, positions)
    assert tokens.dtype == torch.int32
    assert torch.equal(tokens.long(), seeded_sampling.seeded_argmax(probs.log(), seed, positions)[:, 0])
    assert tokens[0] == tokens[1]  # the same distribution, seed and position
    assert torch.equal(sampler.sampling_from_probs_torch(probs, seed, positions), tokens)
