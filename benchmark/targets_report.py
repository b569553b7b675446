"""Issue 10's targets table from one run's outputs (benchmark/targets.sh OUTDIR writes them).

    python benchmark/targets_report.py OUTDIR          # -> OUTDIR/targets.md

Inputs (any may be missing; the table then says "not measured (part X failed: reason)"):
  env.txt       device / versions / commit header
  status.txt    one line per part: "<part> <exit code> <seconds>" (124: killed by its timeout)
  kernels.json  benchmark/kernels.py --targets --json: {"ceilings", "failed": {part: error}, "targets": [...]}
  kernels.log, driver.log, ncu.log   the parts' output (their last error line is quoted on failure)
  driver.log    benchmark/driver_bench.py --sweep 8,64 --profile stdout: the sweep table, one profile per
                batch ("Profile, batch B, one graph replay: ...") and of one prompt's prefill, the e2e row
  ncu.csv       ncu --csv of benchmark/kernel_limits.py (parsed by kernel_limits.parse_ncu_csv)
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_limits import by_target, main_kernel, parse_ncu_csv, verdict  # noqa: E402

# row id, what, before (issue 10 / earlier results files), target text, kernels.py part, kernel_limits targets
ROWS = [
    ("decode8", "decode step, `bench`, batch 8, 8K context", "~200 ms eager (issue 10); 31.6 ms graph replay "
     "(2026-12-01-h200-decode-graph.md)", "<= 10 ms and <= 3x floor", "driver", ("moe_decode",)),
    ("decode64", "decode step, batch 64, 8K context", "37.3 ms graph replay, 20x floor (2026-12-01-h200-decode-graph.md)",
     "<= 4x floor", "driver", ()),
    ("prefill", "prefill, `bench` 8 x 8K", "6,184 tok/s (2026-12-01-h200-decode-graph.md)", ">= 25,000 tok/s", "driver", ()),
    ("fp8_gemm", "FP8 GEMM, M = 8192 / M = 8", "0.31-0.36x / 0.22-0.47x bf16 (issue 10)", ">= 1.0x / >= 0.8x bf16", "gemm",
     ("fp8_gemm_m8192", "fp8_gemm_m8")),
    ("moe_grouped", "grouped MXFP4 MoE, 8192 tokens x top-6", "0.13x bf16 at best (2026-12-01-h200-kernels-moe.md)",
     ">= 0.6x bf16 of equal FLOPs", "moe", ("moe_grouped",)),
    ("attention_prefill", "sparse attention prefill (8K rows, 128 + 512 keys)", "42.7 TFLOP/s (issue 10)", ">= 250 TFLOP/s",
     "attention", ("attention_prefill",)),
    ("attention_decode", "sparse attention decode, batch 64", "5% of roofline (issue 10)", ">= 30% of roofline", "attention",
     ("attention_decode",)),
    ("index_scores", "index scores 64 x 64K", "24% of HBM floor (issue 10)", ">= 50% of HBM floor", "indexer", ("index_scores",)),
    ("cache_stores", "cache stores", "32-47% of HBM (issue 10)", ">= 80% of HBM", "stores",
     ("store_window", "store_compressed", "store_index_key")),
    ("engram_gather", "Engram gather, HBM table, 8192 x 24 rows", "53.7 us (issue 10)", "<= 40 us", "engram", ("engram_gather",)),
]
OUT = Path(".")  # the run's folder (set by report())
KERNEL_ROWS = {"fp8_gemm": ("fp8_gemm_m8192", "fp8_gemm_m8")}  # table row -> kernels.json rows (default: same id)


def read(path: Path) -> str:
    """The file's text; a missing file reads as its gzipped copy (results folders keep ncu.csv.gz), else ""."""
    if path.exists():
        return path.read_text(errors="replace")
    gz = path.with_name(path.name + ".gz")
    return gzip.decompress(gz.read_bytes()).decode(errors="replace") if gz.exists() else ""


def part_status(out: Path) -> dict[str, tuple[int, str]]:
    """part -> (exit code, seconds) from status.txt."""
    st = {}
    for ln in read(out / "status.txt").splitlines():
        f = ln.split()
        if len(f) >= 2 and f[1].lstrip("-").isdigit():
            st[f[0]] = (int(f[1]), f[2] if len(f) > 2 else "?")
    return st


def failure(out: Path, part: str, status: dict) -> str:
    """Why a part produced nothing: its exit code / timeout and its log's last error line."""
    if part not in status:
        return "did not run"
    rc, secs = status[part]
    why = "killed by its timeout" if rc in (124, 137) else f"exit code {rc}"
    lines = [ln for ln in read(out / f"{part}.log").splitlines() if ln.strip()]
    err = [ln for ln in lines if re.search(r"Error|error|failed|FAILED|ERR", ln)]
    last = (err or ([] if rc == 0 else lines) or [""])[-1].strip().replace("|", "/")
    return f"{why} after {secs} s" + (f"; {last[:200]}" if last else "; its output lacks this row")


