"""WIDE weight loads (one [WR, 64] load per 4 K blocks) vs four [WR, 16] loads in the grouped MoE: time and bits,
fast-mode pick (split / stream-K) and deterministic pick (unsplit). Run from the repository root.
Ran on a working tree between 08c0783 and e1358ef whose `moe_triton` had a module switch
`WIDE_LOADS` (the landed one-load path when True, the four loads when False); the switch is gone since e1358ef.
"""
import os, sys, time
import torch
ROOT = os.getcwd()
sys.path[:0] = [os.path.join(ROOT, p) for p in ("python", "sgl-kernel", "benchmark")]
import kernels as K  # noqa: E402
from decode_sweep import HID, INTER, TOPK, expert_bytes, moe_inputs  # noqa: E402
from dsv41_kernels import moe_triton as mt  # noqa: E402
print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
rows = []
def line(*a):
    s = "| " + " | ".join(str(x) for x in a) + " |"
    print(s, flush=True); rows.append(s)
line("shape", "config", "four loads us", "wide us", "speedup", "GB/s wide", "bits equal")
for n_exp, ts in ((16, (1, 8, 64)), (384, (8, 64))):
    ws = K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, HID, INTER)
    for t in ts:
        args, nbytes = moe_inputs(t, n_exp, ws, "cuda")
        base = mt.pick_config(t * TOPK, n_exp)
        for name, cfg in (("fast", base + mt.fast_decode_tail(t * TOPK, n_exp, INTER, HID, base, "cuda")), ("det", base + (1, 1))):
            res = {}
            for wide in (False, True):
                mt.WIDE_LOADS = wide
                tv = K.bench_graph([lambda c=cfg: mt.moe_experts_triton(*args, config=c)], reps=30)
                res[wide] = (tv, mt.moe_experts_triton(*args, config=cfg))
            mt.WIDE_LOADS = False
            same = torch.equal(res[True][1].view(torch.int16), res[False][1].view(torch.int16))
            line(f"E={n_exp} T={t}", f"{name} {cfg}", f"{res[False][0]*1e6:.1f}", f"{res[True][0]*1e6:.1f}",
                 f"{res[False][0]/res[True][0]:.2f}x", f"{nbytes/res[True][0]/1e9:.0f}", same)
        del args
    del ws
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "/tmp"), "moe_wide.txt"), "w") as f:
    f.write("\n".join(rows) + "\n")
print("done", time.strftime("%H:%M:%S"), flush=True)
