"""Decode-size sweep of the W4A8 / W8A8 GEMMs: the grouped MoE's SWAP tiles and the dense GEMMs' ordered
split-K, each beside the one-pass kernel it replaces, bits compared.

    python benchmark/kernels.py --only decode [--out decode.md]

MoE (`moe_experts_triton`): hidden 5120, inter 2304, top-6, E = 16 / 256 experts, T = 1 / 8 / 64 tokens;
configs (BM, BN1, BN2, warps, stages, SWAP), the first being the one-pass prefill tiles; then the fast
mode's candidates (`fast_moe_configs`: + S1, S2 K splits) and the pick with torch-op routing.
Dense (`fp8_linear_triton`, `fp4_linear_triton`): the decode linears of the `bench` / release widths at
M = 1 / 8 / 16 / 64; configs from `gemm_triton.pick_config` (4 entries: one pass; 6: ordered split-K). Per row:
median GPU time of the whole op from CUDA-graph replays (activation quant and routing included; decode
sizes rotate enough weight copies to exceed L2), bits equal to the first config's (torch.equal), speed-up
over it, and GB/s of the weight bytes touched against the HBM copy ceiling measured in the same run.
A config that fails to compile or run is reported and the sweep goes on.
`--only decode_split` (`sweep_split`): the fast mode's K splits at decode, beside the deterministic-mode config
of the same call: dense GEMMs' folded split-K for 2 / 4 / 8 programs per SM (chunk sums capped at 1/8, 1/4 or
1/2 of the weight bytes; `gemm_triton.fold_config`); bits are NOT expected equal (the split changes the fp32
addition order), the max |diff| to the first config is shown. The grouped MoE's K splits (S1, S2) are among
`--only decode_moe`'s fast-mode candidates.
`--only decode_mix` (`sweep_fp32(mix_only=True)`): the decode mHC mix's tiles (`mix_configs`).
`--only decode_stats` (`sweep_stats`): launch configs of the fixed-order RMS statistics (rms_norm, mhc_gates).
`--only decode_enter` (`sweep_enter`): the mHC site entry (`mhc_enter`) beside the unfused chain it replaces.
`--only decode_wide` (`sweep_wide`): wide decode GEMMs (the Engram wkv) over one-pass, SWAP and folded tiles.
`--only decode_fp32` (`sweep_fp32`): the same for `fp32_linear` (head, router, mHC mix), the first row of each
shape being `fp32_gemm_triton.pick_config`'s choice.
"""

from __future__ import annotations

import torch

HID, INTER, TOPK = 5120, 2304, 6
MOE_CONFIGS = ((64, 32, 32, 4, 4, False), (16, 64, 128, 4, 4, True), (16, 64, 128, 4, 3, True),
               (16, 64, 128, 4, 6, True), (16, 64, 64, 4, 4, True), (16, 128, 128, 8, 4, True), (32, 64, 128, 4, 4, True))
DENSE = {"wq_a": ("fp8", 1280, HID), "wkv": ("fp8", 512, HID), "wq_b": ("fp8", 64 * 512, 1280),
         "wo_b": ("fp8", HID, 8 * 1024), "shared w1": ("fp8", INTER, HID), "shared w2": ("fp8", HID, INTER),
         "expert w1": ("fp4", INTER, HID)}


