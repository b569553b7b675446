"""What limits each issue-10 target kernel, measured by Nsight Compute (not guessed).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section MemoryWorkloadAnalysis --csv \\
        python benchmark/kernel_limits.py [--only name,...] > ncu.csv       # CUDA: launch every target once
    python benchmark/kernel_limits.py --parse ncu.csv [--out limits.md]     # any machine: the per-kernel table

Run mode: for each target (TARGETS, at its issue-10 shape) build the inputs, launch once untimed (Triton
compiles), synchronise, then between torch.cuda.profiler.start() and stop() launch a marker kernel
(`_target_mark_kernel`, grid = (target index + 1, 1, 1)) and the target exactly once; free the inputs
(and the caching allocator's blocks, so that ncu's replay saves little memory). Progress goes to
stderr; stdout is left to ncu's CSV.

Parse mode: ncu's `--csv` details page, one line per (kernel launch, section, metric):
  "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",
  "Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"[, rule columns]
Lines that are not CSV records of that header (==PROF== progress, warnings) are skipped. Kernels are
attributed to the target of the last marker launched before them.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# (target name, issue-10 row it explains, shape text); builders are in build() below
TARGETS = [
    ("fp8_gemm_m8192", "fp8_gemm_m8192", "fp8_linear wo_b M=8192 N=5120 K=8192"),
    ("fp8_gemm_m8", "fp8_gemm_m8", "fp8_linear wo_b M=8 N=5120 K=8192"),
    ("moe_grouped", "moe_grouped", "moe_experts E=16 T=8192 top-6"),
    ("attention_prefill", "attention_prefill", "sparse_attention_paged t=8192 128+512 keys"),
    ("attention_decode", "attention_decode", "sparse_attention_paged t=64 128+512 keys"),
    ("index_scores", "index_scores", "index_scores t=64 visible=65536"),
    ("store_window", "cache_stores", "window_kv_store n=8192"),
    ("store_compressed", "cache_stores", "compressed_kv_store n=8192"),
    ("store_index_key", "cache_stores", "index_key_store n=8192"),
    ("engram_gather", "engram_gather", "engram_gather 8192x24 rows, 4M-row HBM table"),
    # appended (marker grids are list positions: earlier ncu.csv files keep parsing the same)
    ("moe_decode", "decode8", "moe_experts E=16 T=8 top-6 (the decode step's largest cost)"),
]
MARK = "_target_mark_kernel"

# ------------------------------------------------------------------------------------------ parse
BOUND_PCT = 60.0  # a unit at >= 60% of its peak is what the kernel is bound by
SMALL_US = 10.0  # below this, with fewer blocks than SMs, launch/tail effects dominate
TIME_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
BYTES = {"byte": 1, "b": 1, "kbyte": 1e3, "kb": 1e3, "kib": 1024, "mbyte": 1e6, "mb": 1e6, "mib": 1 << 20}


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def _dims(text: str) -> int | None:
    """"(128, 1, 1)" -> 128; "(9, 32, 1)" -> 288."""
    parts = re.findall(r"\d+", text or "")
    if not parts:
        return None
    out = 1
    for p in parts:
        out *= int(p)
    return out


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv text -> one dict per kernel launch, in ID order: id, kernel, block, grid, and
    metrics {metric name: [(section, unit, value)]} (a name can repeat across sections, e.g. Memory
    Throughput in % in SpeedOfLight and in byte/s in MemoryWorkloadAnalysis)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    head = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if head is None:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[head:]))):
        kid = row.get("ID")
        if not kid or kid == "ID" or row.get("Kernel Name") is None:
            continue  # a repeated header or a malformed line
        k = kernels.setdefault(kid, dict(id=int(_num(kid) or 0), kernel=row["Kernel Name"], block=_dims(row.get("Block Size", "")),
                                         grid=_dims(row.get("Grid Size", "")), grid_text=row.get("Grid Size", ""), metrics={}))
        name = (row.get("Metric Name") or "").strip()
        if name:
            k["metrics"].setdefault(name, []).append((row.get("Section Name", ""), (row.get("Metric Unit") or "").strip(),
                                                      (row.get("Metric Value") or "").strip()))
    return sorted(kernels.values(), key=lambda k: k["id"])


def metric(k: dict, name: str, unit: str | None = None) -> float | None:
    """First numeric value of `name` (with `unit` == "%" only percentages; unit None: any)."""
    for _, u, v in k["metrics"].get(name, []):
        if (unit is None or u == unit) and _num(v) is not None:
            return _num(v)
    return None


def scaled(k: dict, name: str, table: dict) -> float | None:
    """A value converted by its unit through `table` (durations -> us, sizes -> bytes)."""
    for _, u, v in k["metrics"].get(name, []):
        base = u.lower().split("/")[0]  # "Kbyte/block" -> "kbyte"
        if _num(v) is not None and base in table:
            return _num(v) * table[base]
    return None


def summary(k: dict) -> dict:
    """The numbers of the table: duration us, DRAM / memory / SM throughput %, occupancy, launch."""
    smem = [scaled(k, n, BYTES) for n in ("Static Shared Memory Per Block", "Dynamic Shared Memory Per Block",
                                          "Driver Shared Memory Per Block")]
    limits = {n: metric(k, f"Block Limit {n}") for n in ("Registers", "Shared Mem", "Warps", "SM")}
    limits = {n: v for n, v in limits.items() if v is not None}
    return dict(kernel=k["kernel"], us=scaled(k, "Duration", TIME_US), dram=metric(k, "DRAM Throughput", "%"),
                mem=metric(k, "Memory Throughput", "%"), sm=metric(k, "Compute (SM) Throughput", "%"),
                occ=metric(k, "Achieved Occupancy", "%"), theo=metric(k, "Theoretical Occupancy", "%"),
                regs=metric(k, "Registers Per Thread"), smem=sum(x for x in smem if x is not None) if any(
                    x is not None for x in smem) else None, block=k["block"] or metric(k, "Block Size"),
                grid=k["grid"] or metric(k, "Grid Size"), sms=metric(k, "# SMs") or 132,
                occ_limit=min(limits, key=limits.get) if limits else None)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}%"


def verdict(s: dict) -> str:
    """The rule (from the measured metrics only):
    1. SM throughput >= BOUND_PCT and >= memory throughput: "compute: SM x%".
    2. Memory throughput >= BOUND_PCT: "memory: DRAM x%" when DRAM is itself >= BOUND_PCT, else
       "memory (L1/L2): memory units x%, DRAM y%".
    3. Duration < SMALL_US and fewer blocks than SMs: "launch/tail: N blocks on M SMs, t us".
    4. Otherwise nothing is near its peak: "latency: DRAM x%, SM y%, occupancy z% (theoretical w%,
       limited by <block limit>) with R regs/thread, S KB smem/block"."""
    sm, mem, dram = s["sm"] or 0.0, max(s["mem"] or 0.0, s["dram"] or 0.0), s["dram"] or 0.0
    if s["sm"] is None and s["mem"] is None and s["dram"] is None:
        return "unknown: no SpeedOfLight metrics"
    if sm >= BOUND_PCT and sm >= mem:
        return f"compute: SM {sm:.0f}% (DRAM {dram:.0f}%)"
    if mem >= BOUND_PCT:
        if dram >= BOUND_PCT:
            return f"memory: DRAM {dram:.0f}%"
        return f"memory (L1/L2): memory units {mem:.0f}%, DRAM {dram:.0f}%"
    if s["us"] is not None and s["us"] < SMALL_US and s["grid"] and s["grid"] < s["sms"]:
        return f"launch/tail: {s['grid']} blocks on {s['sms']:.0f} SMs, {s['us']:.1f} us"
    occ = f"occupancy {_pct(s['occ'])}"
    if s["theo"] is not None:
        occ += f" (theoretical {_pct(s['theo'])}" + (f", limited by {s['occ_limit'].lower()}" if s["occ_limit"] else "") + ")"
    regs = "" if s["regs"] is None else f" with {s['regs']:.0f} regs/thread"
    smem = "" if s["smem"] is None else f", {s['smem'] / 1024:.0f} KiB smem/block"
    return f"latency: DRAM {dram:.0f}%, SM {sm:.0f}%, {occ}{regs}{smem}"


