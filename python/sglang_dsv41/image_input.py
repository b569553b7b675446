"""One image as the model takes it (spec model 6.4): the size plan, the ViT patches, the span layout.

    image = decode_image(data)                       # PIL RGB image; ImageError on anything unreadable
    span = image_span(image, cfg.vision)             # ImageSpan: patches bf16 [n_vit_h * n_vit_w, 3, p, p], types
    ids = text_ids[:k] + [cfg.image_token_id] * span.length + text_ids[k:]

Size plan (`plan_image`), from the original width w and height h:
  1. with max_wh_ratio R: w = min(w, h * R);
  2. fewer than min_pixels pixels: both sides scaled by sqrt(min_pixels / (w h)), truncated;
  3. each side rounded up to a multiple of the patch size p: the pixel canvas;
  4. the LLM grid is ceil(canvas / p / r) per side (r = downsample ratio); the span holds
     rows * (cols + 1) + 2 positions (a newline per row, start and end markers). Past max_n_token the
     canvas shrinks, aspect kept, to the largest whole number of r*p cells that fits (a single column
     or row for extreme aspect ratios).
Pixels: the image is fitted into the canvas, aspect kept and centred on grey (127, 127, 127) (PIL's
`ImageOps.pad`, bicubic), or stretched to it when max_wh_ratio is set and w >= R h; then
(x / 255 - 0.5) / 0.5 per RGB channel, in bf16, cut into p x p patches in reading order (channel-major
inside a patch).
Span layout: IMAGE_START, then per LLM row its cols IMAGE positions and one IMAGE_NEW_LINE, then
IMAGE_END; every position carries `image_token_id`, the types tell them apart. The IMAGE positions
take the aligner's rows in reading order, the markers their learned vectors (layers/transformer.py).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch

from sglang_dsv41.config import VisionConfig

TEXT, IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END = -1, 0, 1, 2, 3
GREY = (127, 127, 127)


class ImageError(ValueError):
    """An image that cannot be decoded or planned (the message names the problem)."""


@dataclass(frozen=True)
class ImagePlan:
    canvas_h: int
    canvas_w: int
    """pixel size the image is fitted into (multiples of the patch size)."""
    grid_h: int
    grid_w: int
    """LLM positions per column / row of the aligner grid."""
    patch: int

    @property
    def vit_h(self) -> int:
        return self.canvas_h // self.patch

    @property
    def vit_w(self) -> int:
        return self.canvas_w // self.patch

    @property
    def length(self) -> int:
        """positions of the span: grid_h rows of (grid_w + newline), plus the two markers."""
        return span_length(self.grid_h, self.grid_w)


def span_length(grid_h: int, grid_w: int) -> int:
    return grid_h * (grid_w + 1) + 2


def _grid(canvas_h: int, canvas_w: int, v: VisionConfig) -> tuple[int, int]:
    p, r = v.patch_size, v.downsample_ratio
    return -(-(canvas_h // p) // r), -(-(canvas_w // p) // r)


def _shrunk_canvas(h: float, w: float, v: VisionConfig) -> tuple[int, int]:
    """The largest aspect-preserving canvas whose span fits max_n_token (solving
    gh (gw + 1) + 2 <= max for gh = gw * h / w), in whole cells of r * p pixels."""
    p, cell, budget = v.patch_size, v.patch_size * v.downsample_ratio, v.max_n_token
    aspect = h / w
    cols = math.sqrt((budget - 2) / aspect + 0.25) - 0.5
    rows = cols * aspect
    if cols < 1.0:  # very tall: one column
        return (budget - 2) // 2 * cell, cell
    if rows < 1.0:  # very wide: one row
        return cell, (budget - 3) * cell
    scale = min(math.floor(cols) * cell / w, math.floor(rows) * cell / h)
    return math.floor(h * scale / p) * p, math.floor(w * scale / p) * p


def plan_image(width: int, height: int, v: VisionConfig) -> ImagePlan:
    """The size plan of an image of `width` x `height` pixels (module docstring). Raises ImageError
    for an empty image."""
    if width < 1 or height < 1:
        raise ImageError(f"image of {width}x{height} pixels: both sides must be at least 1")
    p = v.patch_size
    w, h = width, height
    if v.max_wh_ratio is not None and w > h * v.max_wh_ratio:
        w = h * v.max_wh_ratio
    if w * h < v.min_pixels:
        up = (v.min_pixels / (w * h)) ** 0.5
        w, h = int(w * up), int(h * up)
    canvas_h, canvas_w = math.ceil(h / p) * p, math.ceil(w / p) * p
    grid_h, grid_w = _grid(canvas_h, canvas_w, v)
    if span_length(grid_h, grid_w) > v.max_n_token:
        canvas_h, canvas_w = _shrunk_canvas(h, w, v)
        grid_h, grid_w = _grid(canvas_h, canvas_w, v)
    if span_length(grid_h, grid_w) > v.max_n_token or min(canvas_h, canvas_w) < p:
        raise ImageError(f"image of {width}x{height} pixels has no size plan within {v.max_n_token} positions")
    return ImagePlan(canvas_h, canvas_w, grid_h, grid_w, p)


def decode_image(data: bytes, max_pixels: int | None = None):
    """Encoded image bytes (PNG, JPEG, WebP, GIF, BMP, ...) -> a PIL RGB image. Raises ImageError on
    bytes PIL cannot read, and on an image larger than `max_pixels` (checked from the header, before
    the pixels are decoded)."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"image data must be bytes, got {type(data).__name__}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if max_pixels is not None and w * h > max_pixels:
                raise ImageError(f"image of {w}x{h} pixels exceeds the limit of {max_pixels} pixels")
            return img.convert("RGB")
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError(f"cannot decode the image: {e}") from None


