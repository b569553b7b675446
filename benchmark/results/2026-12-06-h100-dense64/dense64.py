"""Dense FP8 decode GEMMs at 64 rows (bench widths): the fast-mode pick beside one-pass and folded split-K variants.
From the repository root: python benchmark/results/2026-12-06-h100-dense64/dense64.py"""
import os
import sys

import torch
import triton

sys.path[:0] = [os.path.join(os.getcwd(), p) for p in ("python", "sgl-kernel", "benchmark")]
import kernels as K  # noqa: E402
from dsv41_kernels import gemm_triton as gt  # noqa: E402
from sweep_rows import SweepRows  # noqa: E402

rows = SweepRows("dense64.txt", "GEMM", "config", "us", "vs pick", "GB/s", "bits == pick")
sms = torch.cuda.get_device_properties(0).multi_processor_count
m = 64
for name, n, k in (("wq_b", 32768, 1280), ("wo_b", 5120, 8192), ("shared w1|w3", 4608, 5120), ("shared w2", 5120, 2304),
                   ("wq_a|wkv", 1792, 5120)):
    wbytes = n * k + n * k // 32
    sets_n = max(1, min(16, -(-(160 << 20) // wbytes)))
    weights = [K.gemm_weights("fp8", n, k) for _ in range(sets_n)]
    xs = [torch.randn(m, k, device="cuda").bfloat16() for _ in range(sets_n)]
    pick = tuple(gt.pick_config(m, n, k, "cuda", False, fast=True))
    kb = k // 32
    cfgs = [(64, 64, 4, 4), (64, 128, 8, 4), (64, 128, 4, 4), (64, 64, 4, 6), (64, 32, 4, 6), (64, 64, 8, 4),
            (64, 64, 4, 4, 0, True), (64, 128, 4, 4, 0, True), (64, 128, 8, 4, 0, True), (64, 256, 8, 3, 0, True)]
    for per_sm in (2, 4, 8):
        for traffic in (0.25, 0.5, 1.0):
            want = triton.cdiv(per_sm * sms, triton.cdiv(n, 64))
            cap = max(1, int(traffic * k / (8 * m)))
            chunks = max(1, min(want, cap, kb))
            if chunks > 1:
                c = (64, 64, 4, 4, triton.cdiv(kb, chunks), True, True)
                if c not in cfgs:
                    cfgs.append(c)
    cfgs = [c for c in cfgs if c != pick]
    ref = gt.fp8_linear_triton(xs[0], *weights[0], config=pick)
    t0 = K.bench_graph([lambda x=x, w=w: gt.fp8_linear_triton(x, *w, config=pick) for x, w in zip(xs, weights)])
    rows.add(name, f"pick {pick}", f"{t0*1e6:.1f}", "1.00x", f"{wbytes/t0/1e9:.0f}", "-")
    for cfg in cfgs:
        if rows.elapsed() > 200:
            rows.add("stopped", "time limit")
            break
        try:
            tv = K.bench_graph([lambda x=x, w=w, c=cfg: gt.fp8_linear_triton(x, *w, config=c) for x, w in zip(xs, weights)])
            got = gt.fp8_linear_triton(xs[0], *weights[0], config=cfg)
            rows.add(name, cfg, f"{tv*1e6:.1f}", f"{t0/tv:.2f}x", f"{wbytes/tv/1e9:.0f}", torch.equal(got.view(torch.int16), ref.view(torch.int16)))
        except Exception as e:  # noqa: BLE001
            rows.add(name, cfg, "FAILED", f"{type(e).__name__}: {str(e)[:160]}", "-", "-")
    del weights, xs
    torch.cuda.empty_cache()
rows.save()
