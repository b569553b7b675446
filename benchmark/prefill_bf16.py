"""The bf16 prefill paths (dequant_triton, moe_prefill, gemm_triton._bf16_mm) on one CUDA GPU: errors against
the twins beside the fp8 tensor-core kernels', then times of the grouped MoE (E = 16 / 256, hidden 5120,
inter 2304, top-6) and of the dense FP8 GEMMs (M = 512 / 1024 / 8192) against the fp8 kernels and a bf16
GEMM of equal shape (eager medians, triton.testing.do_bench). Writes $OUT/bf16_proto.txt (OUT defaults to /tmp).
    OUT=DIR python benchmark/prefill_bf16.py"""
import os, sys, time, json
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [f"{ROOT}/python", f"{ROOT}/sgl-kernel", f"{ROOT}/test/kernels", f"{ROOT}/benchmark"]
import torch
from triton.testing import do_bench
from dsv41_kernels import ops
from dsv41_kernels.moe_triton import moe_experts_triton, pick_config as moe_pick
from dsv41_kernels.moe_prefill import moe_experts_bf16
from dsv41_kernels.gemm_triton import fp8_linear_triton, pick_config as gemm_pick
from moe_cases import assert_moe_close, build_moe
OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda"
lines = []
def log(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); lines.append(s)
def t_ms(fn, rep=50):
    return do_bench(fn, warmup=5, rep=rep, return_mode="median")
log("torch", torch.__version__, torch.cuda.get_device_name())
# ---- correctness, MoE (small E so the twin is quick)
for (t, k, e, hid, inter, seed) in ((256, 6, 4, 512, 256, 1), (300, 6, 16, 1024, 512, 2), (64, 6, 4, 5120, 2304, 3)):
    x, ids, wts, *w = build_moe(t, k, e, hid, inter, seed=seed, device=DEV)
    want = ops.moe_experts.torch(x, ids, wts, *w, 10.0)
    bf = moe_experts_bf16(x, ids, wts, *[a.view(torch.uint8) for a in w], 10.0)
    fu = moe_experts_triton(x, ids, wts, *w, 10.0, config=moe_pick(t * k))
    for name, got in (("bf16", bf), ("fp8", fu)):
        g, ww = got.double().flatten(0, -2), want.double().flatten(0, -2)
        err = ((g - ww).norm(dim=-1) / ww.norm(dim=-1).clamp_min(1e-30)).max().item()
        fro = ((g - ww).norm() / ww.norm()).item()
        try:
            assert_moe_close(got, want); ok = "pass"
        except AssertionError as ex:
            ok = f"FAIL {ex}"
        log(f"moe check T={t} E={e} H={hid} I={inter} {name}: worst row rel {err:.3e}, frob {fro:.3e}, {ok}")
    log(f"  bf16 vs fp8 bitwise equal: {torch.equal(bf.view(torch.int16), fu.view(torch.int16))}")
# ---- correctness, dense
from kernels import gemm_weights
for (m, n, kk) in ((1100, 1280, 5120), (2048, 5120, 8192)):
    wq, sq = gemm_weights("fp8", n, kk)
    x = torch.randn(m, kk, device=DEV).bfloat16()
    want = ops.fp8_linear.torch(x[:64], wq, sq)
    got = fp8_linear_triton(x, wq, sq)[:64]
    fu = fp8_linear_triton(x[:64], wq, sq)
    for name, g in (("bf16", got), ("fp8", fu)):
        rel = ((g.double() - want.double()).norm() / want.double().norm()).item()
        log(f"dense check M={m} N={n} K={kk} {name}: rel frob {rel:.3e}")
