"""Server numerics vs the reference model. Oracle: `ReferenceModel` full-sequence fp32 logits and routing
decisions on the same checkpoint, teacher-forced on the server's tokens (test/server/oracle.py). The server
runs the paged runtime inside SGLang's scheduler with scalar ATen kernels (ATEN_CPU_CAPABILITY=default,
inherited), so greedy tokens and routed experts must be equal and logprobs equal within LOGPROB_ATOL (see
docs/sglang.md, tolerance table). The server also runs `--enable-return-routed-experts` (on CPU; the
capture only copies expert ids and changes neither scheduling nor math), and full prefill
(`--no-enable-decoder-swa-bounded-replay`; test_swa_replay_server.py covers the replay modes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from oracle import reference_routed_experts, teacher_forced
from launch import start_server, stop_server

LOGPROB_ATOL = 1e-5
"""logprob = log_softmax of the runtime's fp32 logits in both; observed difference is 0."""


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("numerics") / "server.log"
    srv = start_server(tiny_dir, log, "--chunked-prefill-size", "64", "--enable-mixed-chunk",
                       "--enable-return-routed-experts", "--no-enable-decoder-swa-bounded-replay")
    yield srv
    stop_server(srv.proc)


def _ids(n: int, seed: int, vocab: int = 1023) -> list[int]:
    """Random ids below the tiny model's image token (1023), which SGLang rewrites in prompts."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def _generate(server, ids, n, input_logprobs=False, **extra):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, **extra}
    if input_logprobs:
        body["logprob_start_len"] = 0
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def _check(out, reference, ids, n, input_logprobs=False):
    meta = out["meta_info"]
    assert len(out["output_ids"]) == n
    toks, lps, in_lps = teacher_forced(reference, ids, out["output_ids"])
    assert out["output_ids"] == toks
    got = [x[0] for x in meta["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, lps)) <= LOGPROB_ATOL
    if input_logprobs:
        got_in = [x[0] for x in meta["input_token_logprobs"][1:]]
        assert [x[1] for x in meta["input_token_logprobs"]] == ids
        assert len(got_in) == len(in_lps)
        assert max(abs(a - b) for a, b in zip(got_in, in_lps)) <= LOGPROB_ATOL
    return meta


def test_prefill_and_decode(server, tiny_reference):
    ids = _ids(20, 1)
    _check(_generate(server, ids, 8, input_logprobs=True), tiny_reference, ids, 8, input_logprobs=True)


def test_chunked_prefill(server, tiny_reference):
    """150 prompt tokens through three 64-token chunks, input logprobs of every position."""
    ids = _ids(150, 2)
    _check(_generate(server, ids, 3, input_logprobs=True), tiny_reference, ids, 3, input_logprobs=True)


def test_prefix_cache_hit(server, tiny_reference):
    a = _ids(140, 3)
    b = a[:130] + _ids(20, 4)
    _check(_generate(server, a, 2), tiny_reference, a, 2)
    meta = _check(_generate(server, b, 4), tiny_reference, b, 4)
    assert meta["cached_tokens"] >= 128  # two 64-token pages of the shared prefix


def test_concurrent_mixed_lengths(server, tiny_reference):
    prompts = [_ids(n, 10 + n) for n in (9, 70, 41, 33)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda p: _generate(server, p, 5), prompts))
    for p, out in zip(prompts, outs):
        _check(out, tiny_reference, p, 5)


def _routed_experts(out, cfg) -> torch.Tensor:
    """meta_info["routed_experts"] (base64 int32, decoded by SGLang's own helper) -> [tokens, layers, top_k]."""
    from sglang.srt.state_capturer.routed_experts import extract_routed_experts_from_meta_info

    flat = torch.from_numpy(extract_routed_experts_from_meta_info(out).copy())
    return flat.reshape(-1, cfg.num_layers, cfg.moe.n_activated_experts)


def test_routed_experts_startup_on_cpu(server):
    assert "HostCache[routed_experts] allocated" in server.log_text()


def test_routed_experts_equal_reference(server, tiny_reference):
    """Rows = every token that ran a forward: the prompt and all generated tokens but the last."""
    cfg = tiny_reference.cfg
    ids = _ids(12, 5)
    out = _generate(server, ids, 4, return_routed_experts=True)
    got = _routed_experts(out, cfg)
    assert got.shape == (len(ids) + 4 - 1, cfg.num_layers, cfg.moe.n_activated_experts)
    assert 0 <= int(got.min()) and int(got.max()) < cfg.moe.n_routed_experts
    assert torch.equal(got, reference_routed_experts(tiny_reference, ids + out["output_ids"]))


def test_routed_experts_prefix_hit_and_start_len(server, tiny_reference):
    """Cached prefix rows come from the capture of the request that computed them (keyed by token slot);
    `routed_experts_start_len` drops the first rows. 150 tokens also run as three 64-token chunks."""
    a = _ids(150, 6)
    b = a[:140] + _ids(10, 7)
    _generate(server, a, 1)
    out = _generate(server, b, 3, return_routed_experts=True, routed_experts_start_len=100)
    assert out["meta_info"]["cached_tokens"] >= 128
    expected = reference_routed_experts(tiny_reference, b + out["output_ids"])[100:]
    assert torch.equal(_routed_experts(out, tiny_reference.cfg), expected)
