"""One whole training step (forward, backward, clipping, AdamW) captured as a CUDA graph.

The fast numerics policy (`NumericsPolicy.train(fast=True)`) over a fixed batch shape [B, T] launch the same ~3 * 10^4 small
kernels every step with no host synchronisation (the Engram hash, which syncs, is computed outside),
so the step is captured once and replayed: the launch overhead, not the GPU, is what bounds a step
of the small presets. Static buffers: ids int64 [B*T], target mask bool [B*T], Engram row ids;
outputs: summed target loss, target count, per-sequence all-correct bool [B]. The optimizer must be
built with `capturable=True` and a tensor learning rate (`set_lr` writes it in place).
"""

from __future__ import annotations

from typing import Callable

import torch


class GraphedStep:
    def __init__(self, model, opt: torch.optim.Optimizer, params: list, batch: int, length: int,
                 loss_fn: Callable, clip: float = 1.0):
        """loss_fn(ids, mask, engram_ids) -> (summed CE, count, right [B]) with the fast forward."""
        dev = params[0].device
        self.model, self.opt, self.params, self.clip, self.loss_fn = model, opt, params, clip, loss_fn
        self.ids = torch.zeros(batch * length, dtype=torch.int64, device=dev)
        self.mask = torch.zeros(batch * length, dtype=torch.bool, device=dev)
        self.engram: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple | None = None

    def _body(self):
        total, n, right = self.loss_fn(self.ids, self.mask, self.engram)
        (total / n).backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        return total.detach(), n, right

    def load(self, ids: torch.Tensor, mask: torch.Tensor, engram: torch.Tensor | None) -> None:
        self.ids.copy_(ids)
        self.mask.copy_(mask)
        if engram is not None:
            if self.engram is None:
                self.engram = engram.clone()
            else:
                self.engram.copy_(engram)

    def warmup_and_capture(self, warm_batches: list) -> list:
        """Run `warm_batches` [(ids, mask, engram)] as real eager steps on a side stream (allocator and
        autograd warm-up, they train), then capture the step. Returns their (total, n, right)."""
        outs = []
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for b in warm_batches:
                self.load(*b)
                self.opt.zero_grad(set_to_none=True)
                outs.append(self._body())
        torch.cuda.current_stream().wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._body()
        return outs

    def step(self, ids: torch.Tensor, mask: torch.Tensor, engram: torch.Tensor | None):
        """Copy the batch in and replay -> (summed CE, count, right [B]) (static tensors: read them
        before the next step)."""
        self.load(ids, mask, engram)
        self.graph.replay()
        return self.out
