"""Tile configs of the fp32 GEMM (`fp32_linear`) at prefill sizes of the mHC mix (fp32 weight, N = 24, K = 20480)
and the router (bf16, N = 16): each config's output compared with torch.equal to the default pick's, and timed
(do_bench medians). Writes $OUT/fp32_prefill_sweep.txt (OUT defaults to /tmp).
    OUT=DIR python benchmark/fp32_prefill_sweep.py"""
import os, sys, itertools
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [f"{ROOT}/python", f"{ROOT}/sgl-kernel"]
import torch
from triton.testing import do_bench
from dsv41_kernels.fp32_gemm_triton import fp32_linear_triton, pick_config
OUT = os.environ.get("OUT", "/tmp")
lines = []
for (m, n, k, wdt) in ((8192, 24, 20480, torch.float32), (2048, 24, 20480, torch.float32), (8192, 16, 5120, torch.bfloat16)):
    x = torch.randn(m, k, device="cuda").bfloat16() if wdt == torch.bfloat16 else torch.randn(m, k, device="cuda")
    w = (torch.randn(n, k, device="cuda") * 0.01).to(wdt)
    dflt = pick_config(m, n, k, wdt == torch.bfloat16, x.device)
    ref = fp32_linear_triton(x, w, config=dflt)
    t0 = do_bench(lambda: fp32_linear_triton(x, w, config=dflt), warmup=5, rep=100, return_mode="median")
    lines.append(f"m={m} n={n} k={k} {wdt}: default {dflt} {t0*1e3:.1f} us")
    if wdt == torch.bfloat16:
        continue
    for bm, bk, split, warps, st in itertools.product((16, 32, 64), (16, 32, 64), (False, True), (2, 4), (3,)):
        cfg = (bm, 32, bk, False, split, warps, st)
        try:
            got = fp32_linear_triton(x, w, config=cfg)
            same = torch.equal(got, ref)
            t = do_bench(lambda: fp32_linear_triton(x, w, config=cfg), warmup=5, rep=60, return_mode="median")
            lines.append(f"  {cfg}: {t*1e3:.1f} us, {t0/t:.2f}x, same bits {same}")
        except Exception as e:
            lines.append(f"  {cfg}: failed {type(e).__name__}")
open(f"{OUT}/fp32_prefill_sweep.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
