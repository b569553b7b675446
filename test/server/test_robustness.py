"""No request may kill the server (issue 9): one real SGLang server on the tiny checkpoint receives the
request classes that used to crash its scheduler, the inconsistencies around them, and a seeded fuzz of
the HTTP surface (test/server/fuzz.py). Oracle: the reply contract (`fuzz.check_reply`: a valid case
must be served, a 200 whose answer is well-formed and agrees with the request; any other case gets a
4xx whose body carries a message, or a well-formed 200) plus liveness after every request: `/health` answers, the
launcher is alive and its log has no scheduler exception (a dying scheduler logs one before it signals
the launcher); the scheduler itself answers a load query after each structured case and after the fuzz,
and, idle after the fuzz, SGLang's strict memory check finds every token slot back in the allocator.

`/health` normally runs a one-token generation and waits at least a second; this server answers it
without the generation (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0) so it can be asked after every case."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from fuzz import MAX_NEW, Case, case_seed, check_reply, make_case, send
from launch import start_server, stop_server

FUZZ_SEED = int(os.environ.get("DSV41_FUZZ_SEED", 20261201))
FUZZ_CASES = int(os.environ.get("DSV41_FUZZ_CASES", 300))
FUZZ_CONCURRENCY = int(os.environ.get("DSV41_FUZZ_CONCURRENCY", 16))
FUZZ_BUDGET_S = float(os.environ.get("DSV41_FUZZ_BUDGET_S", 40))
"""The fuzz stops after this many seconds even if cases remain (a loaded machine), and says so."""

V = 1024  # the tiny checkpoint's vocabulary


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("robustness") / "server.log"
    # Strict idle check (as in test_endpoints): refused and aborted requests must give back every token slot.
    srv = start_server(tiny_dir, log, env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",
                                           "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"})
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="module")
def model(server) -> str:
    return requests.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


def alive(server, round_trip: bool = True) -> str | None:
    """None when the whole server is up; else what is down. A scheduler that dies logs "Scheduler hit an
    exception" before it signals the launcher; `round_trip` also asks the scheduler itself (a load
    query, answered between forwards, so it waits for a running one)."""
    if server.proc.poll() is not None:
        return f"the launcher exited ({server.proc.returncode})"
    if "Scheduler hit an exception" in server.log_text():
        return "the scheduler hit an exception:\n" + server.log_text()[-3000:]
    try:
        if requests.get(server.url + "/health", timeout=30).status_code != 200:
            return "/health did not answer 200"
        if round_trip and requests.get(server.url + "/v1/loads?include=core", timeout=300).status_code != 200:
            return "the scheduler did not answer a load query"
    except requests.RequestException as e:
        return f"no answer: {e}"
    return None


def post(server, path, body, **kw):
    r = requests.post(server.url + path, json=body, timeout=120, **kw)
    return r.status_code, r.text, r


def _message(r) -> str:
    body = r.json()
    err = body.get("error", body)
    return err if isinstance(err, str) else err.get("message", "")


def _sp(**kw):
    return {"max_new_tokens": 1, "temperature": 0, **kw}


# (path, body without the model, fragment the message must contain): every class of issue 9, one request
# each, plus the ones the fuzzer found. Each gets a 4xx that names the field.
CLASSES = [
    # token ids outside [0, vocab): native and OpenAI, single and batched
    ("/generate", {"input_ids": [5, V], "sampling_params": _sp()}, "input_ids[1]"),
    ("/generate", {"input_ids": [[5, 6], [7, -1]], "sampling_params": _sp()}, "input_ids[1][1]"),
    ("/v1/completions", {"prompt": [5, 6, V + 7], "max_tokens": 1}, "prompt[2]"),
    ("/v1/completions", {"prompt": [[5], [2**40]], "max_tokens": 1}, "prompt[1][0]"),
    # a text prompt with zero tokens (the tokenizer adds no BOS)
    ("/generate", {"text": "", "sampling_params": _sp()}, "text: the prompt is empty"),
    ("/generate", {"text": ["hi", ""], "sampling_params": _sp()}, "text[1]: the prompt is empty"),
    # more top logprobs than the vocabulary
    ("/generate", {"input_ids": [5], "return_logprob": True, "top_logprobs_num": V + 1, "sampling_params": _sp()},
     "top_logprobs_num"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "logprobs": V + 1}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True,
                              "top_logprobs": V + 1}, "top_logprobs"),
    # max_tokens >= 1 everywhere
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ("/generate", {"text": "hi", "sampling_params": _sp(max_new_tokens=0)}, "sampling_params.max_new_tokens"),
    # n in [1, 128] everywhere
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 0}, "n: must be an integer of at least 1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 1000}, "at most 128"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "n": 129}, "n:"),
    ("/generate", {"text": "hi", "sampling_params": _sp(n=0)}, "sampling_params.n"),
    # logit bias and stop token ids in range
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "logit_bias": {str(V): 5}}, "logit_bias"),
    ("/generate", {"text": "hi", "sampling_params": _sp(logit_bias={"abc": 1})}, "logit_bias: key 'abc'"),
    ("/generate", {"text": "hi", "sampling_params": _sp(stop_token_ids=[V])}, "stop_token_ids[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                              "stop_token_ids": [-5]}, "stop_token_ids[0]"),
    # what the model cannot serve: images, embeddings
    ("/generate", {"text": "hi", "image_data": "data:image/png;base64,AAAA", "sampling_params": _sp()},
     "image_data"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
        "max_tokens": 1}, "'image_url'"),  # SGLang's own check answers first here
    # found by the fuzzer: an empty batch (a stream of it ended without a reply)
    ("/generate", {"text": [], "stream": True, "sampling_params": _sp()}, "text: the batch is empty"),
    # found by the fuzzer: a list where a single request takes one value (killed the scheduler)
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": [20], "sampling_params": _sp()},
     "logprob_start_len: a single request takes one value"),
    ("/generate", {"text": ["a", "b"], "top_logprobs_num": [1], "sampling_params": _sp()},
     "top_logprobs_num: the batch has 2 prompts but 1 values"),
    # found by the fuzzer: top_k past int32 (the sampler's tensor overflowed and killed the scheduler)
    ("/generate", {"text": "hi", "sampling_params": _sp(top_k=2**63)}, "sampling_params.top_k"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "top_k": 2**31}, "top_k"),
    # found by the fuzzer: a logit bias of 1e308 (inf in fp32: NaN probabilities killed the scheduler)
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": 1e308}}, "[-100, 100]"),
    # found probing the other endpoints: /detokenize of an id the tokenizer lacks (was a 500)
    ("/detokenize", {"tokens": [5, 99999]}, "tokens[1]"),
    # found by the fuzzer: a field of the wrong type that SGLang's request model dereferences (was a 500)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                              "response_format": [1]}, "wrong type"),
    # found by the HTTP fuzz of 2026-12: a list rid on a single OpenAI prompt (a list used as a dict key: 500)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "rid": ["a"]},
     "rid: a single prompt takes one string"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "rid": []}, "rid: a single prompt takes one string"),
    # a stop regex that does not parse (re.error escaped SGLang's normalize: 500)
    ("/generate", {"text": "hi", "sampling_params": _sp(stop_regex="(")}, "sampling_params.stop_regex: not a valid"),
    # a stop regex that backtracks exponentially (40 forced "a" tokens held the scheduler for minutes)
    ("/generate", {"text": "hi", "sampling_params": _sp(max_new_tokens=40, ignore_eos=True, logit_bias={"100": 100},
                                                         stop_regex="(a|aa)*b")}, "an alternation inside a repeat"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                              "stop_regex": ["x", "a*a*a*b"]}, "stop_regex[1]: at most one variable-length repeat"),
    # an empty stop string or a stop regex matching "" stopped every answer before its first token (a silent "")
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stop": ""},
     "stop: an empty stop string"),
    ("/generate", {"text": "hi", "sampling_params": _sp(stop=["x", ""])}, "sampling_params.stop[1]: an empty stop"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "stop_regex": "a*"}, "matches the empty string"),
    # found fuzzing the other endpoints (2026-12): embedding overrides reached the model's missing
    # get_input_embeddings() and killed the scheduler
    ("/v1/score", {"query": [5, 6], "items": [[7]], "label_token_ids": [5], "query_embed_overrides": [[1.0]],
                   "embed_override_token_id": 5}, "query_embed_overrides: input-embedding overrides"),
    ("/generate", {"text": "hi", "positional_embed_overrides": {"positions": [0], "embeds": [[1.0]]},
                   "sampling_params": _sp()}, "positional_embed_overrides"),
    # a text query with token-id items was scored as the text "Is it[7]" (a silent wrong score)
    ("/v1/score", {"query": "Is it", "items": [[7]], "label_token_ids": [5]}, "items: token-id items need"),
    # Ollama: SGLang's ValueErrors were 500s (a cut-off 200 for a stream); /api/chat had no chat template (500);
    # num_predict 0 answered an empty 200, and format / images / unknown models were ignored
    ("/api/generate", {"prompt": "hi", "stream": True, "options": {"num_predict": -1}}, "options.num_predict"),
    ("/api/generate", {"prompt": "hi", "stream": True, "options": {"top_p": 5}}, "top_p"),
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"num_predict": 0}}, "options.num_predict"),
    ("/api/generate", {"prompt": "hi", "stream": False, "format": "json"}, "format: output formats"),
    ("/api/generate", {"model": "nope", "prompt": "hi", "stream": False}, "does not exist on this server"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": True}, "chat template"),
    # /vertex_generate builds SGLang's request from `parameters`: an unknown key was a 500
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"bogus": 1}}, "parameters: got an unexpected"),
    # ... and the native /generate rules did not run on its instances and parameters (max_new_tokens 0: empty 200)
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"sampling_params": {"max_new_tokens": 0}}},
     "parameters.sampling_params.max_new_tokens"),
    ("/vertex_generate", {"instances": [{"input_ids": [5, 10**9]}], "parameters": {}}, "instances[*].input_ids"),
    # /v1/tokenize has no streaming answer: a truthy `stream` was a 501
    ("/v1/tokenize", {"prompt": "hi", "stream": True}, "stream: this endpoint answers in one response"),
    # ... nor SGLang's own /generate contract (both were 500s)
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"sampling_params": "x"}},
     "parameters.sampling_params: invalid type"),
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"sampling_params": {"temperature": "hot"}}},
     "expected f64"),
    # found probing 2026-12: text and input_ids together (the text was dropped; batches of two shapes were a 500)
    ("/generate", {"text": ["a", "b"], "input_ids": [5, 6], "sampling_params": _sp()}, "text, input_ids: send the"),
    # fields SGLang ignores here: a silent wrong answer (suffix without a FIM template, best_of beyond n,
    # routed experts on a server started without --enable-return-routed-experts)
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "suffix": "}"}, "suffix: this server has no fill-in"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "best_of": 3}, "best_of: this server does not rank"),
    ("/generate", {"text": "hi", "return_routed_experts": True, "stream": True, "sampling_params": _sp()},
     "return_routed_experts: this server was started without"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                              "return_routed_experts": True}, "return_routed_experts: this server was started"),
    # found by the fuzz 2026-12: 40,000 ids as chat content made pydantic report 560,000 union errors, and
    # validating them held the event loop (and /health) for 20-30 s; token batches stay uncounted
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [5] * 40_000}], "max_tokens": 1},
     "more than 8192 array elements"),
    ("/generate", {"input_ids": [V] * 9000, "sampling_params": _sp()}, "input_ids[0]"),
]


@pytest.mark.parametrize("path, body, fragment", CLASSES, ids=[f"{p}:{f}" for p, _, f in CLASSES])
def test_refused_with_a_message_naming_the_field(server, model, path, body, fragment):
    status, text, r = post(server, path, {"model": model, **body} if path.startswith(("/v1", "/api")) else body)
    assert 400 <= status < 500, text[:500]
    assert fragment in _message(r), text[:500]
    assert check_reply(Case(0, path, b""), status, text) is None
    assert alive(server) is None


def test_safe_stop_regex_still_stops(server):
    """A stop regex within the rules (one repeat, no empty match) is served and ends the answer at its match."""
    status, text, r = post(server, "/generate", {"text": "hi", "sampling_params": _sp(
        max_new_tokens=12, ignore_eos=True, logit_bias={"100": 100}, stop_regex="a{5}")})  # token 100 is "a"
    assert status == 200, text[:300]
    assert r.json()["text"] == "aaaaa" and r.json()["meta_info"]["finish_reason"] == {"type": "stop", "matched": "a{5}"}


def test_refused_before_the_stream_starts(server, model):
    """A streaming request with a bad id gets a real 4xx, not a 200 with an error event."""
    status, text, _ = post(server, "/generate", {"input_ids": [V], "stream": True, "sampling_params": _sp()})
    assert status == 400 and "input_ids[0]" in text
    status, text, _ = post(server, "/v1/completions", {"model": model, "prompt": [V], "max_tokens": 1, "stream": True})
    assert status == 400 and "prompt[0]" in text


@pytest.mark.parametrize("raw", [b'{"model": ', b"[1, 2", b'{"prompt": "\xff\xfe"}', b'{"max_tokens": "x"}'])
def test_malformed_bodies_carry_no_server_paths(server, raw):
    r = requests.post(server.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"},
                      timeout=60)
    assert r.status_code == 400
    assert _message(r) and "File " not in r.text and "site-packages" not in r.text and ".py" not in r.text


def test_edges_are_still_served(server, model):
    """The largest legal values pass validation and generate."""
    status, text, r = post(server, "/generate", {"input_ids": [[0, 1], [V - 1]], "return_logprob": True,
                                                 "top_logprobs_num": V, "sampling_params": _sp(stop_token_ids=[V - 1])})
    assert status == 200, text[:300]
    assert all(len(x["meta_info"]["output_top_logprobs"][0]) == V for x in r.json())
    status, text, r = post(server, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 1, "n": 2,
                                                       "logit_bias": {str(V - 1): 1.0}})
    assert status == 200 and len(r.json()["choices"]) == 2, text[:300]


def test_a_large_prompt_does_not_stall_other_clients(server, model):
    """A prompt that only tokenizing can judge (under the byte budget, over the context) is tokenized in a
    worker thread: other requests keep being answered meanwhile. One that the byte budget alone rules
    out is refused without tokenizing."""
    text = "ab " * 250_000  # 750 KB: about 500K tokens, under C x 29 bytes (C = 28543), so it has to be tokenized
    result = {}

    def big():
        t0 = time.monotonic()
        result["status"], result["text"], _ = post(server, "/v1/completions", {"model": model, "prompt": text,
                                                                                "max_tokens": 1})
        result["s"] = time.monotonic() - t0

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.2)
    waits = []
    while thread.is_alive() and len(waits) < 50:
        t0 = time.monotonic()
        status, _, _ = post(server, "/v1/completions", {"model": model, "prompt": [V], "max_tokens": 1})
        waits.append(time.monotonic() - t0)
        assert status == 400
    thread.join()
    assert result["status"] == 400 and "context length" in result["text"], result["text"][:300]
    # Each small request was answered in a fraction of the big one's time (on the loop it would wait for all of it).
    assert waits and max(waits) < max(0.5, result["s"] / 2), (waits, result["s"])

    t0 = time.monotonic()
    status, body, _ = post(server, "/v1/completions", {"model": model, "prompt": "ab " * 700_000, "max_tokens": 1})
    assert status == 400 and "at least" in body and "bytes" in body
    assert time.monotonic() - t0 < max(2.0, result["s"] / 2)


def test_fuzz_http_surface(server, model):
    """FUZZ_CASES seeded cases with FUZZ_CONCURRENCY in flight (one bad client among others; accepted
    cases share forwards while refused ones flow past them), bounded by FUZZ_BUDGET_S. After each case:
    its reply, /health and the server's liveness. A failure prints the seeds of the cases in flight;
    `python test/server/fuzz.py --case-seed N` replays one alone."""
    t0 = time.monotonic()
    lock = threading.Lock()
    in_flight: set[int] = set()
    statuses: dict[int, int] = {}
    served_valid = []

    def one(i: int) -> str | None:
        if time.monotonic() - t0 > FUZZ_BUDGET_S:
            return None
        case = make_case(case_seed(FUZZ_SEED, i), model, V)
        with lock:
            in_flight.add(case.seed)
        try:
            status, text = send(server.url, case)
            problem = check_reply(case, status, text)
        except requests.RequestException as e:
            status, problem = -1, f"no reply: {e}"
        problem = problem or alive(server, round_trip=False)
        with lock:
            statuses[status] = statuses.get(status, 0) + 1
            if case.valid and not problem:
                served_valid.append(case.seed)
            others = sorted(in_flight - {case.seed})
            in_flight.discard(case.seed)
        if problem:
            return f"{case.describe()}\n  -> {problem}\n  (cases in flight: {others})"
        return None

    with ThreadPoolExecutor(FUZZ_CONCURRENCY) as pool:
        problems = [p for p in pool.map(one, range(FUZZ_CASES)) if p]
    ran = sum(statuses.values())
    print(f"fuzz seed {FUZZ_SEED}: {ran}/{FUZZ_CASES} cases in {time.monotonic() - t0:.0f}s "
          f"({FUZZ_CONCURRENCY} in flight, up to {MAX_NEW} new tokens each): {statuses}; "
          f"{len(served_valid)} valid cases served")
    assert not problems, "\n".join(problems[:5])
    assert ran >= min(FUZZ_CASES, FUZZ_CONCURRENCY) and served_valid
    # Idle with the radix cache flushed, SGLang's strict check proves no case leaked a token slot.
    deadline = time.monotonic() + 120
    while "Cache flushed." not in requests.post(server.url + "/flush_cache", timeout=60).text:
        assert time.monotonic() < deadline, "the server did not become idle after the fuzz"
        time.sleep(1)
    time.sleep(3)  # several idle scheduler loops, each running the pool check
    assert "memory leak detected" not in server.log_text()
    assert alive(server) is None  # a floor only: the count depends on the machine


def test_ollama_generate_still_answers(server, model):
    """The Ollama hooks leave good requests alone: a stream (run to its first chunk before the header) and a
    plain answer give the same greedy text, and the stream says why it ended."""
    body = {"model": model, "prompt": "Hello", "options": {"num_predict": 3, "temperature": 0}}
    status, text, r = post(server, "/api/generate", {**body, "stream": False})
    assert status == 200, text[:300]
    status, streamed, _ = post(server, "/api/generate", {**body, "stream": True})
    assert status == 200, streamed[:300]
    chunks = [json.loads(line) for line in streamed.splitlines() if line.strip()]
    # SGLang's stream dropped the final chunk's text (fixed by other_endpoints.ollama_generate_stream)
    assert chunks[-1]["done"] and "".join(c["response"] for c in chunks) == r.json()["response"]
    assert chunks[-1]["done_reason"] == ("length" if r.json()["eval_count"] == 3 else "stop")
    assert r.json()["done_reason"] == chunks[-1]["done_reason"]  # SGLang's plain answer always said "stop"
    long = {**body, "stream": False, "options": {"num_predict": 1, "temperature": 0}}
    status, text, r = post(server, "/api/generate", long)
    assert status == 200 and r.json()["eval_count"] == 1 and r.json()["done_reason"] == "length", text[:300]


def test_vertex_generate_still_answers(server):
    """The /generate rules on /vertex_generate's instances and parameters leave a good request alone: its
    predictions equal /generate's answers to the same prompts."""
    sp = {"max_new_tokens": 2, "temperature": 0}
    body = {"instances": [{"text": "Hello"}, {"text": "The"}], "parameters": {"sampling_params": sp}}
    status, text, r = post(server, "/vertex_generate", body)
    assert status == 200, text[:300]
    status, text, native = post(server, "/generate", {"text": ["Hello", "The"], "sampling_params": sp})
    assert status == 200, text[:300]
    assert [p["text"] for p in r.json()["predictions"]] == [a["text"] for a in native.json()]


