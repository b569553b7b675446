"""Secrets never leave, profiler output stays in its directory, errors name the field (issue 34): one real SGLang
server on a generated tiny checkpoint, started by its alias with `--api-key` and `--admin-api-key` (and a
128-token context, so a prompt at the length limit prefills in seconds).

Oracles: every GET route the server lists in its OpenAPI schema, asked with each key and with none, answers a
body that holds neither key, nor the launch command, nor the directory the alias resolved to; `/server_info` and
`/model_info` name the model as passed; `/start_profile` refuses each escape from SGLANG_TORCH_PROFILER_DIR with
a 400 naming the field and nothing is created outside it, while a relative `output_dir` lands inside; field
errors name the field; the prompt-length limit is where docs/sglang.md says (SGLang's `max_req_input_len`)."""

from __future__ import annotations

import json
import time

import pytest
import requests

from launch import start_server, stop_server

USER_KEY = "user-key-3f9c1a7e"
ADMIN_KEY = "admin-key-8b2d4c6f"
ALIAS = "deepseek-v4.1-tiny-random"
CONTEXT = 128
LAUNCH_MARKERS = ("--api-key", "--admin-api-key", "launch_server", "--context-length")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dsv41_cache")


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache, profile_root):
    log = tmp_path_factory.mktemp("secrets") / "server.log"
    srv = start_server(ALIAS, log, "--api-key", USER_KEY, "--admin-api-key", ADMIN_KEY,
                       "--context-length", str(CONTEXT),
                       env={"SGLANG_DSV41_CACHE": str(cache), "SGLANG_TORCH_PROFILER_DIR": str(profile_root),
                            "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"})
    yield srv
    stop_server(srv.proc)


def _auth(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def get(server, path, key=USER_KEY):
    return requests.get(server.url + path, headers=_auth(key), timeout=60)


def post(server, path, body, key=USER_KEY):
    return requests.post(server.url + path, json=body, headers=_auth(key), timeout=120)


def message(r) -> str:
    body = r.json()
    err = body.get("error", body)
    return err if isinstance(err, str) else str(err.get("message", err.get("detail", "")) or body.get("detail", ""))


def info_paths(server) -> list[str]:
    """Every side-effect-free GET route: listed with GET and without POST (SGLang's `api_route`s that take both
    act: /start_profile, /flush_cache, ...); `{model}` filled with the served name, other parameters skipped;
    plus the routes the schema does not list (`/metrics` is a mounted app) and the schema itself."""
    schema = get(server, "/openapi.json").json()
    out = ["/metrics", "/get_load", "/openapi.json"]
    for path, methods in schema["paths"].items():
        if "get" not in methods or "post" in methods:
            continue
        if path == "/v1/models/{model}":
            path = f"/v1/models/{ALIAS}"
        if "{" not in path:
            out.append(path)
    return out


def test_info_endpoints_hold_no_secret_launch_command_or_internal_path(server, cache):
    paths = info_paths(server)
    assert {"/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models"} <= set(paths), paths
    leaks = []
    for path in paths:
        for key in (USER_KEY, ADMIN_KEY, None):
            r = get(server, path, key)
            for secret in (USER_KEY, ADMIN_KEY, str(cache), *LAUNCH_MARKERS):
                if secret in r.text:
                    leaks.append((path, key and key[:5], r.status_code, secret))
    assert not leaks, leaks


def test_server_and_model_info_redacted_and_named_as_passed(server):
    info = get(server, "/server_info").json()
    assert info["api_key"] == info["admin_api_key"] == info["launch_command"] == "<redacted>"
    assert info["ssl_keyfile_password"] is None  # unset stays null
    assert info["model_path"] == info["tokenizer_path"] == ALIAS
    for state in info["internal_states"]:  # each scheduler's copy of the args
        assert state["api_key"] == state["admin_api_key"] == "<redacted>", state.get("api_key")
        assert state["model_path"] == ALIAS
    assert info["context_length"] == CONTEXT and info["port"] == int(server.url.rsplit(":", 1)[1])  # rest intact
    model = get(server, "/model_info").json()
    assert model["model_path"] == model["tokenizer_path"] == model["served_model_name"] == ALIAS
    assert get(server, "/get_model_info").json()["model_path"] == ALIAS
    assert get(server, "/server_info", ADMIN_KEY).status_code == 401  # the admin key opens admin routes only


def test_profile_output_stays_in_its_directory(server, profile_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (profile_root / "link").symlink_to(outside)
    refusals = [
        ({"output_dir": "../escape"}, "output_dir"),
        ({"output_dir": str(profile_root / ".." / "escape2")}, "output_dir"),
        ({"output_dir": str(outside / "abs")}, "output_dir"),
        ({"output_dir": "/etc"}, "output_dir"),
        ({"output_dir": "link/through"}, "output_dir"),
        ({"profile_prefix": "../../pfx"}, "profile_prefix"),
        ({"profile_id": "a/../../b"}, "profile_id"),
    ]
    for body, field in refusals:
        r = post(server, "/start_profile", {**body, "activities": ["CPU"]}, ADMIN_KEY)
        assert r.status_code == 400 and message(r).startswith(field), (body, r.status_code, r.text[:300])
        assert str(profile_root) not in r.text or str(profile_root) in json.dumps(body)  # not revealed
    assert not (profile_root.parent / "escape").exists() and not (profile_root.parent / "escape2").exists()
    assert list(outside.iterdir()) == []
    assert post(server, "/start_profile", {"output_dir": "run1", "activities": ["CPU"]}, USER_KEY).status_code == 401
    assert post(server, "/start_profile", {"output_dir": "run1", "activities": ["CPU"]}, ADMIN_KEY).status_code == 200
    gen = post(server, "/generate", {"text": "1+1=", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert gen.status_code == 200, gen.text[:300]
    assert post(server, "/stop_profile", {}, ADMIN_KEY).status_code == 200
    for _ in range(120):  # the scheduler writes the trace after the reply
        if list((profile_root / "run1").glob("*.trace.json*")):
            break
        time.sleep(0.5)
    assert list((profile_root / "run1").glob("*.trace.json*")), "no trace in <profile dir>/run1"
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("path, body, fragments", [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1, "sampling_seed": 2**64}},
     ["sampling_params.sampling_seed", "[-2**63, 2**63 - 1]"]),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"sampling_seed": 1.5}]},
     ["sampling_params[1].sampling_seed", "[-2**63, 2**63 - 1]"]),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": "hot"}}, ["sampling_params.temperature", "f64"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "bogus"}]}], "max_tokens": 1},
     ["messages[0].content[0].type", "'bogus'"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 1},
     ["messages[0].content[0].text: Field required"]),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": [{"type": "text", "text": "a"}, 5]}],
                              "max_tokens": 1}, ["messages[1].content[1]"]),
])
def test_errors_name_the_field(server, path, body, fragments):
    r = post(server, path, {"model": ALIAS, **body} if path.startswith("/v1") else body)
    text = message(r)
    assert r.status_code == 400 and all(f in text for f in fragments), (r.status_code, r.text[:500])
    assert "role" not in text and "expected i64" not in text, text


