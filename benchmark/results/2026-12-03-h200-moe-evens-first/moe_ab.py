"""A/B on the H200: grouped MoE decode (evens-first K order) and the multi-program routing kernel against
the previous code, same inputs, CUDA-graph timing; bits and diffs printed. The previous code is two
copies made next to this file from commit f822dfc (commands in ../2026-12-03-h200-moe-evens-first.md):
moe_triton_prev.py, routing_prev.py.
Run from the repository root: python benchmark/results/2026-12-03-h200-moe-evens-first/moe_ab.py [routing]"""
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
from dsv41_kernels import moe_routing_triton as rnew  # noqa: E402
import moe_triton_prev as prev  # noqa: E402
import routing_prev as rprev  # noqa: E402

print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
rows = []


def line(*a):
    s = " | ".join(str(x) for x in a)
    print(s, flush=True)
    rows.append(s)


def maxdiff(a, b):
    return float((a.float() - b.float()).abs().nan_to_num(0.0).max())


def relerr(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


line("what", "shape", "config", "prev us", "new us", "speed-up", "new vs prev", "new vs twin rel L2",
     "prev vs twin rel L2")
for n_exp in (() if "routing" in sys.argv else (16, 384)):
    w1, s1 = K.expert_weights(n_exp, INTER, HID)
    w3, s3 = K.expert_weights(n_exp, INTER, HID)
    w2, s2 = K.expert_weights(n_exp, HID, INTER)
    for t in (1, 8, 64):
        args, nbytes = moe_inputs(t, n_exp, (w1, s1, w3, s3, w2, s2), "cuda")
        twin = ops.moe_experts.torch(*args) if t <= 8 else None
        base = moe_triton.pick_config(t * TOPK)
        sp = moe_triton.split_counts(t * TOPK, n_exp, INTER, HID, *base[:3], "cuda")
        cfgs = [base + sp, base]
        def split(bm, bn1, bn2):
            return moe_triton.split_counts(t * TOPK, n_exp, INTER, HID, bm, bn1, bn2, "cuda")
        if t == 64:
            cfgs += [(32, 64, 128, 4, 4, True) + split(32, 64, 128), (16, 128, 128, 4, 4, True) + split(16, 128, 128)]
        if t == 8:
            cfgs += [(16, 128, 128, 4, 4, True) + split(16, 128, 128), (16, 64, 128, 4, 3, True) + sp]
        for cfg in cfgs:
            try:
                tp = K.bench_graph([lambda c=cfg: prev.moe_experts_triton(*args, config=c)], reps=20)
                tn = K.bench_graph([lambda c=cfg: moe_triton.moe_experts_triton(*args, config=c)], reps=20)
                gp = prev.moe_experts_triton(*args, config=cfg)
                gn = moe_triton.moe_experts_triton(*args, config=cfg)
                tw = (f"{relerr(gn, twin):.2e}", f"{relerr(gp, twin):.2e}") if twin is not None else ("-", "-")
                line("moe", f"E={n_exp} T={t}", cfg, f"{tp * 1e6:.1f}", f"{tn * 1e6:.1f}", f"{tp / tn:.2f}x",
                     f"max|diff| {maxdiff(gn, gp):.3g}", *tw)
            except Exception as e:  # noqa: BLE001
                line("moe", f"E={n_exp} T={t}", cfg, "FAILED", f"{type(e).__name__}: {str(e)[:200]}")
        del args
    del w1, s1, w3, s3, w2, s2
    torch.cuda.empty_cache()

for n_exp in (16, 384):
    for t in (1, 8, 64, 85):
        g = torch.Generator(device="cuda").manual_seed(t)
        ids = torch.rand(t, n_exp, device="cuda", generator=g).topk(TOPK, dim=-1).indices
        w = torch.rand(t, TOPK, device="cuda", generator=g)
        a = rprev.routing_tiles_fused(ids, w, n_exp, 16)
        b = rnew.routing_tiles_fused(ids, w, n_exp, 16)
        same = all(torch.equal(x, y) for x, y in zip(a, b))
        tp = K.bench_graph([lambda: rprev.routing_tiles_fused(ids, w, n_exp, 16)] * 4, reps=20)
        tn = K.bench_graph([lambda: rnew.routing_tiles_fused(ids, w, n_exp, 16)] * 4, reps=20)
        line("routing", f"E={n_exp} T={t} ({t * TOPK} pairs)", "BM 16", f"{tp * 1e6:.1f}", f"{tn * 1e6:.1f}",
             f"{tp / tn:.2f}x", f"tables equal: {same}", "-", "-")

out = os.environ.get("OUT", "/tmp")
with open(os.path.join(out, "moe_ab.txt"), "w") as f:
    f.write("\n".join(rows) + "\n")
print("done", time.strftime("%H:%M:%S"), flush=True)
