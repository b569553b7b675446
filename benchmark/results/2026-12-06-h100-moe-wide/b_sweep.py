"""Sweep of the MoE decode configs with WIDE weight loads on / off (E = 16, bench widths). Repository root.
Ran on the same intermediate tree as a_wide_loads.py (module switch `WIDE_LOADS`).
"""
import os, sys, time
import torch
ROOT = os.getcwd()
sys.path[:0] = [os.path.join(ROOT, p) for p in ("python", "sgl-kernel", "benchmark")]
import kernels as K  # noqa: E402
from decode_sweep import HID, INTER, TOPK, moe_inputs  # noqa: E402
from dsv41_kernels import moe_triton as mt  # noqa: E402
print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
rows = []
def line(*a):
    s = "| " + " | ".join(str(x) for x in a) + " |"
    print(s, flush=True); rows.append(s)
line("shape", "config (BM, BN1, BN2, warps, stages, SWAP, S1, S2, maxnreg, stream/SM)", "wide", "us", "vs default", "bits == four loads, same config")
n_exp = 16
ws = K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, INTER, HID) + K.expert_weights(n_exp, HID, INTER)
cases = {
    64: [(32, 64, 128, 4, st, True, 1, 1, None, sp) for sp in (1.5, 2, 3) for st in (3, 4, 5)],
    8: [(16, 64, 128, 4, st, True, 1, 1, mr) for st in (3, 4) for mr in (None, 96, 104)] +
       [(16, 64, 128, 4, 4, True, 1, 1, None, sp) for sp in (2, 3, 4)],
    1: [(16, 64, 128, 4, st, True, 3, 3, mr) for st in (3, 4) for mr in (None, 96)],
}
for t, cfgs in cases.items():
    args, nbytes = moe_inputs(t, n_exp, ws, "cuda")
    base = mt.pick_config(t * TOPK, n_exp)
    dflt = base + mt.fast_decode_tail(t * TOPK, n_exp, INTER, HID, base, "cuda")
    mt.WIDE_LOADS = False
    t0 = K.bench_graph([lambda: mt.moe_experts_triton(*args, config=dflt)], reps=30)
    line(f"T={t}", f"default {dflt}", False, f"{t0*1e6:.1f}", "1.00x", "-")
    for cfg in cfgs:
        ref = None
        for wide in (False, True):
            mt.WIDE_LOADS = wide
            try:
                tv = K.bench_graph([lambda c=cfg: mt.moe_experts_triton(*args, config=c)], reps=30)
                got = mt.moe_experts_triton(*args, config=cfg)
                if ref is None: ref = got
                line(f"T={t}", cfg, wide, f"{tv*1e6:.1f}", f"{t0/tv:.2f}x", torch.equal(got.view(torch.int16), ref.view(torch.int16)))
            except Exception as e:  # noqa: BLE001
                line(f"T={t}", cfg, wide, "FAILED", f"{type(e).__name__}: {str(e)[:160]}", "-")
    mt.WIDE_LOADS = False
    del args
with open(os.path.join(os.environ.get("OUT", "/tmp"), "moe_wide2.txt"), "w") as f:
    f.write("\n".join(rows) + "\n")
print("done", time.strftime("%H:%M:%S"), flush=True)
