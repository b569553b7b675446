"""`--speculative-algorithm DSPARK` through SGLang's real server on CPU (issue 30, Build 5).

One server of the embedded default `deepseek-v4.1-tiny` (its trained 1-stage drafter, gamma 5) with
DSPARK and `--decode-log-interval 1`. Oracle: the reference forward, teacher-forced over the server's
tokens (oracle.py): greedy output through draft + verify must be the reference's greedy continuation
token for token, EOS, stop strings and max_tokens inside a block included.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from launch import start_server, stop_server
from oracle import teacher_forced

MODEL = "deepseek-v4.1-tiny"
GAMMA = 5
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("dspark") / "server.log"
    srv = start_server(MODEL, log, "--speculative-algorithm", "DSPARK", "--decode-log-interval", "1",
                       "--max-running-requests", "8")
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="module")
def renderer():
    from sglang_dsv41.train.task import ChatRenderer

    return ChatRenderer(MODEL)


@pytest.fixture(scope="module")
def reference():
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.reference.model import ReferenceModel

    return ReferenceModel(load_model(MODEL, progress=False))


@pytest.fixture(scope="module")
def prompts(renderer):
    from sglang_dsv41.train.dspark import sample_problems

    return [renderer.prompt(p.question) for p in sample_problems({1: 1, 2: 4}, 8, "test", seed=3)]


def _generate(server, ids, **sampling):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 24, "temperature": 0, **sampling}}
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def greedy(server, prompts):
    """The 8 prompts at once (one decode batch), greedy, up to 24 new tokens or EOS."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: _generate(server, p), prompts))


def test_startup_report_shows_the_drafter(server):
    log = server.log_text()
    assert "DSPARK drafter (checkpoint mtp.*): 1 window-only stage(s)" in log
    assert f"gamma {GAMMA} drafts, chain verify of {GAMMA + 1} rows" in log
    assert "+ 1 drafter stage(s)" in log  # its window KV is in the bytes per token slot


def test_greedy_is_the_reference_continuation(greedy, prompts, reference, renderer):
    for p, out in zip(prompts, greedy):
        new = out["output_ids"]
        assert new and new[-1] == renderer.eos_id and out["meta_info"]["finish_reason"]["type"] == "stop"
        want, _, _ = teacher_forced(reference, p, new)
        assert new == want


def test_speculative_metrics_per_request(greedy):
    lengths = []
    for out in greedy:
        meta = out["meta_info"]
        verifies, tokens = meta["spec_verify_ct"], meta["completion_tokens"]
        assert 0 < verifies < tokens  # the prefill's token, then several tokens per verify
        assert meta["spec_accept_length"] == pytest.approx(tokens / verifies)
        assert 0 <= meta["spec_num_correct_drafts"] <= verifies * GAMMA
        lengths.append(meta["spec_accept_length"])
    # the trained drafter (held-out accept length about 4 of 6 on these prompts): far above 1
    assert sum(lengths) / len(lengths) > 2.5, lengths


def test_accept_length_log_line_and_server_info(server, greedy):
    found = [float(x) for x in re.findall(r"accept len: ([\d.]+), accept rate: [\d.]+", server.log_text())]
    assert found and all(1.0 <= x <= GAMMA + 1 for x in found)
    info = requests.get(server.url + "/server_info", timeout=30).json()
    avg = info["internal_states"][0]["avg_spec_accept_length"]
    assert 1.0 < avg <= GAMMA + 1


def test_max_tokens_and_stop_string_inside_a_block(server, greedy, prompts, renderer):
    p, full = prompts[0], greedy[0]["output_ids"]
    for n in (1, 2, 3, 4):  # every cut point inside the first verify's block
        out = _generate(server, p, max_new_tokens=n)
        assert out["output_ids"] == full[:n] and out["meta_info"]["finish_reason"]["type"] == "length"
    text = renderer.tokenizer.decode(full)
    stop = text[len(text) // 2 : len(text) // 2 + 1]
    out = _generate(server, p, stop=[stop])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]


def test_logprobs_of_accepted_tokens(server, prompts, reference):
    body = {"input_ids": prompts[1], "sampling_params": {"max_new_tokens": 12, "temperature": 0},
            "return_logprob": True}
    out = requests.post(server.url + "/generate", json=body, timeout=600).json()
    new = out["output_ids"]
    got = [lp for lp, _tok, _ in out["meta_info"]["output_token_logprobs"]]
    assert [tok for _lp, tok, _ in out["meta_info"]["output_token_logprobs"]] == new
    _, want, _ = teacher_forced(reference, prompts[1], new)
    assert got == pytest.approx(want, abs=LOGPROB_ATOL)


def test_sampled_chat_request(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 37+48?"}], "max_tokens": 16,
            "temperature": 1.0, "top_p": 0.9, "top_k": 20, "seed": 1}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("sampling", [{"frequency_penalty": 0.5}, {"repetition_penalty": 1.2}, {"min_new_tokens": 4},
                                      {"regex": "[0-9]+"}, {"logit_bias": {"5": 2.0}}])
def test_what_the_speculative_step_does_not_apply_is_refused(server, prompts, sampling):
    body = {"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 4, **sampling}}
    r = requests.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 400
    assert next(iter(sampling)) in r.text and "DSPARK" in r.text
    assert _generate(server, prompts[0], max_new_tokens=2)["output_ids"]  # the server still answers