# ------------------------------------------------------------------------------------------ driver.log
def parse_driver(text: str) -> dict:
    """-> {"sweep": {batch: {"replay_ms", "loop_ms", "floor_ms", "x_floor"}}, "profiles": {key: (total_ms,
    [(op, calls, ms, share)])} with key "decode8" / "decode64" (graph replay) or "prefill", "e2e": {...}}."""
    res: dict = {"sweep": {}, "profiles": {}, "e2e": None}
    lines = text.splitlines()
    num = r"([\d.]+|nan|inf)"
    for i, ln in enumerate(lines):
        m = re.match(rf"^\| (\d+) \| (graph replay only|graph, driver loop) \| {num} \| \d+ \| {num} \(.*\) \| {num} \|", ln)
        if m:
            d = res["sweep"].setdefault(int(m.group(1)), {})
            key = "replay_ms" if m.group(2).startswith("graph replay") else "loop_ms"
            d[key], d["floor_ms"] = float(m.group(3)), float(m.group(4))
            if key == "replay_ms":
                d["x_floor"] = float(m.group(5))
        m = re.match(r"^Profile, (?:batch (\d+), one graph replay|prefill of one \d+-token prompt): ([\d.]+) ms", ln)
        if m:
            key = f"decode{m.group(1)}" if m.group(1) else "prefill"
            ops = []
            for row in lines[i + 1:]:
                r = re.match(r"^\| `(.*)` \| (\d+) \| ([\d.]+) \| (\d+)% \|$", row)
                if r:
                    ops.append((r.group(1), int(r.group(2)), float(r.group(3)), int(r.group(4)) / 100))
                elif ops and not row.startswith("|"):
                    break
            res["profiles"][key] = (float(m.group(2)), ops)
        if ln.startswith("| preset | prompts |") and i + 2 < len(lines):
            f = [c.strip() for c in lines[i + 2].strip("|").split("|")]
            if len(f) >= 10:
                try:
                    res["e2e"] = dict(prefill_s=float(f[4]), floor_s=float(f[5].split()[0]), tok_s=float(f[6]),
                                      decode_ms=float(f[7]), decode_floor_ms=float(f[8]))
                except ValueError:
                    pass
    return res


def category(op: str) -> str:
    """Groups a profile row: torch's many small kernels into one bucket, library GEMMs into another."""
    if "at::native" in op:
        return "small torch elementwise / reduction kernels"
    if "cutlass" in op or "nvjet" in op or "gemm" in op.lower() and "_kernel" not in op:
        return "cuBLAS / CUTLASS GEMMs (bf16: prefill FP8 / MoE on bf16 operands, bf16 layers)"
    return f"`{op}`"


def top_costs(profile, n: int = 3) -> list[tuple[str, float, float]]:
    """(category, ms, share of the step's device time) of the n largest categories in the top-op rows."""
    total, ops = profile
    cats: dict[str, float] = {}
    for op, _, ms, _ in ops:
        if op.startswith("aten::"):  # a host op: its device time is its kernels', listed on their own rows
            continue
        cats[category(op)] = cats.get(category(op), 0.0) + ms
    return [(c, ms, ms / max(total, 1e-9)) for c, ms in sorted(cats.items(), key=lambda x: -x[1])[:n]]


def costs_text(profile) -> str:
    return "; ".join(f"{c} {ms:.2f} ms ({share:.0%})" for c, ms, share in top_costs(profile))


# ------------------------------------------------------------------------------------------ rows
def driver_cells(rid: str, drv: dict, why: str) -> tuple[str, str, str, str]:
    """(this run, ceiling/floor, met?, what limits it) of a decode / prefill row."""
    prof = drv["profiles"].get(rid)
    limits = (f"profile of one {'graph replay' if rid != 'prefill' else 'prompt prefill'} ({prof[0]:.1f} ms device "
              f"time): {costs_text(prof)}") if prof else f"no profile ({why})"
    if rid == "prefill":
        e = drv["e2e"]
        if not e:
            return f"not measured (part driver failed: {why})", "-", "-", limits
        x = e["prefill_s"] / e["floor_s"] if e["floor_s"] else float("nan")
        return (f"**{e['tok_s']:,.0f} tok/s** ({e['prefill_s']:.2f} s)", f"MMA floor {e['floor_s']:.2f} s -> {x:.0f}x",
                "yes" if e["tok_s"] >= 25000 else "missed", limits)
    b = int(rid[len("decode"):])
    d = drv["sweep"].get(b)
    if not d or "replay_ms" not in d:
        return f"not measured (part driver failed: {why})", "-", "-", limits
    ms, x = d["replay_ms"], d["x_floor"]
    met = (ms <= 10 and x <= 3) if b == 8 else x <= 4
    loop = f"; driver loop {d['loop_ms']:.1f} ms" if "loop_ms" in d else ""
    return f"**{ms:.2f} ms** graph replay{loop}", f"floor {d['floor_ms']:.3f} ms -> {x:.1f}x", "yes" if met else "missed", limits


