"""Decode sweep of the grouped W4A8 MoE (`moe_experts_triton`): every launch config, old and stacked.

    python benchmark/kernels.py --only moe_decode [--out moe_decode.md]

Shapes: hidden 5120, inter 2304, top-6, E = 16 / 256 experts, T = 1 / 8 / 64 tokens. Configs:
moe_triton.OLD_CONFIG (block by block, the path timed on 2026-12-01) and every DECODE_CANDIDATES entry
(BM, BN1, BN2, warps, stages, STACK). Per (E, T, config): median GPU time of the whole op from CUDA-graph
replays (routing sort and activation quant included), bits equal to OLD_CONFIG's output (torch.equal),
the speed-up over OLD_CONFIG, and GB/s of the touched expert weight bytes (packed E2M1 + E8M0 scales of
w1, w3, w2 of every expert with a routed pair) against the HBM copy ceiling measured in the same run.
A config that fails to compile or run is reported and the sweep goes on.
"""

from __future__ import annotations

import torch

HID, INTER, TOPK = 5120, 2304, 6


def expert_bytes(n_active: int) -> int:
    """Bytes of w1, w3 ([inter, hid/2] + [inter, hid/32]) and w2 ([hid, inter/2] + [hid, inter/32]) per expert."""
    return n_active * 3 * (INTER * HID // 2 + INTER * HID // 32)


def sweep(bench_graph, record, expert_weights, peak_bw: float, dev: str = "cuda") -> list[dict]:
    """-> one dict per (E, T, config): e, t, config, us, same, speedup, gbs, frac (of the copy ceiling)."""
    from dsv41_kernels.moe_triton import DECODE_CANDIDATES, OLD_CONFIG, moe_experts_triton, pick_config

    out = []
    for n_exp in (16, 256):
        w1, s1 = expert_weights(n_exp, INTER, HID)
        w3, s3 = expert_weights(n_exp, INTER, HID)
        w2, s2 = expert_weights(n_exp, HID, INTER)
        for t in (1, 8, 64):
            g = torch.Generator(device=dev).manual_seed(t + n_exp)
            x = torch.randn(t, HID, device=dev, generator=g).bfloat16()
            ids = torch.rand(t, n_exp, device=dev, generator=g).topk(TOPK, dim=-1).indices
            wts = torch.rand(t, TOPK, device=dev, generator=g)
            args = (x, ids, wts, w1, s1, w3, s3, w2, s2, 10.0)
            active = int(torch.unique(ids).numel())
            nbytes = expert_bytes(active)
            ref = moe_experts_triton(*args, config=OLD_CONFIG).view(torch.int16)
            t_old = None
            for cfg in (OLD_CONFIG, *DECODE_CANDIDATES):
                try:
                    tv = bench_graph([lambda c=cfg: moe_experts_triton(*args, config=c)], reps=20)
                    same = torch.equal(moe_experts_triton(*args, config=cfg).view(torch.int16), ref)
                except Exception as e:  # noqa: BLE001 - e.g. a compile error or out of shared memory
                    print(f"  moe_decode E={n_exp} T={t} {cfg} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                t_old = t_old or tv
                gbs = nbytes / tv / 1e9
                tag = " (old)" if cfg == OLD_CONFIG else " (pick_config)" if cfg == pick_config(t * TOPK) else ""
                record("moe_decode", f"E={n_exp} T={t} {cfg}{tag}", tv, nbytes, 6 * t * TOPK * INTER * HID,
                       note=f"{active} experts; bits == old: {same}; {t_old / tv:.2f}x old; weights {gbs:.0f} GB/s = "
                            f"{gbs * 1e9 / peak_bw:.0%} of the copy ceiling {peak_bw / 1e12:.2f} TB/s")
                out.append(dict(e=n_exp, t=t, config=cfg, us=tv * 1e6, same=same, speedup=t_old / tv, gbs=gbs,
                                frac=gbs * 1e9 / peak_bw))
            del x, ids, wts, args, ref
        del w1, s1, w3, s3, w2, s2
        torch.cuda.empty_cache()
    for n_exp in (16, 256):
        for t in (1, 8, 64):
            rows = [r for r in out if r["e"] == n_exp and r["t"] == t and r["same"]]
            if rows:
                b = min(rows, key=lambda r: r["us"])
                print(f"BEST E={n_exp} T={t}: {b['config']} {b['us']:.1f} us, {b['speedup']:.2f}x old, "
                      f"{b['gbs']:.0f} GB/s ({b['frac']:.0%})", flush=True)
    bad = [r for r in out if not r["same"]]
    print(f"moe_decode: {len(out)} runs, {len(bad)} with bits != old" + "".join(f"\n  DIFFERENT BITS E={r['e']} T={r['t']} "
          f"{r['config']}" for r in bad), flush=True)
    return out
