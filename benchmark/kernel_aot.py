"""What the compiler made of the decode-step kernels, without a GPU: Triton compiles each kernel for
sm_90a ahead of time (the configs the pickers choose for a decode step of the `bench` widths), ptxas
reports registers and spills, and the IR says whether the loop's loads became asynchronous copies
(Triton's software pipeline) and whether each warpgroup MMA is waited on before the next starts.

    python benchmark/kernel_aot.py [--out FILE.md]

Columns: registers per thread and spill bytes (ptxas -v), shared memory per program, `cp.async` in the
PTX (pipelined loads), `ld.global` (loads left in place), warpgroup MMAs in the loop body and the
`pendings` of every `warp_group_dot_wait` after them (0 = the MMA finished before the next line runs),
and `mma.sync` instructions (the pre-Hopper MMA, used where a tile is too small for a warpgroup MMA);
IEEE divisions / square roots (`div.rn`, `sqrt.rn`) and approximate ones (`div.full`, `.approx`) in the PTX
(the router and SwiGLU kernels must have only IEEE ones: torch CUDA's bits).
Integer arguments are specialised as at run time for these shapes (divisible by 16 where the real call's
are). The Triton that is imported compiles: with the H200's (3.6.0) the registers equal Nsight Compute's
there (113 / 102 for the two decode MoE launches, 39 for the dense fold; results/2026-12-02-sm90a-aot-
decode-kernels.md), another version may differ by a few.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SMS = 132  # H200, as the pickers assume for a CPU device

MOE_TYPES = dict(a_ptr="*fp8e4nv", sa_ptr="*fp32", sa_rs="i32", perm_ptr="*i32", tile_e_ptr="*i32", tile_p_ptr="*i32",
                 tile_end_ptr="*i32", E="i32", w_ptr="*u8", v_ptr="*u8", w_es="i32", w_rs="i32", sw_ptr="*u8",
                 sv_ptr="*u8", sw_es="i32", sw_rs="i32", rw_ptr="*fp32", out_ptr="*u8", os_ptr="*fp32", os_rs="i32",
                 N="i32", K="i32", TOPK="i32", limit="fp32", part_ptr="*fp32", R="i32", KSB="i32", cnt_ptr="*i32")
MOE_ODD = {"sa_rs", "TOPK", "limit"}  # token counts and top-k: not multiples of 16 in general
DENSE_TYPES = dict(x_ptr="*fp8e4nv", x_rs="i32", sa_ptr="*fp32", w_ptr="*fp8e4nv", w_rs="i32", sw_ptr="*u8", sw_rs="i32",
                   p_ptr="*fp32", M="i32", N="i32", K="i32", KS="i32", cnt_ptr="*i32", out_ptr="*bf16", out_rs="i32")
DENSE_ODD = {"M", "KS"}
ATTN_TYPES = dict(q_ptr="*bf16", q_st="i32", q_sh="i32", k_ptr="*bf16", ws_ptr="*i64", ws_st="i32", cs_ptr="*i64",
                  cs_st="i32", sink_ptr="*fp32", scale="fp32", out_ptr="*bf16", po_ptr="*fp32", pm_ptr="*fp32", W="i32",
                  K="i32", H="i32", run_max_start="fp32")
ATTN_ODD = {"H"}
ROUTE_TYPES = dict(z_ptr="*fp32", z_rs="i32", b_ptr="*fp32", b_rs="i32", f_ptr="*i64", w_ptr="*fp32", id_ptr="*i64",
                   E="i32", scale="fp32", PS="i32")
ROUTE_ODD = {"E", "b_rs", "PS"}
SWIGLU_TYPES = dict(g_ptr="*bf16", g_rs="i32", u_ptr="*bf16", u_rs="i32", w_ptr="*fp32", out_ptr="*i16", out_rs="i32",
                    N="i32", limit="fp32")
SWIGLU_ODD: set = set()
ENTER_TYPES = dict(r_ptr="*bf16", r_ts="i32", r_ns="i32", part_ptr="*fp32", PS="i32", mix_ptr="*fp32", base_ptr="*fp32",
                   scale_ptr="*fp32", pre_ptr="*fp32", post_ptr="*fp32", comb_ptr="*fp32", prev_ptr="*fp32",
                   w_ptr="*bf16", col_ptr="*bf16", out_ptr="*bf16", T="i32", iters="i32", hc_eps="fp32",
                   norm_eps="fp32")
ENTER_ODD = {"T", "PS", "iters"}
NO_FUSION = {"_block_partials_kernel", "_route_kernel", "_swiglu_kernel", "_mhc_enter_kernel"}
"""Kernels launched with NO_FMA (enable_fp_fusion=False), compiled the same way here."""


def compile_kernel(fn, types: dict, odd: set, const: dict, warps: int, stages: int, maxnreg: int | None = None) -> dict:
    """Compile `fn` for sm_90a with `const` constexprs (and a register cap); -> registers, spills, shared bytes,
    PTX / IR counts."""
    sig = {name: ("constexpr" if name in const else types[name]) for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in const and name not in odd and types[name] != "fp32"}
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs), target=TARGET,
                       options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=fn.__name__ not in NO_FUSION)
                       | ({"maxnreg": maxnreg} if maxnreg else {}))
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(ptx)
        res = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True, check=True)
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores", res.stderr)
    body = ttgir[ttgir.find("scf.for"):]  # the first loop and what follows it
    return dict(regs=int(regs.group(1)) if regs else -1, spill=int(spill.group(1)) if spill else -1,
                smem=getattr(c.metadata, "shared", -1), cp_async=ptx.count("cp.async.ca") + ptx.count("cp.async.cg"),
                ld_global=len(re.findall(r"\bld\.global", ptx)), wgmma=body.count("ttng.warp_group_dot "),
                mma_sync=ptx.count("mma.sync"), ieee=ptx.count("div.rn.f32") + ptx.count("sqrt.rn.f32"),
                approx=ptx.count("div.full.f32") + ptx.count("div.approx") + ptx.count("sqrt.approx"),
                waits=re.findall(r"warp_group_dot_wait .*?pendings = (\d+)", body))


def cases():
    """(name, fn, types, odd, constexprs, warps, stages) of a decode step's kernels at the bench widths."""
    import triton.language as tl

    from dsv41_kernels import attention_triton, gemm_triton, moe_triton

    out = []
    for t in (8, 64):
        rows = t * 6
        pick = moe_triton.pick_config(rows, 16)
        bm, bn1, bn2, warps, stages, swap = pick
        s1, s2 = moe_triton.split_counts(rows, 16, 2304, 5120, bm, bn1, bn2, "cpu")
        tail = moe_triton.decode_tail(rows, 16, 2304, 5120, pick, "cpu", fast=False)  # the deterministic pick's
        cap = [c for c in tail[2:3] if c]  # its register cap, if any
        for stage1, bn, splits in ((True, bn1, s1), (False, bn2, s2)):
            const = dict(STAGE1=stage1, BM=bm, BN=bn, SUB=4, SWAP=swap, PACKED=True, KSPLIT=splits > 1)
            out.append((f"_moe_gemm_kernel stage {1 if stage1 else 2}, {t} tokens x top-6, K split {splits}"
                        + (f", maxnreg {cap[0]}" if cap else ""),
                        moe_triton._moe_gemm_kernel, MOE_TYPES, MOE_ODD, const, warps, stages, cap[0] if cap else None))
    for name, n, k in (("wq_a", 1280, 5120), ("wo_b", 5120, 8192), ("shared w1", 2304, 5120)):
        cfg = gemm_triton.pick_config(8, n, k, "cpu", fast=True)
        bm, bn, warps, stages, ks, swap, *fold = cfg
        const = dict(FP4=False, BM=bm, BN=bn, SWAP=swap, FOLD=bool(fold and fold[0]))
        out.append((f"_block_partials_kernel {name} M=8 (KS {ks})", gemm_triton._block_partials_kernel, DENSE_TYPES,
                    DENSE_ODD, const, warps, stages))
    for t in (8, 64):
        hb, splits, warps, stages, kb = attention_triton._config(t, 64)
        const = dict(D=512, HB=hb, SPLITS=splits, KB=kb, STAGES=stages, DOT_T=tl.bfloat16)
        out.append((f"_attn_kernel decode (gathered keys), {t} rows x 64 heads, 128 + 512 keys",
                    attention_triton._attn_kernel, ATTN_TYPES, ATTN_ODD, const, warps, stages))
    from dsv41_kernels import router_triton

    out.append(("_route_kernel, 384 experts top-6 (release router)", router_triton._route_kernel, ROUTE_TYPES, ROUTE_ODD,
                dict(K=6, KP=8, BE=512, NORM=True, FORCED=False, C=1), 4, 1))
    out.append(("_route_kernel, 16 experts top-6, the router GEMM's 5 chunk partials (moe_gate)",
                router_triton._route_kernel, dict(ROUTE_TYPES, id_ptr="*i32"), ROUTE_ODD,
                dict(K=6, KP=8, BE=16, NORM=True, FORCED=False, C=5), 4, 1))
    out.append(("_swiglu_kernel, shared expert h", router_triton._swiglu_kernel, SWIGLU_TYPES, SWIGLU_ODD,
                dict(HAS_W=False, CLAMP=True, BLOCK=1024), 4, 1))
    from dsv41_kernels import mhc_enter_triton
    from sglang_dsv41.reduction import cascade_step

    for c in (80, 1):  # the decode mix's FAST_CHUNK partials (fast mode), and a folded mix
        const = dict(N=4, NP=4, H=5120, MIXP=32, C=c, STEP=cascade_step(640), G=8, HSTEP=cascade_step(160), HG=8,
                     ROWS=1, CH=1024, BF16=True)
        out.append((f"_mhc_enter_kernel, 1 row per program, {c} mix part(s)", mhc_enter_triton._mhc_enter_kernel,
                    ENTER_TYPES, ENTER_ODD, const, 4, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the table to this markdown file")
    a = ap.parse_args()
    if a.out and not Path(a.out).resolve().parent.is_dir():
        ap.error(f"--out: the folder of {a.out!r} does not exist")
    lines = [f"triton {triton.__version__}, target sm_90a (compiled on a CPU machine; no GPU ran)", "",
             "| kernel | constexprs | warps / stages | registers | spill B | smem B | cp.async | ld.global | "
             "warpgroup MMAs in loop | wait pendings | mma.sync | IEEE div / sqrt | approximate div / sqrt |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, fn, types, odd, const, warps, stages, *cap in cases():
        r = compile_kernel(fn, types, odd, const, warps, stages, *cap)
        waits = ",".join(r["waits"]) if r["waits"] else "-"
        row = (f"| {name} | {', '.join(f'{k}={v}' for k, v in const.items())} | {warps} / {stages} | {r['regs']} | "
               f"{r['spill']} | {r['smem']} | {r['cp_async']} | {r['ld_global']} | {r['wgmma']} | {waits} | {r['mma_sync']} | "
               f"{r['ieee']} | {r['approx']} |")
        print(row, flush=True)
        lines.append(row)
    if a.out:
        Path(a.out).write_text(f"`python benchmark/kernel_aot.py`\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "0")
    main()
