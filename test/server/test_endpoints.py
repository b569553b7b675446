"""End to end through SGLang's real server (HTTP + tokenizer manager + scheduler + detokenizer) on the
tiny checkpoint: OpenAI and native endpoints, bad inputs, disconnects, no KV leak. Oracle for
content: the server itself (greedy determinism) and deepseek-recipe's V4.1 chat rendering."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import deepseek_recipe as dr
import openai
import pytest
import requests

from launch import start_server, stop_server


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("endpoints") / "server.log"
    # Strict idle check: SGLang's scheduler raises if, when idle, free + cached slots != pool size.
    srv = start_server(tiny_dir, log, env={"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"})
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300)


def _model(server) -> str:
    return requests.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]


def test_health_models_and_startup_report(server, tiny_dir):
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert _model(server) == str(tiny_dir)
    log = server.log_text()
    assert "DeepSeek-V4.1 (sglang-dsv41) serving report" in log
    assert "layer  6  ratio 1  rope yarn  KV source, index source, candidate source" in log
    assert "type=DeepseekV41ForCausalLM" in log  # our class, not SGLang's DeepseekV4ForCausalLM


def test_completion_greedy_max_tokens_and_logprobs(server, client):
    r = client.completions.create(model=_model(server), prompt="Hello, DeepSeek", max_tokens=5, temperature=0,
                                  logprobs=2)
    c = r.choices[0]
    assert r.usage.completion_tokens == 5 and c.finish_reason == "length" and c.text
    assert len(c.logprobs.token_logprobs) == 5 and all(lp <= 0 for lp in c.logprobs.token_logprobs)
    assert all(len(t) == 2 for t in c.logprobs.top_logprobs)
    again = client.completions.create(model=_model(server), prompt="Hello, DeepSeek", max_tokens=5, temperature=0)
    assert again.choices[0].text == c.text


def test_streaming_equals_non_streaming(server, client):
    kw = dict(model=_model(server), prompt="Stream me", max_tokens=6, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    parts = [ch.choices[0].text for ch in client.completions.create(stream=True, **kw) if ch.choices]
    assert len(parts) > 1 and "".join(parts) == full


def test_n_greater_than_one(server, client):
    r = client.completions.create(model=_model(server), prompt="Pick", max_tokens=3, n=3, temperature=1.0)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 9


def test_stop_string(server, client):
    kw = dict(model=_model(server), prompt="Stop here", temperature=0)
    ids = requests.post(server.url + "/generate", json={"text": "Stop here", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}, timeout=300).json()["output_ids"]
    stop = requests.post(server.url + "/detokenize", json={"tokens": ids[3:5]}, timeout=60)
    stop_text = stop.json()["text"] if stop.ok else client.completions.create(max_tokens=8, **kw).choices[0].text[4:7]
    r = client.completions.create(max_tokens=8, stop=[stop_text], **kw).choices[0]
    assert r.finish_reason == "stop" and stop_text not in r.text


def test_chat_rendered_with_deepseek_recipe(server, client, tiny_tokenizer):
    prompt = dr.DeepseekV41Encoding().render_conversation(
        dr.Conversation([dr.UserMessage("Hi there")], thinking_mode=False)).prompt
    r = client.chat.completions.create(model=_model(server), messages=[{"role": "user", "content": "Hi there"}],
                                       max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == len(tiny_tokenizer(prompt, add_special_tokens=False).input_ids)
    gen = requests.post(server.url + "/generate", json={"text": prompt, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}}, timeout=300).json()
    assert r.choices[0].message.content == gen["text"]
    chunks = client.chat.completions.create(model=_model(server), messages=[{"role": "user", "content": "Hi there"}],
                                            max_tokens=4, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == gen["text"]


def test_generate_return_logprob(server):
    out = requests.post(server.url + "/generate", json={"input_ids": [5, 6, 7, 8, 9], "sampling_params": {
        "max_new_tokens": 3, "temperature": 0}, "return_logprob": True, "logprob_start_len": 0,
        "top_logprobs_num": 2}, timeout=300).json()
    meta = out["meta_info"]
    assert [x[1] for x in meta["input_token_logprobs"]] == [5, 6, 7, 8, 9]
    assert [x[1] for x in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(len(t) == 2 for t in meta["output_top_logprobs"])


@pytest.mark.parametrize("body, fragment", [
    ({"prompt": [5] * 40000, "max_tokens": 2}, "context length"),
    ({"prompt": "hi", "max_tokens": 100000}, "maximum context length"),
    ({"prompt": "hi", "max_tokens": 1, "temperature": -1}, "temperature"),
    ({"prompt": "hi", "max_tokens": 1, "top_p": 2}, "top_p"),
])
def test_bad_requests_get_4xx(server, body, fragment):
    r = requests.post(server.url + "/v1/completions", json={"model": _model(server), **body}, timeout=120)
    assert 400 <= r.status_code < 500 and fragment in r.json()["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
])
def test_unknown_model_name_gets_4xx(server, path, body):
    r = requests.post(server.url + path, json={"model": "no-such-model", **body}, timeout=60)
    assert 400 <= r.status_code < 500 and "no-such-model" in r.json()["message"]


def test_malformed_json_gets_400(server):
    r = requests.post(server.url + "/v1/completions", data='{"model": ', timeout=60,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400


def test_sixteen_concurrent_requests(server, client):
    """16 requests at once (mixed prefill/decode batches) give exactly what each gives alone."""
    def one(i):
        c = client.completions.create(model=_model(server), prompt=f"Request {i}:", max_tokens=4, temperature=0,
                                      logprobs=1, extra_body={"ignore_eos": True}).choices[0]
        return c.finish_reason, c.logprobs.tokens, c.logprobs.token_logprobs

    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(one, range(16)))
    assert all(f == "length" and len(t) == 4 for f, t, _ in outs)
    assert outs[:3] == [one(i) for i in range(3)]


def _idle(server, timeout: float) -> bool:
    """/flush_cache succeeds only when no request is running or waiting."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if "Cache flushed." in requests.post(server.url + "/flush_cache", timeout=30).text:
            return True
        time.sleep(1)
    return False