def test_tokenize_reports_server_context(server, model):
    """`/v1/tokenize`'s max_model_len is the context the server accepts (as `/v1/models` says), not the
    tokenizer's model_max_length."""
    status, text, r = post(server, "/v1/tokenize", {"model": model, "prompt": "Hello world"})
    assert status == 200, text[:300]
    served = requests.get(server.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"]
    assert r.json()["max_model_len"] == served and r.json()["count"] == len(r.json()["tokens"]) > 0


MIX_GOOD = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 2, "temperature": 0}),
    ("/v1/completions", {"prompt": "The number is", "max_tokens": 2, "temperature": 0}),
    ("/generate", {"input_ids": [5, 17, 300], "sampling_params": _sp(max_new_tokens=2)}),
    ("/api/generate", {"prompt": "Say", "stream": False, "options": {"num_predict": 2, "temperature": 0}}),
]
MIX_BAD = [path_body[:2] for path_body in CLASSES if path_body[0] in ("/v1/score", "/api/generate", "/generate")][-8:]


def _mix_answer(path: str, r) -> object:
    body = r.json()
    return {"/generate": lambda: body["output_ids"], "/api/generate": lambda: body["response"],
            "/v1/completions": lambda: body["choices"][0]["text"],
            "/v1/chat/completions": lambda: body["choices"][0]["message"]["content"]}[path]()


