"""Time every dsv41_kernels Triton kernel at V4.1-Flash shapes on one GPU, against measured ceilings.

    python benchmark/kernels.py [--out results.md] [--only name,...] [--quick]

Per case: median GPU time per call from CUDA-graph replays (prefill-size stores rotate 8 input sets
so that their working set exceeds L2; the torch twins are timed eagerly with do_bench), bytes moved and FLOPs
counted by hand (each input read once, each output written once), achieved TB/s and TFLOP/s,
fraction of the ceilings measured in the same run (device-to-device copy: bytes read + written;
8192^3 bf16 matmul on random data), and the torch twin's time. Engram gather also runs SGLang
0.5.23's own Triton gather (its module file only, loaded from .whl/sglang_0_5_23_engram_gather.py)
on the same inputs. The GEMMs (fp8_linear / fp4_linear, activation quant included) are compared
with a plain bf16 F.linear of the same shape. Shapes: hidden 5120, 64 x 512 heads, indexer 32 x 128,
window 128, top-512, contexts 4K / 32K / 128K (ratio-2 index sources see ctx/2 positions), decode
batches 1/16/64/256, prefill chunk 8K; dense FP8 linears wq_a, wkv, wq_b, wo_b, shared expert at
M = 8 / 64 / 8192, MXFP4 expert w1 / w2 (width 2304) at M = 8 / 512 / 4096; the grouped MoE
(`--only moe`: E = 16 / 256 experts, T = 8 / 64 / 8192 tokens, top-6) against the per-expert loop and
bf16 GEMMs of equal FLOPs; the layer ops of the decode step (`--only layers`: RMSNorm, RoPE rows, mHC
stream collapse / expand, the MoE combine and RoPE rows of q at T = 8 / 8192);
`--only decode`: decode-size GEMM configs, new vs one-pass, bits compared (benchmark/decode_sweep.py;
`--only decode_moe` / `decode_dense`: its MoE / dense half only; `decode_fp32`: the fp32_linear configs).

    python benchmark/kernels.py --targets [--json targets.json] [--out targets.md]

--targets: only the rows of issue 10's targets table, each beside its baseline and ceiling measured in
the same run, no launch-config sweeps and no twin timings: fp8_linear at M = 8192 / 8 (wq_a, wo_b,
shared w1) vs bf16 F.linear; the grouped MoE at 8192 tokens x top-6 (E = 16 / 256) vs bf16 GEMMs of
equal FLOPs; sparse attention prefill (8192 rows) and decode (batch 64), 128 window + 512 compressed
keys; index scores 64 x 64K; the three cache stores at n = 8192; Engram gather from an HBM table.
--json: one record per target row (row, name, shape, us, value, unit, baseline, ceiling, fraction,
target, met), the input of benchmark/targets_report.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from triton.testing import do_bench  # noqa: E402

from dsv41_kernels import ops  # noqa: E402
from sglang_dsv41.quant import index_fp4_pack, index_fp4_stage1, kv_fp4_pack, window_kv_pack  # noqa: E402

DEV = "cuda"
D, H, HID, DI, HI, W, TOPK = 512, 64, 5120, 128, 32, 128, 512
ROWS: list[dict] = []
TARGETS: list[dict] = []  # one record per issue-10 target row (see target())


def bench(fn, rep=60) -> float:
    """Median seconds of one call (host launch overhead included; used for the torch twins)."""
    return do_bench(fn, warmup=10, rep=rep, return_mode="median") * 1e-3


def bench_graph(fns, reps=30) -> float:
    """Median GPU seconds per call: all `fns` (one per rotating input set, so that their working
    set exceeds L2) captured in one CUDA graph, replayed `reps` times."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / len(fns))
    return sorted(ts)[len(ts) // 2]


def ceilings() -> tuple[float, float]:
    a = torch.empty(4 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    bw = 2 * a.numel() / t
    del a, b
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    t = bench(lambda: x @ y)
    return bw, 2 * 8192**3 / t


def record(name, shape, t, nbytes, flops, twin_t=None, note=""):
    ROWS.append(dict(name=name, shape=shape, us=t * 1e6, bytes=nbytes, flops=flops, tbs=nbytes / t / 1e12,
                     tfs=flops / t / 1e12, twin_us=None if twin_t is None else twin_t * 1e6, note=note))
    r = ROWS[-1]
    twin = "-" if twin_t is None else f"{twin_t * 1e6:10.1f} us"
    print(f"{name:28s} {shape:34s} {r['us']:10.1f} us {r['tbs']:6.2f} TB/s {r['tfs']:7.1f} TF/s twin {twin} {note}", flush=True)


def target(row, name, shape, t, value, unit, baseline, ceiling, fraction, goal, met) -> None:
    """One issue-10 target record. row: the targets-table row it belongs to (e.g. "fp8_gemm_m8192");
    t: seconds per call; value/unit: the number the target is stated in; baseline/ceiling: text
    with the numbers measured in this run; fraction: achieved / ceiling (0..1); goal: the target text."""
    TARGETS.append(dict(row=row, name=name, shape=shape, us=t * 1e6, value=value, unit=unit, baseline=baseline,
                        ceiling=ceiling, fraction=fraction, target=goal, met=bool(met)))
    print(f"TARGET {row:22s} {shape:36s} {value:10.3f} {unit:14s} {fraction:6.1%} of ceiling; target {goal}: "
          f"{'met' if met else 'missed'}", flush=True)


def timed(name, shape, op, args, nbytes, flops, twin=True, note="", twin_rep=20, sets=None, eager=False, **kw):
    """`args` is one argument tuple, or (with `sets`) a list of tuples rotated inside the graph. eager: time
    host launches instead of a graph (prefill paths that a graph capture would not take)."""
    arg_sets = sets or [args]
    t = bench(lambda: op.triton(*args, **kw)) if eager else None
    if t is None:
        try:
            t = bench_graph([lambda a=a: op.triton(*a, **kw) for a in arg_sets])
        except Exception as e:  # noqa: BLE001 - e.g. not capturable: time with host launches
            print(f"  ({name}: graph capture failed, {type(e).__name__}; timing eager)", flush=True)
            t = bench(lambda: op.triton(*args, **kw))
    tt = bench(lambda: op.torch(*args), rep=twin_rep) if twin else None
    record(name, shape, t, nbytes, flops, tt, note)
    return t


def rope(n):
    ang = torch.rand(n, 32, device=DEV) * 100
    return torch.cos(ang), torch.sin(ang)


# ---------------------------------------------------------------------------------------- cases
# (rows, num_warps) launches timed per store kernel at n = 8192 (seg: the kernel's default for the pair)
STORE_SWEEP = {
    "window": ((1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (4, 4), (8, 4), (16, 4)),
    "compressed": ((1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (4, 4), (8, 4), (16, 4)),
    "index key": ((2, 1), (4, 1), (8, 1), (16, 1), (4, 2), (8, 2), (16, 2), (8, 4), (16, 4)),
    "query quant": ((4, 1), (8, 1), (16, 1), (32, 1), (8, 2), (16, 2), (32, 2), (16, 4), (32, 4)),
}
STORE_SEGS = {"window": (64, 256, 512), "compressed": (64, 256, 512), "index key": (128,), "query quant": (32, 128)}


def store_mismatch(fn, args, want, pool_arg=None, slots=None) -> int:
    """Rows (pool rows at `slots`, or output rows) whose bytes differ from the twin's `want`."""
    a = list(args)
    if pool_arg is None:
        got = fn(*a)
        g, w = got.view(torch.int16).flatten(0, -2), want.view(torch.int16).flatten(0, -2)
        gn, wn = got.isnan().flatten(0, -2), want.isnan().flatten(0, -2)
        return int(((gn != wn) | (~gn & (g != w))).any(-1).sum())
    a[pool_arg] = torch.zeros_like(a[pool_arg])
    fn(*a)
    return int((a[pool_arg][slots] != want).any(-1).sum())


def case_stores(targets_only: bool = False):
    """Cache stores and index_query_quant at prefill n = 8192 and decode n = 64. At n = 8192 also the
    (rows, warps) sweep, segment lengths, and the portable encoders (no hardware conversions / PTX), each
    checked against the twin (note: rows that differ). index_query_quant is timed twice: the registered
    op (indexer_triton.py) and cache_store_triton.index_query_quant_triton."""
    from dsv41_kernels import cache_store_triton as cst

    R = 8  # input sets rotated per graph replay (8 x 15 MB > L2 at n = 8192)
    for n in ((8192,) if targets_only else (8192, 64)):
        wgt = torch.rand(D, device=DEV).bfloat16()
        pool = torch.zeros(R * 8192, D + D // 32, dtype=torch.uint8, device=DEV)
        cpool = torch.zeros(R * 8192, D // 2 + D // 16, dtype=torch.uint8, device=DEV)
        ipool = torch.zeros(R * 8192, DI // 2 + DI // 32, dtype=torch.uint8, device=DEV)
        perm = torch.randperm(R * 8192, device=DEV)
        ins = [(torch.randn(n, D, device=DEV).bfloat16(), *rope(n), perm[i * n:(i + 1) * n]) for i in range(R)]
        slots = ins[0][3]
        qs = [torch.randn(n, HI, DI, device=DEV).bfloat16() for _ in range(R)]
        cases = [  # name, op, kernel, argument sets, pool argument, bytes moved
            ("window", ops.window_kv_store, ops.window_kv_store.triton,
             [(kv, wgt, 1e-20, c, s_, sl, pool) for kv, c, s_, sl in ins], 6, n * (2 * D + 2 * 4 * 32 + 8 + D + D // 32)),
            ("compressed", ops.compressed_kv_store, ops.compressed_kv_store.triton,
             [(kv, c, s_, sl, cpool) for kv, c, s_, sl in ins], 4, n * (2 * D + 2 * 4 * 32 + 8 + D // 2 + D // 16)),
            ("index key", ops.index_key_store, ops.index_key_store.triton,
             [(kv[:, :DI].contiguous(), c, s_, sl, ipool) for kv, c, s_, sl in ins], 4,
             n * (2 * DI + 2 * 4 * 32 + 8 + DI // 2 + DI // 32)),
            ("query quant", ops.index_query_quant, cst.index_query_quant_triton,
             [(q, c, s_) for q, (_, c, s_, _) in zip(qs, ins)], None, n * (HI * DI * 2 * 2 + 2 * 4 * 32)),
        ]
        if targets_only:
            cases = [c for c in cases if c[4] is not None]  # the three cache stores
        for name, op, fn, sets, pa, io in cases:
            shape = f"n={n}" if pa is not None else f"t={n} x {HI}x{DI}"
            if pa is not None:
                a = list(sets[0])
                a[pa] = torch.zeros_like(a[pa])
                op.torch(*a)
                want = a[pa][slots]
            else:
                want = op.torch(*sets[0])
            bad = store_mismatch(fn, sets[0], want, pa, slots)
            t = bench_graph([lambda a=a: fn(*a) for a in sets])
            tt = None if targets_only else bench(lambda: op.torch(*sets[0]), rep=20)
            record(op.name if pa is not None else "index_query_quant (new)", shape, t, io, 0, tt,
                   note=f"{bad} rows differ from the twin")
            if targets_only:
                frac = io / t / PEAK_BW
                target("cache_stores", op.name, shape, t, 100 * frac, "% of HBM", "-",
                       f"HBM copy {PEAK_BW / 1e12:.2f} TB/s", frac, ">= 80% of HBM", frac >= 0.8)
                continue
            if pa is None:
                told = bench_graph([lambda a=a: op.triton(*a) for a in sets])
                record("  registered (indexer_triton)", shape, told, io, 0, note=f"new is {told / t:.2f}x faster")
            if n != 8192:
                continue
            variants = [dict(rows=r, num_warps=w) for r, w in STORE_SWEEP[name]]
            variants += [dict(seg=sg) for sg in STORE_SEGS[name]] + [dict(portable=True)]
            for kw in variants:
                try:
                    tv = bench_graph([lambda a=a: fn(*a, **kw) for a in sets])
                    bad = store_mismatch(lambda *a: fn(*a, **kw), sets[0], want, pa, slots)
                    label = " ".join(f"{k}={v}" for k, v in kw.items())
                    record(f"  {name} variant", label, tv, io, 0, note=f"{t / tv:.2f}x the default's speed; {bad} rows differ")
                except Exception as e:  # noqa: BLE001 - keep the other variants
                    print(f"  {name} variant {kw} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del pool, cpool, ipool, ins, qs, cases


def index_inputs(t, n):
    pool = index_fp4_pack(index_fp4_stage1(torch.randn(t * n + 7, DI, device=DEV).bfloat16()))
    table = torch.randperm(pool.size(0), device=DEV)[: t * n].view(t, n)  # every row its own keys
    q = index_fp4_stage1(torch.randn(t, HI, DI, device=DEV).bfloat16())
    w = torch.randn(t, HI, device=DEV).bfloat16()
    return q, w, pool, table


def differ(got, want) -> int:
    """Elements whose bits differ (NaN positions compared, payloads not)."""
    gn, wn = got.isnan(), want.isnan()
    return int(((gn != wn) | (~gn & (got.view(torch.int32) != want.view(torch.int32)))).sum())


def paged_table(t, n, rows, page=128):
    """Slot table as the runtime lays keys out: each row's positions in its own pages of `page`
    consecutive pool slots (256 / ratio per page), the pages drawn at random from a pool of `rows`."""
    pages = torch.randperm(rows // page, device=DEV)[: t * -(-n // page)].view(t, -1)
    return (pages[:, :, None] * page + torch.arange(page, device=DEV)).view(t, -1)[:, :n].contiguous()


def case_indexer(targets_only: bool = False):
    # index_scores: fp8 kernel (default) vs the previous bf16 kernel; at t=64 / 64K also a paged slot table
    # (the serving layout: 68 B rows back to back; the random table reads 3 x 32 B sectors per 68 B row),
    # an int32 table, and a launch sweep (block_n, warps, stages, block_n-steps per program, register cap)
    for t, n in ((64, 65536),) if targets_only else ((64, 65536), (64, 16384), (64, 2048), (1, 65536)):
        q, w, pool, table = index_inputs(t, n)
        nbytes = t * n * (68 + 8 + 4) + t * HI * (DI + 1) * 2
        flops = 2 * t * n * HI * DI
        note = (f"MMA floor {flops / PEAK_FLOPS * 1e6:.1f} us, HBM floor {nbytes / PEAK_BW * 1e6:.1f} us "
                f"({(nbytes + t * n * 28) / PEAK_BW * 1e6:.1f} us in 32 B sectors of random slots)")
        if targets_only:
            t8 = timed("index_scores", f"t={t} visible={n}", ops.index_scores, (q, w, pool, table), nbytes, flops,
                       twin=False, note=note)
            frac = nbytes / PEAK_BW / t8
            target("index_scores", "index_scores", f"t={t} visible={n}", t8, 100 * frac, "% of HBM floor", "-",
                   f"HBM floor {nbytes / PEAK_BW * 1e6:.1f} us", frac, ">= 50% of HBM floor", frac >= 0.5)
            return
        ref = ops.index_scores.torch(q, w, pool, table)
        note += f"; {differ(ops.index_scores.triton(q, w, pool, table), ref)} of {t * n} differ from the twin"
        t8 = timed("index_scores", f"t={t} visible={n}", ops.index_scores, (q, w, pool, table), nbytes, flops,
                   twin=t * n <= 64 * 16384, note=note)
        tb = bench_graph([lambda: ops.index_scores.triton(q, w, pool, table, variant="bf16", block_n=64)])
        record("  scores bf16 (previous)", f"t={t} visible={n} block_n=64", tb, nbytes, flops, note=f"fp8 {tb / t8:.1f}x faster; "
               f"{differ(ops.index_scores.triton(q, w, pool, table, variant='bf16', block_n=64), ref)} differ from the twin")
        if t == 64 and n == 65536:
            paged = paged_table(t, n, pool.size(0))
            ref = ops.index_scores.torch(q, w, pool, paged)
            tp = bench_graph([lambda: ops.index_scores.triton(q, w, pool, paged)])
            record("  scores fp8 paged table", f"t={t} visible={n}", tp, nbytes, flops,
                   note=f"{differ(ops.index_scores.triton(q, w, pool, paged), ref)} differ from the twin")
            p32 = paged.int()
            tp = bench_graph([lambda: ops.index_scores.triton(q, w, pool, p32)])
            record("  scores fp8 paged int32", f"t={t} visible={n}", tp, nbytes - t * n * 4, flops,
                   note=f"{differ(ops.index_scores.triton(q, w, pool, p32), ref)} differ from the twin")
            for kw in (dict(num_stages=2), dict(num_stages=4), dict(block_n=64), dict(num_warps=8), dict(block_n=256, num_warps=8),
                       dict(tiles=16), dict(tiles=32), dict(tiles=64, maxnreg=128), dict(num_stages=2, maxnreg=128),
                       dict(asm_epilogue=False)):
                try:
                    tv = bench_graph([lambda: ops.index_scores.triton(q, w, pool, paged, **kw)])
                    out = ops.index_scores.triton(q, w, pool, paged, **kw)
                    record("  scores variant", "paged " + " ".join(f"{k}={v}" for k, v in kw.items()), tv, nbytes, flops,
                           note=f"{differ(out, ref)} differ from the twin")
                except Exception as e:  # noqa: BLE001
                    print("  variant failed:", type(e).__name__, str(e)[:200])
            del paged, p32, ref
        del pool, table
    # topk_select: default, then both variants at every shape (split: 3 launches over row chunks;
    # cta: one program per row, the previous kernel); at 64 x 64K also the split kernel's other paths
    for t, n in ((64, 65536), (1, 65536), (64, 16384), (8192, 4096)):
        s = torch.randn(t, n, device=DEV).bfloat16().float()
        io = t * n * 4 + t * TOPK * 4
        timed("topk_select", f"t={t} n={n} k=512", ops.topk_select, (s, TOPK), io, 0)
        sets = [("", s)]
        if t == 64 and n == 65536:
            outlier = s.clone()
            outlier[:, 7] = 3e38  # k-th largest ~127 binades below the maximum: the row fallback
            sets += [(" ties", (s * 4).round() / 4), (" fp32", torch.randn(t, n, device=DEV)), (" outlier", outlier)]
        for what, x in sets:
            want = ops.topk_select.torch(x, TOPK)
            for var in ("split", "cta"):
                tv = bench_graph([lambda: ops.topk_select.triton(x, TOPK, variant=var)])
                record(f"  topk {var}{what}", f"t={t} n={n} k=512", tv, io, 0,
                       note=f"{differ(ops.topk_select.triton(x, TOPK, variant=var), want)} differ from the twin")
    for t, n in ((64, 131072), (1, 131072), (64, 32768)):
        s = torch.randn(t, n, device=DEV).bfloat16().float()
        vis = torch.full((t,), n, device=DEV)
        timed("candidate_blocks", f"t={t} n={n} top-2048/8", ops.candidate_blocks, (s, vis, 2048, 8), t * n * 5, 0)


def case_attention(targets_only: bool = False):
    from dsv41_kernels.attention_prefill import prefill_rows
    from dsv41_kernels.attention_triton import _config as attn_config

    shapes = ((64, 32768), (8192, 32768)) if targets_only else \
        ((1, 32768), (16, 32768), (64, 32768), (64, 4096), (64, 131072), (256, 32768), (8192, 32768))
    for t, ctx in shapes:
        wpool = window_kv_pack(torch.randn(max(t * W, 4096), D, device=DEV).bfloat16())
        cpool = kv_fp4_pack(torch.randn(min(ctx, 65536) * max(1, min(t, 4)), D, device=DEV).bfloat16())
        q = torch.randn(t, H, D, device=DEV).bfloat16()
        ws = torch.randperm(wpool.size(0), device=DEV)[: t * W].view(t, W) if t * W <= wpool.size(0) else \
            torch.randint(0, wpool.size(0), (t, W), device=DEV)
        cs = torch.randint(0, cpool.size(0), (t, TOPK), device=DEV)
        sink = torch.randn(H, device=DEV)
        keys = W + TOPK
        nbytes = t * (W * 528 + TOPK * 288 + keys * 8 + 2 * 2 * H * D)
        flops = 4 * t * H * D * keys
        args = (q, wpool, ws, cpool, cs, sink, D**-0.5)
        note = f"MMA floor {flops / PEAK_FLOPS * 1e6:.1f} us, HBM floor {nbytes / PEAK_BW * 1e6:.1f} us"
        prefill = prefill_rows(t, q.device)  # the library-GEMM prefill path: eager (a capture runs the kernel)
        ta = timed("sparse_attention_paged", f"t={t} ctx={ctx} 128+512", ops.sparse_attention_paged, args, nbytes, flops,
                   twin=t <= 256 and not targets_only, note=note + ("; prefill path, eager" if prefill else ""),
                   eager=prefill)
        base = "-"
        if prefill:
            cfg = attn_config(t, H)
            tk = bench_graph([lambda: ops.sparse_attention_paged.triton(*args, config=cfg)])
            record("  attention kernel (deterministic mode)", f"t={t} ctx={ctx} 128+512", tk, nbytes, flops,
                   note=f"config {cfg}")
            base = f"Triton kernel (deterministic mode) {tk * 1e6:.1f} us = {flops / tk / 1e12:.1f} TFLOP/s"
        if targets_only and t >= 4096:  # prefill: TFLOP/s against the MMA ceiling
            tfs = flops / ta / 1e12
            target("attention_prefill", "sparse_attention_paged", f"t={t} 128+512 keys", ta, tfs, "TFLOP/s", base,
                   f"bf16 MMA {PEAK_FLOPS / 1e12:.0f} TFLOP/s", tfs * 1e12 / PEAK_FLOPS, ">= 250 TFLOP/s", tfs >= 250)
        elif targets_only:  # decode: the larger of the MMA and HBM floors over the time
            floor = max(flops / PEAK_FLOPS, nbytes / PEAK_BW)
            target("attention_decode", "sparse_attention_paged", f"t={t} 128+512 keys", ta, 100 * floor / ta,
                   "% of roofline", "-", f"roofline {floor * 1e6:.1f} us (MMA {flops / PEAK_FLOPS * 1e6:.1f}, "
                   f"HBM {nbytes / PEAK_BW * 1e6:.1f})", floor / ta, ">= 30% of roofline", floor / ta >= 0.3)
        if t in (1, 64) and ctx == 32768 and not targets_only:
            for cfg in ((32, 1, 8, 2, 64), (32, 2, 8, 2, 64), (32, 8, 8, 2, 64), (32, 16, 8, 2, 32), (64, 1, 8, 2, 64),
                        (64, 2, 8, 3, 32), (16, 1, 4, 2, 64)):
                try:
                    tc = bench_graph([lambda: ops.sparse_attention_paged.triton(*args, config=cfg)])
                    record("  attn variant", f"t={t} hb,splits,warps,stages,kb={cfg}", tc, nbytes, flops)
                except Exception as e:  # noqa: BLE001
                    print("  variant", cfg, "failed:", type(e).__name__, str(e)[:200])


def load_sglang_gather():
    path = ROOT / ".whl" / "sglang_0_5_23_engram_gather.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("sglang_0_5_23_engram_gather", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def case_engram(targets_only: bool = False):
    rows = 32 << 20  # 32M rows x 264 B = 8.9 GB: far larger than L2
    w = torch.randint(0, 256, (rows, 256), dtype=torch.uint8, device=DEV)
    w[(w & 0x7F) == 0x7F] = 0
    w = w.view(torch.float8_e4m3fn)
    s = torch.randint(110, 140, (rows, 8), dtype=torch.uint8, device=DEV).view(torch.float8_e8m0fnu)
    ids = torch.randint(0, rows, (8192, 24), device=DEV)
    n = ids.numel()
    nbytes = n * (264 + 8 + 512)
    t = timed("engram_gather", "8192x24 rows, HBM table", ops.engram_gather, (w, s, ids), nbytes, 0, twin=not targets_only)
    if targets_only:  # baseline: SGLang 0.5.23's own gather on the same inputs, when its file is there
        floor, sg, base = nbytes / PEAK_BW, load_sglang_gather(), "SGLang 0.5.23 gather: not available (.whl file missing)"
        if sg is not None:
            out, flat = torch.empty(n, 256, dtype=torch.bfloat16, device=DEV), ids.view(-1)
            ts = bench_graph([lambda: sg.engram_gather(w.data_ptr(), s.data_ptr(), flat, out, 256, 32)])
            base = f"SGLang 0.5.23 gather {ts * 1e6:.1f} us"
        target("engram_gather", "engram_gather", "8192x24 rows, HBM table", t, t * 1e6, "us", base,
               f"HBM floor {floor * 1e6:.1f} us", floor / t, "<= 40 us", t * 1e6 <= 40)
        return
    for br, nw in ((16, 4), (32, 8)):
        tb = bench_graph([lambda: ops.engram_gather.triton(w, s, ids, block_r=br, num_warps=nw)])
        record("  gather variant", f"block_r={br} warps={nw}", tb, nbytes, 0)
    sg = load_sglang_gather()
    if sg is not None:
        out = torch.empty(n, 256, dtype=torch.bfloat16, device=DEV)
        flat = ids.view(-1)
        ts = bench_graph([lambda: sg.engram_gather(w.data_ptr(), s.data_ptr(), flat, out, 256, 32)])
        record("sglang-0.5.23 engram_gather", "8192x24 rows, HBM table", ts, nbytes, 0, note=f"ours is {ts / t:.2f}x faster")
        mine = ops.engram_gather.triton(w, s, ids).view(n, 256)
        print("  sglang vs ours bitwise (finite rows):", bool(torch.equal(out.view(torch.int16), mine.view(torch.int16))))
    del w, s
    hrows = 2 << 20
    hw = torch.randint(0, 0x7E, (hrows, 256), dtype=torch.uint8).view(torch.float8_e4m3fn).pin_memory()
    hs = torch.randint(110, 140, (hrows, 8), dtype=torch.uint8).view(torch.float8_e8m0fnu).pin_memory()
    hids = torch.randint(0, hrows, (8192, 24), device=DEV)
    th = timed("engram_gather", "8192x24 rows, pinned host table", ops.engram_gather, (hw, hs, hids), n * 264, 0, twin=False,
               note=f"row bytes over PCIe: {n * 264 / 1e9:.3f} GB")
    print(f"  host gather: {n * 264 / th / 1e9:.1f} GB/s of row bytes", flush=True)
    for br, nw in ((1, 1), (2, 4)):
        tv = bench_graph([lambda: ops.engram_gather.triton(hw, hs, hids, block_r=br, num_warps=nw)])
        record("  host gather variant", f"block_r={br} warps={nw}", tv, n * 264, 0, note=f"{n * 264 / tv / 1e9:.1f} GB/s")
    if sg is not None:
        out = torch.empty(n, 256, dtype=torch.bfloat16, device=DEV)
        flat = hids.view(-1)
        ts = bench_graph([lambda: sg.engram_gather(hw.data_ptr(), hs.data_ptr(), flat, out, 256, 32, sort_ids=True)])
        record("sglang-0.5.23 engram_gather", "pinned host, sort_ids", ts, n * 264, 0, note=f"{n * 264 / ts / 1e9:.1f} GB/s")
    for t in (8192, 64):
        st = torch.randn(t, 4, HID, device=DEV).bfloat16()
        kv = torch.randn(t, 5 * HID, device=DEV).bfloat16()
        qw, kw = torch.rand(4, HID, device=DEV).bfloat16(), torch.rand(4, HID, device=DEV).bfloat16()
        nbytes = t * (4 * HID * 2 * 2 + 5 * HID * 2) + 2 * 4 * HID * 2
        timed("engram_gate", f"t={t} 4x{HID}", ops.engram_gate, (st, kv, qw, kw, 1e-20), nbytes, t * 4 * HID * 8)
    win = torch.randint(0, 99092, (8192, 4), device=DEV)
    pos = torch.randint(0, 1 << 20, (8192,), device=DEV)
    mult = torch.randint(1, 1 << 40, (2, 4), device=DEV) | 1
    primes = torch.randint(16_000_000, 17_000_000, (2, 3, 8), device=DEV)
    offs = torch.randint(0, 1 << 28, (2, 3, 8), device=DEV)
    timed("engram_hash", "8192 tokens x 2 layers x 24", ops.engram_hash, (win, pos, mult, primes, offs, 3),
          8192 * (32 + 8 + 2 * 24 * 8), 0)


def gemm_weights(kind: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random checkpoint-like weights: fp8 e4m3 [N, K] + e8m0 [N/32, K/32], or MXFP4 int8 [N, K/2] + [N, K/32]."""
    if kind == "fp8":
        w = (torch.randn(n, k, device=DEV) * 4).to(torch.float8_e4m3fn)
        s = torch.randint(118, 124, (-(-n // 32), k // 32), dtype=torch.uint8, device=DEV)
    else:
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=DEV).view(torch.int8)
        s = torch.randint(118, 124, (n, k // 32), dtype=torch.uint8, device=DEV)
    return w, s.view(torch.float8_e8m0fnu)


GEMM_VARIANTS = ((64, 16, 4, 4), (64, 32, 4, 4), (64, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 3), (128, 128, 8, 4),
                 (64, 256, 8, 3))  # (BM, BN, num_warps, num_stages) tried on the w1 shapes


def case_gemm(targets_only: bool = False):
    """fp8_linear (dense W8A8) and fp4_linear (routed-expert W4A8) at V4.1-Flash shapes, each against a
    plain bf16 F.linear of the same shape. Decode sizes rotate enough weight copies to exceed L2."""
    fp8_shapes = {"wq_a": (1280, HID), "wkv": (D, HID), "wq_b": (H * D, 1280), "wo_b": (HID, 8 * 1024),
                  "shared w1": (2304, HID), "shared w2": (HID, 2304)}
    fp4_shapes = {"expert w1": (2304, HID), "expert w2": (HID, 2304)}
    from dsv41_kernels.gemm_triton import PREFILL_ROWS
    from dsv41_kernels.gemm_triton import pick_config as gemm_config
    cases = [("fp8", name, nk, m) for name, nk in fp8_shapes.items() for m in (8, 64, 8192)]
    cases += [("fp4", name, nk, m) for name, nk in fp4_shapes.items() for m in (8, 512, 4096)]
    if targets_only:
        cases = [("fp8", name, fp8_shapes[name], m) for name in ("wq_a", "wo_b", "shared w1") for m in (8192, 8)]
    for kind, name, (n, k), m in cases:
        op = ops.fp8_linear if kind == "fp8" else ops.fp4_linear
        wbytes = (n * k if kind == "fp8" else n * k // 2) + n * k // 32
        r = 1 if m > 512 else max(1, min(16, -(-(160 << 20) // wbytes)))  # decode: working set > L2
        sets = []
        for _ in range(r):
            w, s = gemm_weights(kind, n, k)
            sets.append((torch.randn(m, k, device=DEV).bfloat16(), w, s))
        flops = 2 * m * n * k
        nbytes = m * k * (2 + 1 + 1) + m * k // 32 * 8 + wbytes + m * n * 2  # x, q (write + read), scales, w, out
        shape = f"{name} M={m} N={n} K={k}"
        xb = [torch.randn(m, k, device=DEV).bfloat16() for _ in range(r)]
        wb = [torch.randn(n, k, device=DEV).bfloat16() for _ in range(r)]
        tb = bench_graph([lambda a=a, b=b: torch.nn.functional.linear(a, b) for a, b in zip(xb, wb)])
        del xb, wb
        note = f"bf16 F.linear {tb * 1e6:.1f} us ({flops / tb / 1e12:.0f} TF/s)"
        prefill = m >= PREFILL_ROWS  # the bf16 prefill path (eager: a graph capture runs the fp8 kernel)
        t = timed(f"{kind}_linear", shape, op, sets[0], nbytes, flops, twin=m <= 64 and not targets_only, sets=sets,
                  note=note, eager=prefill)
        ROWS[-1]["note"] = f"{note}; ours at {tb / t:.2f}x its speed" + ("; bf16 prefill path, eager" if prefill else "")
        if prefill:
            cfg = gemm_config(m, n, k, torch.device(DEV), kind == "fp4")
            tk = bench_graph([lambda a=a: op.triton(*a, config=cfg) for a in sets])
            record("  fp8 tensor-core kernel (deterministic mode)", shape, tk, nbytes, flops,
                   note=f"config {cfg}; {tb / tk:.2f}x bf16 F.linear")
            note = f"{note}; fp8 kernel (deterministic mode) {tk * 1e6:.1f} us"
        if targets_only and m > 512:
            target("fp8_gemm_m8192", "fp8_linear", shape, t, tb / t, "x bf16", note,
                   f"bf16 MMA {PEAK_FLOPS / 1e12:.0f} TFLOP/s", flops / t / PEAK_FLOPS, ">= 1.0x bf16", tb / t >= 1.0)
        elif targets_only:
            floor = nbytes / PEAK_BW
            target("fp8_gemm_m8", "fp8_linear", shape, t, tb / t, "x bf16", f"bf16 F.linear {tb * 1e6:.1f} us",
                   f"HBM floor {floor * 1e6:.1f} us", floor / t, ">= 0.8x bf16", tb / t >= 0.8)
        if name in ("shared w1", "expert w1") and not targets_only:
            for cfg in GEMM_VARIANTS:
                try:
                    tv = bench_graph([lambda a=a, c=cfg: op.triton(*a, config=c) for a in sets])
                    record("  gemm variant", f"{kind} M={m} BM,BN,warps,stages={cfg}", tv, nbytes, flops)
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                    print("  variant", cfg, "failed:", type(e).__name__, str(e)[:200])
        del sets


def expert_weights(e: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked random MXFP4 experts: int8 [E, N, K/2] + e8m0 [E, N, K/32]."""
    w = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device=DEV).view(torch.int8)
    s = torch.randint(118, 124, (e, n, k // 32), dtype=torch.uint8, device=DEV).view(torch.float8_e8m0fnu)
    return w, s


MOE_VARIANTS = ((64, 32, 32, 4, 4), (64, 64, 64, 4, 4), (64, 64, 128, 4, 4), (64, 128, 128, 8, 3), (128, 64, 128, 8, 3),
                (64, 32, 64, 4, 3))  # (BM, BN w1/w3, BN w2, num_warps, num_stages)


def case_moe(targets_only: bool = False):
    """Grouped W4A8 MoE (`moe_experts`: routing sort + 2 launches over all experts, activation quant
    included) at V4.1 expert shapes (hidden 5120, inter 2304, top-6), E = 16 (bench preset) and 256
    (release), against (a) the per-expert loop it replaces (unique().tolist(), then per expert a row
    gather, 3 fp4_linear launches and the SwiGLU; host time included, since it synchronises) and (b) a
    bf16 dense GEMM pair of equal FLOPs ([R, 5120] x [5120, 4608], then [R, 2304] x [2304, 5120], R = 6T)."""
    from dsv41_kernels.moe_prefill import bf16_prefill
    from dsv41_kernels.moe_triton import moe_experts_triton
    from dsv41_kernels.moe_triton import pick_config as moe_config

    inter, k6 = 2304, 6
    for n_exp in (16, 256):
        w1, s1 = expert_weights(n_exp, inter, HID)
        w3, s3 = expert_weights(n_exp, inter, HID)
        w2, s2 = expert_weights(n_exp, HID, inter)
        per_expert = 3 * inter * HID // 2 + 3 * inter * HID // 32
        for t in ((8192,) if targets_only else (8, 64, 8192)):
            x = torch.randn(t, HID, device=DEV).bfloat16()
            ids = torch.rand(t, n_exp, device=DEV).topk(k6, dim=-1).indices
            wts = torch.rand(t, k6, device=DEV)
            r = t * k6
            active = int(torch.unique(ids).numel())
            flops = 6 * r * inter * HID
            nbytes = active * per_expert + t * HID * 2 + r * (inter * 2 + HID * 2)
            args = (x, ids, wts, w1, s1, w3, s3, w2, s2, 10.0)
            want = ops.moe_experts.torch(*args) if t <= 64 else None
            prefill = bf16_prefill(r, n_exp, x.device)  # the bf16 prefill path: eager (a capture runs the fp8 kernel)
            tg = bench(lambda: moe_experts_triton(*args), rep=300) if prefill else bench_graph([lambda: moe_experts_triton(*args)])
            note = f"{active} experts active" + ("; bf16 prefill path, eager" if prefill else "")
            tk = None
            if prefill:
                tk = bench_graph([lambda: moe_experts_triton(*args, config=moe_config(r))])
                record("  grouped fp8 kernel (deterministic mode)", f"E={n_exp} T={t} top-6", tk, nbytes, flops,
                       note=f"config {moe_config(r)}")
            if want is not None:
                got = moe_experts_triton(*args).double()
                err = ((got - want.double()).norm(dim=-1) / want.double().norm(dim=-1).clamp_min(1e-30)).max().item()
                note += f"; worst row rel. error vs twin {err:.2e}"

            def loop():
                y = torch.zeros(t, HID, device=DEV)
                for e in torch.unique(ids).tolist():
                    rows, slot = torch.where(ids == e)
                    xe = x[rows]
                    g = ops.fp4_linear.triton(xe, w1[e], s1[e]).float()
                    u = ops.fp4_linear.triton(xe, w3[e], s3[e]).float()
                    h = wts[rows, slot, None] * (torch.nn.functional.silu(g.clamp(max=10.0)) * u.clamp(-10.0, 10.0))
                    y[rows] += ops.fp4_linear.triton(h.bfloat16(), w2[e], s2[e]).float()
                return y

            tl_ = float("nan") if targets_only else bench(loop, rep=20 if t <= 64 else 5)
            xb = torch.randn(r, HID, device=DEV).bfloat16()
            hb = torch.randn(r, inter, device=DEV).bfloat16()
            wb1 = torch.randn(2 * inter, HID, device=DEV).bfloat16()
            wb2 = torch.randn(HID, inter, device=DEV).bfloat16()
            tb = bench_graph([lambda: (torch.nn.functional.linear(xb, wb1), torch.nn.functional.linear(hb, wb2))])
            record("moe_experts (grouped)", f"E={n_exp} T={t} top-6", tg, nbytes, flops,
                   note=f"{note}; per-expert loop {tl_ * 1e6:.0f} us ({tl_ / tg:.1f}x slower); bf16 dense GEMMs of equal "
                        f"FLOPs {tb * 1e6:.1f} us: ours at {tb / tg:.2f}x their speed; HBM floor {nbytes / PEAK_BW * 1e6:.1f} us")
            if targets_only:
                base = f"bf16 GEMM pair of equal FLOPs {tb * 1e6:.1f} us" + (
                    f"; grouped fp8 kernel (deterministic mode) {tk * 1e6:.1f} us = {tb / tk:.3f}x" if tk else "")
                target("moe_grouped", "moe_experts", f"E={n_exp} T={t} top-6", tg, tb / tg, "x bf16",
                       base, f"bf16 MMA {PEAK_FLOPS / 1e12:.0f} TFLOP/s",
                       flops / tg / PEAK_FLOPS, ">= 0.6x bf16", tb / tg >= 0.6)
            if t in (8, 8192) and n_exp == 16 and not targets_only:
                ref = moe_experts_triton(*args, config=moe_config(r)).view(torch.int16)
                for cfg in MOE_VARIANTS:
                    try:
                        tv = bench_graph([lambda c=cfg: moe_experts_triton(*args, config=c)])
                        same = torch.equal(moe_experts_triton(*args, config=cfg).view(torch.int16), ref)
                        record("  moe variant", f"T={t} BM,BN1,BN2,warps,stages={cfg}", tv, nbytes, flops,
                               note=f"bitwise equal to pick_config's: {same}")
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                        print("  moe variant", cfg, "failed:", type(e).__name__, str(e)[:200])
            del xb, hb, wb1, wb2
        del w1, s1, w3, s3, w2, s2
        torch.cuda.empty_cache()


def case_decode():
    """Decode sizes of the GEMMs: the grouped MoE's SWAP tiles and the dense ordered split-K beside the
    one-pass kernel, bits compared (benchmark/decode_sweep.py)."""
    from decode_sweep import sweep

    sweep(bench_graph, record, expert_weights, gemm_weights, PEAK_BW)


def case_decode_moe():
    """Only the MoE half of `case_decode`."""
    from decode_sweep import report, sweep_moe

    report(sweep_moe(bench_graph, record, expert_weights, PEAK_BW))


def case_decode_dense():
    """Only the dense half of `case_decode`."""
    from decode_sweep import report, sweep_dense

    report(sweep_dense(bench_graph, record, gemm_weights, PEAK_BW))


def case_decode_split():
    """The fast mode's dense decode K splits (folded split-K) beside the deterministic config
    (decode_sweep.sweep_split; the MoE's splits: --only decode_moe)."""
    from decode_sweep import report, sweep_split

    report(sweep_split(bench_graph, record, gemm_weights, PEAK_BW))


def case_decode_wide():
    """Wide decode GEMMs (the Engram wkv: N = 25600) over one-pass, SWAP and folded tiles
    (decode_sweep.sweep_wide)."""
    from decode_sweep import report, sweep_wide

    report(sweep_wide(bench_graph, record, gemm_weights, PEAK_BW))


def case_decode_mix():
    """The decode mHC mix's candidate tiles (decode_sweep.sweep_fp32, mix_only)."""
    from decode_sweep import report, sweep_fp32

    report(sweep_fp32(bench_graph, record, PEAK_BW, mix_only=True))


def case_decode_fp32():
    """`fp32_linear` configs at the decode step's shapes, bits compared (decode_sweep.sweep_fp32)."""
    from decode_sweep import report, sweep_fp32

    report(sweep_fp32(bench_graph, record, PEAK_BW))


def case_decode_enter():
    """The mHC site entry, fused vs the unfused chain, at decode (decode_sweep.sweep_enter)."""
    from decode_sweep import report, sweep_enter

    report(sweep_enter(bench_graph, record, PEAK_BW))


def case_decode_stats():
    """RMSNorm and mHC gate launch configs at decode (decode_sweep.sweep_stats)."""
    from decode_sweep import report, sweep_stats

    report(sweep_stats(bench_graph, record, PEAK_BW))


def case_layers():
    """The per-call costs of the layers that the kernel slots and transformations remove: RMSNorm (one
    Triton launch vs the twin's torch formulation of the fixed order), mHC stream collapse / expand (one
    launch vs the twins' [T, H] fp32 temporaries), RoPE of whole q / output rows (one launch vs ~8 and a
    concatenation), the MoE combine (one launch vs ~16 elementwise ones), the batch-invariant fp32 GEMM
    `fp32_linear` at the lm head / router / mHC mix shapes (one kernel, no fp32 weight copy, vs the twin's
    64-row sgemms), RoPE position rows (device table gather vs the CPU build + copy per call)."""
    from dsv41_kernels.fp32_gemm_triton import pick_config
    from sglang_dsv41.layers.rope import Rotary

    for t in (8, 8192):
        for d in (5120, 1280, 512):
            x = torch.randn(t, d, device=DEV).bfloat16()
            w = torch.rand(d, device=DEV).bfloat16()
            same = torch.equal(ops.rms_norm.triton(x, w, 1e-6).view(torch.int16), ops.rms_norm.torch(x, w, 1e-6).view(torch.int16))
            timed("rms_norm", f"t={t} d={d}", ops.rms_norm, (x, w, 1e-6), t * d * 4 + d * 2, 0, twin_rep=10,
                  note=f"bitwise equal to the twin: {same}")
    for t in (8, 8192):  # mHC stream collapse / expand, n = 4 bf16 streams of H = 5120
        n, h = 4, HID
        r = torch.randn(t, n, h, device=DEV).bfloat16()
        y = torch.randn(t, h, device=DEV).bfloat16()
        pre, post, comb = torch.rand(t, n, device=DEV), torch.rand(t, n, device=DEV) * 2, torch.rand(t, n, n, device=DEV)
        same = torch.equal(ops.mhc_collapse.triton(r, pre).view(torch.int16), ops.mhc_collapse.torch(r, pre).view(torch.int16))
        timed("mhc_collapse", f"t={t} n={n} H={h}", ops.mhc_collapse, (r, pre), t * n * h * 2 + t * n * 4 + t * h * 2, 2 * t * n * h,
              twin_rep=10, note=f"bitwise equal to the twin: {same}")
        same = torch.equal(ops.mhc_expand.triton(y, r, post, comb).view(torch.int16),
                           ops.mhc_expand.torch(y, r, post, comb).view(torch.int16))
        timed("mhc_expand", f"t={t} n={n} H={h}", ops.mhc_expand, (y, r, post, comb),
              t * n * h * 2 + t * h * 2 + t * (n + n * n) * 4 + t * n * h * 2, 2 * t * n * h * (n + 1), twin_rep=10,
              note=f"bitwise equal to the twin: {same}")
        del r, y
    for t in (8, 8192):  # RoPE of q / the attention output: 64 heads x 512, the last 64 rotated
        q = torch.randn(t, H, D, device=DEV).bfloat16()
        cs, sn = rope(t)
        same = torch.equal(ops.rope_rotate.triton(q, cs, sn, True).view(torch.int16),
                           ops.rope_rotate.torch(q, cs, sn, True).view(torch.int16))
        timed("rope_rotate", f"t={t} h={H} d={D}", ops.rope_rotate, (q, cs, sn, True), 2 * t * H * D * 2 + t * 64 * 4,
              6 * t * H * 32, twin_rep=10, note=f"bitwise equal to the twin: {same}")
        del q
    for t in (8, 8192):  # MoE combine: 6 routed slots + the shared expert, H = 5120
        rs = torch.randn(t, 6, HID, device=DEV).bfloat16()
        sh = torch.randn(t, HID, device=DEV).bfloat16()
        same = torch.equal(ops.moe_combine.triton(rs, sh).view(torch.int16), ops.moe_combine.torch(rs, sh).view(torch.int16))
        timed("moe_combine", f"t={t} k=6 H={HID}", ops.moe_combine, (rs, sh), t * 8 * HID * 2, 7 * t * HID, twin_rep=10,
              note=f"bitwise equal to the twin: {same}")
        del rs, sh
    # fp32_linear: lm head (bench vocab 1024, released 129280), router (16 experts), mHC mix (fp32 fn,
    # 4 flattened bf16 streams); bytes = x + w as stored + the fp32 output (split workspace not counted)
    for what, m, n, k, wdt in (("head", 8, 1024, HID, torch.bfloat16), ("head", 8, 129280, HID, torch.bfloat16),
                               ("router", 8, 16, HID, torch.bfloat16), ("router", 8192, 16, HID, torch.bfloat16),
                               ("hc_mix", 8, 24, 4 * HID, torch.float32), ("hc_mix", 8192, 24, 4 * HID, torch.float32)):
        x = torch.randn(m, k, device=DEV).bfloat16()
        w = (torch.randn(n, k, device=DEV) * 0.02).to(wdt)
        err = (ops.fp32_linear.triton(x, w) - ops.fp32_linear.torch(x, w)).abs()
        tol = 4 * k * 2.0**-24 * (x.float().abs() @ w.float().abs().T)  # test/kernels/fp32_gemm_cases.py
        worst = float((err / tol).max())
        cfg = pick_config(m, n, k, wdt == torch.bfloat16, DEV)
        timed("fp32_linear", f"{what} m={m} n={n} k={k} w={str(wdt)[6:]}", ops.fp32_linear, (x, w),
              x.numel() * 2 + w.numel() * w.element_size() + m * n * 4, 2 * m * n * k, twin_rep=5 if n > 100000 else 10,
              note=f"config {cfg}; max |kernel - twin| = {worst:.3f} x the tolerance")
        del x, w, err, tol
    import types

    rope_cfg = types.SimpleNamespace(rope=types.SimpleNamespace(rope_head_dim=64, theta=10000.0, compress_theta=160000.0,
                                                                yarn_original_max_pos=65536, yarn_factor=16, beta_fast=32,
                                                                beta_slow=1))
    rot = Rotary(rope_cfg, "yarn")
    for t in (8, 8192):
        pos = torch.randint(0, 1 << 20, (t,), device=DEV)
        tcpu = bench(lambda: rot.freqs(pos), rep=20)
        rot.use_table(rot.position_table(1 << 20, DEV))
        ttab = bench_graph([lambda: rot.freqs(pos)])
        same = all(torch.equal(a, b) for a, b in zip(rot.freqs(pos), (rot.use_table(None) or rot.freqs(pos))))
        record("rope freqs (table)", f"t={t}", ttab, t * 64 * 4 * 2, 0,
               note=f"CPU build + copy per call {tcpu * 1e6:.1f} us (host sync); bitwise equal: {same}")


def write_md(path: str, bw: float, fl: float, header: str) -> None:
    lines = [header, "", f"Ceilings measured in this run: HBM copy {bw / 1e12:.2f} TB/s (read + write), "
             f"bf16 matmul {fl / 1e12:.0f} TFLOP/s.", "",
             "| kernel | shape | time us | bytes MB | GFLOP | TB/s | % HBM | TFLOP/s | % MMA | twin us | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ROWS:
        twin = "-" if r["twin_us"] is None else f"{r['twin_us']:.0f}"
        lines.append(f"| {r['name'].strip()} | {r['shape']} | {r['us']:.1f} | {r['bytes'] / 1e6:.2f} | {r['flops'] / 1e9:.2f} | "
                     f"{r['tbs']:.2f} | {100 * r['tbs'] * 1e12 / bw:.0f} | {r['tfs']:.1f} | {100 * r['tfs'] * 1e12 / fl:.1f} | "
                     f"{twin} | {r['note']} |")
    if TARGETS:
        lines += ["", "Issue-10 target rows:", "",
                  "| row | kernel | shape | us | value | baseline | ceiling | % of ceiling | target | met |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['row']} | {r['name']} | {r['shape']} | {r['us']:.1f} | {r['value']:.3g} {r['unit']} | {r['baseline']} | "
                  f"{r['ceiling']} | {100 * r['fraction']:.1f} | {r['target']} | {'yes' if r['met'] else 'no'} |" for r in TARGETS]
    if FAILED:
        lines += ["", *(f"Part {k} failed: {v}" for k, v in FAILED.items())]
    Path(path).write_text("\n".join(lines) + "\n")


def write_json(path: str, header: str) -> None:
    """{"device": header, "ceilings": {...}, "failed": {part: error}, "targets": [target records]}."""
    Path(path).write_text(json.dumps({"device": header, "ceilings": {"hbm_tb_s": PEAK_BW / 1e12,
                                      "mma_tflops": PEAK_FLOPS / 1e12}, "failed": FAILED, "targets": TARGETS}, indent=1))


def main() -> None:
    global PEAK_BW, PEAK_FLOPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--only", default="stores,indexer,attention,engram,gemm,moe,layers")
    ap.add_argument("--targets", action="store_true", help="only issue 10's target rows (gemm, moe, attention, "
                    "indexer, stores, engram), beside baseline and ceiling; no sweeps, no twin timings")
    ap.add_argument("--json", default="", help="with --targets: write the target records here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmark/kernels.py needs a CUDA device (torch.cuda.is_available() is False)")
    parts = "gemm,moe,attention,indexer,stores,engram" if a.targets else a.only
    props = torch.cuda.get_device_properties(0)
    header = f"Device: {props.name}, {props.total_memory >> 20} MiB, {props.multi_processor_count} SMs; torch {torch.__version__}"
    import triton

    header += f", triton {triton.__version__}"
    print(header, flush=True)
    PEAK_BW, PEAK_FLOPS = ceilings()
    print(f"ceilings: copy {PEAK_BW / 1e12:.2f} TB/s, bf16 mm {PEAK_FLOPS / 1e12:.0f} TFLOP/s", flush=True)
    for part in parts.split(","):
        t0 = time.time()
        try:
            fn = {"stores": case_stores, "indexer": case_indexer, "attention": case_attention, "engram": case_engram,
                  "gemm": case_gemm, "moe": case_moe, "layers": case_layers, "decode": case_decode,
                  "decode_moe": case_decode_moe, "decode_dense": case_decode_dense,
                  "decode_fp32": case_decode_fp32, "decode_split": case_decode_split,
                  "decode_mix": case_decode_mix, "decode_stats": case_decode_stats,
                  "decode_enter": case_decode_enter, "decode_wide": case_decode_wide}[part]
            fn(targets_only=True) if a.targets else fn()
        except Exception as e:  # noqa: BLE001 - keep the other parts
            import traceback

            traceback.print_exc()
            print(f"part {part} failed: {type(e).__name__}: {e}", flush=True)
            FAILED[part] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"[{part}: {time.time() - t0:.0f} s]", flush=True)
        torch.cuda.empty_cache()
        if a.json:  # after every part, so that a timeout keeps what was measured
            write_json(a.json, header)
    if a.out:
        write_md(a.out, PEAK_BW, PEAK_FLOPS, header)


PEAK_BW = PEAK_FLOPS = 1.0
FAILED: dict[str, str] = {}  # part -> error text
if __name__ == "__main__":
    main()
