"""MoE decode tiles at 64 tokens over 16 experts (stream-K) and the 16-pair pick's cap rule at 384 experts.
From the repository root: python benchmark/results/2026-12-06-h100-moe-wide/c_sweep.py"""
import os
import sys

import torch

sys.path[:0] = [os.path.join(os.getcwd(), p) for p in ("python", "sgl-kernel", "benchmark")]
import kernels as K  # noqa: E402
from decode_sweep import HID, INTER, TOPK, moe_inputs  # noqa: E402
from dsv41_kernels import moe_triton as mt  # noqa: E402
from sweep_rows import SweepRows  # noqa: E402

rows = SweepRows("moe_sweep5.txt", "shape", "config", "us", "vs pick", "bits == pick")
for n_exp, t, cfgs in (
        (16, 64, [(32, bn1, bn2, w, st, True, 1, 1, None, sp) for (bn1, bn2, w) in ((64, 128, 8), (32, 128, 4), (32, 64, 4), (64, 64, 4), (128, 128, 8))
                  for st in (3, 4) for sp in (2, 3, 4)]),
        (384, 8, [(16, 64, 128, 4, 4, True, 1, 1, None), (16, 64, 128, 4, 3, True, 1, 1, None), (16, 64, 128, 4, 4, True, 1, 1, 96)]),
        (384, 64, [(16, 64, 128, 4, 4, True, 1, 1, None), (16, 64, 128, 4, 3, True, 1, 1, None)])):
    ws = K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, HID, INTER)
    args, nbytes = moe_inputs(t, n_exp, ws, "cuda")
    base = mt.pick_config(t * TOPK, n_exp)
    pick = base + mt.decode_tail(t * TOPK, n_exp, INTER, HID, base, "cuda", fast=True)
    t0 = K.bench_graph([lambda: mt.moe_experts_triton(*args, config=pick)], reps=30)
    ref = mt.moe_experts_triton(*args, config=pick)
    rows.add(f"E={n_exp} T={t}", f"pick {pick}", f"{t0*1e6:.1f}", "1.00x", "-")
    for cfg in cfgs:
        if rows.elapsed() > 170:
            rows.add("stopped", "time limit")
            break
        try:
            tv = K.bench_graph([lambda c=cfg: mt.moe_experts_triton(*args, config=c)], reps=30)
            got = mt.moe_experts_triton(*args, config=cfg)
            rows.add(f"E={n_exp} T={t}", cfg, f"{tv*1e6:.1f}", f"{t0/tv:.2f}x", torch.equal(got.view(torch.int16), ref.view(torch.int16)))
        except Exception as e:  # noqa: BLE001
            rows.add(f"E={n_exp} T={t}", cfg, "FAILED", f"{type(e).__name__}: {str(e)[:160]}", "-")
    del args, ws
    torch.cuda.empty_cache()
rows.save()
