"""Every hook into SGLang internals, in one place (SGLang 0.5.23 is pinned in pyproject.toml).

Each entry of `HOOKS` names the SGLang object it touches and why; `install()` applies them and
`test/sglang/test_hooks.py` fails loudly when a target moves. Public plugin APIs (resolution-hook and
model-override registries, HookRegistry) are preferred. HookRegistry wraps plain functions in four
places (the architecture rewrite, the `/generate` contract check, the scheduler's admission check and the
pool-configurator factory), methods of the OpenAI and Ollama serving classes and the tokenizer manager for
request validation (validation.py and other_endpoints.py hold the rules) and of KVCacheConfigurator for the
KV budget (kv_budget.py), and the only writes into SGLang tables are the CPU host allocator and the HTTP app's error handlers
(through FastAPI's `add_exception_handler`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from sglang_dsv41.sglang.requests import admin_endpoints
from sglang_dsv41.sglang.model.cuda_graphs import cuda_graphs_off_step
from sglang_dsv41.sglang.model.server_args import REPLAY_WINDOW, ARCHITECTURE, resolve_model_name, v41_defaults, validate_flags
from sglang_dsv41.sglang.requests.validation import (
    OFF_LOOP_TOKENIZE_CHARS,
    Limits,
    RequestError,
    admitted_error,
    chat_request_error,
    completion_request_error,
    detokenize_request_error,
    generate_body_error,
    request_texts,
    routed_experts_error,
    text_bytes_error,
    tokenized_error,
    tokenizer_facts,
    validation_message,
    vertex_error,
    vertex_request_body,
)

logger = logging.getLogger(__name__)

EXTERNAL_PACKAGE = "sglang_dsv41.sglang.model"


@dataclass(frozen=True)
class Hook:
    target: str
    """Dotted path of the SGLang object that must exist."""
    why: str


HOOKS = (
    Hook("sglang.srt.configs.deepseek_v41.normalize_deepseek_v41_config",
         "AFTER hook: SGLang rewrites architectures [DeepseekV41ForCausalLM] -> [DeepseekV4ForCausalLM] "
         "(its CUDA-only V4 class); we keep the checkpoint's name so the registry resolves our class."),
    Hook("sglang.srt.arg_groups.resolution_hooks.register_resolution_hook",
         "wraps step handle_model_source_paths: `--model deepseek-v4.1-tiny` becomes the generated "
         "checkpoint dir (served under the alias) and `deepseek-v4.1` the hub id, before any download."),
    Hook("sglang.srt.arg_groups.resolution_hooks._OVERRIDABLE_HOOKS",
         "the step names we wrap (handle_model_source_paths, handle_missing_default_values, "
         "handle_cuda_graph_config) must stay overridable."),
    Hook("sglang.srt.arg_groups.cuda_graph_hook.handle_cuda_graph_config",
         "resolution step we wrap (cuda_graphs.py): for our model on CUDA both graph phases are disabled "
         "(the adapter's forward is not wired for capture) and flags that act only through capture are rejected."),
    Hook("sglang.srt.arg_groups.model_override_base.register_model_override",
         "per-architecture provider for DeepseekV41ForCausalLM: page size 64 when unset, even page sizes "
         "only, and startup errors naming rejected flags (server_args.py)."),
    Hook("sglang.srt.models.registry.import_model_classes",
         "SGLANG_EXTERNAL_MODEL_PACKAGE (set by the plugin) makes the registry import our package and "
         "defer the in-tree model zoo; if the registry was imported first, we add our class directly."),
    Hook("sglang.srt.models.registry.ModelRegistry",
         "fallback registration target (ModelRegistry.models[arch] = class)."),
    Hook("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request",
         "AFTER hook: SGLang ignores the request's `model`; a name this server does not serve becomes a 4xx. "
         "Then the completions rules of validation.py (prompt ids, n, logprobs, stop ids, logit bias)."),
    Hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request",
         "AFTER hook: the same model-name check, then the chat rules (max_tokens >= 1, n, top_logprobs, "
         "text-only content)."),
    Hook("sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._validate_request",
         "AFTER hook (on the inherited no-op): `/detokenize` ids must be ids of the tokenizer (a 500 before)."),
    Hook("sglang.srt.entrypoints.openai.serving_score.OpenAIServingScore._validate_request",
         "AFTER hook (on the inherited no-op): the model-name check, then the `/v1/score` rules of other_endpoints.py "
         "(no embedding overrides: they killed the scheduler; no text query with token-id items: a silent wrong score)."),
    Hook("sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingTokenize._validate_request",
         "AFTER hook (on the inherited no-op): the model-name check, as on every OpenAI endpoint."),
    Hook("sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate",
         "AROUND hook (other_endpoints.py): Ollama rules first (model name, options, unserved fields); SGLang's own "
         "ValueErrors become a 400 (were a 500), and a stream is run to its first chunk before the 200 is sent."),
    Hook("sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat",
         "AROUND hook: the same as handle_generate, and a 400 when the tokenizer has no chat template (was a 500)."),
    Hook("sglang.srt.entrypoints.ollama.serving.OllamaServing._stream_generate_response",
         "AROUND hook: SGLang's `/api/generate` stream dropped the text of its final chunk (a streamed answer lost "
         "its last token); ours sends every delta and a `done_reason` of `length` or `stop`."),
    Hook("sglang.srt.entrypoints.ollama.serving.OllamaServing._generate_generate_response",
         "AROUND hook: a plain `/api/generate` answer says why it ended (`length` or `stop`; SGLang always said "
         "`stop`)."),
    Hook("sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingTokenize._handle_non_streaming_request",
         "AROUND hook: `/v1/tokenize` reports the server's context length as `max_model_len` (SGLang: the "
         "tokenizer's model_max_length), and tokenizes a large text in a worker thread (SGLang: on the event loop)."),
    Hook("sglang.srt.entrypoints.ollama.serving.OllamaServing.get_show",
         "AROUND hook: `/api/show` of a model this server does not serve is a 404 (SGLang described any name)."),
    Hook("sglang.srt.entrypoints.api_contract.generate_contract_error",
         "AFTER hook: `/generate` answers a non-None result with a 400 before streaming starts; we add the "
         "native endpoint's rules (ids, max_new_tokens >= 1, n, top_logprobs_num, text budget); `/vertex_generate` "
         "calls it with its own body, whose instances and parameters get the same rules."),
    Hook("sglang.srt.entrypoints.http_server.get_global_state",
         "read: the tokenizer manager (vocabulary, context) for the `/generate` rules."),
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
         "AFTER hook: every generate request after tokenization, from every entry point: ids in range, "
         "non-empty, top logprobs <= vocab, top_k, logit bias, stop ids, text-only, "
         "return_routed_experts only with --enable-return-routed-experts (SGLang dropped it silently)."),
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_texts",
         "AROUND hook: refuse a text whose byte size proves it exceeds the context, and tokenize large texts "
         "in a worker thread so the event loop keeps serving other clients."),
    Hook("sglang.srt.managers.utils.validate_input_length",
         "AFTER hook: the scheduler's per-request admission check; an error string aborts that request "
         "alone (Req.set_finish_with_abort). We add the rules whose breach ends the scheduler: ids in range, "
         "non-empty, top logprobs <= vocab, top_k in int32, logit bias and stop ids."),
    Hook("sglang.srt.entrypoints.http_server._setup_and_run_http_server",
         "BEFORE hook: register our error handlers on the app: malformed requests (SGLang's handler echoes "
         "the endpoint's file path and line) and exceptions escaping body validation (Starlette's 500)."),
    Hook("sglang.srt.mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS",
         "entry 'cpu' (unless SGLang has its own): --enable-return-routed-experts allocates the routed-expert "
         "capturer's host cache through ALLOC_MEMORY_FUNCS[device], whose default pins it with "
         "cudaHostRegister (no CUDA on CPU); on CPU the device cache is host memory, so nothing to pin."),
    Hook("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.swa_reprefill_tail_tokens",
         "AFTER hook: with decoder SWA bounded replay on and encoder replay off, a prefix match leaves the "
         "last 128 tokens to recompute (spec attention 6.4). Our window KV is per token slot in SGLang's "
         "generic pool, which has no SWA component, so SGLang's own cap (keyed on that component) is 0."),
    Hook("sglang.srt.model_executor.encoder_swa_replay.run_encoder_swa_replay",
         "AROUND hook: with --enable-encoder-swa-bounded-replay our model folds each hit's replay rows into its "
         "own forward (sglang/request_windows.py); SGLang's separate replay forward is skipped for it (it reads "
         "the DeepSeek pool's request_window, which the generic pool our model uses does not have)."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.release_memory_occupation",
         "AROUND hook (admin_endpoints.py): on our CPU platform `/release_memory_occupation` is a 400 in the front "
         "end (SGLang's scheduler synchronises the CUDA device there, which killed a CPU server)."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.resume_memory_occupation",
         "AROUND hook (admin_endpoints.py): the same for `/resume_memory_occupation`."),
    Hook("sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager._stop_profile",
         "AROUND hook (admin_endpoints.py): an OSError writing a profile trace is a refused stop, not the "
         "scheduler's end."),
    Hook("sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager._profile",
         "AROUND hook (admin_endpoints.py): a start while a profile runs is refused (SGLang started a second "
         "profiler over the first)."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.start_expert_distribution_record",
         "AROUND hook (admin_endpoints.py): a 400 without a recorder mode (the scheduler's no-op recorder raised)."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.stop_expert_distribution_record",
         "AROUND hook (admin_endpoints.py): the same."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.dump_expert_distribution_record",
         "AROUND hook (admin_endpoints.py): the same."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.init_weights_update_group",
         "AROUND hook (admin_endpoints.py): a weight-update group that cannot form is a 400 (the scheduler "
         "blocked in its rendezvous)."),
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.configure_logging",
         "AROUND hook (admin_endpoints.py): `/configure_logging` fields checked before SGLang stores them (a bad "
         "log level made every later request fail)."),
    Hook("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin._execute_profile",
         "AROUND hook (admin_endpoints.py): `/start_profile` fields checked before the scheduler (an unknown "
         "activity list killed it); SGLang's refusals become 400s instead of 500s."),
    Hook("sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_disk",
         "AROUND hook: `/update_weights_from_disk` into our model is checked from the safetensors headers "
         "first (DeepseekV41ForCausalLM.weight_update_error) and refused with a 400; SGLang's rollback after "
         "a failed load re-reads the same path, which failed again and ended the scheduler."),
    Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class",
         "AROUND hook (kv_budget.py): for our model the generic MHA pool is SGLang's NoOpMHATokenToKVPool "
         "(no per-token bytes); the platform's get_kv_pool_cls seam, applied for our model on every device."),
    Hook("sglang.srt.model_executor.pool_configurator.create_memory_pool_configurator",
         "AFTER hook (kv_budget.py): for our model the pool configurator sizes max_total_num_tokens from our "
         "bytes per token slot (KVPools + token store + the generic pool's 0) and our fixed bytes."),
    Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure",
         "AFTER hook (kv_budget.py): our KVPools are allocated at load, from the sizes of SGLang's pools."),
)


def resolve(target: str):
    """Import the object at a dotted path (raises if SGLang moved it)."""
    import importlib

    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(target)


def _targets(suffix: str) -> list[str]:
    """The HOOKS targets ending with `suffix` (install code names its targets through HOOKS only)."""
    return [h.target for h in HOOKS if h.target.endswith(suffix)]


# ---------------------------------------------------------------------------- architecture
def keep_v41_architecture(result: dict, values, *args, **kwargs):
    """AFTER hook on normalize_deepseek_v41_config(values) -> dict."""
    src = values.get("architectures") if hasattr(values, "get") else None
    if src == [ARCHITECTURE] and result.get("architectures") != [ARCHITECTURE]:
        result = dict(result)
        result["architectures"] = [ARCHITECTURE]
    return result


def _install_architecture_hook() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(HOOKS[0].target, keep_v41_architecture, HookType.AFTER)


# ---------------------------------------------------------------------------- request validation
# The rules live in validation.py; these adapters read SGLang's objects and turn an error into what
# each hook point answers with (an error string, or a ValueError SGLang's handlers make a 400).
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
    if result:
        return result
    (target,) = _targets(".get_global_state")
    state = resolve(target)()
    if state is None or state.tokenizer_manager is None:
        return None
    if isinstance(body, dict) and "instances" in body and not ({"text", "input_ids"} & body.keys()):
        # `/vertex_generate` checks its own body through this function: check the request it builds
        # instead, through the hooked function (SGLang's contract, then this hook's rules on that body).
        # A parameter named `instances` is SGLang's to refuse (an unknown key), and never recurses here.
        native = vertex_request_body(body)
        if native is None or "instances" in native:
            return None
        err = resolve(_targets(".generate_contract_error")[0])(native)
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
    error = tokenized_error(obj, input_ids, int(tm.model_config.vocab_size))
    if not error and getattr(obj, "return_routed_experts", False) is True:
        error = routed_experts_error(True, routed_experts_served())
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
    return admitted_error(req.origin_input_ids, getattr(req, "vocab_size", None), getattr(req, "top_logprobs_num", 0),
                          sampling, getattr(req, "positional_embed_overrides", None))


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


def add_error_handlers(*args, **kwargs):
    """BEFORE hook on http_server._setup_and_run_http_server: runs before uvicorn builds the app's
    middleware stack, so the handlers registered here are the ones requests meet (FastAPI's public
    `add_exception_handler`). Error bodies carry a message, never server paths or tracebacks."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse

    from sglang.srt.entrypoints.http_server import app

    sglang_handler = app.exception_handlers.get(RequestValidationError)

    def error(request, status: int, message: str):
        path = request.url.path
        if path.startswith("/v1/responses"):
            content = {"error": {"message": message, "type": "Bad Request", "param": None, "code": status}}
        else:
            content = {"object": "error", "message": message, "type": "Bad Request" if status < 500 else
                       "InternalServerError", "param": None, "code": status}
        return ORJSONResponse(status_code=status, content=content)

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


