"""A/B: grouped MoE with stacked w1|w3 weight tiles (c03fab7) vs the previous kernel (moe_prev.py next to this
file, made by the command in ../2026-12-05-h100-moe-stacked.md), same inputs, CUDA-graph timing, bits compared.
Writes moe_ab2.txt into $OUT (default /tmp)."""
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [HERE] + [os.path.join(ROOT, p) for p in ("python", "sgl-kernel", "benchmark", "test/kernels")]

import kernels as K  # noqa: E402
from decode_sweep import HID, INTER, TOPK, moe_inputs  # noqa: E402
from dsv41_kernels import moe_triton, ops  # noqa: E402
import moe_prev as prev  # noqa: E402

print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
rows = []


def line(*a):
    s = " | ".join(str(x) for x in a)
    print(s, flush=True)
    rows.append(s)


def maxdiff(a, b):
    return float((a.float() - b.float()).abs().nan_to_num(0.0).max())


line("shape", "config", "prev us", "new us", "speed-up", "bits new == prev")
for n_exp, ts in ((16, (1, 8, 64)), (384, (8, 64))):
    w1, s1 = K.expert_weights(n_exp, INTER, HID)
    w3, s3 = K.expert_weights(n_exp, INTER, HID)
    w2, s2 = K.expert_weights(n_exp, HID, INTER)
    for t in ts:
        args, nbytes = moe_inputs(t, n_exp, (w1, s1, w3, s3, w2, s2), "cuda")
        base = moe_triton.pick_config(t * TOPK, n_exp)

        def split(bm, bn1, bn2):
            return moe_triton.split_counts(t * TOPK, n_exp, INTER, HID, bm, bn1, bn2, "cuda")
        bm = base[0]
        cfgs = [base + split(*base[:3]), base,
                (bm, 32, 128, 4, 4, True) + split(bm, 32, 128),
                (bm, 128, 128, 4, 4, True) + split(bm, 128, 128),
                (bm, 64, 128, 8, 4, True) + split(bm, 64, 128),
                (bm, 64, 128, 4, 3, True) + split(bm, 64, 128),
                (bm, 32, 128, 4, 3, True) + split(bm, 32, 128),
                (bm, 32, 64, 4, 4, True) + split(bm, 32, 64)]
        if n_exp == 16 and t == 8:
            cfgs += [(bm, 32, 128, 4, 4, True, 1, 1), (bm, 32, 128, 4, 4, True, 4, 2), (bm, 64, 128, 4, 4, True, 4, 2)]
        for cfg in dict.fromkeys(cfgs):
            try:
                tp = K.bench_graph([lambda c=cfg: prev.moe_experts_triton(*args, config=c)], reps=20)
                tn = K.bench_graph([lambda c=cfg: moe_triton.moe_experts_triton(*args, config=c)], reps=20)
                gp = prev.moe_experts_triton(*args, config=cfg)
                gn = moe_triton.moe_experts_triton(*args, config=cfg)
                same = torch.equal(gp.view(torch.int16), gn.view(torch.int16))
                line(f"E={n_exp} T={t}", cfg, f"{tp * 1e6:.1f}", f"{tn * 1e6:.1f}", f"{tp / tn:.2f}x",
                     f"{same}" + ("" if same else f" max|diff| {maxdiff(gn, gp):.3g}"))
            except Exception as e:  # noqa: BLE001
                line(f"E={n_exp} T={t}", cfg, "FAILED", f"{type(e).__name__}: {str(e)[:300]}")
        del args
    del w1, s1, w3, s3, w2, s2
    torch.cuda.empty_cache()

out = os.environ.get("OUT", "/tmp")
with open(os.path.join(out, "moe_ab2.txt"), "w") as f:
    f.write("\n".join(rows) + "\n")
print("done", time.strftime("%H:%M:%S"), flush=True)
