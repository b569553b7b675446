"""Floors of one driver step, from the model's shapes and the ceilings measured on the machine.

    ceil = measure_ceilings("cuda")           # {"hbm_tb_s": copy read+write, "mma_tflops": bf16 matmul}
    b = decode_bytes(model, batch, context, active_experts)   # {"weights": .., "kv": .., "total": ..}
    f = prefill_flops(model, prompt_len)      # per prompt: {"linear": .., "attention": .., "index": .., "total": ..}

Decode floor = bytes that must be read once per step / HBM bandwidth: every weight the step
touches (routed experts: only the distinct experts the step's rows were routed to; the embedding
and Engram tables: only the gathered rows; `wo_a` as its kept bf16 copy, the lm head whole) plus
the KV the rows attend to (window keys of every layer, the selected top-k compressed keys, every
visible index key of an index-source layer). Activations, slot tables and logits are not counted.
Prefill floor = matrix FLOPs / the bf16 matmul rate (the FP8 / MXFP4 GEMMs could run at twice
that on FP8 tensor cores; the bound quoted is the bf16 one): every linear layer (routed experts at
top_k of E), sparse attention (QK and PV over min(window, p+1) + min(top-k, visible) keys per row
and layer), index scores (every visible compressed position per row of an index source).
"""

from __future__ import annotations

import torch

from sglang_dsv41.layers.attention import Attention
from sglang_dsv41.layers.engram import Engram
from sglang_dsv41.layers.linear import BF16Linear, FP8Linear, MXFP4Linear
from sglang_dsv41.layers.moe import MoE


def measure_ceilings(device: str = "cuda", copy_bytes: int = 2 << 30, n: int = 8192) -> dict[str, float]:
    """HBM copy bandwidth (bytes read + written / s, TB/s) and bf16 matmul TFLOP/s, median of 10."""
    src = torch.empty(copy_bytes // 2, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)

    def timed(fn, reps: int = 10) -> float:
        fn()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return sorted(times)[len(times) // 2]

    t_copy = timed(lambda: dst.copy_(src))
    t_mm = timed(lambda: a @ b)
    return {"hbm_tb_s": 2 * src.numel() / t_copy / 1e12, "mma_tflops": 2 * n**3 / t_mm / 1e12}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def decode_bytes(model, batch: int, context: int, active_experts: dict[int, int] | None = None) -> dict[str, float]:
    """Bytes one decode step of `batch` rows at `context` cached tokens must read. `active_experts`:
    layer -> distinct routed experts of the step (None: every expert)."""
    cfg = model.cfg
    weights = 0
    counted: set[int] = set()

    def add(t: torch.Tensor, frac: float = 1.0) -> None:
        nonlocal weights
        if t.data_ptr() not in counted:
            counted.add(t.data_ptr())
            weights += _nbytes(t) * frac

    for name, mod in model.named_modules():
        if isinstance(mod, MoE):
            lid = int(name.split(".")[1])
            frac = (active_experts or {}).get(lid, cfg.moe.n_routed_experts) / cfg.moe.n_routed_experts
            for ex in mod.experts:
                for p in ex.parameters(recurse=True):
                    add(p, frac)
        elif isinstance(mod, Engram):
            e = cfg.engram
            weights += batch * e.n_hash_cols * (_nbytes(mod.embed.weight[0]) + _nbytes(mod.embed.scale[0]))
            for p in mod.embed.parameters():
                counted.add(p.data_ptr())
    for name, p in model.named_parameters():
        if name == "embed.weight":
            weights += batch * _nbytes(p[0])
            counted.add(p.data_ptr())
        elif name.endswith("wo_a.weight") or name.endswith("wo_a.scale"):
            continue
        else:
            add(p)
    for mod in model.modules():
        if isinstance(mod, Attention):
            weights += _nbytes(mod.wo_a.dequantized())
    a, c = cfg.attention, cfg.compression
    kv = 0
    for role in cfg.layer_roles:
        kv += batch * min(a.window_size, context) * cfg.window_kv_bytes_per_token
        r = role.compress_ratio
        if r:
            vis = context // r
            kv += batch * min(c.index_topk, vis) * cfg.compressed_kv_bytes_per_entry
            if role.is_index_source:
                kv += batch * vis * cfg.index_key_bytes_per_entry
    return {"weights": float(weights), "kv": float(kv), "total": float(weights + kv)}


def prefill_flops(model, prompt_len: int) -> dict[str, float]:
    """Matrix FLOPs of prefilling one prompt of `prompt_len` tokens (logits of its last row only)."""
    cfg = model.cfg
    per_token = 0.0
    for mod in model.modules():
        if isinstance(mod, (FP8Linear, MXFP4Linear)):
            per_token += 2 * mod.in_features * mod.out_features
        elif isinstance(mod, BF16Linear):
            per_token += 2 * mod.weight.numel()
    m = cfg.moe
    routed = sum(2 * (3 * cfg.hidden_size * m.moe_inter_dim) for mod in model.modules() if isinstance(mod, MoE))
    per_token -= routed * m.n_routed_experts * (1 - m.n_activated_experts / m.n_routed_experts)
    hc = cfg.hc
    per_token += len(cfg.layer_roles) * 2 * 2 * hc.mix_dim * hc.hc_mult * cfg.hidden_size  # mHC mix, two sites
    linear = per_token * prompt_len + 2 * cfg.hidden_size * cfg.vocab_size
    a, c = cfg.attention, cfg.compression
    attn = index = 0.0
    pos = torch.arange(prompt_len, dtype=torch.float64)
    for role in cfg.layer_roles:
        keys = (pos + 1).clamp(max=a.window_size)
        r = role.compress_ratio
        if r:
            vis = torch.div(pos + 1, r, rounding_mode="floor")
            keys = keys + vis.clamp(max=c.index_topk)
            if role.is_index_source:
                index += float(vis.sum()) * 2 * c.index_n_heads * c.index_head_dim
        attn += float(keys.sum()) * 4 * a.n_heads * a.head_dim
    return {"linear": linear, "attention": attn, "index": index, "total": linear + attn + index}
