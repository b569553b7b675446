"""SGLang's seeded sampling (deterministic inference) on the CPU, in torch.

With `--enable-deterministic-inference` (and any RL target) SGLang samples every row by the Gumbel-max trick
with noise hashed from (the request's `sampling_seed`, the row's position, the token id): MurmurHash3 (x86, 32
bit, hash seed 0) of the 16-byte message seed_lo, seed_hi, position, token, each a little-endian uint32. The hash
is a Triton kernel on accelerators and an `sgl_kernel` CPU op otherwise, which SGLang's CPU-engine build has
and our CPU platform does not (the first sampled token raised ImportError and ended the scheduler). This is
the same hash and noise in torch ops (int64 arithmetic on uint32 values, exact), so a seed samples the same
token here as on the GPU; test/sglang/test_rl_args.py checks the hash against SGLang's kernel run by Triton's
interpreter.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for uint32 values in int64, in two 16-bit halves of c (no product reaches 2**63)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """One 4-byte block into the hash state."""
    k = _mul32(_rotl32(_mul32(k, _C1), 15), _C2)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _MASK


def murmur_hash32(seed: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """seed [n] (int64, read as uint64), positions [n], tokens [m] -> int64 [n, m] holding uint32 hashes."""
    seed = seed.to(torch.int64)
    lo, hi = seed & _MASK, (seed >> 32) & _MASK  # the arithmetic shift's sign bits are masked off
    h = _mix(_mix(torch.zeros_like(lo), lo), hi)
    h = _mix(h, positions.to(torch.int64) & _MASK)
    h = _mix(h[:, None], (tokens.to(torch.int64) & _MASK)[None, :])
    h = h ^ 16  # the message length
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def seeded_argmax(logprobs: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """logprobs [n, m] (any float; weights up to a per-row constant) -> int64 [n, 1]: each row's sample under
    Gumbel noise -log(-log(u)), u = hash / (2**32 - 1), in fp64. log(u) is capped at -2**-32 (u = 1 would give
    +inf noise; the cap is the hash's spacing) and floored at fp64's lowest (u = 0)."""
    u = murmur_hash32(seed, positions, torch.arange(logprobs.shape[1], device=logprobs.device)).to(torch.float64)
    log_u = (u / _MASK).log().clamp(min=torch.finfo(torch.float64).min, max=-(2.0**-32))
    gumbel = -(-log_u).log()
    return torch.argmax(gumbel + logprobs.to(torch.float64), dim=1, keepdim=True)


def sample_on_cpu(original, logprobs: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """AROUND hook on SGLang's `layers.sampler.multinomial_with_seed(logprobs, seed, positions)`: CPU tensors are
    sampled by `seeded_argmax`, others by SGLang."""
    if logprobs.device.type != "cpu":
        return original(logprobs, seed, positions)
    return seeded_argmax(logprobs, seed, positions)
