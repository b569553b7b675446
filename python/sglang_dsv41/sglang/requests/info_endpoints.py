"""What SGLang's info endpoints may tell a client: no secret and no launch command, and the model as the user
named it (docs/sglang.md "Secrets and info endpoints").

SGLang 0.5.23 answers `/server_info` (and `/get_server_info`) with every server arg, the launch command line and
each scheduler's copy of the args (`internal_states`), to anyone holding the user API key: `--api-key`,
`--admin-api-key` (which opens the weight-update routes), `--ssl-keyfile-password` and the command that carries
them. It redacts only its watermark keys. `/model_info` reports `model_path` / `tokenizer_path`, which for our
aliases (`--model deepseek-v4.1-tiny`) is a directory of this installation rather than the name the user gave.

Two seams apply one rule (`redact`):
- an ASGI middleware on the HTTP app (registered by an AROUND hook on `_setup_and_run_http_server`, where the
  error handlers are registered too) rewrites the JSON body of each path in INFO_PATHS, whatever route function
  built it;
- an AFTER hook on `utils.common.build_server_info` covers the same dict where SGLang serves it without HTTP
  (its gRPC metadata server, the Rust server's handoff).
"""

from __future__ import annotations

import json
import re
from typing import Any

REDACTED = "<redacted>"
"""What a secret's value (or the launch command) becomes; SGLang uses the same marker for its watermark keys.
An unset secret stays null, as in SGLang, so a client can still tell whether a key is configured."""

SECRET_FIELDS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key", "watermark_key_b",
                           "watermark_config"})
"""The ServerArgs fields of SGLang 0.5.23 that hold secrets (test_info_endpoints pins this set against SGLang's
fields, so a new secret-looking field fails a test instead of leaking)."""

LAUNCH_FIELDS = frozenset({"launch_command"})
"""Fields that carry the command line (every flag as typed, keys included)."""

INFO_PATHS = frozenset({"/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models",
                        "/v1/loads", "/get_load", "/get_hicache_l3_cache_layout", "/hicache/storage-backend"})
"""HTTP GET routes that describe the server; `/v1/models/<name>` is covered as a prefix."""

_SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials",
                           "apikey", "authorization", "cookie"})
_TOKEN_KINDS = frozenset({"hf", "hub", "access", "auth", "api", "bearer", "refresh", "session", "id"})
_MIN_SECRET_CHARS = 4
"""Secret values shorter than this are not scrubbed out of free text (they would hit unrelated words); their
fields are still redacted by name."""


def is_secret_name(name: Any) -> bool:
    """A field name whose value is a credential: SECRET_FIELDS, or a name ending in `key`, naming a password,
    secret or credential, or an `<hf|access|auth|api|...>_token`. Counts such as `max_total_tokens` are not."""
    if not isinstance(name, str):
        return False
    if name in SECRET_FIELDS:
        return True
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if not words:
        return False
    return (bool(_SECRET_WORDS & set(words)) or words[-1] == "key" or words == ["token"]
            or (len(words) > 1 and words[-1] == "token" and words[-2] in _TOKEN_KINDS))


def secret_values(server_args: Any) -> tuple[str, ...]:
    """The configured secrets, scrubbed from any text of an info body (e.g. a command line SGLang re-quotes)."""
    values = (getattr(server_args, name, None) for name in sorted(SECRET_FIELDS))
    return tuple(sorted({v for v in values if isinstance(v, str) and len(v) >= _MIN_SECRET_CHARS}, key=len,
                        reverse=True))


def passed_paths(server_args: Any) -> dict[str, str]:
    """{resolved path: what the user passed} for the model and tokenizer when resolution changed them (our
    alias hook turns `deepseek-v4.1-tiny` into a directory of this installation). SGLang keeps the caller's
    values in `_raw_input` and the resolution's result in `resolved_dict()` (its `/server_info` fields); a
    record without both maps nothing."""
    raw = getattr(server_args, "_raw_input", None)
    if not isinstance(raw, dict) or not isinstance(raw.get("model_path"), str) or not hasattr(server_args,
                                                                                              "resolved_dict"):
        return {}
    resolved = server_args.resolved_dict()
    asked = {"model_path": raw["model_path"], "tokenizer_path": raw.get("tokenizer_path") or raw["model_path"]}
    return {resolved[f]: given for f, given in asked.items()
            if isinstance(resolved.get(f), str) and resolved[f] != given}


def _scrub_text(text: str, secrets: tuple[str, ...], paths: dict[str, str]) -> str:
    for resolved, given in paths.items():
        if text == resolved:
            return given
        if text.startswith(resolved.rstrip("/") + "/"):
            text = given + text[len(resolved.rstrip("/")):]
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact(value: Any, secrets: tuple[str, ...] = (), paths: dict[str, str] | None = None) -> Any:
    """A copy of an info body (JSON-like: dicts, lists, scalars) with every secret field's value and the launch
    command replaced by REDACTED (None stays None), any configured secret scrubbed from the remaining text, and
    a resolved model / tokenizer path shown as the user passed it."""
    paths = paths or {}
    if isinstance(value, dict):
        return {k: (REDACTED if v is not None and (is_secret_name(k) or k in LAUNCH_FIELDS)
                    else redact(v, secrets, paths)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets, paths) for v in value]
    if isinstance(value, str):
        return _scrub_text(value, secrets, paths)
    return value


def redact_server_info(result, server_args, *args, **kwargs):
    """AFTER hook on `utils.common.build_server_info(server_args, scheduler_info) -> dict`."""
    return redact(result, secret_values(server_args), passed_paths(server_args))


def is_info_path(path: str) -> bool:
    return path in INFO_PATHS or path.startswith("/v1/models/")


class RedactInfoMiddleware:
    """ASGI middleware: the body of a response to an INFO_PATHS request is buffered, and a JSON body is
    rewritten by `redact`; any body still holding a configured secret has it replaced. Other paths stream
    through untouched."""

    def __init__(self, app, secrets: tuple[str, ...] = (), paths: dict[str, str] | None = None):
        self.app, self.secrets, self.paths = app, tuple(secrets), dict(paths or {})

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "").removeprefix(scope.get("root_path", "") or "") or "/"
        if not is_info_path(path):
            return await self.app(scope, receive, send)
        start, chunks = None, []

        async def buffered(message):
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = self.rewrite(b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, buffered)

    def rewrite(self, body: bytes) -> bytes:
        try:
            parsed = json.loads(body)
        except ValueError:
            text = body.decode("utf-8", "replace")
            scrubbed = _scrub_text(text, self.secrets, {})
            return body if scrubbed == text else scrubbed.encode()
        return json.dumps(redact(parsed, self.secrets, self.paths), separators=(",", ":"),
                          ensure_ascii=False).encode()


def add_info_redaction(original, server_args, *args, **kwargs):
    """AROUND hook on `http_server._setup_and_run_http_server(server_args, ...)` (the BEFORE slot there holds the
    error handlers): the middleware goes on the app before uvicorn builds its middleware stack (Starlette's public
    `add_middleware`). SGLang adds its API-key middleware later in the same function, so that one runs first."""
    from sglang.srt.entrypoints.http_server import app

    app.add_middleware(RedactInfoMiddleware, secrets=secret_values(server_args), paths=passed_paths(server_args))
    return original(server_args, *args, **kwargs)


__all__ = ["INFO_PATHS", "LAUNCH_FIELDS", "REDACTED", "SECRET_FIELDS", "RedactInfoMiddleware", "add_info_redaction",
           "is_info_path", "is_secret_name", "passed_paths", "redact", "redact_server_info", "secret_values"]