def _register(suffix: str, fn, kind: str) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in _targets(suffix):
        HookRegistry.register(target, fn, getattr(HookType, kind))


def _install_request_validation() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dsv41.sglang.requests import other_endpoints

    special = {".OpenAIServingDetokenize.": check_detokenize_request, ".OpenAIServingScore.": check_other_openai_request,
               ".OpenAIServingTokenize.": check_other_openai_request}
    for target in _targets("._validate_request"):
        check = next((fn for key, fn in special.items() if key in target), check_openai_request)
        HookRegistry.register(target, check, HookType.AFTER)
    for suffix in (".handle_generate", ".handle_chat"):
        _register(suffix, other_endpoints.ollama_request, "AROUND")
    _register(".get_show", other_endpoints.ollama_show, "AROUND")
    _register("._stream_generate_response", other_endpoints.ollama_generate_stream, "AROUND")
    _register("._generate_generate_response", other_endpoints.ollama_generate_once, "AROUND")
    _register("OpenAIServingTokenize._handle_non_streaming_request", other_endpoints.tokenize_context, "AROUND")
    _register(".generate_contract_error", check_generate_body, "AFTER")
    _register("._validate_one_request", check_tokenized, "AFTER")
    _register("._tokenize_texts", tokenize_texts, "AROUND")
    _register("._setup_and_run_http_server", add_error_handlers, "BEFORE")
    admin = {".release_memory_occupation": admin_endpoints.refuse_memory_occupation_on_cpu,
             ".resume_memory_occupation": admin_endpoints.refuse_memory_occupation_on_cpu,
             "._execute_profile": admin_endpoints.checked_profile,
             ".init_weights_update_group": admin_endpoints.checked_weight_group,
             ".configure_logging": admin_endpoints.checked_logging,
             "_expert_distribution_record": admin_endpoints.refuse_expert_recording_when_off}
    for suffix, fn in admin.items():  # front-end AROUND hooks of the admin routes (admin_endpoints.py)
        _register(suffix, fn, "AROUND")


