"""Engram n-gram hashing: token ids -> embedding-table row ids (bit-exact, CPU or CUDA).

For a token at absolute position p the window column s = 0..N-1 (N = max_ngram_size) is the s-th
predecessor (s = 0 is the token itself). Tokens are first mapped to compressed classes with the
token map. A column is *blocked* when p < s (before the sequence start) or when it, or any newer
column, holds a dead token (image tokens); blocking is cumulative from newer to older columns.
Blocked columns use pad = token_map[pad_token_id].

With c_s the (possibly pad) class of column s and mult[layer] the layer's odd multipliers:
    prod_s = c_s * mult[layer][s]                         (int64; cannot overflow, see below)
    r_0 = prod_0,  r_i = r_{i-1} XOR prod_i
    row(size i+1, head h) = r_i mod primes[layer][i-1][h] + offsets[layer][(i-1)*H + h]
for i = 1..N-1, h = 0..H-1. Each token gets (N-1)*H row ids per Engram layer, ordered
(size 2: heads 0..H-1, size 3: heads 0..H-1, ...), indexing that layer's table.

Multipliers: for Engram layer id L, `np.random.default_rng(10007 * L).integers(0, B, size=(N,),
dtype=np.int64)` with B = max(1, (INT64_MAX // compressed_vocab_size) // 2); mult = 2*v + 1.
Hence c * mult < compressed_vocab_size * 2B <= INT64_MAX for every class c < compressed_vocab_size.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from sglang_dsv41.config import EngramConfig
from sglang_dsv41.numerics import Slot
from sglang_dsv41.shared_math import hash_rows

INT64_MAX = int(np.iinfo(np.int64).max)
_SEED_STRIDE = 10007


def multiplier_bound(compressed_vocab_size: int) -> int:
    """B: the exclusive upper bound of the raw draws (multipliers are 2*v+1, v in [0, B))."""
    if compressed_vocab_size <= 0:
        raise ValueError(f"compressed_vocab_size must be positive, got {compressed_vocab_size}")
    return max(1, (INT64_MAX // compressed_vocab_size) // 2)


def hash_multipliers(layer_ids: Sequence[int], max_ngram_size: int, compressed_vocab_size: int) -> torch.Tensor:
    """Odd per-layer, per-column multipliers.

    Returns:
        LongTensor [len(layer_ids), max_ngram_size] (int64, CPU); row k belongs to layer_ids[k].
    """
    bound = multiplier_bound(compressed_vocab_size)
    rows = []
    for layer_id in layer_ids:
        rng = np.random.default_rng(_SEED_STRIDE * int(layer_id))
        v = rng.integers(low=0, high=bound, size=(max_ngram_size,), dtype=np.int64)
        rows.append([2 * int(x) + 1 for x in v])
    return torch.tensor(rows, dtype=torch.long).reshape(len(layer_ids), max_ngram_size)


class EngramHasher:
    """Row-id hashing for all Engram layers of one model.

    Args:
        config: the model's `EngramConfig` (layer_ids, max_ngram_size N, n_heads H, vocab_size for
            the prime layout, pad_token_id, compressed_vocab_size).
        token_map: LongTensor [tokenizer vocab] of compressed classes (see
            `sglang_dsv41.tokenizer.token_map`); every class must lie in [0, compressed_vocab_size).
        dead_token_ids: raw token ids that are always dead (e.g. the image placeholder id).
        out_of_vocab_dead: if True (default), raw ids < 0 or >= len(token_map) are dead too (SGLang
            replaces multimodal placeholder ids with out-of-vocab pad values); if False they raise.

    Output of every `hash_*` method: LongTensor [T, n_engram_layers, (N-1)*H] on the input's device,
    layers in `config.layer_ids` order.
    """

    # numerics slot (sglang_dsv41/numerics.py): the kernels policy sets the `engram_hash` op on the instance
    numerics_slots = {"window_hash": Slot("engram", kernel="engram_hash")}
    window_hash = staticmethod(hash_rows)

    def __init__(
        self,
        config: EngramConfig,
        token_map: torch.Tensor,
        dead_token_ids: Sequence[int] = (),
        out_of_vocab_dead: bool = True,
    ):
        token_map = torch.as_tensor(token_map, dtype=torch.long).detach().cpu().reshape(-1)
        if token_map.numel() == 0:
            raise ValueError("token_map is empty")
        lo, hi = int(token_map.min()), int(token_map.max())
        if lo < 0 or hi >= config.compressed_vocab_size:
            raise ValueError(
                f"token_map classes span [{lo}, {hi}], outside [0, compressed_vocab_size={config.compressed_vocab_size})"
            )
        if not 0 <= config.pad_token_id < token_map.numel():
            raise ValueError(f"pad_token_id={config.pad_token_id} is outside the token map (size {token_map.numel()})")
        if config.max_ngram_size < 2 or config.n_heads < 1:
            raise ValueError("Engram needs max_ngram_size >= 2 and n_heads >= 1")

        self.config = config
        self.max_ngram_size = config.max_ngram_size
        self.n_heads = config.n_heads
        self.n_layers = len(config.layer_ids)
        self.n_cols = config.n_hash_cols
        self.out_of_vocab_dead = out_of_vocab_dead
        self.pad_class = int(token_map[config.pad_token_id])

        dead = torch.zeros(token_map.numel(), dtype=torch.bool)
        for t in dead_token_ids:
            if 0 <= int(t) < token_map.numel():
                dead[int(t)] = True
        # Compressed class per raw id, -1 for dead ids.
        self.token_map = token_map
        self.class_table = torch.where(dead, torch.full_like(token_map, -1), token_map)

        layout = config.layout
        self.multipliers = hash_multipliers(config.layer_ids, config.max_ngram_size, config.compressed_vocab_size)
        self.primes = torch.tensor(
            [layout.flat_primes(k) for k in range(self.n_layers)], dtype=torch.long
        ).reshape(self.n_layers, config.max_ngram_size - 1, config.n_heads)
        self.offsets = torch.tensor([list(layout.offsets[k]) for k in range(self.n_layers)], dtype=torch.long).reshape(
            self.n_layers, config.max_ngram_size - 1, config.n_heads
        )
        self.num_embeddings = layout.num_embeddings
        self._device_tables: dict[str, tuple[torch.Tensor, ...]] = {}

    # ------------------------------------------------------------------ helpers
    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(class_table [V], multipliers [L, N], primes [L, N-1, H], offsets [L, N-1, H]) on device."""
        key = str(device)
        tabs = self._device_tables.get(key)
        if tabs is None:
            tabs = tuple(t.to(device) for t in (self.class_table, self.multipliers, self.primes, self.offsets))
            self._device_tables[key] = tabs
        return tabs  # type: ignore[return-value]

    def compress(self, ids: torch.Tensor, dead_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Raw token ids (any shape, int) -> compressed classes (same shape, int64), -1 where dead.

        Dead: `dead_mask` True, an id in `dead_token_ids`, or (with out_of_vocab_dead) an id outside
        [0, len(token_map)).
        """
        ids = ids.to(torch.long)
        table = self._tables(ids.device)[0]
        in_vocab = (ids >= 0) & (ids < table.numel())
        if not self.out_of_vocab_dead and not bool(in_vocab.all()):
            raise ValueError("token id outside the token map")
        cls = torch.where(in_vocab, table[ids.clamp(0, table.numel() - 1)], torch.full_like(ids, -1))
        if dead_mask is not None:
            cls = torch.where(dead_mask.to(device=ids.device, dtype=torch.bool), torch.full_like(cls, -1), cls)
        return cls

    # ------------------------------------------------------------------ core
    def hash_windows(self, windows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hash explicit windows.

        Args:
            windows: LongTensor [T, N]; column s is the compressed class of the s-th predecessor
                (s = 0: the token itself), -1 for a dead token. Values in columns with
                positions < s are ignored.
            positions: LongTensor [T], absolute position of each token.
        Returns:
            LongTensor [T, n_layers, (N-1)*H] row ids.
        """
        n = self.max_ngram_size
        if windows.dim() != 2 or windows.shape[1] != n:
            raise ValueError(f"windows must be [T, {n}], got {tuple(windows.shape)}")
        _, mult, primes, offsets = self._tables(windows.device)
        return self.window_hash(windows.to(torch.long), positions, mult, primes, offsets, self.pad_class)

    def hash_packed(
        self,
        input_ids: torch.Tensor,
        seq_lens: torch.Tensor | Sequence[int],
        start_pos: torch.Tensor | Sequence[int] | None = None,
        history: torch.Tensor | None = None,
        dead_mask: torch.Tensor | None = None,
        history_dead_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hash several sequences (chunks) packed back to back.

        Args:
            input_ids: LongTensor [T_total], the chunks concatenated.
            seq_lens: [B] tokens per chunk (sum = T_total).
            start_pos: [B] absolute position of each chunk's first token (default all 0).
            history: LongTensor [B, N-1] raw token ids preceding each chunk, oldest first (the
                last column immediately precedes start_pos). Entries whose position would be < 0
                are ignored (any value). May be None only when every start_pos is 0.
            dead_mask: BoolTensor [T_total], extra dead tokens.
            history_dead_mask: BoolTensor [B, N-1], extra dead history tokens.
        Returns:
            LongTensor [T_total, n_layers, (N-1)*H].
        """
        device = input_ids.device
        n = self.max_ngram_size
        ids = input_ids.reshape(-1).to(torch.long)
        t_total = ids.numel()
        seq_lens = torch.as_tensor(seq_lens, dtype=torch.long, device=device).reshape(-1)
        b = seq_lens.numel()
        if start_pos is None:
            start = torch.zeros(b, dtype=torch.long, device=device)
        else:
            start = torch.as_tensor(start_pos, dtype=torch.long, device=device).reshape(-1)
        if start.numel() != b:
            raise ValueError(f"start_pos has {start.numel()} entries for {b} sequences")

        if history is None:
            if b and bool((start > 0).any()):
                raise ValueError("history is required when a chunk starts after position 0")
            hist_cls = torch.full((b, n - 1), -1, dtype=torch.long, device=device)
        else:
            history = history.to(device=device, dtype=torch.long).reshape(b, -1)
            if history.shape[1] != n - 1:
                raise ValueError(f"history must be [B, {n - 1}], got {tuple(history.shape)}")
            hist_pos = start.reshape(b, 1) - (n - 1) + torch.arange(n - 1, device=device).reshape(1, -1)
            # Positions < 0 are blocked by the position rule anyway; make their ids harmless.
            history = torch.where(hist_pos >= 0, history, torch.zeros_like(history))
            hist_cls = self.compress(history, history_dead_mask)

        cls = self.compress(ids, dead_mask)
        seq_idx = torch.repeat_interleave(torch.arange(b, device=device), seq_lens, output_size=t_total)
        first = torch.cumsum(seq_lens, 0) - seq_lens
        arange_t = torch.arange(t_total, device=device)
        local = arange_t - first[seq_idx]
        positions = start[seq_idx] + local

        columns = []
        for s in range(n):
            from_cur = cls[(arange_t - s).clamp(min=0)]
            if s == 0:
                columns.append(from_cur)
                continue
            from_hist = hist_cls[seq_idx, (n - 1 + local - s).clamp(0, n - 2)]
            columns.append(torch.where(local >= s, from_cur, from_hist))
        windows = torch.stack(columns, dim=1) if t_total else torch.empty(0, n, dtype=torch.long, device=device)
        return self.hash_windows(windows, positions)

    def hash_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """One new token per sequence (a decode step): `hash_packed(input_ids, ones, positions, history)` in
        a dozen tensor ops instead of its general window assembly (which is ~60 small launches on a GPU).

        Args:
            input_ids: LongTensor [B], each sequence's token at positions[b].
            positions: LongTensor [B] absolute positions.
            history: LongTensor [B, N-1] raw ids before each token, oldest first (entries at
                positions < 0 any value).
        Returns:
            LongTensor [B, n_layers, (N-1)*H].
        """
        n = self.max_ngram_size
        pos = positions.reshape(-1, 1).to(torch.long)
        hist = history.to(device=pos.device, dtype=torch.long).reshape(pos.size(0), n - 1)
        # column s = the s-th predecessor (s = 0 the token itself), as `hash_packed` builds it
        newest_first = torch.cat([input_ids.reshape(-1, 1).to(torch.long), hist.flip(1)], dim=1)
        back = torch.arange(n, device=pos.device).reshape(1, n)
        raw = torch.where(pos >= back, newest_first, torch.zeros_like(newest_first))  # before the start: harmless id
        return self.hash_windows(self.compress(raw), positions)

    def hash_ids(
        self,
        input_ids: torch.Tensor,
        start_pos: int = 0,
        history: torch.Tensor | None = None,
        dead_mask: torch.Tensor | None = None,
        history_dead_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hash one chunk of one sequence.

        Args:
            input_ids: LongTensor [T] raw token ids at positions start_pos..start_pos+T-1.
            start_pos: absolute position of input_ids[0].
            history: LongTensor [k] raw ids preceding start_pos, oldest first; the last
                min(k, N-1) are used. Needs k >= min(start_pos, N-1); entries at positions < 0 are
                ignored. None is allowed only for start_pos == 0.
            dead_mask: BoolTensor [T] extra dead tokens (e.g. image tokens).
            history_dead_mask: BoolTensor [k] extra dead history tokens.
        Returns:
            LongTensor [T, n_layers, (N-1)*H] on input_ids' device.
        """
        n = self.max_ngram_size
        device = input_ids.device
        ids = input_ids.reshape(-1)
        need = min(int(start_pos), n - 1)
        if start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {start_pos}")
        hist = None
        hdead = None
        if history is not None or need > 0:
            if history is None:
                raise ValueError(f"history of {need} token(s) is required at start_pos={start_pos}")
            history = history.reshape(-1).to(device=device, dtype=torch.long)
            k = history.numel()
            if k < need:
                raise ValueError(f"history has {k} token(s); {need} are needed at start_pos={start_pos}")
            hdm = None
            if history_dead_mask is not None:
                hdm = history_dead_mask.reshape(-1).to(device=device, dtype=torch.bool)
            if k >= n - 1:
                hist = history[k - (n - 1):]
                hdead = hdm[k - (n - 1):] if hdm is not None else None
            else:  # left-pad; the padded slots sit at positions < 0 since k >= start_pos here
                padn = n - 1 - k
                hist = torch.cat([torch.zeros(padn, dtype=torch.long, device=device), history])
                if hdm is not None:
                    hdead = torch.cat([torch.zeros(padn, dtype=torch.bool, device=device), hdm])
            hist = hist.reshape(1, n - 1)
            hdead = hdead.reshape(1, n - 1) if hdead is not None else None
        return self.hash_packed(
            ids,
            [ids.numel()],
            [int(start_pos)],
            history=hist,
            dead_mask=dead_mask.reshape(-1) if dead_mask is not None else None,
            history_dead_mask=hdead,
        )

    def hash_sequence(self, input_ids: torch.Tensor, dead_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hash a whole sequence from position 0: LongTensor [T] -> LongTensor [T, n_layers, (N-1)*H]."""
        return self.hash_ids(input_ids, 0, None, dead_mask)


def engram_hash_sequence(
    config: EngramConfig,
    token_map: torch.Tensor,
    input_ids: torch.Tensor,
    dead_mask: torch.Tensor | None = None,
    dead_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """One-shot convenience: hash input_ids [T] from position 0 -> LongTensor [T, n_layers, (N-1)*H]."""
    return EngramHasher(config, token_map, dead_token_ids).hash_sequence(input_ids, dead_mask)
