"""The serving forward's values with the trainer's gradients: zero train/serve mismatch by construction.

The trainer's own forward (`policy.batch_response_logprobs`: torch ops over a dense KV) equals a server
that runs the same torch ops bit for bit (the CPU server, the driver's torch twins on a GPU), but not
GPU rollouts that run the serving op table (Triton), whose results differ from their twins in the last
bits (`benchmark/results/2026-12-05-h200-mismatch.md`: KL 8.3e-4 in deterministic mode). `ServingValues` runs the rollouts' own
forward for the value:

- `serving`: a serving copy of the trainer's weights (the exported bytes, `export.checkpoint_tensors`)
  under `NumericsPolicy.kernels(table)` (the op table the rollouts ran: `runtime.kernels.kernel_table`);
  `sync()` copies the masters' bytes in after every optimizer step;
- `logits(rollouts, r3)`: a prefill of every `prompt + response[:-1]` through the paged runtime
  (`runtime.driver.Driver`, pages taken and released per call; one chunk, or as many as the pages
  need) -> per rollout the fp32 logits of its response rows and its routed experts.

`policy.batch_response_logprobs(..., values=)` then takes those logits as the value of the twin
forward's logits (`quant.ste.ste`: the gradient passes unchanged to the twin's logits) and replays the
value forward's routed experts in the twin forward, so the gradient flows through the experts that
produced the value. Under deterministic mode (SGLANG_DSV41_DETERMINISTIC=1) a row's result depends
neither on the batch nor on prefill vs decode, so the value is bit for bit what the rollouts computed
at each decode step (test/train/test_serving_values_gpu.py); in the fast default mode the prefill
and decode paths differ in their last bits (split-K at decode, library GEMMs at prefill).

The rollouts must run on the same bytes as the copy: the export of the masters, which `train.rl` pushes
before its first rollout. The checkpoint's own bytes can encode the same values with other scales, and
the GPU's routed-expert kernel reads the bytes, not only the values.

Cost: one extra no-grad prefill of the batch per step (the rollouts' forward), plus one copy of the
serving weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sglang_dsv41.checkpoint.loader import load_model, replace_tensors
from sglang_dsv41.layers.decisions import Decisions
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.train.export import checkpoint_tensors
from sglang_dsv41.train.rollout import Rollout


@dataclass
class Values:
    logits: list[torch.Tensor]
    """per rollout, fp32 [R_b, vocab]: the serving forward's logits of its response rows."""
    routed: list[torch.Tensor]
    """per rollout, int32 [P_b + R_b - 1, layers, top_k]: the experts that forward used (the
    rollout's own under R3)."""


class ServingValues:
    """The rollouts' forward over a serving copy of `trainer`'s weights (module docstring)."""

    def __init__(self, trainer: DeepseekV41, path: str | os.PathLike, table, max_tokens: int = 8192,
                 max_requests: int = 256, page_size: int = 64):
        """`path`: the checkpoint `trainer` was loaded from (config, tokenizer, frozen tables);
        `table`: the rollouts' op table; `max_tokens` / `max_requests`: the largest batch `logits`
        takes (tokens summed over its rollouts, rollouts)."""
        if not getattr(trainer, "trainable", False):
            raise ValueError("ServingValues takes the trainable model (train.trainable.make_trainable)")
        self.trainer = trainer
        self.device = trainer.embed.weight.device
        self.serving = load_model(path, device=self.device, progress=False)
        self.max_tokens, self.max_requests = max_tokens, max_requests
        self.sync()
        apply_numerics(self.serving, NumericsPolicy.kernels(table))
        self.driver = Driver(self.serving, max_tokens, max_requests, page_size=page_size, device=self.device,
                             ops=table, graphs=False)
        self.capacity = -(-max_tokens // page_size) * page_size  # the driver's free slots

    def sync(self) -> None:
        """Copy the trainer's current weights (their serving bytes) into the serving copy, in place: the
        kernels' stacked experts are views of the parameters, kept dequantized copies are refreshed."""
        replace_tensors(self.serving, checkpoint_tensors(self.trainer, include_frozen=False))

    @torch.no_grad()
    def logits(self, rollouts: list[Rollout], r3: bool = False) -> Values:
        """One prefill of every rollout's `prompt + response[:-1]` (R3: the rollouts' experts forced)."""
        if not rollouts or any(not r.prompt or not r.response for r in rollouts):
            raise ValueError("ServingValues.logits needs rollouts with a non-empty prompt and response")
        rows = [len(r.prompt) + len(r.response) - 1 for r in rollouts]
        if len(rollouts) > self.max_requests or sum(rows) > self.max_tokens:
            raise ValueError(f"{len(rollouts)} rollouts of {sum(rows)} tokens exceed this ServingValues' "
                             f"{self.max_requests} requests / {self.max_tokens} tokens")
        if r3 and any(r.routed_experts is None for r in rollouts):
            raise ValueError("R3 needs routed experts from the server (--enable-return-routed-experts)")
        logits, experts = [], []
        for group in self._groups(rows):
            lg, ex = self._prefill([rollouts[i] for i in group], [rows[i] for i in group], r3)
            logits += lg
            experts += ex
        return Values(logits, experts)

    def _groups(self, rows: list[int]) -> list[list[int]]:
        """Consecutive rollouts per prefill so that the pages fit: the driver gives every sequence of a
        step pages up to the step's longest (`Driver._table`). A row's values do not depend on its batch
        in deterministic mode."""
        ps, groups = self.driver.page_size, [[]]
        for i, n in enumerate(rows):
            cand = groups[-1] + [i]
            if groups[-1] and len(cand) * -(-max(rows[j] for j in cand) // ps) * ps > self.capacity:
                groups.append([i])
            else:
                groups[-1] = cand
        return groups

    def _prefill(self, rollouts: list[Rollout], rows: list[int], r3: bool):
        """One prefill chunk of these rollouts' rows -> their response rows' logits and routed experts."""
        replay = None
        if r3:
            table = torch.cat([r.routed_experts[:n] for r, n in zip(rollouts, rows)]).to(self.device)
            replay = Decisions(routed_experts={layer: table[:, layer].contiguous() for layer in range(table.shape[1])})
        seqs = [Sequence(i, r.sequence[:-1], n) for i, (r, n) in enumerate(zip(rollouts, rows))]
        for s in seqs:
            self.driver.pools.clear_request(s.req_slot)
        try:
            out = self.driver.step(seqs, rows, all_logits=True, replay=replay)
        finally:
            self.driver.release(seqs)
        # the runtime returns inference tensors, which autograd cannot record: clone them out
        routed = torch.stack([out.decisions.routed_experts[layer] for layer in sorted(out.decisions.routed_experts)], dim=1)
        logits, experts, start = [], [], 0
        for r, n in zip(rollouts, rows):
            logits.append(out.logits[start + len(r.prompt) - 1: start + n].float().clone())
            experts.append(routed[start: start + n].to(torch.int32).cpu().clone())
            start += n
        return logits, experts
