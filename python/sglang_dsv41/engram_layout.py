"""Engram table layout: the prime-sized bucket ranges of each (n-gram size, head) segment.

Rule (spec model 5.2.3): one set of already-used primes is shared by all Engram layers. For each
Engram layer (in `engram_layer_ids` order), for each n-gram size 2..N, the running value restarts
at `vocab_size - 1`; for each head take the next prime strictly greater than the running value that
has not been used yet. A layer's table is the concatenation of its (N-1)*heads segments in
(n-gram size, head) order; `offsets` are the prefix sums. With vocab 16,000,000, 8 heads and N = 4
this gives exactly 384,006,168 and 384,016,682 rows (V4.1-Flash).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# Deterministic Miller-Rabin witnesses for every n < 3.3e24 (covers all int64 values).
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    """Exact primality for 64-bit integers (deterministic Miller-Rabin)."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_unused_prime(after: int, used: set[int]) -> int:
    """Smallest prime strictly greater than `after` that is not in `used`."""
    n = after + 1
    while n in used or not is_prime(n):
        n += 1
    return n


@dataclass(frozen=True)
class EngramLayout:
    """primes[layer][ngram-2][head] moduli and offsets[layer][col] row offsets, col = (ngram-2)*heads + head."""

    primes: tuple[tuple[tuple[int, ...], ...], ...]
    offsets: tuple[tuple[int, ...], ...]

    @staticmethod
    def build(num_layers: int, max_ngram_size: int, n_heads: int, vocab_size: int) -> "EngramLayout":
        return _build_layout(num_layers, max_ngram_size, n_heads, vocab_size)

    @property
    def num_embeddings(self) -> tuple[int, ...]:
        """Rows of each layer's table."""
        return tuple(sum(p for per_n in layer for p in per_n) for layer in self.primes)

    def flat_primes(self, layer_index: int) -> tuple[int, ...]:
        """The (N-1)*heads moduli of one layer in column order."""
        return tuple(p for per_n in self.primes[layer_index] for p in per_n)


@lru_cache(maxsize=16)
def _build_layout(num_layers: int, max_ngram_size: int, n_heads: int, vocab_size: int) -> EngramLayout:
    used: set[int] = set()
    primes, offsets = [], []
    for _ in range(num_layers):
        per_layer = []
        for _n in range(max_ngram_size - 1):
            current, sizes = vocab_size - 1, []
            for _h in range(n_heads):
                current = next_unused_prime(current, used)
                used.add(current)
                sizes.append(current)
            per_layer.append(tuple(sizes))
        flat = [p for per_n in per_layer for p in per_n]
        offs, acc = [], 0
        for p in flat:
            offs.append(acc)
            acc += p
        primes.append(tuple(per_layer))
        offsets.append(tuple(offs))
    return EngramLayout(primes=tuple(primes), offsets=tuple(offsets))
