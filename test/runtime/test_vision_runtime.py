"""Image prompts through the paged runtime (runtime/driver.py, CPU): a prompt with two images prefilled in one
chunk next to a text-only request, then decoded token by token. Oracle: ReferenceModel (DeepSeek's forward bit
for bit, test/official/test_vision_official.py) on the same full sequence: every prefill row's logits and
each decode step's, bit for bit. Image tokens stay in the KV: the decode rows attend to them."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from sglang_dsv41.image_input import decode_image, image_span
from sglang_dsv41.reference.model import ReferenceModel
from sglang_dsv41.runtime.driver import Driver, Sequence


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return load_model(write_tiny_checkpoint(tmp_path_factory.mktemp("tv") / "ckpt", "tiny-vision"), progress=False)


def _image(w: int, h: int, seed: int):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return decode_image(buf.getvalue())


def test_image_prompt_prefill_and_decode_equal_the_reference(vision_model):
    m = vision_model
    img = m.cfg.image_token_id
    text = torch.randint(3, img - 2, (140,), generator=torch.Generator().manual_seed(5)).tolist()
    a = image_span(_image(60, 50, 1), m.cfg.vision, start=10)
    b = image_span(_image(120, 70, 2), m.cfg.vision, start=10 + a.length + 40)
    ids = text[:10] + [img] * a.length + text[10:50] + [img] * b.length + text[50:]
    decode = 3
    ref = ReferenceModel(m).forward(torch.tensor(ids), images=[a, b]).logits
    prompt = len(ids) - decode
    drv = Driver(m, 2048, 2, page_size=64, poison=True)
    seq, other = Sequence(0, list(ids), prompt), Sequence(1, text[:70], 70)
    for s in (seq, other):
        drv.pools.clear_request(s.req_slot)
    rows, embeds = m.image_rows([a, b])
    out = drv.step([seq, other], [prompt, 70], all_logits=True, image_rows=(rows, embeds))
    assert torch.equal(out.logits[:prompt], ref[:prompt])
    for t in range(prompt, len(ids)):
        got = drv.step([seq], [1]).logits
        assert torch.equal(got[0], ref[t]), t


def test_text_after_an_image_sees_it(vision_model):
    """Control: the same ids without the image embeddings (placeholder token embeddings instead) give
    other logits after the span, so the test above compares something the images decide."""
    m = vision_model
    img = m.cfg.image_token_id
    a = image_span(_image(60, 50, 1), m.cfg.vision, start=4)
    ids = [5, 6, 7, 8] + [img] * a.length + list(range(20, 150))
    with_image = ReferenceModel(m).forward(torch.tensor(ids), images=[a]).logits
    without = ReferenceModel(m).forward(torch.tensor(ids)).logits
    assert torch.equal(with_image[:4], without[:4]) and not torch.equal(with_image[-1], without[-1])
