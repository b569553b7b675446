"""A PNG of per-step curves, drawn with Pillow (a dependency SGLang already brings; matplotlib is not
installed with this project). One panel per group of series, shared step axis, min/max labels.

    line_panels(path, steps, [("reward", {"train reward": [...], "held-out": [...]}),
                              ("mismatch", {"KL mean": [...]})])
Values may be None (a step without that measurement); such points are skipped.
"""

from __future__ import annotations

import math
import os

from PIL import Image, ImageDraw, ImageFont

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]
W, PANEL_H, MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 900, 300, 80, 20, 30, 40


def _range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def line_panels(path: str | os.PathLike, steps: list[int], panels: list[tuple[str, dict[str, list[float | None]]]],
                title: str = "") -> None:
    img = Image.new("RGB", (W, PANEL_H * len(panels) + 20), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    if title:
        draw.text((MARGIN_L, 4), title, fill="black", font=font)
    x0, x1 = MARGIN_L, W - MARGIN_R
    smin, smax = (min(steps), max(steps)) if steps else (0, 1)
    sx = lambda s: x0 + (x1 - x0) * ((s - smin) / (smax - smin) if smax > smin else 0.5)  # noqa: E731
    for k, (name, series) in enumerate(panels):
        top = 20 + k * PANEL_H + MARGIN_T
        bottom = 20 + (k + 1) * PANEL_H - MARGIN_B
        draw.rectangle([x0, top, x1, bottom], outline="black")
        draw.text((x0, top - 14), name, fill="black", font=font)
        vals = [v for ys in series.values() for v in ys if v is not None and math.isfinite(v)]
        lo, hi = _range(vals) if vals else (0.0, 1.0)
        sy = lambda v: bottom - (bottom - top) * (v - lo) / (hi - lo)  # noqa: E731
        for frac in (0.0, 0.5, 1.0):
            v = lo + (hi - lo) * frac
            y = sy(v)
            draw.line([x0 - 4, y, x0, y], fill="black")
            draw.text((4, y - 6), f"{v:.3g}", fill="black", font=font)
        for s in (smin, (smin + smax) // 2, smax):
            draw.line([sx(s), bottom, sx(s), bottom + 4], fill="black")
            draw.text((sx(s) - 6, bottom + 6), str(s), fill="black", font=font)
        draw.text(((x0 + x1) // 2 - 10, bottom + 20), "step", fill="black", font=font)
        for j, (label, ys) in enumerate(series.items()):
            color = COLORS[j % len(COLORS)]
            pts = [(sx(s), sy(v)) for s, v in zip(steps, ys) if v is not None and math.isfinite(v)]
            if len(pts) > 1:
                draw.line(pts, fill=color, width=2)
            for x, y in pts:
                draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=color)
            draw.rectangle([x1 - 170, top + 6 + 14 * j, x1 - 160, top + 14 + 14 * j], fill=color)
            draw.text((x1 - 155, top + 4 + 14 * j), label, fill="black", font=font)
    img.save(str(path))
