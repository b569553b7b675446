"""The MoE decode pick now (one load per 4 weight tiles; 16-pair tiles: 3 stages, 96 registers where that makes one
wave) vs the pick of the kernel before it (`moe_head.py` in a folder FOLDER: `git show
08c0783:sgl-kernel/dsv41_kernels/moe_triton.py` with its two `@...triton_impl` lines removed): time and bits, fast
mode and deterministic mode. From the repository root:
    PYTHONPATH=FOLDER python benchmark/results/2026-12-06-h100-moe-wide/d_previous_vs_new.py"""
import os
import sys

import torch

sys.path[:0] = [os.path.join(os.getcwd(), p) for p in ("python", "sgl-kernel", "benchmark")]
import kernels as K  # noqa: E402
import moe_head as old  # noqa: E402
from decode_sweep import HID, INTER, TOPK, moe_inputs  # noqa: E402
from dsv41_kernels import moe_triton as new  # noqa: E402
from sweep_rows import SweepRows  # noqa: E402

rows = SweepRows("moe_wide3.txt", "shape", "mode", "previous pick", "us", "new pick", "us", "speedup", "GB/s new", "bits equal")
for n_exp, ts in ((16, (1, 8, 64)), (384, (8, 64))):
    ws = K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, HID, INTER)
    for t in ts:
        args, nbytes = moe_inputs(t, n_exp, ws, "cuda")
        r = t * TOPK
        ob, nb = old.pick_config(r, n_exp), new.pick_config(r, n_exp)
        for mode, fast in (("fast", True), ("deterministic", False)):
            oc = ob + (old.fast_decode_tail(r, n_exp, INTER, HID, ob, "cuda") if fast else (1, 1))
            nc = nb + new.decode_tail(r, n_exp, INTER, HID, nb, "cuda", fast=fast)
            to = K.bench_graph([lambda: old.moe_experts_triton(*args, config=oc)], reps=30)
            tn = K.bench_graph([lambda: new.moe_experts_triton(*args, config=nc)], reps=30)
            same = torch.equal(old.moe_experts_triton(*args, config=oc).view(torch.int16),
                               new.moe_experts_triton(*args, config=nc).view(torch.int16))
            rows.add(f"E={n_exp} T={t}", mode, oc, f"{to*1e6:.1f}", nc, f"{tn*1e6:.1f}", f"{to/tn:.2f}x", f"{nbytes/tn/1e9:.0f}", same)
        del args
    del ws
    torch.cuda.empty_cache()
rows.save()