def test_abort_on_client_disconnect(server):
    body = {"model": _model(server), "prompt": "Go on forever", "max_tokens": 5000, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        next(r.iter_lines())
    # 5000 tokens take minutes here; an aborted request frees the scheduler within seconds.
    assert _idle(server, 60)


def test_no_kv_leak_after_load(server):
    """Runs after the load above: with the radix cache flushed, SGLang's idle invariant check
    (strict mode) proves every token slot is back in the allocator; a leak would crash the server."""
    assert _idle(server, 60)
    time.sleep(3)  # several idle scheduler loops, each running the pool check
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert "memory leak detected" not in server.log_text()
    assert server.proc.poll() is None


def test_trainer_clis_refuse_a_server_without_the_rl_flag(server, tiny_dir, tmp_path):
    """This server was started without `--rl-on-policy-target sglang_dsv41`: the RL trainer CLIs read its
    `/server_info` and stop with one line naming the flag, before loading a model."""
    from sglang_dsv41.train import mismatch, rl

    line = (f"the server at {server.url} was not started with --rl-on-policy-target sglang_dsv41 "
            "(rl_on_policy_target is None); restart it with that flag")
    with pytest.raises(SystemExit) as e:
        mismatch.main(["--model", str(tiny_dir), "--server", server.url])
    assert str(e.value) == f"train.mismatch: {line}"
    with pytest.raises(SystemExit) as e:
        rl.main(["--server", server.url, "--model", str(tiny_dir), "--out", str(tmp_path)])
    assert str(e.value) == f"train.rl: {line}"


def test_unsupported_flag_fails_at_startup(tiny_dir):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model", str(tiny_dir), "--enable-two-batch-overlap"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "--enable-two-batch-overlap: DeepSeek-V4.1 does not support two-batch overlap" in p.stdout + p.stderr
