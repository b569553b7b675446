"""Images through one real SGLang server on the CPU (preset tiny-vision: a 2-block vision tower in the released
layout, the tokenizer's `<｜deepseek_image｜>` at `image_token_id`), prefill chunks of 64 tokens so that image spans
are cut by chunk boundaries. Oracle: ReferenceModel on the same checkpoint with the same image spans
(`image_input.image_span` of the same bytes), teacher-forced on the server's tokens (oracle.py): greedy tokens
equal, logprobs within LOGPROB_ATOL. Also: the OpenAI chat path (deepseek-recipe renders the placeholder), the
prefix cache (the same image twice), bad images (a 400 naming the problem while the server keeps serving), and a
second server with the default flags (decoder SWA replay on) against the tail-replay reference."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
import requests
import torch

from launch import start_server, stop_server
from oracle import teacher_forced

LOGPROB_ATOL = 1e-5
"""as test_numerics.py (docs/sglang.md tolerance table): log_softmax of the same fp32 logits on both sides."""
CHUNK = 64
"""--chunked-prefill-size (a multiple of the page size, 64)."""


def _png(w: int, h: int, seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _png_header(w: int, h: int) -> bytes:
    """A PNG of w x h pixels as far as its header says, with no pixel data: what a reader learns before decoding."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory):
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_vision") / "ckpt", "tiny-vision", seed=0)


@pytest.fixture(scope="module")
def reference(vision_dir):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.reference.model import ReferenceModel

    return ReferenceModel(load_model(vision_dir, progress=False))


@pytest.fixture(scope="module")
def server(vision_dir, tmp_path_factory):
    # decoder SWA replay off: the reference runs images in one plain prefill (as test_numerics.py)
    srv = start_server(vision_dir, tmp_path_factory.mktemp("vision_server") / "server.log",
                       "--chunked-prefill-size", str(CHUNK), "--no-enable-decoder-swa-bounded-replay")
    yield srv
    stop_server(srv.proc)


def _generate(server, ids, images=None, new=4, input_logprobs=True):
    """Greedy; input logprobs of every prompt position make SGLang recompute the prompt (no prefix-cache hit)."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0 if input_logprobs else -1}
    if images:
        body["image_data"] = [_data_url(x) for x in images]
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def _expanded(reference, ids, images):
    """The prompt as the server runs it: each placeholder becomes its image's span."""
    from sglang_dsv41.image_input import decode_image, image_span

    cfg = reference.model.cfg
    out, spans, it = [], [], iter(images)
    for t in ids:
        if t != cfg.image_token_id:
            out.append(t)
            continue
        span = image_span(decode_image(next(it)), cfg.vision, start=len(out))
        spans.append(span)
        out += [cfg.image_token_id] * span.length
    return out, spans


def _check_against_reference(reference, ids, images, out):
    full, spans = _expanded(reference, ids, images)
    seq = full + out["output_ids"]
    lp = torch.log_softmax(reference.forward(torch.tensor(seq), images=spans).logits.float(), -1)
    rows = range(len(full) - 1, len(seq) - 1)
    assert out["output_ids"] == [int(lp[r].argmax()) for r in rows]
    want = [lp[r, seq[r + 1]].item() for r in rows]
    got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    if out["meta_info"].get("input_token_logprobs"):
        want += [lp[j - 1, seq[j]].item() for j in range(1, len(full))]
        got += [x[0] for x in out["meta_info"]["input_token_logprobs"][1:]]
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) <= LOGPROB_ATOL
    return full


def test_text_greedy_tokens_and_logprobs_equal_the_reference(server, reference):
    ids = torch.randint(3, 900, (24,), generator=torch.Generator().manual_seed(8)).tolist()
    out = _generate(server, ids)
    toks, lps, in_lps = teacher_forced(reference, ids, out["output_ids"])
    assert out["output_ids"] == toks
    got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    got_in = [x[0] for x in out["meta_info"]["input_token_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(got + got_in, lps + in_lps)) <= LOGPROB_ATOL


def test_two_images_cut_by_chunks_equal_the_reference(server, reference):
    img = reference.model.cfg.image_token_id
    ids = list(range(20, 80)) + [img, 41, 42, 43, 44, 45, img, 7, 8]  # span 0 at 60..69: cut at 64
    images = [_png(60, 40, 1), _png(30, 90, 2)]
    out = _generate(server, ids, images)
    full = _check_against_reference(reference, ids, images, out)
    assert out["meta_info"]["prompt_tokens"] == len(full)  # the spans count toward the prompt
    spans = _expanded(reference, ids, images)[1]
    assert any(s.start < k * CHUNK < s.start + s.length for s in spans for k in range(1, 4))  # a chunk cut a span


def test_the_same_image_again_hits_the_prefix_cache(server, reference):
    img = reference.model.cfg.image_token_id
    # the span inside the first 64-token page; the prompt long enough that whole pages stay cached past the
    # window that decoder SWA replay (on by default) recomputes
    ids = list(range(100, 130)) + [img] + list(range(200, 600))
    images = [_png(50, 50, 3)]
    first = _generate(server, ids, images, input_logprobs=False)
    again = _generate(server, ids, images, input_logprobs=False)
    assert again["output_ids"] == first["output_ids"]
    assert first["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] >= 2 * CHUNK
    _check_against_reference(reference, ids, images, again)
    other = _generate(server, ids, [_png(50, 50, 4)], input_logprobs=False)  # another image, same size: its own KV
    _check_against_reference(reference, ids, [_png(50, 50, 4)], other)


def test_chat_image_url_is_served(server, reference):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"},
                                                      {"type": "image_url", "image_url": {"url": _data_url(_png(64, 48, 5))}}]}],
            "max_tokens": 3, "temperature": 0}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    span = _expanded(reference, [reference.model.cfg.image_token_id], [_png(64, 48, 5)])[0]
    assert r.json()["usage"]["prompt_tokens"] > len(span)


