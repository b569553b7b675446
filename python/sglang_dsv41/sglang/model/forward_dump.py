"""Diagnostic: with SGLANG_DSV41_DUMP_FORWARDS=DIR set in the server's environment, every forward of
the model writes one file DIR/NNNNNN.pt (torch.save of a dict): the runtime `Batch` fields it ran
(input_ids, positions, req_index, req_slots, prefix_lens, extend_lens, token_table, history,
logits_rows, ...), SGLang's `mode`, `rids`, `seq_lens` and `out_cache_loc`, the fp32 `logits` rows
handed to SGLang's sampler, the wall time `t` and torch's thread count. Unset (the default): nothing
is read or written. `scripts/forward_dump_check.py` compares the dumped logits with the trainer's
dense forward, request by request."""

from __future__ import annotations

import itertools
import os
import time

import torch

DUMP_ENV = "SGLANG_DSV41_DUMP_FORWARDS"


class ForwardDump:
    def __init__(self, directory: str):
        self.directory, self.count = directory, itertools.count(1)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:  # a startup error naming the variable, not a traceback from inside the model
            raise ValueError(f"{DUMP_ENV}={directory!r}: cannot create the dump folder ({e})") from None
        if not os.access(directory, os.W_OK):
            raise ValueError(f"{DUMP_ENV}={directory!r}: the dump folder is not writable")

    @staticmethod
    def from_env() -> "ForwardDump | None":
        d = os.environ.get(DUMP_ENV)
        return ForwardDump(d) if d else None

    def write(self, fb, batch, logits: torch.Tensor) -> None:
        rec = {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in vars(batch).items()}
        rec.update(mode=str(fb.forward_mode), rids=list(fb.rids) if fb.rids is not None else None,
                   seq_lens=fb.seq_lens.detach().cpu().clone(), out_cache_loc=fb.out_cache_loc.detach().cpu().clone(),
                   logits=logits.detach().float().cpu().clone(), t=time.time(), threads=torch.get_num_threads())
        torch.save(rec, os.path.join(self.directory, f"{next(self.count):06d}.pt"))
