"""A checkpoint with a vision tower (the released layout: `vision.*`, `aligner.*`, `image_*`, `gate.bias_vl`) starts
and serves text through one real SGLang server on the CPU: preset tiny-vision. SGLang would take it for a
multimodal model and look for an image processor registered for our class (there is none: it stopped at
startup); the adapter serves the text model (registration.keep_v41_architecture, docs/vision.md "Not built").
Oracle: ReferenceModel on the same checkpoint, teacher-forced on the server's tokens (oracle.py): greedy tokens
equal, logprobs within LOGPROB_ATOL; image inputs are refused with a 400 naming them, and the server keeps serving."""

from __future__ import annotations

import pytest
import requests
import torch

from launch import start_server, stop_server
from oracle import teacher_forced

LOGPROB_ATOL = 1e-5
"""as test_numerics.py (docs/sglang.md tolerance table): log_softmax of the same fp32 logits on both sides."""


@pytest.fixture(scope="module")
def vision_dir(tmp_path_factory):
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_vision") / "ckpt", "tiny-vision", seed=0)


@pytest.fixture(scope="module")
def server(vision_dir, tmp_path_factory):
    srv = start_server(vision_dir, tmp_path_factory.mktemp("vision_server") / "server.log")
    yield srv
    stop_server(srv.proc)


def test_greedy_tokens_and_logprobs_equal_the_reference(server, vision_dir):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.reference.model import ReferenceModel

    ids = torch.randint(3, 900, (24,), generator=torch.Generator().manual_seed(8)).tolist()
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}
    out = requests.post(server.url + "/generate", json=body, timeout=600).json()
    toks, lps, in_lps = teacher_forced(ReferenceModel(load_model(vision_dir, progress=False)), ids, out["output_ids"])
    assert out["output_ids"] == toks
    got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    got_in = [x[0] for x in out["meta_info"]["input_token_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(got + got_in, lps + in_lps)) <= LOGPROB_ATOL


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "hi", "image_data": "data:image/png;base64,AAAA", "sampling_params": {"max_new_tokens": 1}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
        "max_tokens": 1}),
])
def test_images_are_refused_and_the_server_keeps_serving(server, path, body):
    r = requests.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 400 and "image" in r.text, r.text
    ok = requests.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=600)
    assert ok.status_code == 200 and isinstance(ok.json()["text"], str), ok.text
