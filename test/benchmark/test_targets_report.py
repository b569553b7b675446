"""benchmark/kernel_limits.py's ncu CSV parser and verdict rule, and benchmark/targets_report.py on fake
run outputs (ncu's real --csv layout; a driver log in driver_bench's format; a kernels.json record set)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

import kernel_limits as KL  # noqa: E402
import targets_report as TR  # noqa: E402

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type",'
        '"Rule Description","Estimated Speedup Type","Estimated Speedup"')


def row(i, kernel, grid, section, metric, unit, value, block="(128, 1, 1)"):
    return (f'"{i}","4242","python3","127.0.0.1","{kernel}","1","7","{block}","{grid}","0","9.0","{section}",'
            f'"{metric}","{unit}","{value}","","","","",""')


SOL, OCC, LS, MWA = "GPU Speed Of Light Throughput", "Occupancy", "Launch Statistics", "Memory Workload Analysis"


def kernel_rows(i, name, grid, us, dram, mem, sm, occ, regs, smem_kb):
    return [row(i, name, grid, SOL, "Duration", "us", us), row(i, name, grid, SOL, "DRAM Throughput", "%", dram),
            row(i, name, grid, SOL, "Memory Throughput", "%", mem), row(i, name, grid, SOL, "Compute (SM) Throughput", "%", sm),
            row(i, name, grid, MWA, "Memory Throughput", "Tbyte/second", "0.51"),  # same name, other unit: not the %
            row(i, name, grid, OCC, "Achieved Occupancy", "%", occ), row(i, name, grid, OCC, "Theoretical Occupancy", "%", "12.50"),
            row(i, name, grid, OCC, "Block Limit Registers", "block", "1"), row(i, name, grid, OCC, "Block Limit Warps", "block", "16"),
            row(i, name, grid, LS, "Registers Per Thread", "register/thread", regs),
            row(i, name, grid, LS, "Dynamic Shared Memory Per Block", "Kbyte/block", smem_kb),
            row(i, name, grid, LS, "# SMs", "SM", "132")]


def sample_csv() -> str:
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", HEAD]
    lines.append(row(0, "_target_mark_kernel", "(1, 1, 1)", SOL, "Duration", "us", "1.50"))
    lines += kernel_rows(1, "_scaled_mm_kernel", "(64, 40, 1)", "1,234.5", "12.1", "20.3", "9.4", "6.02", "255", "64.51")
    lines.append(row(2, "_target_mark_kernel", "(7, 1, 1)", SOL, "Duration", "us", "1.50"))  # store_window
    lines += kernel_rows(3, "_window_kv_store_kernel", "(4096, 1, 1)", "18.2", "85.3", "86.0", "30.1", "70.2", "40", "0")
    lines.append('==PROF== Disconnected from process 4242')
    return "\n".join(lines) + "\n"


def test_parse_and_verdict():
    ks = KL.parse_ncu_csv(sample_csv())
    assert [k["id"] for k in ks] == [0, 1, 2, 3]
    groups = KL.by_target(ks)
    assert list(groups) == ["fp8_gemm_m8192", "store_window"]
    g = groups["fp8_gemm_m8192"][0]
    assert g["us"] == 1234.5 and g["dram"] == 12.1 and g["mem"] == 20.3 and g["sm"] == 9.4
    assert g["regs"] == 255 and abs(g["smem"] - 64510) < 1 and g["block"] == 128 and g["grid"] == 2560
    assert g["occ_limit"] == "Registers"
    v = KL.verdict(g)
    assert v.startswith("latency: DRAM 12%, SM 9%, occupancy 6% (theoretical 12%, limited by registers) with 255 regs")
    assert KL.verdict(groups["store_window"][0]) == "memory: DRAM 85%"
    assert KL.verdict(dict(g, sm=75.0, mem=40.0)) == "compute: SM 75% (DRAM 12%)"
    assert KL.verdict(dict(g, mem=70.0, dram=20.0)).startswith("memory (L1/L2)")
    assert KL.verdict(dict(g, us=4.0, grid=8)).startswith("launch/tail: 8 blocks")
    assert KL.parse_ncu_csv("==ERROR== profiling failed\n") == []
    assert "255" in KL.table_md(groups)


DRIVER_LOG = """## 2026-12-02 NVIDIA H200
| batch | path | ms / step | tok/s | floor ms (weights + KV GB) | x floor |
|---|---|---|---|---|---|
| 8 | graph, driver loop | 31.58 | 253 | 1.759 (7.28 + 0.04) | 17.9 |
| 8 | graph replay only | 12.00 | 666 | 1.759 (7.28 + 0.04) | 6.8 |
| 8 | serving path (graph set: load + replay) | 31.90 | 251 | 1.759 (7.28 + 0.04) | 18.1 |

Profile, batch 8, one graph replay: 28.90 ms of device time in all (1328 kernel launches; 1061 of them (in 80 kernels) average under 5 us, 2.27 ms in all); top ops by self device time:

