"""Both SWA bounded-replay modes through SGLang's real server on CPU (spec attention 7).

One server with `--enable-encoder-swa-bounded-replay` and the decoder flag left to its default
(resolved on). Oracle: the reference forward with the same replay semantics
(`ReferenceModel.forward(decoder_tail_replay=, prefix_hit=)`); prompt logprobs must equal full
prefill, because such requests run every prompt row.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from launch import start_server, stop_server
from oracle import teacher_forced

LOGPROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("swa_replay") / "server.log"
    srv = start_server(tiny_dir, log, "--enable-encoder-swa-bounded-replay", "--max-running-requests", "8",
                       env={"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"})
    yield srv
    stop_server(srv.proc)


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1023, (n,), generator=g).tolist()  # below the image token


def _generate(server, ids, n, **extra):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, **extra}
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def _first_logprob(reference, ids, **replay) -> tuple[int, float]:
    lp = torch.log_softmax(reference.forward(torch.tensor(ids), **replay).logits[-1].float(), -1)
    return int(lp.argmax()), lp.max().item()


def test_startup_report_shows_both_modes(server):
    log = server.log_text()
    assert "decoder (tail-only prefill from layer" in log and "): on" in log
    assert "encoder (window KV in request rings, rebuilt on prefix hits): on" in log
    assert "none (request rings)" in log and "window ring per request slot" in log


def test_prompt_logprobs_equal_full_prefill(server, tiny_reference):
    """A prompt-logprob request runs its whole extend through every layer: full-prefill numbers."""
    ids = _ids(200, 1)
    out = _generate(server, ids, 2, logprob_start_len=0)
    toks, lps, in_lps = teacher_forced(tiny_reference, ids, out["output_ids"])
    got_in = [x[0] for x in out["meta_info"]["input_token_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(got_in, in_lps)) <= LOGPROB_ATOL
    assert out["output_ids"][0] == toks[0]


def test_long_prompt_runs_the_tail_only(server, tiny_reference):
    ids = _ids(200, 2)
    out = _generate(server, ids, 3)
    tok, lp = _first_logprob(tiny_reference, ids, decoder_tail_replay=True)
    assert out["output_ids"][0] == tok
    assert abs(out["meta_info"]["output_token_logprobs"][0][0] - lp) <= LOGPROB_ATOL


def test_prefix_hit_replays_the_last_window(server, tiny_reference):
    a = _ids(200, 3)
    b = a[:192] + _ids(20, 4)
    _generate(server, a, 1)
    out = _generate(server, b, 2)
    hit = out["meta_info"]["cached_tokens"]
    assert hit == 192  # three 64-token pages: compressed KV and index keys only
    tok, lp = _first_logprob(tiny_reference, b, decoder_tail_replay=True, prefix_hit=hit)
    assert out["output_ids"][0] == tok
    assert abs(out["meta_info"]["output_token_logprobs"][0][0] - lp) <= LOGPROB_ATOL


def test_load_with_aborts_leaves_no_leak(server):
    """Concurrent hits and misses, some aborted mid-stream; then SGLang's strict idle check (every
    token slot back in the allocator) runs for a few loops. Rings are per request slot, fixed."""
    base = _ids(160, 5)

    def one(i):
        ids = base[: 128 + 32 * (i % 2)] + _ids(8, 100 + i)  # hits of 128 (2 pages) and misses
        if i % 2 == 0:
            body = {"input_ids": ids, "stream": True,
                    "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}
            with requests.post(server.url + "/generate", json=body, stream=True, timeout=300) as r:
                next(r.iter_lines())
            return None
        return _generate(server, ids, 4)["output_ids"]

    with ThreadPoolExecutor(5) as pool:
        outs = list(pool.map(one, range(5)))
    assert all(o is None or len(o) == 4 for o in outs)
    t0 = time.monotonic()
    while "Cache flushed." not in requests.post(server.url + "/flush_cache", timeout=30).text:
        assert time.monotonic() - t0 < 120
        time.sleep(1)
    time.sleep(3)
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert "memory leak detected" not in server.log_text() and server.proc.poll() is None


def test_rejected_combination_fails_at_startup(tiny_dir):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model", str(tiny_dir),
           "--enable-encoder-swa-bounded-replay", "--max-running-requests", "8", "--enable-mixed-chunk"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "--enable-mixed-chunk: --enable-encoder-swa-bounded-replay does not support mixed prefill/decode " \
           "batches yet" in p.stdout + p.stderr
