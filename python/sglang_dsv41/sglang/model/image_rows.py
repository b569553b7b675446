"""The image spans of an SGLang extend forward -> the runtime's `image_rows` (docs/vision.md "Serving").

SGLang's scheduler replaces a span's `image_token_id`s by pad ids derived from the image's hash
(`pad_input_ids`: the prefix-cache key), all >= MM_PAD_SHIFT_VALUE; `remap_pad_ids` turns them back
into `image_token_id` before anything reads them (the id check, the Engram token store, the routing
bias of image rows). Each request's `MultimodalInputs` lists its images with their spans' inclusive
offsets in the prompt; `image_rows` encodes every image whose span meets the rows this forward runs
for the request (a chunk boundary may cut a span: only the chunk's part is used; a prefix-cache hit
covers the rest) and places its rows at their packed row indices.
"""

from __future__ import annotations

import torch
from sglang.srt.managers.schedule_batch import MM_PAD_SHIFT_VALUE

from sglang_dsv41.image_input import ImagePlan, ImageSpan
from sglang_dsv41.layers.transformer import DeepseekV41

PLAN_KEY = "dsv41_plan"
"""`MultimodalDataItem.model_specific_data` key of an image's plan: (canvas_h, canvas_w, grid_h, grid_w, patch)."""


def remap_pad_ids(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """int64 [N]: pad ids (>= MM_PAD_SHIFT_VALUE) -> image_token_id; other ids unchanged."""
    return torch.where(input_ids >= MM_PAD_SHIFT_VALUE, torch.full_like(input_ids, image_token_id), input_ids)


def item_span(item) -> ImageSpan:
    """One MultimodalDataItem of our processor -> its ImageSpan (start: the span's first prompt position)."""
    if hasattr(item, "reconstruct"):  # a CUDA-IPC feature from the tokenizer process -> a tensor here
        item.reconstruct(torch.cuda.current_device() if torch.cuda.is_available() else None)
    plan = ImagePlan(*item.model_specific_data[PLAN_KEY])
    start, end = item.offsets[0]
    if end - start + 1 != plan.length:
        raise ValueError(f"image item: offsets {item.offsets[0]} do not hold its {plan.length}-position span")
    return ImageSpan(torch.as_tensor(item.feature), plan, start)


def image_rows(model: DeepseekV41, mm_inputs: list | None, starts: list[int], lens: list[int]):
    """`mm_inputs[b]`: request b's MultimodalInputs or None; request b runs positions starts[b] ..
    starts[b] + lens[b] - 1 at packed rows sum(lens[:b]) + ... -> (rows int64 [M], bf16 [M, hidden])
    or None when no image span meets this forward."""
    rows, embs, base = [], [], 0
    for b, (first, n) in enumerate(zip(starts, lens)):
        mm = mm_inputs[b] if mm_inputs is not None and b < len(mm_inputs) else None
        for item in (mm.mm_items if mm is not None else ()):
            span = item_span(item)
            lo, hi = max(span.start, first), min(span.start + span.length, first + n)
            if lo < hi:
                e = model.image_embeddings(span)
                rows.append(torch.arange(base + lo - first, base + hi - first))
                embs.append(e[lo - span.start: hi - span.start])
        base += n
    if not rows:
        return None
    dev = model.embed.weight.device
    return torch.cat(rows).to(dev), torch.cat(embs)
