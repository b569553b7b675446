"""Rollouts sampled by the offline driver (paged runtime, an op table: Triton kernels on CUDA): the GPU
stand-in for an RL server where SGLang cannot run. Each prompt is prefilled in one chunk, then decoded
step by step; each new token is sampled at temperature 1 from the driver's fp32 logits (seeded
torch.Generator on the device), its logprob is log_softmax(logits)[token] in fp32 (what an RL server
returns with SGLANG_RETURN_ORIGINAL_LOGPROB=1), and every forward's routed experts are kept
([prompt + response - 1, layers, top_k], the server's `return_routed_experts` layout).
"""

from __future__ import annotations

from collections import Counter

import torch

from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
from sglang_dsv41.runtime.driver import Driver, Sequence
from sglang_dsv41.train.rollout import Rollout


def sample_rollouts(model, table, prompts: list[list[int]], new: int, device: str, seed: int,
                    stop_id: int | None = None) -> tuple[list[Rollout], Counter]:
    """Prefill every prompt in one chunk, then decode `new` tokens each at temperature 1 (stopping a
    sequence at `stop_id`). -> rollouts with fp32 logprobs and int32 routed experts, op-call counts."""
    table, calls = table.counting()
    apply_numerics(model, NumericsPolicy.kernels(table))
    k, layers = model.cfg.moe.n_activated_experts, model.cfg.num_layers
    max_tokens = sum(len(p) + new for p in prompts) + len(prompts) * 64
    drv = Driver(model, max_tokens, len(prompts), page_size=64, device=device, ops=table, graphs=False)
    seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
    for s in seqs:
        drv.pools.clear_request(s.req_slot)
    gen = torch.Generator(device=device).manual_seed(seed)
    routed: list[list[torch.Tensor]] = [[] for _ in prompts]  # per sequence: [rows, layers, k] chunks
    resp: list[list[int]] = [[] for _ in prompts]
    lps: list[list[float]] = [[] for _ in prompts]
    active = list(seqs)
    counts = [len(p) for p in prompts]
    with torch.no_grad():
        while active:
            out = drv.step(active, counts)
            table_rows = torch.stack([out.decisions.routed_experts[layer] for layer in range(layers)], dim=1)
            table_rows = table_rows.to(torch.int32).cpu()  # [rows, layers, k], rows request-major
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
            lp = logp.gather(1, tok[:, None]).squeeze(1)
            tok, lp = tok.tolist(), lp.cpu().tolist()
            row, nxt = 0, []
            for s, c, t, v in zip(active, counts, tok, lp):
                routed[s.req_slot].append(table_rows[row: row + c])
                row += c
                resp[s.req_slot].append(t)
                lps[s.req_slot].append(v)
                s.tokens.append(t)
                s.prefill_len = len(s.tokens)
                if len(resp[s.req_slot]) < new and t != stop_id:
                    nxt.append(s)
            active, counts = nxt, [1] * len(nxt)
    drv.release(seqs)
    ros = [Rollout(prompt=list(p), response=r, logprobs=v, finish="length", routed_experts=torch.cat(x)[: len(p) + len(r) - 1])
           for p, r, v, x in zip(prompts, resp, lps, routed)]
    return ros, calls