def expert_bytes(n_active: int) -> int:
    """Bytes of w1, w3 ([inter, hid/2] + [inter, hid/32]) and w2 ([hid, inter/2] + [hid, inter/32]) per expert."""
    return n_active * 3 * (INTER * HID // 2 + INTER * HID // 32)


def moe_inputs(t: int, n_exp: int, weights: tuple, dev: str) -> tuple[tuple, int]:
    """(moe_experts arguments for t tokens routed top-6 over n_exp experts, bytes of the experts they touch)."""
    g = torch.Generator(device=dev).manual_seed(t + n_exp)
    x = torch.randn(t, HID, device=dev, generator=g).bfloat16()
    ids = torch.rand(t, n_exp, device=dev, generator=g).topk(TOPK, dim=-1).indices
    wts = torch.rand(t, TOPK, device=dev, generator=g)
    return (x, ids, wts, *weights, 10.0), expert_bytes(int(torch.unique(ids).numel()))


def _row(record, peak_bw, name, shape, tv, t0, nbytes, flops, same, ref="first config"):
    """same: bits equal to `ref`'s (bool), or a text that says how far they are (split sweeps)."""
    gbs = nbytes / tv / 1e9
    bits = same if isinstance(same, str) else f"bits == {ref}: {same}"
    record(name, shape, tv, nbytes, flops, note=f"{bits}; {t0 / tv:.2f}x the first config; "
           f"weights {gbs:.0f} GB/s = {gbs * 1e9 / peak_bw:.0%} of the copy ceiling {peak_bw / 1e12:.2f} TB/s")
    return dict(name=name, shape=shape, us=tv * 1e6, same=same if not isinstance(same, str) else True,
                speedup=t0 / tv, frac=gbs * 1e9 / peak_bw)


def fast_moe_configs(t: int, n_exp: int, dev: str) -> list[tuple]:
    """Fast-mode decode candidates: the pick (SWAP tiles + `decode_tail`), the split pick, other tiles / warps / pipeline
    depths with their own `split_counts`, other splits of the picked tiles (unsplit included), and the
    pick's splits under register caps (`moe_experts_triton`'s MAXNREG) at 3 and 4 pipeline stages, and the
    stream-K schedule at 2, 4 and 5 programs per SM."""
    from dsv41_kernels import moe_triton

    base = tuple(moe_triton.pick_config(t * TOPK, n_exp))
    s1, s2 = moe_triton.split_counts(t * TOPK, n_exp, INTER, HID, *base[:3], dev)
    out = [base + moe_triton.decode_tail(t * TOPK, n_exp, INTER, HID, base, dev, fast=True), base + (s1, s2)]
    for bm, bn1, bn2, w, st in ((16, 64, 128, 4, 3), (16, 64, 64, 4, 4), (16, 32, 64, 4, 4)):
        out.append((bm, bn1, bn2, w, st, True) + moe_triton.split_counts(t * TOPK, n_exp, INTER, HID, bm, bn1, bn2, dev))
    for sp in ((s1 + 1, s2 + 1), (2 * s1, 2 * s2), (max(1, s1 // 2), max(1, s2 // 2)), (1, 1)):
        out.append(base + sp)
    # register caps (MAXNREG) with 3 / 4 pipeline stages: more programs per SM, the pick's bits
    for st, regs in ((3, None), (3, 96), (3, 80), (4, 96), (4, 80)):
        out.append(base[:4] + (st,) + base[5:] + (s1, s2, regs))
    # stream-K (`_moe_stream_kernel`): programs per SM with the register cap that lets them all be resident
    for regs, per_sm in ((None, 2), (128, 4), (96, 5)):
        out.append(base[:5] + (True, 1, 1, regs, per_sm))
    return list(dict.fromkeys(out))


def sweep_moe(bench_graph, record, expert_weights, peak_bw: float, dev: str = "cuda", experts=(16, 256)) -> list[dict]:
    """MOE_CONFIGS (one pass, bits against the first), then the fast-mode candidates (`fast_moe_configs`,
    max |diff| to the pick), and the pick with the routing tables from torch ops instead of the one launch
    of `moe_routing_triton` (bits must be equal)."""
    from dsv41_kernels import moe_triton
    from dsv41_kernels.moe_triton import moe_experts_triton, pick_config

    out = []
    for n_exp in experts:
        w1, s1 = expert_weights(n_exp, INTER, HID)
        w3, s3 = expert_weights(n_exp, INTER, HID)
        w2, s2 = expert_weights(n_exp, HID, INTER)
        for t in (1, 8, 64):
            args, nbytes = moe_inputs(t, n_exp, (w1, s1, w3, s3, w2, s2), dev)
            ref = moe_experts_triton(*args, config=MOE_CONFIGS[0]).view(torch.int16)
            fast = fast_moe_configs(t, n_exp, dev)
            pick = fast[0]
            picked = moe_experts_triton(*args, config=pick)
            t0 = None
            for cfg in list(MOE_CONFIGS) + fast + ["torch routing"]:
                try:
                    c = pick if cfg == "torch routing" else cfg
                    rows = moe_triton.ROUTING_ROWS
                    moe_triton.ROUTING_ROWS = 0 if cfg == "torch routing" else rows
                    try:
                        tv = bench_graph([lambda c=c: moe_experts_triton(*args, config=c)], reps=20)
                        got = moe_experts_triton(*args, config=c)
                    finally:
                        moe_triton.ROUTING_ROWS = rows
                    if cfg in MOE_CONFIGS:
                        same = torch.equal(got.view(torch.int16), ref)
                    elif cfg == "torch routing":
                        same = f"bits == the pick: {torch.equal(got.view(torch.int16), picked.view(torch.int16))}"
                    else:
                        same = f"max|diff| to the pick {_maxdiff(got, picked):.3g}"
                except Exception as e:  # noqa: BLE001 - a compile error or out of shared memory
                    print(f"  decode moe E={n_exp} T={t} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                t0 = t0 or tv
                tag = (" (pick_config)" if tuple(cfg) == tuple(pick_config(t * TOPK)) else
                       " (fast pick)" if cfg == pick else "") if cfg != "torch routing" else f" {pick}"
                out.append(_row(record, peak_bw, "moe decode", f"E={n_exp} T={t} {cfg}{tag}", tv, t0, nbytes,
                                6 * t * TOPK * INTER * HID, same))
            del args, ref
        del w1, s1, w3, s3, w2, s2
        torch.cuda.empty_cache()
    return out


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().nan_to_num(0.0).max())


def sweep_split(bench_graph, record, gemm_weights, peak_bw: float, dev: str = "cuda") -> list[dict]:
    import triton

    from dsv41_kernels import gemm_triton

    out = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, (kind, n, k) in DENSE.items():
        fp4 = kind == "fp4"
        fn = gemm_triton.fp4_linear_triton if fp4 else gemm_triton.fp8_linear_triton
        wbytes = (n * k if kind == "fp8" else n * k // 2) + n * k // 32
        sets_n = max(1, min(16, -(-(160 << 20) // wbytes)))
        weights = [gemm_weights(kind, n, k) for _ in range(sets_n)]
        for m in (1, 8, 64):
            xs = [torch.randn(m, k, device=dev).bfloat16() for _ in range(sets_n)]
            base = tuple(gemm_triton.pick_config(m, n, k, dev, fp4, fast=False))
            configs = [base]
            kb = k // 32
            for per_sm, traffic in ((2, 0.125), (4, 0.125), (8, 0.125), (4, 0.25), (8, 0.25), (8, 0.5)):
                want = triton.cdiv(per_sm * sms, triton.cdiv(n, 64))
                cap = max(1, int(traffic * k * (0.5 if fp4 else 1.0) / (8 * m)))
                chunks = max(1, min(want, cap, kb))
                bm = 16 if m <= 16 else 32 if m <= 32 else 64
                cfg = (bm, 64, 4, 4, triton.cdiv(kb, chunks), True, True)
                configs += [cfg] if cfg not in configs else []
                if m <= 8 and (per_sm, traffic) == (4, 0.25):  # 8 activation rows as the MMA's N side
                    configs.append((8, 64, 4, 4, triton.cdiv(kb, chunks), True, True))
            picked = tuple(gemm_triton.pick_config(m, n, k, dev, fp4, fast=True))
            configs += [picked] if picked not in configs else []
            ref = fn(xs[0], *weights[0], config=base)
            t0 = None
            for cfg in configs:
                try:
                    tv = bench_graph([lambda x=x, w=w, c=cfg: fn(x, *w, config=c) for x, w in zip(xs, weights)])
                    d = _maxdiff(fn(xs[0], *weights[0], config=cfg), ref)
                except Exception as e:  # noqa: BLE001
                    print(f"  split {name} M={m} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                t0 = t0 or tv
                tag = " (fast pick)" if cfg == picked else " (deterministic)" if cfg == base else ""
                row = _row(record, peak_bw, f"{kind}_linear split", f"{name} M={m} N={n} K={k} {cfg}{tag}", tv, t0,
                           wbytes, 2 * m * n * k, f"max|diff| {d:.3g}")
                out.append(row)
            del xs, ref
        del weights
        torch.cuda.empty_cache()
    return out


def dense_configs(m: int, ks: int, fp4: bool) -> list[tuple]:
    """One-pass tiles (BM, BN, warps, stages), one-pass SWAP tiles (BM activation rows, BN weight rows,
    warps, stages, 0, True) and, up to 16 rows, ordered split-K (.., KS, SWAP): narrow and wide weight
    tiles, deeper pipelines (more weight bytes in flight per SM)."""
    bm = 16 if m <= 16 else 64
    out = [(64, 64, 4, 4), (64, 64, 4, 6), (64, 32, 4, 6), (64, 32, 4, 8),
           (bm, 64, 4, 4, 0, True), (bm, 64, 4, 8, 0, True), (bm, 128, 4, 4, 0, True), (bm, 128, 4, 6, 0, True),
           (bm, 128, 8, 6, 0, True)]
    if m <= 16:
        out += [(16, 64, 4, 4, ks, True), (16, 64, 4, 6, ks, True), (16, 64, 4, 4, 2 * ks, True)]
    return out


def sweep_dense(bench_graph, record, gemm_weights, peak_bw: float, dev: str = "cuda") -> list[dict]:
    from dsv41_kernels.gemm_triton import fp4_linear_triton, fp8_linear_triton, pick_config

    out = []
    for name, (kind, n, k) in DENSE.items():
        fn = fp8_linear_triton if kind == "fp8" else fp4_linear_triton
        wbytes = (n * k if kind == "fp8" else n * k // 2) + n * k // 32
        sets_n = max(1, min(16, -(-(160 << 20) // wbytes)))  # working set > L2
        weights = [gemm_weights(kind, n, k) for _ in range(sets_n)]
        for m in (1, 8, 16, 64):
            xs = [torch.randn(m, k, device=dev).bfloat16() for _ in range(sets_n)]
            chosen = tuple(pick_config(m, n, k, dev, kind == "fp4"))
            ks = max(1, -(-(-(-n // 64) * (k // 32)) // (8 * 132)))  # K blocks per program for ~8 programs / SM
            configs = [(64, 32 if kind == "fp4" else 16, 4, 4)] + dense_configs(m, ks, kind == "fp4")
            configs += [chosen] if chosen not in configs else []
            ref = fn(xs[0], *weights[0], config=configs[0]).view(torch.int16)
            t0 = None
            for cfg in configs:
                try:
                    tv = bench_graph([lambda x=x, w=w, c=cfg: fn(x, *w, config=c) for x, w in zip(xs, weights)])
                    same = torch.equal(fn(xs[0], *weights[0], config=cfg).view(torch.int16), ref)
                except Exception as e:  # noqa: BLE001
                    print(f"  decode {name} M={m} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                t0 = t0 or tv
                tag = " (pick_config)" if cfg == chosen else ""
                out.append(_row(record, peak_bw, f"{kind}_linear decode", f"{name} M={m} N={n} K={k} {cfg}{tag}", tv,
                                t0, wbytes, 2 * m * n * k, same))
            del xs, ref
        del weights
        torch.cuda.empty_cache()
    return out


FP32_SHAPES = (("head", 8, 1024, HID, "bf16"), ("head", 8, 129280, HID, "bf16"), ("head", 64, 129280, HID, "bf16"),
               ("router", 8, 16, HID, "bf16"), ("router", 64, 16, HID, "bf16"), ("hc_mix", 8, 24, 4 * HID, "fp32"),
               ("hc_mix", 64, 24, 4 * HID, "fp32"), ("hc_mix", 8192, 24, 4 * HID, "fp32"))
"""`fp32_linear` at the decode step's shapes (bench / released head, 16-expert router, mHC mix with its fp32
weight) and the prefill mHC mix; x bf16, the weight as named."""


def fp32_configs(m: int, tc: bool) -> list[tuple]:
    """Candidate (BM, BN, BK, SWAP, SPLIT, warps, stages) of `fp32_gemm_triton` (bf16: the MMA's M side 64
    wide on whole warpgroups, as its wrapper asserts)."""
    if tc and m <= 64:
        bm = 16 if m <= 16 else 64
        return [(bm, 64, 128, True, s, 4, st) for s in (False, True) for st in (3, 4)] + \
               [(bm, 128, 64, True, s, 4, 3) for s in (False, True)] + [(bm, 64, 64, True, True, 4, 6)]
    if tc:
        return [(64, 64, 64, False, False, 4, 4), (128, 64, 64, False, False, 8, 4)]
    bms = (16, 32) if m <= 64 else (32, 64, 128)
    return [(bm, 32, bk, False, s, w, 3) for bm in bms for bk in (16, 32, 64) for s in (False, True) for w in (4, 8)]


def mix_configs(m: int) -> list[tuple]:
    """Candidate tiles of the decode mHC mix (N = 24), split over the K chunks: the deterministic-mode pick
    (16 x 32, BK 64, chunks of 1024), 16-wide column tiles, and the default's shorter chunks (entry 8)."""
    return [(16, 32, 64, False, True, 4, 3), (16, 16, 64, False, True, 4, 3), (16, 16, 32, False, True, 2, 3)] + \
        [(16, 32, bk, False, True, 4, 3, c) for c in (128, 256, 512) for bk in (32, 64)] + \
        [(16, 16, 64, False, True, 4, 3, 256), (16, 32, 64, False, True, 2, 3, 256)]


def sweep_fp32(bench_graph, record, peak_bw: float, dev: str = "cuda", mix_only: bool = False) -> list[dict]:
    """mix_only: the decode mHC mix shapes (M = 8 / 64) with `mix_configs` only (chunk sizes differ: max |diff|
    to the pick instead of bits)."""
    from dsv41_kernels.fp32_gemm_triton import fp32_linear_triton, pick_config

    out = []
    for name, m, n, k, wkind in FP32_SHAPES:
        if mix_only and (name != "hc_mix" or m > 64):
            continue
        wdt = torch.bfloat16 if wkind == "bf16" else torch.float32
        x = torch.randn(m, k, device=dev).bfloat16()
        w = (torch.randn(n, k, device=dev) * 0.02).to(wdt)
        wbytes = w.numel() * w.element_size()
        # weight copies rotated through the replay, working set > L2, as in a decode step (28 mHC mixes of
        # 2 MB each): with one L2-resident weight a latency-bound variant looked 1.4x faster than the pick
        # and made the step's fp32 GEMMs 1.33x slower (benchmark/results/2026-12-02-h200-fp32-mix.md)
        ws = [w] + [w.clone() for _ in range(max(1, min(64, -(-(160 << 20) // wbytes))) - 1)]
        nbytes = x.numel() * 2 + wbytes + m * n * 4
        chosen = tuple(pick_config(m, n, k, wkind == "bf16", dev))
        configs = [chosen] + [c for c in (mix_configs(m) if mix_only else fp32_configs(m, wkind == "bf16")) if c != chosen]
        ref = fp32_linear_triton(x, w, config=chosen)
        t0 = None
        for cfg in configs:
            try:
                tv = bench_graph([lambda c=cfg, wi=wi: fp32_linear_triton(x, wi, config=c) for wi in ws])
                got = fp32_linear_triton(x, w, config=cfg)
                same = (f"max|diff| {_maxdiff(got, ref):.3g}" if mix_only
                        else torch.equal(got.view(torch.int32), ref.view(torch.int32)))
            except Exception as e:  # noqa: BLE001 - a compile error or out of shared memory
                print(f"  fp32_linear {name} M={m} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            t0 = t0 or tv
            tag = " (pick_config)" if cfg == chosen else ""
            out.append(_row(record, peak_bw, "fp32_linear decode", f"{name} M={m} N={n} K={k} w={wkind} {cfg}{tag}",
                            tv, t0, nbytes, 2 * m * n * k, same))
        del x, w, ws, ref
        torch.cuda.empty_cache()
    return out


def sweep_stats(bench_graph, record, peak_bw: float, dev: str = "cuda") -> list[dict]:
    """The decode step's fixed-order RMS statistics: `rms_norm` (d = 5120 / 1280 / 512) and `mhc_gates` (4
    streams of 5120) at T = 8 / 64, over launch configs (warps, cascade chunks per loop
    iteration of `triton_numerics.ordered_sumsq`), the first row of each shape the default. `same`: bits equal
    to the twin (every config must); time from graph replays of 8 calls on 8 input copies.
    Reached by `python benchmark/kernels.py --only decode_stats`."""
    from dsv41_kernels.mhc import mhc_gates
    from dsv41_kernels.mhc_triton import mhc_gates_triton
    from dsv41_kernels.norm import rms_norm
    from dsv41_kernels.norm_triton import rms_norm_triton

    out = []
    for t in (8, 64):
        for d in (5120, 1280, 512):
            xs = [torch.randn(t, d, device=dev).bfloat16() for _ in range(8)]
            w = torch.rand(d, device=dev).bfloat16()
            want = rms_norm.torch(xs[0], w, 1e-6).view(torch.int16)
            t0 = None
            for cfg in [{}] + [dict(num_warps=nw, chunks=c) for nw in (1, 2, 4) for c in (2, 4, 8, 16)]:
                tv = bench_graph([lambda x=x, c=cfg: rms_norm_triton(x, w, 1e-6, **c) for x in xs])
                same = torch.equal(rms_norm_triton(xs[0], w, 1e-6, **cfg).view(torch.int16), want)
                t0 = t0 or tv
                out.append(_row(record, peak_bw, "rms_norm decode", f"t={t} d={d} {cfg or 'default'}", tv, t0,
                                t * d * 4 + d * 2, 0, same, ref="twin"))
        n, d = 4, 4 * HID
        xs = [torch.randn(t, d, device=dev).bfloat16() for _ in range(8)]
        mix = torch.randn(t, (2 + n) * n, device=dev)
        base, scale = torch.randn((2 + n) * n, device=dev) * 0.1, torch.ones(3, device=dev)
        args = (mix, base, scale, 20, 1e-6, 1e-6)
        ref = [g.view(torch.int32) for g in mhc_gates.torch(xs[0], *args)]
        t0 = None
        for cfg in [{}] + [dict(num_warps=nw, chunks=c) for nw in (1, 2, 4) for c in (4, 8, 16, 32)]:
            tv = bench_graph([lambda x=x, c=cfg: mhc_gates_triton(x, *args, **c) for x in xs])
            same = all(torch.equal(g.view(torch.int32), r) for g, r in zip(mhc_gates_triton(xs[0], *args, **cfg), ref))
            t0 = t0 or tv
            out.append(_row(record, peak_bw, "mhc_gates decode", f"t={t} n={n} H={HID} {cfg or 'default'}", tv, t0,
                            t * d * 2 + t * 24 * 4 * 2, 0, same, ref="twin"))
    return out


def sweep_enter(bench_graph, record, peak_bw: float, dev: str = "cuda") -> list[dict]:
    """A decode mHC site's entry at T = 8 / 64 (4 streams of 5120, fp32 fn [24, 20480]): the unfused chain
    (fp32_linear, mhc_gates, mhc_collapse, rms_norm kernels: five launches with the mix's fold) first, then
    `mhc_enter_triton` (two) over launch configs, then its mix GEMM alone (`linear_parts`: the part of the
    time before the entry's own launch). `same`: (pre, post, comb, x) bits equal to the chain's. Time from
    graph replays over 28 copies of the streams and fn (a step's 28 sites: working set past L2).
    Reached by `python benchmark/kernels.py --only decode_enter`."""
    from dsv41_kernels.fp32_gemm_triton import fp32_linear_triton, linear_parts
    from dsv41_kernels.mhc_enter_triton import mhc_enter_triton
    from dsv41_kernels.mhc_triton import mhc_collapse_triton, mhc_gates_triton
    from dsv41_kernels.norm_triton import rms_norm_triton

    def chain(r, fn, base, scale, iters, hc_eps, eps, prev, w):
        flat = r.flatten(1)
        gates = mhc_gates_triton(flat, fp32_linear_triton(flat, fn), base, scale, iters, hc_eps, eps)
        return (*gates, rms_norm_triton(mhc_collapse_triton(r, prev), w, eps))

    out, n = [], 4
    for t in (8, 64):
        sites = []
        for i in range(28):
            g = torch.Generator(device=dev).manual_seed(t * 100 + i)
            r = torch.randn(t, n, HID, device=dev, generator=g).bfloat16()
            fn = torch.randn((2 + n) * n, n * HID, device=dev, generator=g) * 0.01
            sites.append((r, fn, torch.randn(24, device=dev, generator=g) * 0.1, torch.ones(3, device=dev), 20, 1e-6,
                          1e-6, torch.rand(t, n, device=dev, generator=g), torch.rand(HID, device=dev, generator=g).bfloat16()))
        nbytes = t * n * HID * 2 * 2 + 24 * n * HID * 4 + t * HID * 2
        ref = chain(*sites[0])
        t0 = tv = bench_graph([lambda a=a: chain(*a) for a in sites])
        out.append(_row(record, peak_bw, "mhc site entry decode", f"t={t} unfused chain (5 launches)", tv, t0, nbytes, 0,
                        True, ref="chain"))
        for cfg in ({}, dict(num_warps=1), dict(num_warps=2), dict(num_warps=8)):
            tv = bench_graph([lambda a=a, c=cfg: mhc_enter_triton(*a, **c) for a in sites])
            got = mhc_enter_triton(*sites[0], **cfg)
            same = all(torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                                   b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)) for a, b in zip(got, ref))
            out.append(_row(record, peak_bw, "mhc site entry decode", f"t={t} mhc_enter {cfg or 'default'}", tv, t0,
                            nbytes, 0, same, ref="chain"))
        tv = bench_graph([lambda a=a: linear_parts(a[0].flatten(1), a[1]) for a in sites])
        out.append(_row(record, peak_bw, "mhc site entry decode", f"t={t} its mix GEMM alone (linear_parts)", tv, t0,
                        nbytes, 0, "-", ref="chain"))
    return out


WIDE = {"engram wkv": ("fp8", 5 * HID, 24 * 256)}
"""The Engram layers' wkv at the `bench` widths (n_hash_cols 24 x head_dim 256 -> 4 streams + 1 value)."""


def wide_configs(m: int, k: int) -> list[tuple]:
    """One-pass tiles of 64 / 32 weight rows, SWAP tiles of 64 / 128 weight rows, and folded split-K of
    2 .. 8 chunks (FOLD: the chunk sums are added in chunk order by the last program of a tile)."""
    kb = k // 32
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    out = [(64, 64, 4, 4), (64, 64, 4, 6), (64, 32, 4, 4), (64, 32, 4, 6),
           (bm, 64, 4, 4, 0, True), (bm, 128, 4, 4, 0, True), (bm, 128, 8, 4, 0, True)]
    for chunks in (2, 3, 4, 6, 8):
        out.append((bm, 64, 4, 4, -(-kb // chunks), True, True))
    for chunks in (2, 3, 4):
        out.append((bm, 128, 8, 4, -(-kb // chunks), True, True))
    return out


def sweep_wide(bench_graph, record, gemm_weights, peak_bw: float, dev: str = "cuda") -> list[dict]:
    """Wide decode GEMMs (many weight tiles, few rows): `WIDE` at M = 8 / 64 over `wide_configs`, the first
    row the fast mode's pick. Bits against the first config: equal for one-pass and SWAP tiles, the
    max |diff| for the folded splits (their fp32 addition order differs)."""
    from dsv41_kernels import gemm_triton

    out = []
    for name, (kind, n, k) in WIDE.items():
        fn = gemm_triton.fp8_linear_triton
        wbytes = n * k + n * k // 32
        sets_n = max(2, min(16, -(-(160 << 20) // wbytes)))
        weights = [gemm_weights(kind, n, k) for _ in range(sets_n)]
        for m in (8, 64):
            xs = [torch.randn(m, k, device=dev).bfloat16() for _ in range(sets_n)]
            picked = tuple(gemm_triton.pick_config(m, n, k, dev, fast=True))
            configs = [picked] + [c for c in wide_configs(m, k) if c != picked]
            ref = fn(xs[0], *weights[0], config=picked)
            t0 = None
            for cfg in configs:
                try:
                    tv = bench_graph([lambda x=x, w=w, c=cfg: fn(x, *w, config=c) for x, w in zip(xs, weights)])
                    got = fn(xs[0], *weights[0], config=cfg)
                except Exception as e:  # noqa: BLE001
                    print(f"  wide {name} M={m} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                folded = len(cfg) >= 7 and cfg[6]
                same = f"max|diff| {_maxdiff(got, ref):.3g}" if folded else torch.equal(got.view(torch.int16),
                                                                                       ref.view(torch.int16))
                t0 = t0 or tv
                tag = " (pick_config)" if cfg == picked else ""
                out.append(_row(record, peak_bw, f"{kind}_linear wide", f"{name} M={m} N={n} K={k} {cfg}{tag}", tv,
                                t0, wbytes, 2 * m * n * k, same, ref="the pick"))
            del xs, ref
        del weights
        torch.cuda.empty_cache()
    return out


def report(rows: list[dict]) -> list[dict]:
    bad = [r for r in rows if not r["same"]]
    print(f"decode sweep: {len(rows)} runs, {len(bad)} with bits != the first config"
          + "".join(f"\n  DIFFERENT BITS {r['name']} {r['shape']}" for r in bad), flush=True)
    return rows


def sweep(bench_graph, record, expert_weights, gemm_weights, peak_bw: float) -> list[dict]:
    return report(sweep_dense(bench_graph, record, gemm_weights, peak_bw)
                  + sweep_moe(bench_graph, record, expert_weights, peak_bw))
