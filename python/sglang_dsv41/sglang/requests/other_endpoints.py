"""Request rules for SGLang's secondary endpoints (Ollama `/api/*`, `/v1/score`), and the hook adapters that
apply them (registered by hooks.py). The OpenAI, `/generate` and tokenizer rules are in validation.py.

Ollama: SGLang's handlers have no error handling of their own. A sampling value SGLang refuses (a ValueError
from its sampling-parameter check) escaped as a 500, or, for a stream, after the 200 header as a cut-off
body; `/api/chat` needs the tokenizer's chat template, which DeepSeek-V4.1 does not have (500); and fields
SGLang does not implement (`format`, `context`, `suffix`, `template`, `images`) were dropped silently.

An Ollama `/api/generate` stream dropped the text of its last chunk (SGLang's final `done` line carries an
empty `response`), so a streamed answer lost its last token(s); our stream sends every delta. Streamed or
not, `done_reason` says whether `num_predict` ended the answer (`length`; SGLang always said `stop`).

Tokenize: `/v1/tokenize` reported the tokenizer's `model_max_length` as `max_model_len`; now the server's context.
A large text is tokenized in a worker thread (SGLang tokenized it on the event loop, stalling every client).

Score: a text query with token-id items was joined as text (`"Is it" + "[5, 6]"`): a silent wrong score.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sglang_dsv41.sglang.requests.validation import (
    OFF_LOOP_TOKENIZE_CHARS,
    _first,
    _is_int,
    count_error,
    multimodal_error,
    request_texts,
    stop_strings_error,
    top_k_error,
)

OLLAMA_UNSERVED = {
    "format": "output formats are not implemented by SGLang's Ollama endpoint; use /v1/chat/completions with "
              "response_format",
    "context": "SGLang's Ollama endpoint cannot continue from a context; send the whole conversation in prompt",
    "suffix": "fill-in-the-middle is not implemented by SGLang's Ollama endpoint",
    "template": "SGLang's Ollama endpoint applies no prompt template; render the prompt yourself",
    "images": "the Ollama API's images are not served; send image_url parts to /v1/chat/completions",
}
"""Ollama request fields SGLang would ignore (a silent wrong answer), with why they are refused."""

OLLAMA_NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
"""Ollama `options` SGLang maps to sampling parameters that must be numbers (it compared them as they came)."""


def _number_error(value: Any, field: str) -> str | None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return None
    return f"{field}: expected a number, got {value!r}"[:200]


def ollama_options_error(options: Any) -> str | None:
    """Ollama `options`, as SGLang maps them (`num_predict` -> `max_new_tokens`, and the same names for the rest).
    Ollama's `num_predict` -1 / -2 ("until the context is full") has no SGLang equivalent."""
    if not options:
        return None
    numbers = (_number_error(options.get(name), f"options.{name}") for name in OLLAMA_NUMBERS)
    stop = options.get("stop")
    return _first(
        count_error(options.get("num_predict"), "options.num_predict", 1,
                    what=" (-1 / -2, run until the context is full, are not supported here)"),
        *numbers,
        top_k_error(options.get("top_k"), "options.top_k"),
        None if options.get("seed") is None or _is_int(options.get("seed")) else
        f"options.seed: expected an integer, got {options.get('seed')!r}"[:200],
        None if stop is None or isinstance(stop, (str, list)) else f"options.stop: expected a string or a list of strings",
        stop_strings_error(stop, "options.stop") if stop is not None else None,
    )


def ollama_request_error(request: Any) -> str | None:
    """An OllamaGenerateRequest or OllamaChatRequest (after FastAPI's type checks)."""
    for name, why in OLLAMA_UNSERVED.items():
        if getattr(request, name, None) not in (None, [], ""):
            return f"{name}: {why}"
    for i, message in enumerate(getattr(request, "messages", None) or ()):
        if message.images:
            return f"messages[{i}].images: {OLLAMA_UNSERVED['images']}"
    return ollama_options_error(request.options)


def score_request_error(request: Any) -> str | None:
    """`/v1/score` (a ScoringRequest): token ids or text on both sides, no embedding overrides."""
    err = multimodal_error({"query_embed_overrides": request.query_embed_overrides,
                            "item_embed_overrides": request.item_embed_overrides})
    items = request.items
    id_items = isinstance(items, list) and any(isinstance(item, list) for item in items)
    if not err and isinstance(request.query, str) and id_items:
        err = ("items: token-id items need a token-id query (SGLang joins a text query with the items as text, "
               "so the score would be of the printed list)")
    return err


# ---------------------------------------------------------------------------- hook adapters (hooks.py)
def _ollama_error(status: int, message: str):
    from fastapi.responses import ORJSONResponse

    return ORJSONResponse(status_code=status, content={"error": message})  # Ollama's own error shape


async def _start_stream(response) -> None:
    """Run a streaming response up to its first chunk, so an error SGLang raises while submitting the request
    (a sampling value, a prompt over the context) surfaces here, before the 200 header is sent."""
    body = response.body_iterator
    try:
        first = await body.__anext__()
    except StopAsyncIteration:
        return

    async def chained():
        yield first
        async for chunk in body:
            yield chunk

    response.body_iterator = chained()


