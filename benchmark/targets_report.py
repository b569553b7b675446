"""Issue 32's targets table from one run's outputs (benchmark/targets.sh OUTDIR writes them).

    python benchmark/targets_report.py OUTDIR          # -> OUTDIR/targets.md

Inputs (any may be missing; the table then says "not measured (part X failed: reason)"):
  env.txt       device / versions / commit header
  status.txt    one line per part: "<part> <exit code> <seconds>" (124: killed by its timeout)
  kernels.json  benchmark/kernels.py --targets --json: {"ceilings", "failed": {part: error}, "targets": [...]}
  kernels.log, driver.log, ncu.log   the parts' output (their last error line is quoted on failure)
  driver.log    benchmark/driver_bench.py --sweep 8,64 --profile stdout: the sweep table (graph replay, driver
                loop, serving path), one profile per batch ("Profile, batch B, one graph replay: ... (N kernel
                launches; ...)") and of one prompt's prefill, the e2e row
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

# row id, what, before (issue 32's "now" column: 2026-12-03-h200-targets-8), target text, source part,
# kernel_limits targets. "met?" is judged here against these targets (`judge`), not kernels.py's own.
ROWS = [
    ("decode8", "decode step, `bench`, batch 8, 8K context", "8.24 ms, 4.8x floor", "<= 2.5x floor", "driver",
     ("moe_decode",)),
    ("decode64", "decode step, batch 64", "13.19 ms, 7.2x floor", "<= 3.5x floor", "driver", ()),
    ("launches", "kernel launches per decode step (batch 8, one graph replay)", "1,328", "<= 400", "driver", ()),
    ("serving", "the adapter's decode step on CUDA (runtime part: `DecodeGraphSet`, stand-in batch) vs the driver's "
     "graph step", "~9x (eager)", "<= 1.1x", "driver", ()),
    ("attention_prefill", "sparse attention prefill 8K rows", "103 TFLOP/s", ">= 250 TFLOP/s", "attention",
     ("attention_prefill",)),
    ("attention_decode", "sparse attention decode batch 64", "10.4% of roofline", ">= 30% of roofline", "attention",
     ("attention_decode",)),
    ("index_scores", "index scores 64 x 64K", "23% of HBM floor", ">= 50% of HBM floor", "indexer", ("index_scores",)),
    ("cache_stores", "cache stores (or fused away)", "32-45% of HBM", ">= 80% of HBM, or no separate launch", "stores",
     ("store_window", "store_compressed", "store_index_key")),
    ("fp8_det", "FP8 GEMM, deterministic mode, M = 8192", "0.33x bf16", ">= 0.8x bf16", "gemm", ("fp8_gemm_m8192",)),
    ("prefill", "prefill, `bench` 8 x 8K", "25,990 tok/s", ">= 35,000 tok/s", "driver", ()),
]
TARGET = {"decode8": 2.5, "decode64": 3.5, "launches": 400, "serving": 1.1, "attention_prefill": 250.0,
          "attention_decode": 30.0, "index_scores": 50.0, "cache_stores": 80.0, "fp8_det": 0.8, "prefill": 35000.0}
OUT = Path(".")  # the run's folder (set by report())
KERNEL_ROWS = {"fp8_det": ("fp8_gemm_m8192",)}  # table row -> kernels.json rows (default: same id)


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
        m = re.match(rf"^\| (\d+) \| (graph replay only|graph, driver loop|serving path[^|]*) \| {num} \| \d+ \| "
                     rf"{num} \(.*\) \| {num} \|", ln)
        if m:
            d = res["sweep"].setdefault(int(m.group(1)), {})
            key = {"graph replay only": "replay_ms", "graph, driver loop": "loop_ms"}.get(m.group(2), "serving_ms")
            d[key], d["floor_ms"] = float(m.group(3)), float(m.group(4))
            if key == "replay_ms":
                d["x_floor"] = float(m.group(5))
        m = re.match(r"^Profile, (?:batch (\d+), one graph replay|prefill of one \d+-token prompt): ([\d.]+) ms", ln)
        if m and m.group(1):
            launches = re.search(r"\((\d+) kernel launches; (\d+) of them \(in (\d+) kernels\) average under (\d+) us, "
                                 r"([\d.]+) ms", ln)
            if launches:
                res["sweep"].setdefault(int(m.group(1)), {})["launches"] = tuple(float(x) for x in launches.groups())
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
    """(this run, ceiling/floor, met?, what limits it) of a decode / prefill / launches / serving row."""
    if rid in ("launches", "serving"):
        d = drv["sweep"].get(8, {})
        prof = drv["profiles"].get("decode8")
        limits = f"profile of one graph replay: {costs_text(prof)}" if prof else f"no profile ({why})"
        if rid == "launches":
            if "launches" not in d:
                return f"not measured (part driver failed: {why})", "-", "-", limits
            n, small, kinds, us, ms = d["launches"]
            return (f"**{n:,.0f}** ({small:,.0f} of them in {kinds:.0f} kernels under {us:.0f} us, {ms:.2f} ms)", "-",
                    "yes" if n <= TARGET[rid] else "missed", limits)
        if "serving_ms" not in d or "loop_ms" not in d:
            return f"not measured (part driver failed: {why})", "-", "-", limits
        x = d["serving_ms"] / d["loop_ms"]
        return (f"**{x:.2f}x** (batch 8: {d['serving_ms']:.2f} ms load + replay vs {d['loop_ms']:.2f} ms driver loop; "
                f"graph replay alone {d.get('replay_ms', float('nan')):.2f} ms)", "-",
                "yes" if x <= TARGET[rid] else "missed", "host work per step: the batch copied into the graph's buffers")
    prof = drv["profiles"].get(rid)
    limits = (f"profile of one {'graph replay' if rid != 'prefill' else 'prompt prefill'} ({prof[0]:.1f} ms device "
              f"time): {costs_text(prof)}") if prof else f"no profile ({why})"
    if rid == "prefill":
        e = drv["e2e"]
        if not e:
            return f"not measured (part driver failed: {why})", "-", "-", limits
        x = e["prefill_s"] / e["floor_s"] if e["floor_s"] else float("nan")
        return (f"**{e['tok_s']:,.0f} tok/s** ({e['prefill_s']:.2f} s)", f"MMA floor {e['floor_s']:.2f} s -> {x:.0f}x",
                "yes" if e["tok_s"] >= TARGET[rid] else "missed", limits)
    b = int(rid[len("decode"):])
    d = drv["sweep"].get(b)
    if not d or "replay_ms" not in d:
        return f"not measured (part driver failed: {why})", "-", "-", limits
    ms, x = d["replay_ms"], d["x_floor"]
    met = x <= TARGET[rid]
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
    if rid == "fp8_det":  # the deterministic-mode kernel's time against bf16, from the record's baseline text
        recs = [dict(r, value=det_ratio(r)[0], us=det_ratio(r)[1], unit="x bf16 (deterministic mode)",
                     ceiling="bf16 F.linear", fraction=det_ratio(r)[0]) for r in recs]
    run = "; ".join(f"{r['shape']}: **{r['value']:.3g} {r['unit']}** ({r['us']:.1f} us; {r['baseline']})"
                    if r["baseline"] != "-" else f"{r['shape']}: **{r['value']:.3g} {r['unit']}** ({r['us']:.1f} us)"
                    for r in recs)
    ceil = "; ".join(f"{r['ceiling']}: {100 * r['fraction']:.1f}%" for r in recs)
    ok = [r["value"] <= TARGET[rid] if rid in ("engram_gather",) else r["value"] >= TARGET[rid] for r in recs]
    met = "yes" if all(ok) else f"missed ({sum(not x for x in ok)} of {len(recs)})"
    return run, ceil, met, limits


def det_ratio(rec: dict) -> tuple[float, float]:
    """(bf16 F.linear time / deterministic-mode fp8 kernel time, that kernel's us) of an fp8_gemm_m8192
    record (from kernels.py's baseline text)."""
    bf = re.search(r"bf16 F.linear ([\d.]+) us", rec["baseline"])
    det = re.search(r"fp8 kernel \(deterministic mode\) ([\d.]+) us", rec["baseline"])
    if not (bf and det):
        return float("nan"), float("nan")
    return float(bf.group(1)) / float(det.group(1)), float(det.group(1))


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
    lines = ["# Issue 32 targets, one run", "", "```", read(out / "env.txt").strip() or "(env.txt missing)", "```", ""]
    if kj:
        c = kj["ceilings"]
        lines.append(f"Ceilings measured in the kernels part: HBM copy {c['hbm_tb_s']:.2f} TB/s (read + write), bf16 matmul "
                     f"{c['mma_tflops']:.0f} TFLOP/s. Parts: " + (", ".join(f"{p} exit {rc} in {s} s" for p, (rc, s) in status.items())
                                                           or "not recorded (no status.txt in this folder)"))
        lines.append("")
    lines += ["| what | before (issue 32) | this run | ceiling / floor | target | met? | what limits it |",
              "|---|---|---|---|---|---|---|"]
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
