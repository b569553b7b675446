"""A bound on the shape of a JSON request body, checked before FastAPI validates it.

FastAPI validates a body against SGLang's pydantic models on the HTTP server's event loop, and on the error
path pydantic reports every branch of every union for every bad element: a chat message whose `content` is a
list of 40,000 integers raises 560,000 errors and holds the event loop (and `/health`, and every other client)
for about 20 s. Valid bodies validate in milliseconds. So a body may hold at most ARRAY_ELEMENTS elements in
its arrays, counted across the whole body; token and prompt batches (TOKEN_FIELDS holding scalars or lists of
numbers) are not counted, since they are legitimately long and their errors do not multiply.
"""

from __future__ import annotations

import orjson

ARRAY_ELEMENTS = 8192
"""Array elements a body may hold outside TOKEN_FIELDS' scalar batches: 8192 chat messages, content parts,
tools, stop strings... in all. Pydantic's error path costs about 0.2 ms per element at this bound."""

TOKEN_FIELDS = frozenset({"prompt", "input_ids", "input_embeds", "input", "text", "token_ids_logprob"})
"""Top-level fields that carry token ids, embeddings or a batch of prompts (`/generate`, `/v1/completions`,
`/v1/embeddings`)."""

_SCALARS = (str, int, float, bool)


def _is_scalar_batch(value: list) -> bool:
    """A list of scalars, or a list of lists of numbers (token-id batches, embeddings)."""
    return all(isinstance(x, _SCALARS) or (isinstance(x, list) and all(isinstance(y, (int, float)) for y in x))
               for x in value)


def array_elements(body, limit: int = ARRAY_ELEMENTS) -> int:
    """Elements of the arrays in a parsed JSON body, TOKEN_FIELDS' scalar batches excepted; the count stops
    just past `limit`."""
    count, stack = 0, [body]
    if isinstance(body, dict):
        stack = [v for k, v in body.items() if not (k in TOKEN_FIELDS and isinstance(v, list) and _is_scalar_batch(v))]
    while stack and count <= limit:
        value = stack.pop()
        if isinstance(value, list):
            count += len(value)
            stack.extend(x for x in value if isinstance(x, (list, dict)))
        elif isinstance(value, dict):
            stack.extend(x for x in value.values() if isinstance(x, (list, dict)))
    return count


def shape_error(raw: bytes, limit: int = ARRAY_ELEMENTS) -> str | None:
    """A message when a JSON body holds more than `limit` array elements; None otherwise, and for a body that
    is not JSON (FastAPI's own validation answers that one)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    n = array_elements(body, limit)
    if n <= limit:
        return None
    return (f"the request body holds more than {limit} array elements (messages, content parts, tools, stop "
            f"strings... counted together; token-id and prompt batches are not counted)")


class BodyShapeLimit:
    """ASGI middleware: a request with a JSON body (`content-type: application/json`, or none) that
    `shape_error` refuses gets a 400 from `refuse(path, message)`; any other request goes on with its body
    replayed as it came."""

    def __init__(self, app, refuse):
        self.app, self.refuse = app, refuse

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        ctype = dict(scope.get("headers") or ()).get(b"content-type", b"application/json")
        if not ctype.split(b";")[0].strip().lower().endswith(b"json"):
            return await self.app(scope, receive, send)
        messages, chunks = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        error = shape_error(b"".join(chunks)) if messages[-1]["type"] == "http.request" else None
        if error is not None:
            path = scope.get("path", "").removeprefix(scope.get("root_path", "") or "")
            return await self.refuse(path, error)(scope, receive, send)

        async def replay():
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)


__all__ = ["ARRAY_ELEMENTS", "TOKEN_FIELDS", "BodyShapeLimit", "array_elements", "shape_error"]