def span_types(plan: ImagePlan) -> torch.Tensor:
    """int64 [plan.length]: the span's position types (IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END)."""
    row = [IMAGE] * plan.grid_w + [IMAGE_NEW_LINE]
    return torch.tensor([IMAGE_START] + row * plan.grid_h + [IMAGE_END], dtype=torch.int64)


def image_patches(image, plan: ImagePlan, v: VisionConfig) -> torch.Tensor:
    """PIL RGB image -> bf16 [vit_h * vit_w, 3, p, p] (module docstring: fit, normalise, cut)."""
    from PIL import ImageOps

    size = (plan.canvas_w, plan.canvas_h)
    w, h = image.size
    if v.max_wh_ratio is not None and w >= v.max_wh_ratio * h:
        fitted = image.resize(size)
    else:
        fitted = ImageOps.pad(image, size, color=GREY)
    x = torch.from_numpy(np.asarray(fitted, dtype=np.float32)).permute(2, 0, 1) / 255
    x = ((x - 0.5) / 0.5).to(torch.bfloat16)  # [3, H, W]
    p = plan.patch
    return x.reshape(3, plan.vit_h, p, plan.vit_w, p).permute(1, 3, 0, 2, 4).reshape(plan.vit_h * plan.vit_w, 3, p, p)


@dataclass
class ImageSpan:
    """One image of a prompt: where its span starts, its patches and layout."""

    patches: torch.Tensor
    """bf16 [plan.vit_h * plan.vit_w, 3, p, p]."""
    plan: ImagePlan
    start: int = 0
    """row of the span's first position (IMAGE_START) in the sequence."""

    @property
    def length(self) -> int:
        return self.plan.length

    @property
    def types(self) -> torch.Tensor:
        return span_types(self.plan)


def image_span(image, v: VisionConfig, start: int = 0) -> ImageSpan:
    """A decoded PIL image -> its ImageSpan (patches in bf16 on the CPU)."""
    plan = plan_image(image.size[0], image.size[1], v)
    return ImageSpan(image_patches(image, plan, v), plan, start)