def _install_admission_check() -> None:
    _register(".validate_input_length", check_admitted, "AFTER")


def check_weight_update(original, updater, model_path, *args, **kwargs):
    """Refuse a disk weight update our model cannot take, before SGLang reads any tensor (-> (False, why),
    which the endpoint answers with a 400). Other models go straight to SGLang."""
    check = getattr(updater.get_model(), "weight_update_error", None)
    error = check(model_path) if check is not None else None
    if error:
        return False, error  # SGLang logs the message
    return original(updater, model_path, *args, **kwargs)


# ---------------------------------------------------------------------------- host buffers on CPU
# SGLang's host-buffer allocators are a defaultdict keyed by device type: npu / musa / xpu pin through
# torch, every other key (so "cpu") gets alloc_with_host_register, which calls cudaHostRegister for a
# pinned request and raises "Found no NVIDIA driver" without CUDA. The routed-experts capturer
# (state_capturer/base.py BaseHostCache, built by ModelRunner.init_routed_experts_capturer) always asks
# for pinned memory under the model's device, so without this entry `--enable-return-routed-experts`
# kills the scheduler at startup on CPU. Pinning only serves DMA from an accelerator; on CPU the
# capturer's "device" cache is host memory already, and the readback (on_forward_end / finalize /
# get_topk) is plain CPU indexing. The other users of the table (HiCache host pools) key it by their
# device pool's type, so on a GPU machine they never read "cpu".
def alloc_host_unpinned(dims: tuple, dtype, device: str, pin_memory: bool, allocator=None,
                        registration_granularity_bytes: int | None = None):
    """ALLOC_MEMORY_FUNCS["cpu"]: SGLang's allocator signature; the storage allocator's memory
    (anonymous mmap by default) without cudaHostRegister. `pin_memory` has nothing to pin for."""
    import torch

    if allocator is not None:
        return allocator.allocate(dims, dtype=dtype, device="cpu")
    return torch.empty(dims, dtype=dtype, device="cpu")