# ---- timing MoE
HID, INTER = 5120, 2304
from kernels import expert_weights
for n_exp in (16, 256):
    w1, s1 = expert_weights(n_exp, INTER, HID); w3, s3 = expert_weights(n_exp, INTER, HID); w2, s2 = expert_weights(n_exp, HID, INTER)
    u8 = [a.view(torch.uint8) for a in (w1, s1, w3, s3, w2, s2)]
    for t in ((256, 1024, 2048, 8192) if n_exp == 16 else (2048, 8192)):
        x = torch.randn(t, HID, device=DEV).bfloat16()
        ids = torch.rand(t, n_exp, device=DEV).topk(6, dim=-1).indices
        wts = torch.rand(t, 6, device=DEV)
        r = t * 6
        cfg = moe_pick(r)
        tf = t_ms(lambda: moe_experts_triton(x, ids, wts, w1, s1, w3, s3, w2, s2, 10.0, config=cfg), rep=100 if t < 8192 else 300)
        tb = t_ms(lambda: moe_experts_bf16(x, ids, wts, *u8, 10.0), rep=100 if t < 8192 else 300)
        xb = torch.randn(r, HID, device=DEV).bfloat16(); hb = torch.randn(r, INTER, device=DEV).bfloat16()
        wb1 = torch.randn(2 * INTER, HID, device=DEV).bfloat16(); wb2 = torch.randn(HID, INTER, device=DEV).bfloat16()
        td = t_ms(lambda: (torch.nn.functional.linear(xb, wb1), torch.nn.functional.linear(hb, wb2)))
        fl = 6 * r * INTER * HID
        log(f"moe E={n_exp} T={t}: fp8 grouped {tf:.3f} ms ({td/tf:.3f}x bf16), bf16 path {tb:.3f} ms ({td/tb:.3f}x bf16, {fl/tb/1e9:.0f} TFLOP/s), bf16 dense pair {td:.3f} ms")
        del xb, hb, wb1, wb2
    # breakdown at T=8192
    if n_exp == 16:
        from dsv41_kernels.dequant_triton import fp4_weight_bf16, mxfp8_qdq, swiglu_qdq
        t = 8192; x = torch.randn(t, HID, device=DEV).bfloat16(); perm = torch.randperm(t * 6, device=DEV)
        buf = torch.empty(n_exp, 2 * INTER, HID, dtype=torch.bfloat16, device=DEV)
        log(f"  parts T=8192: qdq+gather {t_ms(lambda: mxfp8_qdq(x, perm, 6)):.3f} ms; w13 dequant {t_ms(lambda: (fp4_weight_bf16(u8[0], u8[1], buf[:, :INTER]), fp4_weight_bf16(u8[2], u8[3], buf[:, INTER:]))):.3f} ms; "
            f"swiglu_qdq {t_ms(lambda: swiglu_qdq(torch.empty(t*6, 2*INTER, dtype=torch.bfloat16, device=DEV).normal_(), torch.rand(t*6, device=DEV), 10.0)):.3f} ms (incl. normal_)")
        xs = torch.randn(t * 6, HID, device=DEV).bfloat16(); offs = torch.arange(1, n_exp + 1, device=DEV, dtype=torch.int32) * (t * 6 // n_exp)
        log(f"  grouped_mm w13 {t_ms(lambda: torch._grouped_mm(xs, buf.transpose(1, 2), offs=offs)):.3f} ms")
        del buf, xs
    del w1, s1, w3, s3, w2, s2, u8
    torch.cuda.empty_cache()
# ---- timing dense
for (name, n, kk) in (("wq_a", 1280, 5120), ("wo_b", 5120, 8192), ("shared w1", 2304, 5120), ("wq_b", 32768, 1280)):
    wq, sq = gemm_weights("fp8", n, kk)
    wb = torch.randn(n, kk, device=DEV).bfloat16()
    for m in (512, 1024, 8192):
        x = torch.randn(m, kk, device=DEV).bfloat16()
        cfg = gemm_pick(m, n, kk, x.device)
        tf = t_ms(lambda: fp8_linear_triton(x, wq, sq, config=cfg))
        tb = t_ms(lambda: fp8_linear_triton(x, wq, sq)) if m >= 1024 else float("nan")
        from dsv41_kernels.gemm_triton import _bf16_mm
        tb2 = t_ms(lambda: _bf16_mm(x, wq, sq, n, kk, False))
        tl_ = t_ms(lambda: torch.nn.functional.linear(x, wb))
        log(f"dense {name} M={m} N={n} K={kk}: fp8 kernel {tf*1e3:.1f} us ({tl_/tf:.3f}x), bf16 path {tb2*1e3:.1f} us ({tl_/tb2:.3f}x), F.linear {tl_*1e3:.1f} us")
open(f"{OUT}/bf16_proto.txt", "w").write("\n".join(lines) + "\n")
