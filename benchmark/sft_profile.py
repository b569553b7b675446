"""Where one fast SFT step's kernels come from: the eager step (forward + backward) of the SFT command
in training.json under torch.profiler, ops listed by CUDA kernel count and by CUDA time.

    python benchmark/sft_profile.py [--batch 1024] [--pad-to 26] [--top 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

import torch  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--pad-to", type=int, default=26)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
    from sglang_dsv41.tiny import write_tiny_checkpoint
    from sglang_dsv41.train import sft, task
    from sglang_dsv41.train.trainable import load_trainable

    start = write_tiny_checkpoint(Path(tempfile.mkdtemp()) / "start", "mini-digits", seed=0)
    model = load_trainable(start, device="cuda")
    apply_numerics(model, NumericsPolicy.train(fast=True))
    data = sft.Batches(task.ChatRenderer(start), sft.parse_levels("1:1,2:4"), a.batch, 0, a.pad_to)

    def step(i: int) -> None:
        ids, mask, t = data.collate(data.problems(i), "cuda")
        total, n, _ = sft.batch_ce(model, ids, mask, t)
        (total / n).backward()
        model.zero_grad(set_to_none=True)

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(3)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"CUDA kernels in one eager step: {len(events)}, CUDA time {sum(e.device_time for e in events) / 1e3:.1f} ms")
    ka = prof.key_averages()
    print(ka.table(sort_by="cuda_time_total", row_limit=a.top, max_name_column_width=60))
    rows = sorted((e for e in ka if e.device_type == torch.autograd.DeviceType.CPU), key=lambda e: -e.count)
    print("aten ops by calls:")
    for e in rows[: a.top]:
        print(f"{e.count:8d}  {e.key}")


if __name__ == "__main__":
    main()
