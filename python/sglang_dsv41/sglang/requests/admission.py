"""Hook functions that apply validation.py's rules where SGLang admits a request: the OpenAI serving classes'
`_validate_request`, the `/generate` contract check, the tokenizer manager (after tokenization, and around
tokenizing) and the scheduler's admission check. Each reads SGLang's objects, asks a rule, and answers the
way its hook point expects: an error string, or a RequestError (a ValueError SGLang's handlers make a 400).
"""

from __future__ import annotations

import asyncio

from sglang_dsv41.sglang.requests.validation import (
    OFF_LOOP_TOKENIZE_CHARS,
    Limits,
    RequestError,
    admitted_error,
    chat_request_error,
    completion_request_error,
    detokenize_request_error,
    dspark_sampling_error,
    generate_body_error,
    named_contract_error,
    prompt_length_error,
    request_texts,
    routed_experts_error,
    text_bytes_error,
    tokenized_error,
    tokenizer_facts,
    vertex_error,
    vertex_request_body,
)


def request_limits(tm) -> Limits:
    """What the served model accepts, from SGLang's TokenizerManager."""
    tokenizer = getattr(tm, "tokenizer", None)
    max_token_bytes, empty_has_tokens = tokenizer_facts(tokenizer) if tokenizer is not None else (None, True)
    return Limits(
        vocab_size=int(tm.model_config.vocab_size),
        context_len=int(tm.context_len),
        reserved_tokens=int(getattr(tm, "num_reserved_tokens", 0) or 0),
        max_token_bytes=max_token_bytes,
        empty_text_has_tokens=empty_has_tokens,
        allow_auto_truncate=bool(getattr(tm, "allow_auto_truncate", False)),
        max_input_tokens=getattr(tm, "max_req_input_len", None),
        images=getattr(tm, "mm_processor", None) is not None,
    )


# Names a request may use: the served name (the alias, e.g. deepseek-v4.1-tiny), the model path,
# SGLang's own default "default", and LoRA-style "<served>:<adapter>".
def model_name_error(tm, model: str | None) -> str | None:
    served = tm.served_model_name
    allowed = {served, getattr(tm, "model_path", served), "default"}
    if model is None or model in allowed or model.startswith(f"{served}:"):
        return None
    return f"The model '{model}' does not exist on this server; it serves '{served}'."


def check_openai_request(result, serving, request, *args, **kwargs):
    """AFTER hook on OpenAIServing{Completion,Chat}._validate_request(self, request) -> str | None."""
    if result:
        return result
    tm = serving.tokenizer_manager
    error = model_name_error(tm, getattr(request, "model", None))
    if error:
        return error
    limits = request_limits(tm)
    if hasattr(request, "messages"):
        return chat_request_error(request, limits)
    template = getattr(getattr(serving, "template_manager", None), "completion_template_name", None)
    return completion_request_error(request, limits, fill_in_middle=template is not None)


def check_detokenize_request(result, serving, request, *args, **kwargs):
    """AFTER hook on OpenAIServingDetokenize._validate_request(self, request) -> str | None."""
    tokenizer = serving.tokenizer_manager.tokenizer
    if result or tokenizer is None:
        return result
    return (model_name_error(serving.tokenizer_manager, getattr(request, "model", None))
            or unstreamed_error(serving, request) or detokenize_request_error(request.tokens, len(tokenizer)))


def unstreamed_error(serving, request) -> str | None:
    """`stream` set on an endpoint whose serving class has no streaming answer (SGLang: a 501)."""
    from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase

    if getattr(request, "stream", False) and (type(serving)._handle_streaming_request
                                              is OpenAIServingBase._handle_streaming_request):
        return "stream: this endpoint answers in one response; send stream false or leave it out"
    return None


def check_other_openai_request(result, serving, request, *args, **kwargs):
    """AFTER hook on OpenAIServing{Score,Tokenize}._validate_request(self, request) -> str | None."""
    from sglang_dsv41.sglang.requests.other_endpoints import score_request_error

    if result:
        return result
    error = model_name_error(serving.tokenizer_manager, getattr(request, "model", None)) or unstreamed_error(serving, request)
    if error or not hasattr(request, "label_token_ids"):
        return error
    return score_request_error(request)


