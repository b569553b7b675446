"""Time every dsv41_kernels Triton kernel at V4.1-Flash shapes on one GPU, against measured ceilings.

    python benchmark/kernels.py [--out results.md] [--only name,...] [--quick]

Per case: median GPU time per call from CUDA-graph replays (prefill-size stores rotate 8 input sets
so that their working set exceeds L2; the torch twins are timed eagerly with do_bench), bytes moved and FLOPs
counted by hand (each input read once, each output written once), achieved TB/s and TFLOP/s,
fraction of the ceilings measured in the same run (device-to-device copy: bytes read + written;
8192^3 bf16 matmul on random data), and the torch twin's time. Engram gather also runs SGLang
0.5.23's own Triton gather (its module file only, loaded from .whl/sglang_0_5_23_engram_gather.py)
on the same inputs. Shapes: hidden 5120, 64 x 512 heads, indexer 32 x 128, window 128, top-512,
contexts 4K / 32K / 128K (ratio-2 index sources see ctx/2 positions), decode batches 1/16/64/256,
prefill chunk 8K.
"""

from __future__ import annotations

import argparse
import importlib.util
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


def timed(name, shape, op, args, nbytes, flops, twin=True, note="", twin_rep=20, sets=None, **kw):
    """`args` is one argument tuple, or (with `sets`) a list of tuples rotated inside the graph."""
    arg_sets = sets or [args]
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
def case_stores():
    R = 8  # input sets rotated per graph replay (8 x 15 MB > L2 at n = 8192)
    for n in (8192, 64):
        wgt = torch.rand(D, device=DEV).bfloat16()
        pool = torch.zeros(R * 8192, D + D // 32, dtype=torch.uint8, device=DEV)
        cpool = torch.zeros(R * 8192, D // 2 + D // 16, dtype=torch.uint8, device=DEV)
        ipool = torch.zeros(R * 8192, DI // 2 + DI // 32, dtype=torch.uint8, device=DEV)
        perm = torch.randperm(R * 8192, device=DEV)
        ins = [(torch.randn(n, D, device=DEV).bfloat16(), *rope(n), perm[i * n:(i + 1) * n]) for i in range(R)]
        io = n * (2 * D + 2 * 4 * 32 + 8 + D + D // 32)
        sets = [(kv, wgt, 1e-20, c, s_, sl, pool) for kv, c, s_, sl in ins]
        timed("window_kv_store", f"n={n}", ops.window_kv_store, sets[0], io, 0, sets=sets)
        if n == 8192:
            for nw in (1, 2, 8):
                tv = bench_graph([lambda a=a: ops.window_kv_store.triton(*a, num_warps=nw) for a in sets])
                record("  window variant", f"warps={nw}", tv, io, 0)
        io = n * (2 * D + 2 * 4 * 32 + 8 + D // 2 + D // 16)
        sets = [(kv, c, s_, sl, cpool) for kv, c, s_, sl in ins]
        timed("compressed_kv_store", f"n={n}", ops.compressed_kv_store, sets[0], io, 0, sets=sets)
        io = n * (2 * DI + 2 * 4 * 32 + 8 + DI // 2 + DI // 32)
        sets = [(kv[:, :DI].contiguous(), c, s_, sl, ipool) for kv, c, s_, sl in ins]
        timed("index_key_store", f"n={n}", ops.index_key_store, sets[0], io, 0, sets=sets)
        io = n * (HI * DI * 2 * 2 + 2 * 4 * 32)
        sets = [(torch.randn(n, HI, DI, device=DEV).bfloat16(), c, s_) for _, c, s_, _ in ins]
        timed("index_query_quant", f"t={n} x {HI}x{DI}", ops.index_query_quant, sets[0], io, 0, sets=sets)
        del pool, cpool, ipool, ins, sets


def index_inputs(t, n):
    pool = index_fp4_pack(index_fp4_stage1(torch.randn(t * n + 7, DI, device=DEV).bfloat16()))
    table = torch.randperm(pool.size(0), device=DEV)[: t * n].view(t, n)  # every row its own keys
    q = index_fp4_stage1(torch.randn(t, HI, DI, device=DEV).bfloat16())
    w = torch.randn(t, HI, device=DEV).bfloat16()
    return q, w, pool, table


def case_indexer():
    for t, n in ((64, 65536), (64, 16384), (64, 2048), (1, 65536)):
        q, w, pool, table = index_inputs(t, n)
        nbytes = t * n * (68 + 8 + 4) + t * HI * (DI + 1) * 2
        flops = 2 * t * n * HI * DI
        note = f"MMA floor {flops / PEAK_FLOPS * 1e6:.1f} us, HBM floor {nbytes / PEAK_BW * 1e6:.1f} us"
        timed("index_scores", f"t={t} visible={n}", ops.index_scores, (q, w, pool, table), nbytes, flops,
              twin=t * n <= 64 * 16384, note=note)
        if t == 64 and n == 65536:
            for bn, nw in ((64, 4), (64, 8), (32, 4)):
                try:
                    tv = bench_graph([lambda: ops.index_scores.triton(q, w, pool, table, block_n=bn, num_warps=nw)])
                    record("  scores variant", f"block_n={bn} warps={nw}", tv, nbytes, flops)
                except Exception as e:  # noqa: BLE001
                    print("  variant failed:", type(e).__name__, str(e)[:200])
        del pool, table
    for t, n in ((64, 65536), (1, 65536), (64, 16384), (8192, 4096)):
        s = torch.randn(t, n, device=DEV).bfloat16().float()
        timed("topk_select", f"t={t} n={n} k=512", ops.topk_select, (s, TOPK), t * n * 4 + t * TOPK * 4, 0)
    for t, n in ((64, 131072), (1, 131072), (64, 32768)):
        s = torch.randn(t, n, device=DEV).bfloat16().float()
        vis = torch.full((t,), n, device=DEV)
        timed("candidate_blocks", f"t={t} n={n} top-2048/8", ops.candidate_blocks, (s, vis, 2048, 8), t * n * 5, 0)


def case_attention():
    for t, ctx in ((1, 32768), (16, 32768), (64, 32768), (64, 4096), (64, 131072), (256, 32768), (8192, 32768)):
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
        timed("sparse_attention_paged", f"t={t} ctx={ctx} 128+512", ops.sparse_attention_paged, args, nbytes, flops,
              twin=t <= 256, note=note)
        if t in (1, 64) and ctx == 32768:
            for cfg in ((16, 1, 8), (32, 1, 8), (32, 2, 8), (32, 4, 8)):
                try:
                    tc = bench_graph([lambda: ops.sparse_attention_paged.triton(*args, config=cfg)])
                    record("  attn variant", f"t={t} hb,splits,warps={cfg}", tc, nbytes, flops)
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


def case_engram():
    rows = 32 << 20  # 32M rows x 264 B = 8.9 GB: far larger than L2
    w = torch.randint(0, 256, (rows, 256), dtype=torch.uint8, device=DEV)
    w[(w & 0x7F) == 0x7F] = 0
    w = w.view(torch.float8_e4m3fn)
    s = torch.randint(110, 140, (rows, 8), dtype=torch.uint8, device=DEV).view(torch.float8_e8m0fnu)
    ids = torch.randint(0, rows, (8192, 24), device=DEV)
    n = ids.numel()
    nbytes = n * (264 + 8 + 512)
    t = timed("engram_gather", "8192x24 rows, HBM table", ops.engram_gather, (w, s, ids), nbytes, 0)
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
    Path(path).write_text("\n".join(lines) + "\n")


def main() -> None:
    global PEAK_BW, PEAK_FLOPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--only", default="stores,indexer,attention,engram")
    a = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    header = f"Device: {props.name}, {props.total_memory >> 20} MiB, {props.multi_processor_count} SMs; torch {torch.__version__}"
    import triton

    header += f", triton {triton.__version__}"
    print(header, flush=True)
    PEAK_BW, PEAK_FLOPS = ceilings()
    print(f"ceilings: copy {PEAK_BW / 1e12:.2f} TB/s, bf16 mm {PEAK_FLOPS / 1e12:.0f} TFLOP/s", flush=True)
    for part in a.only.split(","):
        t0 = time.time()
        try:
            {"stores": case_stores, "indexer": case_indexer, "attention": case_attention, "engram": case_engram}[part]()
        except Exception as e:  # noqa: BLE001 - keep the other parts
            import traceback

            traceback.print_exc()
            print(f"part {part} failed: {type(e).__name__}: {e}", flush=True)
        print(f"[{part}: {time.time() - t0:.0f} s]", flush=True)
        torch.cuda.empty_cache()
    if a.out:
        write_md(a.out, PEAK_BW, PEAK_FLOPS, header)


PEAK_BW = PEAK_FLOPS = 1.0
if __name__ == "__main__":
    main()