def by_target(kernels: list[dict]) -> dict[str, list[dict]]:
    """Target name -> the summaries of its kernels (markers dropped); kernels before any marker go to
    "unattributed"; a marker whose grid is not a known target index too."""
    out: dict[str, list[dict]] = {}
    cur = "unattributed"
    for k in kernels:
        if MARK in k["kernel"]:
            i = (k["grid"] or 0) - 1
            cur = TARGETS[i][0] if 0 <= i < len(TARGETS) else "unattributed"
            continue
        out.setdefault(cur, []).append(summary(k))
    return out


def main_kernel(ks: list[dict]) -> dict:
    """The longest kernel of a target (what limits the target)."""
    return max(ks, key=lambda s: s["us"] or 0.0)


def table_md(groups: dict[str, list[dict]]) -> str:
    lines = ["| target | kernel | us | DRAM % | memory % | SM % | achieved occupancy | regs/thread | smem/block KiB | "
             "block | grid | limited by |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, fmt="{:.0f}"):
        return "n/a" if x is None else fmt.format(x)

    for tgt, ks in groups.items():
        for s in ks:
            lines.append(f"| {tgt} | `{s['kernel'][:60].replace('|', '/')}` | {f(s['us'], '{:.1f}')} | {f(s['dram'])} | "
                         f"{f(s['mem'])} | {f(s['sm'])} | {f(s['occ'])} | {f(s['regs'])} | "
                         f"{f(None if s['smem'] is None else s['smem'] / 1024, '{:.1f}')} | {f(s['block'])} | {f(s['grid'])} | "
                         f"{verdict(s)} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ run
try:  # the marker: its grid size names the target of the kernels after it
    import triton
    import triton.language as tl

    @triton.jit
    def _target_mark_kernel(p):
        tl.store(p + tl.program_id(0), 1)
except ImportError:  # --parse needs no Triton
    _target_mark_kernel = None


def build(name: str):
    """Inputs of one target on CUDA -> a zero-argument launch."""
    import torch

    import kernels as K  # benchmark/kernels.py: shapes, input builders, the op table

    dev, ops = K.DEV, K.ops
    if name.startswith("fp8_gemm"):
        m = 8192 if name.endswith("m8192") else 8
        w, s = K.gemm_weights("fp8", K.HID, 8 * 1024)
        x = torch.randn(m, 8 * 1024, device=dev).bfloat16()
        return lambda: ops.fp8_linear.triton(x, w, s)
    if name.startswith("moe"):
        from dsv41_kernels.moe_triton import moe_experts_triton

        t = 8192 if name == "moe_grouped" else 8
        w1, s1 = K.expert_weights(16, 2304, K.HID)
        w3, s3 = K.expert_weights(16, 2304, K.HID)
        w2, s2 = K.expert_weights(16, K.HID, 2304)
        x = torch.randn(t, K.HID, device=dev).bfloat16()
        ids = torch.rand(t, 16, device=dev).topk(6, dim=-1).indices
        wts = torch.rand(t, 6, device=dev)
        return lambda: moe_experts_triton(x, ids, wts, w1, s1, w3, s3, w2, s2, 10.0)
    if name.startswith("attention"):
        t = 8192 if name.endswith("prefill") else 64
        wpool = K.window_kv_pack(torch.randn(max(t * K.W, 4096), K.D, device=dev).bfloat16())
        cpool = K.kv_fp4_pack(torch.randn(32768 * min(t, 4), K.D, device=dev).bfloat16())
        q = torch.randn(t, K.H, K.D, device=dev).bfloat16()
        ws = torch.randint(0, wpool.size(0), (t, K.W), device=dev)
        cs = torch.randint(0, cpool.size(0), (t, K.TOPK), device=dev)
        sink = torch.randn(K.H, device=dev)
        return lambda: ops.sparse_attention_paged.triton(q, wpool, ws, cpool, cs, sink, K.D**-0.5)
    if name == "index_scores":
        q, w, pool, table = K.index_inputs(64, 65536)
        return lambda: ops.index_scores.triton(q, w, pool, table)
    if name.startswith("store"):
        n = 8192
        kv = torch.randn(n, K.D, device=dev).bfloat16()
        c, s_ = K.rope(n)
        sl = torch.randperm(8 * n, device=dev)[:n]
        if name == "store_window":
            pool = torch.zeros(8 * n, K.D + K.D // 32, dtype=torch.uint8, device=dev)
            wgt = torch.rand(K.D, device=dev).bfloat16()
            return lambda: ops.window_kv_store.triton(kv, wgt, 1e-20, c, s_, sl, pool)
        if name == "store_compressed":
            pool = torch.zeros(8 * n, K.D // 2 + K.D // 16, dtype=torch.uint8, device=dev)
            return lambda: ops.compressed_kv_store.triton(kv, c, s_, sl, pool)
        pool = torch.zeros(8 * n, K.DI // 2 + K.DI // 32, dtype=torch.uint8, device=dev)
        k = kv[:, : K.DI].contiguous()
        return lambda: ops.index_key_store.triton(k, c, s_, sl, pool)
    if name == "engram_gather":
        rows = 4 << 20  # 1.1 GB: far larger than L2, small enough for ncu's replay to save
        w = torch.randint(0, 0x7E, (rows, 256), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
        s = torch.randint(110, 140, (rows, 8), dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
        ids = torch.randint(0, rows, (8192, 24), device=dev)
        return lambda: ops.engram_gather.triton(w, s, ids)
    raise KeyError(name)


def run(only: list[str]) -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("kernel_limits.py: run mode needs a CUDA device (use --parse CSV on other machines)")
    sys.path.insert(0, str(ROOT))

    marks = torch.zeros(len(TARGETS) + 1, dtype=torch.int32, device="cuda")
    _target_mark_kernel[(1,)](marks)  # compiled outside the profiled ranges
    for i, (name, _, shape) in enumerate(TARGETS):
        if only and name not in only:
            continue
        try:
            launch = build(name)
            launch()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            _target_mark_kernel[(i + 1,)](marks)
            launch()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"profiled {name}: {shape}", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - keep the other targets
            print(f"target {name} failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
        launch = None
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parse", metavar="CSV", help="turn ncu's --csv output into the per-kernel table (no GPU needed)")
    ap.add_argument("--out", help="with --parse: write the table here (markdown) instead of stdout")
    ap.add_argument("--only", default="", help="comma-separated target names: " + ",".join(t[0] for t in TARGETS))
    a = ap.parse_args()
    if a.parse:
        if not Path(a.parse).is_file():
            ap.error(f"--parse {a.parse}: no such file")
        groups = by_target(parse_ncu_csv(Path(a.parse).read_text(errors="replace")))
        md = table_md(groups) if groups else "no kernel records in the CSV\n"
        if a.out:
            Path(a.out).write_text(md)
        else:
            print(md, end="")
        return
    only = [x for x in a.only.split(",") if x]
    unknown = sorted(set(only) - {t[0] for t in TARGETS})
    if unknown:
        ap.error(f"--only: unknown target(s) {', '.join(unknown)}; known: {', '.join(t[0] for t in TARGETS)}")
    run(only)


if __name__ == "__main__":
    main()