def test_parallel_mix_good_answers_equal_alone(server, model):
    """8 good requests (greedy) interleaved with 8 bad ones, all in flight at once: every bad one gets its 4xx,
    every good answer equals the same request sent alone, and the server stays up."""
    def request(path, body):
        return post(server, path, {"model": model, **body} if path.startswith(("/v1", "/api")) else body)

    alone = [_mix_answer(p, request(p, b)[2]) for p, b in MIX_GOOD]
    work = [("good", i % len(MIX_GOOD)) for i in range(8)] + [("bad", i) for i in range(len(MIX_BAD))]
    work = [w for pair in zip(work[:8], work[8:]) for w in pair]  # good, bad, good, bad, ...

    def one(item):
        kind, i = item
        path, body = (MIX_GOOD if kind == "good" else MIX_BAD)[i]
        status, text, r = request(path, body)
        if kind == "bad":
            return None if 400 <= status < 500 else f"bad {path} -> {status}: {text[:200]}"
        if status != 200 or _mix_answer(path, r) != alone[i]:
            return f"good {path} -> {status}: {text[:200]} (alone: {alone[i]!r})"
        return None

    with ThreadPoolExecutor(len(work)) as pool:
        problems = [p for p in pool.map(one, work) if p]
    assert len(MIX_BAD) == 8 and not problems, problems
    assert alive(server) is None


