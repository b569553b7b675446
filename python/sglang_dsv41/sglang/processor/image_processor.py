"""Images of a chat request -> the prompt's image spans, in SGLang's tokenizer process.

SGLang's renderer (deepseek-recipe) puts one `image_token_id` placeholder per image into the prompt
ids and hands the images over as `image_data` (data URLs, file paths or `file://` URLs, http(s) URLs
where SGLang's fetcher allows them, raw base64). Per image, in placeholder order: its bytes, decoded
and planned by `image_input.py` (the core's one definition of resize, patches and span layout); the
placeholder becomes `span.length` copies of `image_token_id`, and one `MultimodalDataItem` carries the
patches (bf16 [vit_h * vit_w, 3, p, p]) and the plan (`PLAN_KEY`: canvas_h, canvas_w, grid_h, grid_w,
patch), with the span's inclusive offsets. The model rebuilds the `ImageSpan` from the item
(`image_rows.py`). SGLang then hashes the patches into the span's pad ids (the prefix-cache key:
the same image twice is a cache hit) and counts the span toward the context length.

Every problem with an image is an `ImageError` (a ValueError: SGLang answers it with a 400) naming the
image by its index: unreadable bytes, an image over MAX_PIXELS, more than MAX_IMAGES images, a count of
images that differs from the prompt's placeholders, precomputed features (not supported).
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import unquote, urlparse

from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalProcessorOutput
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor, MultimodalSpecialTokens
from sglang.srt.utils import ImageData
from sglang.srt.utils.common import get_image_bytes

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.image_input import ImageError, decode_image, image_span
from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM
from sglang_dsv41.sglang.model.image_rows import PLAN_KEY

MAX_IMAGES = 16
"""Images in one request at most (each is up to `vision.max_image_tokens` positions of the context)."""
MAX_PIXELS = 64 * 1024 * 1024
"""Pixels of one image at most, read from its header before decoding (the plan shrinks large images
to the tower's size anyway; this bounds the decode's time and memory)."""


def image_bytes(source) -> bytes:
    """One `image_data` entry -> its encoded bytes (SGLang's fetcher for URLs, data URLs and base64)."""
    if isinstance(source, ImageData):
        source = source.url
    if isinstance(source, dict):
        raise ImageError("precomputed image features are not supported; send the image itself")
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if not isinstance(source, str) or not source:
        raise ImageError(f"an image is a URL, a data URL, a file path or base64 text, got {type(source).__name__}")
    if source.startswith("file://"):
        source = unquote(urlparse(source).path)
    if source.startswith("/") and not os.path.isfile(source):
        raise ImageError(f"no image file at {source}")
    return get_image_bytes(source)


class DeepseekV41ImageInput(BaseMultimodalProcessor):
    models = [DeepseekV41ForCausalLM]
    preserve_processor_input_ids = True
    prefer_tokenized_input = True

    def __init__(self, hf_config, server_args, _processor, *args, **kwargs):
        super().__init__(hf_config, server_args, _processor, *args, **kwargs)
        self.vision = ModelConfig.from_pretrained(server_args.model_path).vision
        if self.vision is None:
            raise ValueError(f"{server_args.model_path}: SGLang took the checkpoint for a vision model, but its "
                             "config has no vision tower")
        self.image_token_id = int(hf_config.image_token_id)
        self.mm_tokens = MultimodalSpecialTokens(
            image_token=_processor.convert_ids_to_tokens(self.image_token_id), image_token_id=self.image_token_id,
        ).build(_processor)

    async def process_mm_data_async(self, image_data, input_text, request_obj, *args, **kwargs):
        images = list(image_data or [])
        ids = list(input_text) if isinstance(input_text, list) else self._processor.encode(input_text)
        slots = ids.count(self.image_token_id)
        if len(images) > MAX_IMAGES:
            raise ImageError(f"{len(images)} images in one request; at most {MAX_IMAGES}")
        if slots != len(images):
            raise ImageError(f"the prompt has {slots} image placeholders for {len(images)} images")
        spans = await asyncio.to_thread(self._spans, images)
        tokens, items = [], []
        it = iter(spans)
        for t in ids:
            if t != self.image_token_id:
                tokens.append(t)
                continue
            span = next(it)
            start = len(tokens)
            tokens.extend([self.image_token_id] * span.length)
            p = span.plan
            items.append(MultimodalDataItem(
                modality=Modality.IMAGE, feature=span.patches, offsets=[(start, start + span.length - 1)],
                model_specific_data={PLAN_KEY: (p.canvas_h, p.canvas_w, p.grid_h, p.grid_w, p.patch)}))
        return MultimodalProcessorOutput(input_ids=tokens, mm_items=self._prepare_mm_items_for_transport(items),
                                         im_token_id=self.image_token_id)

    def _spans(self, images: list) -> list:
        out = []
        for i, source in enumerate(images):
            try:
                out.append(image_span(decode_image(image_bytes(source), MAX_PIXELS), self.vision))
            except ImageError as e:
                raise ImageError(f"image {i}: {e}") from None
            except (OSError, ValueError) as e:  # a fetch or base64 failure inside SGLang's loader
                raise ImageError(f"image {i}: cannot read it: {e}") from None
        return out
