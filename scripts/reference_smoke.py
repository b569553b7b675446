"""Generate preset checkpoints and time the reference forward on this machine's device.

    python scripts/reference_smoke.py --presets tiny,small,bench --tokens 512,512,2048 --out DIR

Prints one row per preset: generation time, forward time, tail-replay time, and (on CUDA) the
CPU-vs-CUDA logits agreement for presets small enough to run on the CPU too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_dsv41.checkpoint.loader import load_model  # noqa: E402
from sglang_dsv41.reference.model import ReferenceModel  # noqa: E402
from sglang_dsv41.tiny import write_tiny_checkpoint  # noqa: E402


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--tokens", default="512,512")
    ap.add_argument("--out", default="/tmp/dsv41-smoke")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print("| preset | tokens | gen s | load s | forward s | tail-replay s | cpu-vs-device cos (free) | top-1 agree (free) | cos mean/min (CPU decisions replayed) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for preset, n in zip(a.presets.split(","), (int(x) for x in a.tokens.split(","))):
        t0 = time.perf_counter()
        path = write_tiny_checkpoint(Path(a.out) / preset, preset, seed=0, device=dev)
        gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = load_model(path, device=dev, progress=False)
        load = time.perf_counter() - t0
        ref = ReferenceModel(model)
        ids = torch.randint(3, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
        ref.forward(ids[:8])  # warm-up
        _sync(dev)
        t0 = time.perf_counter()
        out = ref.forward(ids)
        _sync(dev)
        fwd = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref.forward(ids, decoder_tail_replay=True)
        _sync(dev)
        tail = time.perf_counter() - t0
        cos = agree = replayed = "-"
        if dev == "cuda" and preset != "bench":
            cpu_out = ReferenceModel(load_model(path, device="cpu", progress=False)).forward(ids)
            cpu = cpu_out.logits
            c = torch.nn.functional.cosine_similarity(cpu, out.logits.cpu(), dim=-1)
            cos = f"{c.mean().item():.5f}"
            agree = f"{(cpu.argmax(-1) == out.logits.cpu().argmax(-1)).float().mean().item():.3f}"
            rep = ref.forward(ids, replay=cpu_out.decisions).logits.cpu()
            r = torch.nn.functional.cosine_similarity(cpu, rep, dim=-1)
            replayed = f"{r.mean().item():.5f} / {r.min().item():.5f}"
        assert torch.isfinite(out.logits).all()
        print(f"| {preset} | {n} | {gen:.1f} | {load:.1f} | {fwd:.2f} | {tail:.2f} | {cos} | {agree} | {replayed} |", flush=True)
        del model, ref, out
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
