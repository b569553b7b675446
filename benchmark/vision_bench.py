"""Image input speed on one device: the vision tower's encode time for one image, and the prefill of a
prompt holding it next to the text-only prefill of the same length (offline driver, paged runtime, the
kernel op table on CUDA).

    python benchmark/vision_bench.py [--preset bench-vision] [--image-size 1024] [--text 4096] [--repeat 5]
        [--device cuda] [--results benchmark/results/DATE-DEVICE-vision.md]

Model: `--preset` with random weights (`tiny.random_model`, torch's generator on the device): bench-vision
is the bench backbone with the released tower (32 ViT blocks, hidden 1024, 16 heads, patch 14,
downsample 3, up to 1024 positions per image). Image: seeded random RGB pixels of --image-size squared,
planned and cut by image_input.py (1024 x 1024: 74 x 74 patches, a 25 x 25 grid, 652 positions).
Rows (median of --repeat timed runs after one warm-up, device synchronised around each):
  encode            ViT + aligner + span assembly of the image (`DeepseekV41.image_embeddings`)
  prefill, image    one chunk of --text text ids with the image span in the middle, encode included
  prefill, text     one chunk of the same number of text ids
Tokens/s count every prompt position (the span's included).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "sgl-kernel")]

from sglang_dsv41.image_input import image_span  # noqa: E402
from sglang_dsv41.numerics import NumericsPolicy, apply_numerics  # noqa: E402
from sglang_dsv41.runtime.driver import Driver, Sequence  # noqa: E402
from sglang_dsv41.runtime.kernels import kernel_table  # noqa: E402
from sglang_dsv41.tiny import random_model  # noqa: E402


def timed(fn, device: str, repeat: int) -> tuple[float, object]:
    """Median seconds of `repeat` runs of fn() after one warm-up, and the last result."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out = fn()
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="bench-vision")
    ap.add_argument("--image-size", type=int, default=1024)
    ap.add_argument("--text", type=int, default=4096, help="text ids around the image")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--results", default=None)
    a = ap.parse_args(argv)
    from PIL import Image

    with tempfile.TemporaryDirectory() as work:
        model = random_model(a.preset, work, device=a.device, fast=True)
    if model.cfg.vision is None:
        ap.error(f"--preset {a.preset} has no vision tower")
    table = kernel_table(a.device)
    apply_numerics(model, NumericsPolicy.kernels(table))
    pixels = np.random.default_rng(0).integers(0, 256, (a.image_size, a.image_size, 3), dtype=np.uint8)
    half = a.text // 2
    span = image_span(Image.fromarray(pixels), model.cfg.vision, start=half)
    img = model.cfg.image_token_id
    text = torch.randint(3, min(img, model.cfg.vocab_size) - 2, (a.text,), generator=torch.Generator().manual_seed(1)).tolist()
    image_ids = text[:half] + [img] * span.length + text[half:]
    text_ids = torch.randint(3, min(img, model.cfg.vocab_size) - 2, (len(image_ids),),
                             generator=torch.Generator().manual_seed(2)).tolist()
    T = len(image_ids)
    drv = Driver(model, T + 128, 1, page_size=64, device=a.device, ops=table)

    def prefill(ids, with_image: bool):
        seq = Sequence(0, list(ids), len(ids))
        drv.pools.clear_request(0)
        rows = model.image_rows([span]) if with_image else None
        out = drv.step([seq], [len(ids)], image_rows=rows)
        drv.release([seq])
        return out

    with torch.inference_mode():
        t_enc, _ = timed(lambda: model.image_embeddings(span), a.device, a.repeat)
        t_img, _ = timed(lambda: prefill(image_ids, True), a.device, a.repeat)
        t_txt, _ = timed(lambda: prefill(text_ids, False), a.device, a.repeat)
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"cpu ({platform.machine()})"
    p = span.plan
    lines = [
        "| what | tokens | ms | tokens/s |",
        "|---|---|---|---|",
        f"| encode one {a.image_size}x{a.image_size} image ({p.vit_h}x{p.vit_w} patches -> {p.grid_h}x{p.grid_w} grid) "
        f"| {span.length} | {t_enc * 1e3:.2f} | - |",
        f"| prefill, {a.text} text ids + the image (encode included) | {T} | {t_img * 1e3:.2f} | {T / t_img:,.0f} |",
        f"| prefill, {T} text ids | {T} | {t_txt * 1e3:.2f} | {T / t_txt:,.0f} |",
    ]
    for line in lines:
        print(line)
    if a.results:
        try:
            import triton
            tv = f", triton {triton.__version__}"
        except ImportError:
            tv = ""
        head = [f"# Image input speed, {datetime.date.today()}, {dev}", "",
                f"- command: `python benchmark/vision_bench.py {shlex.join(sys.argv[1:] if argv is None else argv)}`",
                f"- device: {dev}; torch {torch.__version__}{tv}",
                f"- model: preset {a.preset}, random weights; vision tower {model.cfg.vision.n_layers} blocks, "
                f"hidden {model.cfg.vision.dim}; median of {a.repeat} runs after a warm-up", ""]
        Path(a.results).parent.mkdir(parents=True, exist_ok=True)
        Path(a.results).write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