| op / kernel | calls | ms | share |
|---|---|---|---|
| `_moe_gemm_kernel` | 28 | 10.537 | 36% |
| `_scaled_mm_kernel` | 105 | 3.764 | 13% |
| `void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native:` | 1862 | 2.610 | 9% |
| `void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrappe` | 619 | 1.584 | 5% |

| preset | prompts | decode steps | chunk | prefill s | prefill floor s (MMA) | prefill tok/s | decode ms/step | decode floor ms (HBM) | decode tok/s | graph capture s | peak GiB | ops called (implementation x calls) |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| bench | 8 x 8192 | 16 | 8192 | 2.00 | 1.05 (810 TFLOP) | 32768 | 35.50 | 1.79 | 225.4 | 0.47 | 14.4 | moe_experts (triton x1) |

Profile, prefill of one 8192-token prompt: 1300.00 ms of device time in all; top ops by self device time:

| op / kernel | calls | ms | share |
|---|---|---|---|
| `_moe_gemm_kernel` | 28 | 530.000 | 41% |
"""


def rec(row, shape, value, met):
    return dict(row=row, name="k", shape=shape, us=10.0, value=value, unit="x bf16", baseline="bf16 F.linear 5.0 us",
                ceiling="bf16 MMA 772 TFLOP/s", fraction=0.25, target=">= 1.0x bf16", met=met)


def test_report_on_fake_run(tmp_path):
    (tmp_path / "env.txt").write_text("NVIDIA H200, 143771 MiB\ntorch 2.11.0 triton 3.6.0\ncommit: abc1234\n")
    (tmp_path / "status.txt").write_text("kernels 0 80\ndriver 0 150\nncu 124 120\n")
    (tmp_path / "kernels.json").write_text(json.dumps({
        "device": "H200", "ceilings": {"hbm_tb_s": 4.16, "mma_tflops": 772.0}, "failed": {"moe": "OutOfMemoryError: x"},
        "targets": [dict(rec("fp8_gemm_m8192", "wo_b M=8192", 0.9, False),
                         baseline="bf16 F.linear 880.0 us (781 TF/s); fp8 kernel (deterministic mode) 1000.0 us"),
                    rec("fp8_gemm_m8", "wo_b M=8", 0.9, True),
                    dict(rec("index_scores", "t=64 visible=65536", 55.0, True), unit="% of HBM floor")]}))
    (tmp_path / "driver.log").write_text(DRIVER_LOG)
    (tmp_path / "ncu.csv").write_text(sample_csv())
    (tmp_path / "ncu.log").write_text("==ERROR== something\n")
    md = TR.report(tmp_path)
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in md.splitlines() if ln.startswith("| ")}
    d8 = rows["decode step, `bench`, batch 8, 8K context"]
    assert "**12.00 ms** graph replay" in d8 and "6.8x" in d8 and "| missed |" in d8  # 6.8x > 2.5x floor
    assert "`_moe_gemm_kernel` 10.54 ms (36%)" in d8
    assert "not measured (part driver failed" in rows["decode step, batch 64"]
    launches = rows["kernel launches per decode step (batch 8, one graph replay)"]
    assert "**1,328** (1,061 of them in 80 kernels under 5 us, 2.27 ms)" in launches and "| missed |" in launches
    serving = [v for k, v in rows.items() if k.startswith("the adapter's decode step")][0]
    assert "**1.01x** (batch 8: 31.90 ms load + replay vs 31.58 ms driver loop" in serving and "| yes |" in serving
    pf = rows["prefill, `bench` 8 x 8K"]
    assert "**32,768 tok/s**" in pf and "| missed |" in pf and "`_moe_gemm_kernel` 530.00 ms (41%)" in pf  # < 35,000
    det = rows["FP8 GEMM, deterministic mode, M = 8192"]
    assert "**0.88 x bf16 (deterministic mode)** (1000.0 us" in det and "| yes |" in det and "latency: DRAM 12%" in det
    assert "| yes |" in rows["index scores 64 x 64K"]
    assert "kernels/attention" not in md and "memory: DRAM 85%" in rows["cache stores (or fused away)"]
    assert "1. `_moe_gemm_kernel`: 10.54 ms, 36%" in md
    assert "2. small torch elementwise / reduction kernels: 4.19 ms, 15%" in md


def test_report_with_nothing(tmp_path):
    (tmp_path / "status.txt").write_text("kernels 124 150\n")
    (tmp_path / "kernels.log").write_text("ceilings: ...\nRuntimeError: CUDA error: out of memory\n")
    md = TR.report(tmp_path)
    assert md.count("not measured (part kernels failed: killed by its timeout after 150 s; RuntimeError: CUDA error") == 5
    assert "not measured (part driver failed: did not run)" in md
    assert "ncu not measured (no kernel records in ncu.csv; part ncu failed: did not run)" in md
