"""HTTP error handlers for the app SGLang serves: malformed bodies answer a 400 that names the field (SGLang's
handler echoed the endpoint's file path and line), and the exceptions that escape a route before the request is
served (a field of the wrong type, an unknown parser, bad `/vertex_generate` parameters) answer a 400 instead of
Starlette's 500. Error bodies carry a message, never server paths or tracebacks.
"""

from __future__ import annotations

from sglang_dsv41.sglang.requests.body_limits import BodyShapeLimit
from sglang_dsv41.sglang.requests.validation import validation_message


def raised_reading_body(exc: BaseException) -> bool:
    """True when `exc` escaped from FastAPI's validation of the request body: a validator of SGLang's
    request models that assumes a field's type (e.g. `response_format: [1]` reaches `.get` on a list)
    raises that error raw instead of a validation error, and Starlette would answer 500."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "request_body_to_args" and code.co_filename.replace("\\", "/").endswith(
                "fastapi/dependencies/utils.py"):
            return True
        tb = tb.tb_next
    return False


PARSER_ROUTES = ("parse_function_call_request", "separate_reasoning_request")
"""Routes whose parser constructors raise ValueError for an unknown parser name outside the route's own
try (`/parse_function_call`'s tool_call_parser, `/separate_reasoning`'s reasoning_parser): a 400, not a 500."""


def raised_choosing_parser(exc: BaseException) -> bool:
    """True for a ValueError raised inside one of PARSER_ROUTES."""
    if not isinstance(exc, ValueError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in PARSER_ROUTES:
            return True
        tb = tb.tb_next
    return False


def raised_building_vertex_request(exc: BaseException) -> bool:
    """True when `exc` escaped from `/vertex_generate` while it built SGLang's request from the body's
    `parameters` (`GenerateReqInput(**parameters)`: an unknown key is a TypeError, a bad combination a
    ValueError of the request's own checks), i.e. before the request was handed to `generate_request`."""
    tb, in_route = exc.__traceback__, False
    while tb is not None:
        code = tb.tb_frame.f_code
        if in_route and code.co_name == "generate_request":
            return False  # raised while serving the request, not while building it
        if code.co_name == "vertex_generate" and code.co_filename.replace("\\", "/").endswith(
                "sglang/srt/entrypoints/http_server.py"):
            in_route = True
        tb = tb.tb_next
    return in_route and isinstance(exc, (TypeError, ValueError))


def error_response(path: str, status: int, message: str):
    """The error body SGLang's OpenAI routes answer (`/v1/responses` nests it under `error`)."""
    from fastapi.responses import ORJSONResponse

    if path.startswith("/v1/responses"):
        content = {"error": {"message": message, "type": "Bad Request", "param": None, "code": status}}
    else:
        content = {"object": "error", "message": message, "type": "Bad Request" if status < 500 else
                   "InternalServerError", "param": None, "code": status}
    return ORJSONResponse(status_code=status, content=content)


def add_error_handlers(*args, **kwargs):
    """BEFORE hook on http_server._setup_and_run_http_server: runs before uvicorn builds the app's
    middleware stack, so the handlers registered here are the ones requests meet (FastAPI's public
    `add_exception_handler`), with the body-shape bound in front of validation (`add_middleware`). Error
    bodies carry a message, never server paths or tracebacks."""
    from fastapi.exceptions import RequestValidationError

    from sglang.srt.entrypoints.http_server import app

    sglang_handler = app.exception_handlers.get(RequestValidationError)

    def error(request, status: int, message: str):
        return error_response(request.url.path, status, message)

    async def clean_validation_error(request, exc):
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))
        if sglang_handler is not None and (path.startswith("/v1/messages") or path == "/v1/systemone"):
            return await sglang_handler(request, exc)  # these two already answer without server paths
        return error(request, 400, validation_message(exc.errors()))

    async def unhandled_error(request, exc):
        # Starlette's ServerErrorMiddleware calls this, then re-raises, so the server log keeps the traceback.
        if raised_reading_body(exc):
            return error(request, 400, f"the request body has a field of the wrong type ({type(exc).__name__}: {exc})")
        if raised_choosing_parser(exc):
            return error(request, 400, str(exc)[:300])
        if raised_building_vertex_request(exc):
            return error(request, 400, f"parameters: {str(exc).removeprefix('GenerateReqInput.__init__() ')}"[:300])
        return error(request, 500, "Internal server error")

    app.add_exception_handler(RequestValidationError, clean_validation_error)
    app.add_exception_handler(Exception, unhandled_error)
    app.add_middleware(BodyShapeLimit, refuse=lambda path, message: error_response(path, 400, message))
