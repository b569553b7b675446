"""Image input == DeepSeek's own vision path, bit for bit (issue: image input). Oracle: the official V4.1
reference in `../shared/official` (official_capture.py `vision`: its `load_image`, span layout and
`Transformer.forward(images=, token_types=)`; skipped, naming the folder, when it is absent).

Checkpoint: `sglang_dsv41.tiny` preset tiny-vision (seed 0: the tiny backbone with a 2-block ViT, hidden
64, at most 64 positions per image). Images: seeded random RGB PNGs of 50x40 (scaled up to min_pixels),
200x90 (shrunk to fit 64 positions) and 30x300 (one column), placed between 150 text ids; and one
prompt with a single image. Compared: our size plan and bf16 patches (image_input.py) against DeepSeek's
preprocessing, the expanded ids, then ReferenceModel's fp32 logits of every row and the routed experts
of every layer. Controls show the comparison can fail: routing image rows with the plain router bias, or
letting image tokens into the Engram n-grams, changes the result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import official_capture as oc

pytestmark = pytest.mark.skipif(not oc.official_available(), reason=oc.skip_reason())

SIZES = [(50, 40), (200, 90), (30, 300)]
TEXT = 150


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    from PIL import Image

    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.tiny import write_tiny_checkpoint

    tmp = tmp_path_factory.mktemp("vision")
    ckpt = write_tiny_checkpoint(tmp / "ckpt", "tiny-vision", seed=0)
    model = load_model(ckpt, progress=False)
    rng = np.random.default_rng(0)
    paths = []
    for i, (w, h) in enumerate(SIZES):
        paths.append(tmp / f"image{i}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    img = model.cfg.image_token_id
    text = torch.randint(3, img - 2, (TEXT,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = {"three": text[:20] + [img] + text[20:70] + [img] + text[70:100] + [img] + text[100:],
               "one": text[:60] + [img] + text[60:]}
    images = {"three": paths, "one": paths[1:2]}
    threads = torch.get_num_threads()
    official = {}
    for name in prompts:  # one worker at a time: each holds an official model
        work = tmp / name
        work.mkdir()
        official[name] = oc.OfficialVision(ckpt, prompts[name], images[name], work, threads).result()
    return model, prompts, images, official


def _ours(model, ids, paths):
    """Expand each placeholder into its span (our preprocessing) -> (ids, spans)."""
    from sglang_dsv41.image_input import decode_image, image_span

    img, out, spans, it = model.cfg.image_token_id, [], [], iter(paths)
    for t in ids:
        if t != img:
            out.append(t)
            continue
        spans.append(image_span(decode_image(next(it).read_bytes()), model.cfg.vision, start=len(out)))
        out += [img] * spans[-1].length
    return torch.tensor(out), spans


@pytest.mark.parametrize("name", ["three", "one"])
def test_preprocessing_equals_deepseeks(case, name):
    model, prompts, images, official = case
    ids, spans = _ours(model, prompts[name], images[name])
    want = official[name]
    assert torch.equal(ids, want["ids"])
    for span, patches, grid in zip(spans, want["patches"], want["grids"], strict=True):
        p = span.plan
        assert [p.vit_h, p.vit_w, p.grid_h, p.grid_w] == grid
        assert torch.equal(span.patches, patches)
    types = torch.full_like(ids, -1)
    for span in spans:
        types[span.start: span.start + span.length] = span.types
    assert torch.equal(types, want["types"])


@pytest.mark.parametrize("name", ["three", "one"])
def test_forward_equals_deepseeks(case, name):
    from sglang_dsv41.reference.model import ReferenceModel

    model, prompts, images, official = case
    ids, spans = _ours(model, prompts[name], images[name])
    out = ReferenceModel(model).forward(ids, images=spans)
    want = official[name]
    assert torch.equal(out.logits, want["logits"])
    for layer, experts in want["routed_experts"].items():
        assert torch.equal(out.decisions.routed_experts[layer].to(torch.int32), experts.reshape(-1, experts.size(-1)))


def test_controls_change_the_result(case):
    """The VL router bias and the Engram masking of image tokens are both visible in the oracle."""
    from sglang_dsv41.engram_hash import EngramHasher
    from sglang_dsv41.reference.model import ReferenceModel

    model, prompts, images, official = case
    ids, spans = _ours(model, prompts["three"], images["three"])
    want = official["three"]
    gates = [layer.ffn.gate for layer in model.layers]
    saved = [g.bias_vl.clone() for g in gates]
    try:
        for g in gates:
            g.bias_vl.copy_(g.bias)
        plain = ReferenceModel(model).forward(ids, images=spans)
    finally:
        for g, b in zip(gates, saved):
            g.bias_vl.copy_(b)
    assert any(not torch.equal(plain.decisions.routed_experts[l].to(torch.int32), e.reshape(-1, e.size(-1)))
               for l, e in want["routed_experts"].items())
    hasher = model.hasher
    try:
        model.hasher = EngramHasher(model.cfg.engram, model.engram_token_map)  # image ids hash like text
        leaky = ReferenceModel(model).forward(ids, images=spans)
    finally:
        model.hasher = hasher
    assert not torch.equal(leaky.logits, want["logits"])
