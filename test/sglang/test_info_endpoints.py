"""The info-endpoint rules of `sglang_dsv41.sglang.requests.info_endpoints` without a server (the served endpoints:
test/server/test_secrets.py). Oracles: SGLang 0.5.23's ServerArgs fields and `build_server_info`, and hand-built
bodies run through the middleware on a Starlette app."""

from __future__ import annotations

import json
from types import SimpleNamespace

from sglang_dsv41.sglang.requests.info_endpoints import (
    REDACTED,
    SECRET_FIELDS,
    RedactInfoMiddleware,
    is_info_path,
    is_secret_name,
    passed_paths,
    redact,
    redact_server_info,
    secret_values,
)


def test_secret_fields_of_sglang_server_args():
    """Exactly these ServerArgs fields are secrets. A new SGLang field that looks like a credential (or a count
    the name rule would hide) fails here, to be looked at, instead of leaking through `/server_info`."""
    from sglang.srt.arg_groups.arg_utils import field_names
    from sglang.srt.server_args import ServerArgs

    names = set(field_names(ServerArgs))
    assert len(names) > 400
    assert SECRET_FIELDS <= names
    assert {n for n in names if is_secret_name(n)} == set(SECRET_FIELDS)


def test_secret_names():
    for name in ("api_key", "admin_api_key", "hf_token", "access_token", "token", "ssl_keyfile_password",
                 "aws_secret_access_key", "client_secret", "credentials", "Authorization", "private-key"):
        assert is_secret_name(name), name
    for name in ("max_total_tokens", "kt_max_deferred_experts_per_token", "tokenizer_path", "ssl_keyfile",
                 "num_reserved_decode_tokens", "key_value", 3, None):
        assert not is_secret_name(name), name


def _args(**kw):
    raw = {"model_path": "deepseek-v4.1-tiny", "tokenizer_path": None}
    resolved = {"model_path": "/opt/pkg/assets/tiny", "tokenizer_path": "/opt/pkg/assets/tiny"}
    return SimpleNamespace(api_key="user-key-1", admin_api_key="admin-key-2", ssl_keyfile_password=None,
                           _raw_input=raw, resolved_dict=lambda: resolved, **kw)


def test_redact_nested_body():
    args = _args()
    body = {"api_key": "user-key-1", "admin_api_key": "admin-key-2", "ssl_keyfile_password": None,
            "launch_command": "--model deepseek-v4.1-tiny --api-key user-key-1", "model_path": "/opt/pkg/assets/tiny",
            "tokenizer_path": "/opt/pkg/assets/tiny/tokenizer.json", "port": 30000,
            "internal_states": [{"api_key": "user-key-1", "note": "said user-key-1 twice: user-key-1",
                                 "extra": {"hf_token": "hf_abc", "max_total_tokens": 7}}]}
    out = redact(body, secret_values(args), passed_paths(args))
    assert out["api_key"] == out["admin_api_key"] == out["launch_command"] == REDACTED
    assert out["ssl_keyfile_password"] is None and out["port"] == 30000
    assert out["model_path"] == "deepseek-v4.1-tiny" and out["tokenizer_path"] == "deepseek-v4.1-tiny/tokenizer.json"
    state = out["internal_states"][0]
    assert state["api_key"] == REDACTED and state["note"] == f"said {REDACTED} twice: {REDACTED}"
    assert state["extra"] == {"hf_token": REDACTED, "max_total_tokens": 7}
    text = json.dumps(out)
    assert "user-key-1" not in text and "admin-key-2" not in text and "/opt/pkg" not in text
    assert body["api_key"] == "user-key-1"  # a copy: SGLang's own objects are not changed


def test_paths_as_passed():
    assert passed_paths(_args()) == {"/opt/pkg/assets/tiny": "deepseek-v4.1-tiny"}
    same = SimpleNamespace(_raw_input={"model_path": "/data/ckpt", "tokenizer_path": None},
                           resolved_dict=lambda: {"model_path": "/data/ckpt", "tokenizer_path": "/data/ckpt"})
    assert passed_paths(same) == {}  # a directory the user passed is shown as passed
    assert passed_paths(SimpleNamespace(model_path="/x")) == {}  # no resolution record: nothing mapped


def test_build_server_info_hook_on_sglang_function():
    """The AFTER hook on SGLang's own `build_server_info`, for a record SGLang parsed from a command line."""
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import build_server_info

    args = prepare_server_args(["--model", "/tmp/no-such-ckpt", "--api-key", "user-key-1", "--admin-api-key",
                                "admin-key-2"])
    info = build_server_info(args, {"max_req_input_len": 7})
    assert info["api_key"] == "user-key-1" and "admin-key-2" in info["launch_command"]  # SGLang's own answer
    out = redact_server_info(info, args, {})
    assert out["launch_command"] == out["api_key"] == out["admin_api_key"] == REDACTED
    assert out["model_path"] == "/tmp/no-such-ckpt" and out["max_req_input_len"] == 7
    assert "user-key-1" not in json.dumps(out, default=str) and "admin-key-2" not in json.dumps(out, default=str)


def test_middleware_rewrites_info_paths_only():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    body = {"api_key": "user-key-1", "launch_command": "x", "model_path": "/opt/pkg/assets/tiny"}
    app = Starlette(routes=[Route("/server_info", lambda r: JSONResponse(body)),
                            Route("/v1/models/{m}", lambda r: JSONResponse(body)),
                            Route("/get_load", lambda r: PlainTextResponse("key user-key-1")),
                            Route("/generate", lambda r: JSONResponse(body))])
    args = _args()
    app.add_middleware(RedactInfoMiddleware, secrets=secret_values(args), paths=passed_paths(args))
    client = TestClient(app)
    for path in ("/server_info", "/v1/models/x"):
        r = client.get(path)
        assert r.json() == {"api_key": REDACTED, "launch_command": REDACTED, "model_path": "deepseek-v4.1-tiny"}
        assert int(r.headers["content-length"]) == len(r.content)
    assert client.get("/get_load").text == f"key {REDACTED}"  # not JSON: the secret is still scrubbed
    assert client.get("/generate").json() == body  # not an info path: untouched
    assert is_info_path("/model_info") and not is_info_path("/v1/chat/completions")