def _install_cpu_host_alloc() -> None:
    (target,) = _targets(".ALLOC_MEMORY_FUNCS")
    alloc_funcs = resolve(target)
    # Replace only SGLang's CUDA-registering default (a lookup may already have stored it under
    # "cpu"); an explicit CPU allocator from a future SGLang wins.
    if alloc_funcs.get("cpu") in (None, alloc_funcs.default_factory()):
        alloc_funcs["cpu"] = alloc_host_unpinned


# ---------------------------------------------------------------------------- model registry
def _install_model_package() -> None:
    import sys

    if "sglang.srt.models.registry" not in sys.modules and not os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE"):
        # Inherited by the scheduler subprocesses, whose registry import happens before plugins load.
        os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = EXTERNAL_PACKAGE
        return
    register_model_class()


def register_model_class() -> None:
    from sglang.srt.models.registry import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.models:
        from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

        ModelRegistry.models[ARCHITECTURE] = DeepseekV41ForCausalLM


# ---------------------------------------------------------------------------- server args
def _on_our_cpu_platform() -> bool:
    from sglang.srt.platforms import current_platform

    return type(current_platform).__name__ == "Dsv41CpuPlatform"


def resolve_alias_step(server_args, previous) -> None:
    """Wrapper of SGLang's handle_model_source_paths."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    path, served = resolve_model_name(cfg.model_path)
    if path != cfg.model_path:
        fields = {"model_path": path}
        if cfg.tokenizer_path in (None, cfg.model_path):
            fields["tokenizer_path"] = path
        if cfg.served_model_name is None and served:
            fields["served_model_name"] = served
        logger.info("sglang-dsv41: model %r -> %s", cfg.model_path, path)
        declare_resolution(server_args, "sglang_dsv41.resolve_alias", **fields)
    previous(server_args)


def cpu_device_step(server_args, previous) -> None:
    """Wrapper of SGLang's handle_missing_default_values: on our CPU platform the device is 'cpu'
    (SGLang's get_device() knows no device when CUDA is absent and its CPU engine is off)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    if resolving_view(server_args).device is None and _on_our_cpu_platform():
        declare_resolution(server_args, "sglang_dsv41.cpu_device", device="cpu")
    previous(server_args)


def v41_overrides(server_args, hf_config) -> dict:
    """Provider registered for DeepseekV41ForCausalLM."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    on_cpu = cfg.device == "cpu"
    validate_flags(cfg, on_cpu)
    raw = dict(getattr(server_args, "_raw_input", None) or {})
    return v41_defaults(cfg, raw, on_cpu)


def _install_server_arg_hooks() -> None:
    from sglang.srt.arg_groups.model_override_base import register_model_override
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook("handle_model_source_paths")(resolve_alias_step)
    register_resolution_hook("handle_missing_default_values")(cpu_device_step)
    register_resolution_hook("handle_cuda_graph_config")(cuda_graphs_off_step)
    register_model_override(ARCHITECTURE)(v41_overrides)


def cap_match_for_decoder_replay(result, cache, *args, **kwargs):
    """AFTER hook on UnifiedRadixCache.swa_reprefill_tail_tokens(req) -> int."""
    if result or not getattr(cache, "decoder_swa_bounded_replay", False):
        return result
    from sglang.srt.runtime_context import get_exec

    return 0 if get_exec().features.enable_encoder_swa_bounded_replay else REPLAY_WINDOW


def skip_encoder_replay_forward(original, worker, batch, *args, **kwargs):
    """AROUND hook on run_encoder_swa_replay(worker, batch): our model replays inside its forward."""
    if hasattr(worker.model_runner.model, "windows"):
        return None
    return original(worker, batch, *args, **kwargs)


def _install_kv_budget() -> None:
    from sglang_dsv41.sglang.model import kv_budget

    _register("._resolve_kv_pool_class", kv_budget.use_no_op_generic_pool, "AROUND")
    _register(".create_memory_pool_configurator", kv_budget.size_from_our_bytes, "AFTER")
    _register("KVCacheConfigurator.configure", kv_budget.allocate_at_load, "AFTER")


def _front_end_process() -> bool:
    """The process that serves HTTP and owns the tokenizer manager (the launcher, or an Engine's process).
    SGLang's scheduler, detokenizer and DP controller are its multiprocessing children."""
    import multiprocessing

    return multiprocessing.parent_process() is None


def install() -> None:
    """Register every hook. Called by the general plugin; SGLang's `load_plugins()` runs each plugin once
    per process (it guards itself) and then applies the HookRegistry hooks. Request validation is
    registered only in the front-end process, so the scheduler subprocesses never import the HTTP server."""
    _install_model_package()
    _install_architecture_hook()
    _install_server_arg_hooks()
    _install_admission_check()
    _register(".update_weights_from_disk", check_weight_update, "AROUND")
    _register("._stop_profile", admin_endpoints.stop_profile_keeping_scheduler, "AROUND")
    _register("SchedulerProfilerManager._profile", admin_endpoints.one_profile_at_a_time, "AROUND")
    _register(".swa_reprefill_tail_tokens", cap_match_for_decoder_replay, "AFTER")
    _register(".run_encoder_swa_replay", skip_encoder_replay_forward, "AROUND")
    _install_kv_budget()
    _install_cpu_host_alloc()
    if _front_end_process():
        _install_request_validation()