def target_error(t: str) -> str:
    """kernel_limits.py's own line about a target missing from ncu.csv (it logs to ncu.log)."""
    for ln in read(OUT / "ncu.log").splitlines():
        if ln.startswith(f"target {t} failed"):
            return ln.replace("|", "/")[:200]
    return "no kernels after its marker in ncu.csv"


def kernel_cells(rid: str, recs: list[dict], why: str, groups: dict, ncu_why: str, subs) -> tuple[str, str, str, str]:
    lim = []
    for t in subs:
        ks = groups.get(t)
        if ks:
            k = main_kernel(ks)
            us = "?" if k["us"] is None else f"{k['us']:.1f} us"
            lim.append(f"{t}: `{k['kernel'][:40]}` {us}: {verdict(k)}")
        else:
            lim.append(f"{t}: ncu not measured ({ncu_why or target_error(t)})")
    limits = "ncu " + "; ".join(lim)
    if not recs:
        return f"not measured (part {why})", "-", "-", limits
    run = "; ".join(f"{r['shape']}: **{r['value']:.3g} {r['unit']}** ({r['us']:.1f} us; {r['baseline']})"
                    if r["baseline"] != "-" else f"{r['shape']}: **{r['value']:.3g} {r['unit']}** ({r['us']:.1f} us)"
                    for r in recs)
    ceil = "; ".join(f"{r['ceiling']}: {100 * r['fraction']:.1f}%" for r in recs)
    met = "yes" if all(r["met"] for r in recs) else f"missed ({sum(not r['met'] for r in recs)} of {len(recs)})"
    return run, ceil, met, limits


def report(out: Path) -> str:
    global OUT
    OUT = out
    status = part_status(out)
    kj = json.loads(read(out / "kernels.json") or "null")
    recs = kj["targets"] if kj else []
    drv = parse_driver(read(out / "driver.log"))
    kernels = parse_ncu_csv(read(out / "ncu.csv"))
    groups = by_target(kernels)
    ncu_why = "no kernel records in ncu.csv; part ncu failed: " + failure(out, "ncu", status) if not kernels else ""
    part_names = {"gemm": "gemm", "moe": "moe", "attention": "attention", "indexer": "indexer", "stores": "stores",
                  "engram": "engram"}
    lines = ["# Issue 10 targets, one run", "", "```", read(out / "env.txt").strip() or "(env.txt missing)", "```", ""]
    if kj:
        c = kj["ceilings"]
        lines.append(f"Ceilings measured in the kernels part: HBM copy {c['hbm_tb_s']:.2f} TB/s (read + write), bf16 matmul "
                     f"{c['mma_tflops']:.0f} TFLOP/s. Parts: " + ", ".join(f"{p} exit {rc} in {s} s" for p, (rc, s) in status.items()))
        lines.append("")
    lines += ["| what | baseline | this run | ceiling / floor | target | met? | what limits it |", "|---|---|---|---|---|---|---|"]
    for rid, what, before, goal, part, subs in ROWS:
        if part == "driver":
            why = failure(out, "driver", status)
            cells = driver_cells(rid, drv, why)
            if subs:  # Nsight Compute of the step's largest kernel, measured alone at the step's shape
                cells = cells[:3] + (cells[3] + "; " + kernel_cells(rid, [], "", groups, ncu_why, subs)[3],)
        else:
            mine = [r for r in recs if r["row"] in KERNEL_ROWS.get(rid, (rid,))]
            if not kj:
                why = "kernels failed: " + failure(out, "kernels", status)
            elif kj["failed"].get(part_names[part]):
                why = f"kernels/{part} failed: {kj['failed'][part]}"
            else:
                why = "kernels did not reach it: " + failure(out, "kernels", status)
            cells = kernel_cells(rid, mine, why, groups, ncu_why, subs)
        lines.append(f"| {what} | {before} | {cells[0]} | {cells[1]} | {goal} | {cells[2]} | {cells[3]} |")
    lines += ["", "## The three largest costs of a decode step (profile of one graph replay)", ""]
    for b in (8, 64):
        prof = drv["profiles"].get(f"decode{b}")
        if prof:
            lines.append(f"Batch {b} ({prof[0]:.2f} ms of device time; categories summed over the profile's top rows):")
            lines += [f"{i}. {c}: {ms:.2f} ms, {share:.0%}" for i, (c, ms, share) in enumerate(top_costs(prof), 1)]
        else:
            lines.append(f"Batch {b}: not measured (part driver failed: {failure(out, 'driver', status)})")
        lines.append("")
    if kernels:
        lines += ["## Nsight Compute, per kernel (benchmark/kernel_limits.py)", ""]
        lines += [f"- {t}: " + "; ".join(f"`{k['kernel'][:50]}` {k['us'] or 0:.1f} us: {verdict(k)}" for k in ks)
                  for t, ks in groups.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    if not out.is_dir():
        sys.exit(f"targets_report.py: {out} is not a folder (the OUTDIR of benchmark/targets.sh)")
    (out / "targets.md").write_text(report(out))
    print(f"wrote {out / 'targets.md'}")


if __name__ == "__main__":
    main()