def check_generate_body(result, body, *args, **kwargs):
    """AFTER hook on api_contract.generate_contract_error(body) -> str | None (the `/generate` route)."""
    import inspect

    from sglang.srt.entrypoints import api_contract
    from sglang.srt.entrypoints.http_server import get_global_state

    if result:  # SGLang's message names no field: find it by asking SGLang's own (unhooked) contract per field
        return named_contract_error(result, body, inspect.unwrap(api_contract.generate_contract_error))
    state = get_global_state()
    if state is None or state.tokenizer_manager is None:
        return None
    if isinstance(body, dict) and "instances" in body and not ({"text", "input_ids"} & body.keys()):
        # `/vertex_generate` checks its own body through this function: check the request it builds
        # instead, through the hooked function (SGLang's contract, then this hook's rules on that body).
        # A parameter named `instances` is SGLang's to refuse (an unknown key), and never recurses here.
        native = vertex_request_body(body)
        if native is None or "instances" in native:
            return None
        err = api_contract.generate_contract_error(native)  # the module attribute: the hooked function
        return None if err is None else vertex_error(err)
    error = generate_body_error(body, request_limits(state.tokenizer_manager))
    flags = body.get("return_routed_experts") if isinstance(body, dict) else None
    if error is None and any(f is True for f in (flags if isinstance(flags, list) else [flags])):
        error = routed_experts_error(True, routed_experts_served())  # checked here too: a stream gets a real 4xx
    return error


def routed_experts_served() -> bool:
    """Whether the server was started with --enable-return-routed-experts (SGLang's published config)."""
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().features.enable_return_routed_experts)


def check_tokenized(result, tm, obj, input_ids, *args, **kwargs):
    """AFTER hook on TokenizerManager._validate_one_request(self, obj, input_ids) -> None."""
    images = getattr(tm, "mm_processor", None) is not None
    error = tokenized_error(obj, input_ids, int(tm.model_config.vocab_size), images)
    if not error and getattr(obj, "return_routed_experts", False) is True:
        error = routed_experts_error(True, routed_experts_served())
    if not error and str(getattr(tm.server_args, "speculative_algorithm", None) or "").upper() == "DSPARK":
        error = dspark_sampling_error(getattr(obj, "sampling_params", None), getattr(obj, "custom_logit_processor", None))
    if not error and input_ids is not None:  # the scheduler's length limit, refused here with the number that fits
        field = "input_ids" if getattr(obj, "input_ids", None) is not None else "text"
        error = prompt_length_error(len(input_ids), request_limits(tm), field)
    if error:
        raise RequestError(error)
    return result


async def tokenize_texts(original, tm, texts, *args, **kwargs):
    """AROUND hook on `async TokenizerManager._tokenize_texts(self, texts, is_cross_encoder=False)`.

    SGLang tokenizes on the event loop (about 1 s per MB here), which stalls every other client. A text
    whose bytes prove it cannot fit the context is refused without tokenizing; a large one is tokenized by
    SGLang's own code in a worker thread (HF fast tokenizers release the GIL). Single strings under
    `--enable-dynamic-batch-tokenizer` already leave the loop and keep SGLang's path."""
    strings = request_texts(texts)
    limits = request_limits(tm)
    for i, text in enumerate(strings):
        error = text_bytes_error(text, limits, "text" if len(strings) == 1 else f"text[{i}]")
        if error:
            raise RequestError(error)
    on_loop = sum(map(len, strings)) < OFF_LOOP_TOKENIZE_CHARS or (
        isinstance(texts, str) and getattr(tm, "async_dynamic_batch_tokenizer", None) is not None)
    if on_loop:
        return await original(tm, texts, *args, **kwargs)
    return await asyncio.to_thread(asyncio.run, original(tm, texts, *args, **kwargs))


def check_admitted(result, req, *args, **kwargs):
    """AFTER hook on managers.utils.validate_input_length(req, max_len, auto_truncate) -> str | None,
    called by the scheduler when a request arrives; an error aborts that request alone."""
    if result:
        return result
    sp = getattr(req, "sampling_params", None)
    sampling = {name: getattr(sp, name, None) for name in ("top_k", "logit_bias")}
    sampling["stop_token_ids"] = sorted(getattr(sp, "stop_token_ids", None) or ())
    sampling["stop_regex"] = list(getattr(sp, "stop_regex_strs", None) or ()) or None
    sampling["stop"] = list(getattr(sp, "stop_strs", None) or ()) or None
    # an image prompt's origin_input_ids carry the spans' pad ids by now (the model's pad_input_ids)
    ids = getattr(req, "origin_input_ids_unpadded", None) or req.origin_input_ids
    return admitted_error(ids, getattr(req, "vocab_size", None), getattr(req, "top_logprobs_num", 0),
                          sampling, getattr(req, "positional_embed_overrides", None))
