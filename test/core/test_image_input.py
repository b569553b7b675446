"""Image preprocessing (image_input.py) on hand-worked cases: the size plan, the span layout, the pixel
normalisation and padding, and the errors for unreadable, empty or oversized images. DeepSeek's own
preprocessing is the oracle in test/official/test_vision_official.py; these are the cases worked out by
hand (tiny-vision's tower: patch 14, downsample 3, at most 64 positions, min_pixels 84 x 84)."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch

from sglang_dsv41.config import ConfigError, ModelConfig, VisionConfig
from sglang_dsv41.image_input import (IMAGE, IMAGE_END, IMAGE_NEW_LINE, IMAGE_START, ImageError, decode_image,
                                      image_span, plan_image, span_types)

V = VisionConfig(n_layers=2, dim=64, n_heads=4, inter_dim=96, max_n_token=64, min_pixels=84 * 84)


def _png(w: int, h: int, color=None, seed: int = 0) -> bytes:
    from PIL import Image

    if color is None:
        pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    else:
        pixels = np.full((h, w, 3), color, dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("w, h, canvas, grid", [
    (84, 84, (84, 84), (2, 2)),        # 6 x 6 patches -> 2 x 2 positions: 2 * 3 + 2 = 8 in the span
    (100, 90, (98, 112), (3, 3)),      # ceil to patches: 7 x 8 patches -> ceil(7/3) x ceil(8/3)
    (42, 42, (84, 84), (2, 2)),        # 1764 < 7056 pixels: scaled by 2 first
    (420, 420, (294, 294), (7, 7)),    # 30 x 30 patches = 10 x 10 positions (112 > 64): shrunk to 7 x 7 (58)
])
def test_size_plan(w, h, canvas, grid):
    p = plan_image(w, h, V)
    assert (p.canvas_h, p.canvas_w) == canvas and (p.grid_h, p.grid_w) == grid
    assert p.length == grid[0] * (grid[1] + 1) + 2 <= V.max_n_token


def test_extreme_aspect_ratios_collapse_to_one_row_or_column():
    tall, wide = plan_image(10, 4000, V), plan_image(4000, 10, V)
    assert (tall.grid_w, tall.canvas_w) == (1, 42) and tall.length <= 64
    assert (wide.grid_h, wide.canvas_h) == (1, 42) and wide.length <= 64
    assert tall.grid_h == (64 - 2) // 2 and wide.grid_w == 64 - 3


def test_span_layout():
    plan = plan_image(100, 90, V)  # 3 x 3 positions
    row = [IMAGE] * 3 + [IMAGE_NEW_LINE]
    assert span_types(plan).tolist() == [IMAGE_START] + row * 3 + [IMAGE_END]


def test_patches_normalise_and_pad_with_grey():
    """A white 84 x 35 image in its 84 x 42 canvas (35 rounds up to 3 patches), centred as PIL's pad
    rounds 3.5: rows 4..38 white (+1), the 4 rows above and 3 below grey 127 ((127 / 255 - 0.5) / 0.5
    in bf16); patches in reading order."""
    span = image_span(decode_image(_png(84, 35, color=255)), replace(V, min_pixels=1))
    assert (span.plan.canvas_h, span.plan.canvas_w, span.plan.vit_h, span.plan.vit_w) == (42, 84, 3, 6)
    assert span.patches.dtype == torch.bfloat16 and span.patches.shape == (18, 3, 14, 14)
    x = span.patches.view(3, 6, 3, 14, 14).permute(2, 0, 3, 1, 4).reshape(3, 42, 84)  # back to the canvas
    grey = torch.tensor((127 / 255 - 0.5) / 0.5, dtype=torch.float32).to(torch.bfloat16)
    assert torch.all(x[:, :4] == grey) and torch.all(x[:, 39:] == grey)
    assert torch.all(x[:, 4:39] == 1.0)


def test_bad_images_raise_image_error():
    with pytest.raises(ImageError, match="cannot decode"):
        decode_image(b"not an image at all")
    with pytest.raises(ImageError, match="cannot decode"):
        decode_image(_png(20, 20)[:40])  # a truncated PNG
    with pytest.raises(ImageError, match=r"200x100 pixels exceeds the limit of 10000"):
        decode_image(_png(200, 100), max_pixels=10_000)
    with pytest.raises(ImageError, match="cannot decode"):
        decode_image(b"")
    with pytest.raises(ImageError, match="must be bytes, got str"):
        decode_image("data:image/png;base64,AAAA")
    with pytest.raises(ImageError, match="both sides must be at least 1"):
        plan_image(0, 30, V)


def test_vision_config_validation():
    from sglang_dsv41.tiny import PRESETS, hf_config

    raw = hf_config(PRESETS["tiny-vision"], 1088, 700)
    assert ModelConfig.from_hf(raw).vision.n_layers == 2
    raw["vision_config"]["num_attention_heads"] = 5
    with pytest.raises(ConfigError, match="vision_config.num_attention_heads"):
        ModelConfig.from_hf(raw)
    raw["vision_config"]["num_hidden_layers"] = 0  # text only: the other vision keys are not read
    assert ModelConfig.from_hf(raw).vision is None