def _ids(n):
    return [5 + i % 50 for i in range(n)]


def test_prompt_length_limit_is_the_documented_one(server):
    """docs/sglang.md: a prompt is served up to M - 1 tokens, M = min(C, KV pool) - 6 (SGLang's max_req_input_len);
    M .. C - 1 tokens is our 400 naming M - 1; C or more SGLang's 400 naming C; prompt + max_tokens at most C, and
    the answer stops at prompt + output = min(C, KV pool) - 2 (SGLang's scheduler lowers max_new_tokens)."""
    info = get(server, "/server_info").json()
    limit = info["max_req_input_len"]
    assert limit == min(CONTEXT, info["max_total_num_tokens"]) - 6 == CONTEXT - 6

    def gen(n, **sp):
        return post(server, "/generate", {"input_ids": _ids(n), "sampling_params": {"temperature": 0, **sp}})

    r = gen(limit - 1, max_new_tokens=CONTEXT - (limit - 1), ignore_eos=True)  # prompt + max_new_tokens = C
    assert r.status_code == 200, r.text[:300]
    assert r.json()["meta_info"]["completion_tokens"] == CONTEXT - 2 - (limit - 1), r.json()["meta_info"]
    for n in (limit, CONTEXT - 1):
        r = gen(n, max_new_tokens=1)
        assert r.status_code == 400 and f"input_ids: the prompt has {n} tokens" in message(r), r.text[:300]
        assert f"at most {limit - 1} tokens" in message(r), message(r)
    r = gen(CONTEXT, max_new_tokens=1)
    assert r.status_code == 400 and f"context length ({CONTEXT} tokens)" in message(r), r.text[:300]
    r = gen(limit - 1, max_new_tokens=CONTEXT - (limit - 1) + 1)
    assert r.status_code == 400 and "maximum context length" in message(r), r.text[:300]
    # completions' default max_tokens (16) counts toward prompt + max_tokens
    r = post(server, "/v1/completions", {"model": ALIAS, "prompt": _ids(limit - 1)})
    assert r.status_code == 400 and "maximum context length" in message(r), r.text[:300]
    r = post(server, "/v1/chat/completions", {"model": ALIAS, "messages": [{"role": "user", "content": "2+2="}],
                                              "max_tokens": 1})
    assert r.status_code == 200, r.text[:300]  # the server still answers