def test_admin_profile_and_memory_routes_keep_the_server(server, model, tmp_path):
    """Admin routes that ended the CPU server, stalled it or answered 500 (admin_endpoints.py, hooks.py): a
    profile round trip writes its trace; a bad `activities` list, a `num_steps` below 1, an output directory the
    server cannot write, a second start while one runs and a stop without a start are 400s with a message;
    memory release / resume are 400s on the CPU platform, expert recording without a recorder mode everywhere;
    a request-log level SGLang would store and then fail every request on, an NCCL weight group on the CPU
    server, a trainer store that is not there, and unknown parser names are 400s; the server stays up."""
    refusals = [
        ("/start_profile", {"activities": ["XYZ"]}, "activities"),
        ("/start_profile", {"activities": []}, "activities"),
        ("/start_profile", {"activities": ["GPU"]}, "CPU only"),
        ("/start_profile", {"num_steps": 0}, "num_steps"),
        ("/start_profile", {"output_dir": "/proc/x"}, "output_dir"),
        ("/start_profile", {"output_dir": str(tmp_path / "file")}, "output_dir"),
        ("/stop_profile", {}, "not in progress"),
        ("/release_memory_occupation", {}, "no device memory"),
        ("/resume_memory_occupation", {}, "no device memory"),
        ("/start_expert_distribution_record", {}, "recording is off"),
        ("/stop_expert_distribution_record", {}, "recording is off"),
        ("/dump_expert_distribution_record", {}, "recording is off"),
        ("/configure_logging", {"log_requests": True, "log_requests_level": 99}, "log_requests_level"),
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                        "world_size": 2}, "not available on the CPU platform"),
        ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                        "world_size": 2, "backend": "gloo"}, "nothing answers"),
        ("/parse_function_call", {"text": "x", "tool_call_parser": "nope", "tools": []}, "tool_call_parser"),
        ("/separate_reasoning", {"text": "x", "reasoning_parser": "nope"}, "nope"),
    ]
    (tmp_path / "file").write_text("x")
    for path, body, fragment in refusals:
        code, text, r = post(server, path, body)
        assert code == 400 and fragment in _message(r), (path, body, code, text[:300])
        assert alive(server) is None, (path, body)
    out = tmp_path / "trace"
    assert post(server, "/start_profile", {"output_dir": str(out), "activities": ["CPU"]})[0] == 200
    code, _, r = post(server, "/start_profile", {"output_dir": str(out)})
    assert code == 400 and "already in progress" in _message(r)
    assert post(server, "/generate", {"text": "1+1=", "sampling_params": _sp(max_new_tokens=2)})[0] == 200
    assert post(server, "/stop_profile", {})[0] == 200
    for _ in range(60):  # the trace is written by the scheduler after the reply
        if list(out.glob("*.trace.json*")):
            break
        time.sleep(0.5)
    assert list(out.glob("*.trace.json*")), "no trace written"
    assert alive(server) is None