@pytest.mark.parametrize("case, images, placeholders, want", [
    ("corrupt", [b"not an image at all"], 1, "image 0: cannot decode"),
    ("empty", [b""], 1, "image 0"),
    ("gigantic", [_png_header(9000, 9000)], 1, "image of 9000x9000 pixels exceeds the limit"),
    ("decompression bomb", [_png_header(20000, 20000)], 1, "image 0: cannot decode"),
    ("zero size", [_png_header(0, 0)], 1, "image 0"),
    ("placeholders", [b"x", b"y"], 1, "1 image placeholders for 2 images"),
    ("too many", [b"x"] * 17, 17, "17 images in one request; at most 16"),
])
def test_bad_images_get_a_400_and_the_server_keeps_serving(server, reference, case, images, placeholders, want):
    ids = [5, 6] + [reference.model.cfg.image_token_id] * placeholders
    body = {"input_ids": ids, "image_data": [_data_url(x) for x in images], "sampling_params": {"max_new_tokens": 1}}
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 400 and want in r.text, (case, r.status_code, r.text)
    ok = requests.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=600)
    assert ok.status_code == 200 and isinstance(ok.json()["text"], str), ok.text


@pytest.mark.parametrize("path, body, want", [
    ("/generate", {"text": "hi", "video_data": "data:video/mp4;base64,AAAA", "sampling_params": {"max_new_tokens": 1}},
     "video_data"),
    ("/generate", {"input_ids": [5, 1023], "image_data": ["/no/such/image.png"], "sampling_params": {"max_new_tokens": 1}},
     "no image file at /no/such/image.png"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [  # deepseek-recipe takes data and http(s) URLs
        {"type": "image_url", "image_url": {"url": "file:///no/such/image.png"}}]}], "max_tokens": 1}, "image_url"),
])
def test_other_bad_media_get_a_400(server, path, body, want):
    r = requests.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 400 and want in r.text, r.text


def test_image_positions_count_toward_the_prompt_limit(server, reference):
    """A prompt that fits as text but not once its placeholder becomes the image's span: the 400 counts the span."""
    limit = requests.get(server.url + "/server_info", timeout=30).json()["max_req_input_len"]
    images = [_png(60, 40, 1)]
    span = _expanded(reference, [reference.model.cfg.image_token_id], images)[0]
    n = limit - len(span) + 1  # text ids + the placeholder: under the limit; expanded: limit tokens
    ids = [5 + i % 50 for i in range(n - 1)] + [reference.model.cfg.image_token_id]
    body = {"input_ids": ids, "image_data": [_data_url(x) for x in images], "sampling_params": {"max_new_tokens": 1}}
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 400 and f"the prompt has {limit} tokens" in r.text, r.text[:300]


@pytest.fixture(scope="module")
def replay_server(vision_dir, tmp_path_factory):
    """The default flags: decoder SWA bounded replay on, SGLang's default prefill chunk (one chunk here)."""
    srv = start_server(vision_dir, tmp_path_factory.mktemp("vision_replay_server") / "server.log")
    yield srv
    stop_server(srv.proc)


def test_images_under_decoder_replay_equal_the_tail_replay_reference(replay_server, reference):
    """The late layers run on the prompt's last window rows only: image 0 lies before those rows, image 1 inside."""
    img = reference.model.cfg.image_token_id
    ids = list(range(100, 150)) + [img] + list(range(150, 400)) + [img] + [5, 6, 7]
    images = [_png(60, 40, 6), _png(30, 90, 7)]
    full, spans = _expanded(reference, ids, images)
    tail = len(full) - reference.model.cfg.attention.window_size
    assert spans[0].start + spans[0].length <= tail <= spans[1].start
    out = _generate(replay_server, ids, images, new=1, input_logprobs=False)
    lp = torch.log_softmax(reference.forward(torch.tensor(full), decoder_tail_replay=True, images=spans).logits[-1].float(), -1)
    assert out["output_ids"] == [int(lp.argmax())]
    assert abs(out["meta_info"]["output_token_logprobs"][0][0] - lp.max().item()) <= LOGPROB_ATOL