async def ollama_request(original, serving, request, raw_request, *args, **kwargs):
    """AROUND hook on `async OllamaServing.handle_generate / handle_chat(self, request, raw_request)`."""
    from fastapi.responses import StreamingResponse

    from sglang_dsv41.sglang.requests.admission import model_name_error

    tm = serving.tokenizer_manager
    error = model_name_error(tm, request.model) or ollama_request_error(request)
    if not error and hasattr(request, "messages") and not getattr(tm.tokenizer, "chat_template", None):
        error = ("/api/chat renders messages with the tokenizer's chat template, which this model does not have "
                 "(DeepSeek-V4.1 chat uses its own encoding); use /v1/chat/completions, or /api/generate")
    if error:
        return _ollama_error(400, error)
    try:
        response = await original(serving, request, raw_request, *args, **kwargs)
        if isinstance(response, StreamingResponse):
            await _start_stream(response)
    except ValueError as e:  # SGLang's own request checks (and ours in the tokenizer manager)
        return _ollama_error(400, str(e))
    return response


def ollama_show(original, serving, model, *args, **kwargs):
    """AROUND hook on OllamaServing.get_show(self, model): a model this server does not serve is a 404 (SGLang
    described any name as a model of the served context length)."""
    from sglang_dsv41.sglang.requests.admission import model_name_error

    error = model_name_error(serving.tokenizer_manager, model)
    if error:
        return _ollama_error(404, error)
    return original(serving, model, *args, **kwargs)


def _done_reason(finish: Any) -> str | None:
    """Ollama's `done_reason` of SGLang's finish_reason: None while running, `length` at the token limit."""
    if finish is None:
        return None
    return "length" if isinstance(finish, dict) and finish.get("type") == "length" else "stop"


async def ollama_generate_once(original, serving, gen_request, raw_request, model_name, *args, **kwargs):
    """AROUND hook on `async OllamaServing._generate_generate_response(self, gen_request, raw_request,
    model_name)`: the same answer, with `done_reason` saying why it ended (SGLang always said `stop`, also
    when `num_predict` cut it)."""
    import time

    from sglang.srt.entrypoints.ollama.protocol import OllamaGenerateResponse

    start = time.time_ns()
    out = await serving.tokenizer_manager.generate_request(gen_request, raw_request).__anext__()
    meta = out.get("meta_info") or {}
    return OllamaGenerateResponse(model=model_name, created_at=serving._get_timestamp(), response=out.get("text", ""),
                                  done=True, done_reason=_done_reason(meta.get("finish_reason")),
                                  total_duration=time.time_ns() - start, prompt_eval_count=meta.get("prompt_tokens"),
                                  eval_count=meta.get("completion_tokens"))


def tokenize_request_chars(request: Any) -> int:
    """Characters a `/v1/tokenize` request asks to tokenize (its prompt strings, or its messages' text)."""
    texts = request_texts(getattr(request, "prompt", None))
    for message in getattr(request, "messages", None) or ():
        content = getattr(message, "content", None)
        parts = content if isinstance(content, list) else [content]
        texts.extend(p if isinstance(p, str) else getattr(p, "text", None) or "" for p in parts if p is not None)
    return sum(map(len, texts))


async def tokenize_context(original, serving, adapted_request, *args, **kwargs):
    """AROUND hook on `async OpenAIServingTokenize._handle_non_streaming_request(self, adapted_request,
    request, raw_request)`: `max_model_len` is the server's context length (SGLang reported the tokenizer's
    `model_max_length`, 1048576 here, so a client sizing its prompts by it was told too much fits). SGLang
    tokenizes on the event loop (a 4 MB prompt held every other client for 8 s); a large request runs
    SGLang's handler in a worker thread, as generate prompts do (admission.tokenize_texts)."""
    if tokenize_request_chars(adapted_request) < OFF_LOOP_TOKENIZE_CHARS:
        result = await original(serving, adapted_request, *args, **kwargs)
    else:
        result = await asyncio.to_thread(asyncio.run, original(serving, adapted_request, *args, **kwargs))
    if hasattr(result, "max_model_len"):
        result.max_model_len = int(serving.tokenizer_manager.model_config.context_len)
    return result


async def ollama_generate_stream(original, serving, gen_request, raw_request, model_name, *args, **kwargs):
    """AROUND hook on `async OllamaServing._stream_generate_response(self, gen_request, raw_request, model_name)`:
    the same NDJSON stream, except that the final line carries its text delta and `done_reason` says why the
    answer ended (`length` or `stop`; SGLang always said `stop`)."""
    import orjson
    from fastapi.responses import StreamingResponse
    from sglang.srt.entrypoints.ollama.protocol import OllamaGenerateStreamResponse

    async def lines():
        sent = ""
        async for chunk in serving.tokenizer_manager.generate_request(gen_request, raw_request):
            text = chunk.get("text", "")
            finish = (chunk.get("meta_info") or {}).get("finish_reason")
            line = OllamaGenerateStreamResponse(model=model_name, created_at=serving._get_timestamp(),
                                                response=text[len(sent):], done=finish is not None,
                                                done_reason=_done_reason(finish))
            sent = text
            yield orjson.dumps(line.model_dump()) + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
