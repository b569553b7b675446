"""Every hook into SGLang internals, as one table (SGLang 0.5.23 is pinned in pyproject.toml).

One row per hook: the SGLang object it touches, how it is applied, our function, and why. `install()`
applies the rows in order; `test/sglang/test_hooks.py` resolves every target, so a target SGLang moves
fails loudly. Kinds:
  before / after / around  SGLang's HookRegistry wraps the target with our function
  step                     our wrapper of a step of SGLang's server-arg resolution (register_resolution_hook)
  provider                 SGLang's per-architecture override registry, for DeepseekV41ForCausalLM
  setup                    our function runs once at install (it writes SGLang's table or environment itself)
  read                     an SGLang object our code uses; nothing is installed
The only writes into SGLang tables are the `setup` rows (model registry, CPU host allocator, RL target choice)
and the HTTP app's error handlers and info-body middleware (FastAPI's `add_exception_handler` /
`add_middleware`, by the `before` and `around` rows on `_setup_and_run_http_server`).

The functions live with their concern: `model/` (the model adapter) and `requests/` (request hardening).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sglang_dsv41.sglang.model import (arg_resolution, cpu_host_alloc, cpu_req_to_token, cuda_graphs, dspark_worker,
                                       kv_budget, registration, rl_mode, seeded_sampling, swa_replay, weight_update)
from sglang_dsv41.sglang.model.server_args import ARCHITECTURE
from sglang_dsv41.sglang.requests import admin_endpoints, admission, error_handlers, info_endpoints, other_endpoints
from sglang_dsv41.sglang.requests import aborts, fair_share

BEFORE, AFTER, AROUND, STEP, PROVIDER, SETUP, READ = "before", "after", "around", "step", "provider", "setup", "read"
KINDS = (BEFORE, AFTER, AROUND, STEP, PROVIDER, SETUP, READ)
SRT = "sglang.srt."


@dataclass(frozen=True)
class Hook:
    at: str
    """Dotted path of the SGLang object under `sglang.srt.`."""
    kind: str
    fn: Callable | None
    why: str

    @property
    def target(self) -> str:
        return SRT + self.at


# Installed in every process SGLang loads plugins in (launcher, scheduler, detokenizer, DP controller).
EVERY_PROCESS = (
    # ------------------------------------------------------------------ the model adapter (model/)
    Hook("models.registry.ModelRegistry", SETUP, registration.use_model_package,
         "SGLANG_EXTERNAL_MODEL_PACKAGE (inherited by the scheduler) makes the registry import model/ and defer "
         "the in-tree model zoo; if the registry was imported first, our class goes into ModelRegistry.models."),
    Hook("models.registry.import_model_classes", READ, None,
         "what the registry runs on the external package: each module's EntryClass (model/deepseek_v41.py)."),
    Hook("configs.deepseek_v41.normalize_deepseek_v41_config", AFTER, registration.keep_v41_architecture,
         "SGLang rewrites architectures [DeepseekV41ForCausalLM] -> [DeepseekV4ForCausalLM] (its CUDA-only V4 "
         "class); we keep the checkpoint's name so the registry resolves our class. A vision tower stays: "
         "SGLang serves images through our processor (SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE, processor/)."),
    Hook("arg_groups.model_hook.handle_language_model_only", AROUND, registration.language_model_only,
         "--language-model-only is refused for architectures outside SGLang's list; ours serves its text model "
         "(the vision tower unloaded, images refused by SGLang)."),
    Hook("arg_groups.resolution_hooks.register_resolution_hook", READ, None,
         "the plugin API the `step` rows are registered through."),
    Hook("arg_groups.resolution_hooks._OVERRIDABLE_HOOKS", READ, None,
         "the steps of the `step` rows must stay overridable."),
    Hook("arg_groups.model_path_hook.handle_model_source_paths", STEP, arg_resolution.resolve_alias_step,
         "`--model deepseek-v4.1-tiny` becomes the generated checkpoint dir (served under the alias) and "
         "`deepseek-v4.1` the hub id, before any download."),
    Hook("arg_groups.platform_hook.handle_platform_defaults", STEP, arg_resolution.context_step,
         "on our CPU platform without --context-length: the context is what the KV pool can always schedule for one "
         "request (pool_limits.py), and never above the checkpoint's own (SGLang refused to start a checkpoint whose "
         "config.json says less than the pool)."),
    Hook("arg_groups.serving_hook.handle_missing_default_values", STEP, arg_resolution.cpu_device_step,
         "on our CPU platform the device is `cpu` (SGLang's get_device() knows none without CUDA or its CPU engine), "
         "and --sleep-on-idle is on (an idle scheduler spun a core at 100%)."),
    Hook("arg_groups.cuda_graph_hook.handle_cuda_graph_config", STEP, cuda_graphs.cuda_graphs_off_step,
         "for our model on CUDA SGLang's graph runners are disabled and its decode graph settings drive the "
         "model's own decode graphs (batch x capacity buckets, SGLANG_DSV41_DECODE_GRAPHS); flags that act only "
         "through SGLang's runners are rejected."),
    Hook("arg_groups.model_override_base.register_model_override", PROVIDER, arg_resolution.v41_overrides,
         "page size 64 when unset, even page sizes only, and startup errors naming rejected flags (server_args.py)."),
    # ------------------------------------------------ deterministic mode and our RL target (docs/rl.md)
    Hook("arg_groups.choices.add_rl_on_policy_target_choices", SETUP, rl_mode.add_rl_target,
         "`--rl-on-policy-target sglang_dsv41` (SGLang's seam for out-of-tree targets; plugins load before the "
         "parser is built)."),
    Hook("arg_groups.attention_hook.handle_deterministic_inference", STEP, arg_resolution.deterministic_step,
         "for our model with --enable-deterministic-inference or our RL target: our batch-invariant numerics "
         "(SGLANG_DSV41_DETERMINISTIC) and the radix cache kept; the target adds raw logprobs, routed experts and "
         "MKL's one CPU code path (full prefill: the provider). Our target on another architecture is refused."),
    Hook("arg_groups.overrides._deterministic_attention_backend", AROUND, arg_resolution.skip_attention_backend_check,
         "SGLang's deterministic attention-backend rule refuses the CPU platform's torch_native; our model's "
         "attention is its own, so the rule is skipped for it."),
    Hook("model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode", AROUND,
         rl_mode.skip_batch_invariant_mode,
         "for our model SGLang's batch-invariant aten ops stay off (they raise on the CPU; on CUDA they would replace "
         "the GEMMs the trainer runs with SGLang's Triton kernels)."),
    Hook("layers.sampler.Sampler.__init__", AFTER, rl_mode.keep_fp32_sampling,
         "with our target the sampler keeps its fp32 deterministic path (SGLang's targets sample from bf16-rounded "
         "logprobs, which is not the trainer's policy)."),
    Hook("layers.sampler.multinomial_with_seed", AROUND, seeded_sampling.sample_on_cpu,
         "deterministic inference samples by seeded Gumbel noise whose hash, on CPU tensors, is an sgl_kernel op our "
         "CPU platform does not have (the first sampled token ended the scheduler); CPU rows are sampled in torch, "
         "with the same hash."),
    Hook("managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state", AFTER,
         rl_mode.report_rl_state,
         "`/server_info` internal_states[i].dsv41: the scheduler's deterministic mode, raw logprobs, MKL_CBWR, "
         "ATEN_CPU_CAPABILITY and torch threads, which the trainer checks at start."),
    Hook("speculative.spec_info.SpeculativeAlgorithm.handle_server_args", AROUND, arg_resolution.dspark_step,
         "for our model with --speculative-algorithm DSPARK, on every device: the draft path is the model path, "
         "one step of top-1, gamma from the checkpoint's drafter (num draft tokens gamma + 1) and no overlap "
         "scheduler (the worker runs synchronously; SGLang turns it off on the CPU only for EAGLE and NGRAM). "
         "SGLang's _handle_dspark refuses --device cpu without asking the platform (its DFLASH path asks) and "
         "falls back to gamma 7. handle_speculative_decoding's other checks, before and after this call, pass on "
         "the CPU as they are."),
    Hook("mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class", AROUND,
         kv_budget.use_no_op_generic_pool,
         "for our model the generic MHA pool is SGLang's NoOpMHATokenToKVPool (no per-token bytes); the "
         "platform's get_kv_pool_cls seam, applied for our model on every device."),
    Hook("model_executor.pool_configurator.create_memory_pool_configurator", AFTER, kv_budget.size_from_our_bytes,
         "for our model the pool configurator sizes max_total_num_tokens from our bytes per token slot "
         "(KVPools + token store + the generic pool's 0) and our fixed bytes."),
    Hook("mem_cache.kv_cache_configurator.KVCacheConfigurator.configure", AFTER, kv_budget.allocate_at_load,
         "our KVPools are allocated at load, from the sizes of SGLang's pools."),
    Hook("mem_cache.unified_radix_cache.UnifiedRadixCache.swa_reprefill_tail_tokens", AFTER,
         swa_replay.cap_match_for_decoder_replay,
         "with decoder SWA bounded replay on and encoder replay off, a prefix match leaves the last 128 tokens "
         "to recompute (spec attention 6.4). Our window KV is per token slot in SGLang's generic pool, which has "
         "no SWA component, so SGLang's own cap (keyed on that component) is 0."),
    Hook("model_executor.encoder_swa_replay.run_encoder_swa_replay", AROUND, swa_replay.skip_encoder_replay_forward,
         "with --enable-encoder-swa-bounded-replay our model folds each hit's replay rows into its own forward "
         "(model/request_windows.py); SGLang's separate replay forward is skipped for it (it reads the DeepSeek "
         "pool's request_window, which the generic pool our model uses does not have)."),
    Hook("model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_disk", AROUND,
         weight_update.update_from_disk,
         "`/update_weights_from_disk` into our model: the directory is read by our confined, bounds-checked reader "
         "and validated whole (schema, finite data) into host memory, then copied in; a failure is a 400 naming "
         "the file and the old weights keep serving. SGLang's loader raised on a malformed shard or index and "
         "its rollback re-read the same files, which ended the scheduler."),
    Hook("managers.tp_worker.TpModelWorker.deserialize_own_rank", AROUND, weight_update.decode_payload,
         "for our model a `/update_weights_from_tensor` payload is safetensors bytes, decoded by our reader; "
         "SGLang unpickles it (its allowlist still lets a pickle call functions)."),
    Hook("managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.update_weights_from_tensor",
         AROUND, weight_update.refuse_bad_tensor_update,
         "for our model a payload or tensor our checks refuse, or a load_format, is a failed update (400); the "
         "exception ended the scheduler."),
    Hook("mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS", SETUP, cpu_host_alloc.add_cpu_allocator,
         "entry 'cpu' (unless SGLang has its own): --enable-return-routed-experts allocates the routed-expert "
         "capturer's host cache through ALLOC_MEMORY_FUNCS[device], whose default pins it with cudaHostRegister "
         "(no CUDA on CPU); on CPU the device cache is host memory, so nothing to pin."),
    Hook("managers.scheduler.Scheduler.maybe_init_draft_worker", AROUND, dspark_worker.init_draft_worker,
         "DSPARK on our model: the speculative worker is Dsv41DSparkWorker (the drafter's stages are in our model "
         "and its KV in our pools); SGLang's create_worker builds a separate draft runner for its V4 class, and the "
         "platform's worker seam is asked only off CUDA."),
    Hook("mem_cache.allocation.assign_req_to_token_pool_func", AROUND, cpu_req_to_token.assign_on_cpu,
         "speculative decode allocation writes req_to_token through a Triton kernel unless SGLang's own CPU engine "
         "runs; on our CPU platform the write is done in torch."),
    # ------------------------------------------------------------------ request hardening (requests/), scheduler side
    Hook("managers.scheduler.Scheduler.init_req_max_new_tokens", AROUND, fair_share.check_schedulable,
         "after SGLang clips max_new_tokens: a request the KV pool can never schedule is aborted alone with a 400 "
         "naming the limit (clipped to 0 new tokens, a prompt of pool - page .. pool - 7 tokens was never admitted "
         "and blocked the queue; a shorter one was answered empty); an unset max_new_tokens is clipped to fit."),
    Hook("managers.schedule_policy.PrefillAdder.add_one_req", AROUND, fair_share.share_long_requests,
         "long fixed-length requests hold at most the long share of the pool together; one that does not fit waits "
         "without stopping the queue (SGLang's FCFS loop ends at the first request that does not fit)."),
    Hook("managers.schedule_policy.PrefillAdder.add_chunked_req", AROUND, fair_share.charge_long_chunk,
         "a long request's next prompt chunk is charged its whole output (SGLang: nothing until the last chunk)."),
    Hook("managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset", AROUND,
         fair_share.charge_long_running,
         "a running long request is charged all of its remaining output (SGLang: at most 4096 tokens, so it admitted "
         "more than the pool could finish, then retracted)."),
    Hook("managers.scheduler.Scheduler.abort_request", AROUND, aborts.abort_exactly,
         "an abort ends exactly the rid it names (SGLang matched by prefix: aborting job-1 ended job-10 .. job-19)."),
    Hook("managers.utils.validate_input_length", AFTER, admission.check_admitted,
         "the scheduler's per-request admission check; an error string aborts that request alone "
         "(Req.set_finish_with_abort). We add the rules whose breach ends the scheduler: ids in range, "
         "non-empty, top logprobs <= vocab, top_k in int32, logit bias and stop ids."),
    Hook("utils.common.build_server_info", AFTER, info_endpoints.redact_server_info,
         "the server-info dict (every server arg, the launch command) loses its secrets and the launch command, and "
         "names the model as the user passed it, also where SGLang serves it without HTTP (gRPC, Rust server)."),
    Hook("managers.scheduler_components.profiler_manager.SchedulerProfilerManager._stop_profile", AROUND,
         admin_endpoints.stop_profile_keeping_scheduler,
         "an OSError writing a profile trace is a refused stop, not the scheduler's end."),
    Hook("managers.scheduler_components.profiler_manager.SchedulerProfilerManager._profile", AROUND,
         admin_endpoints.one_profile_at_a_time,
         "a start while a profile runs is refused (SGLang started a second profiler over the first)."),
)

_OPENAI = "entrypoints.openai."
_OLLAMA = "entrypoints.ollama.serving.OllamaServing."
_CONTROL = "managers.tokenizer_control_mixin.TokenizerControlMixin."

# Installed only in the front-end process (HTTP server and tokenizer manager): registering them elsewhere
# would make the scheduler subprocesses import the HTTP server.
FRONT_END = (
    Hook(_OPENAI + "serving_completions.OpenAIServingCompletion._validate_request", AFTER,
         admission.check_openai_request,
         "SGLang ignores the request's `model`; a name this server does not serve becomes a 4xx. Then the "
         "completions rules of validation.py (prompt ids, n, logprobs, stop ids, logit bias)."),
    Hook(_OPENAI + "serving_chat.OpenAIServingChat._validate_request", AFTER, admission.check_openai_request,
         "the same model-name check, then the chat rules (max_tokens >= 1, n, top_logprobs, text-only content)."),
    Hook(_OPENAI + "serving_tokenize.OpenAIServingDetokenize._validate_request", AFTER,
         admission.check_detokenize_request,
         "(on the inherited no-op) `/detokenize` ids must be ids of the tokenizer (a 500 before)."),
    Hook(_OPENAI + "serving_score.OpenAIServingScore._validate_request", AFTER, admission.check_other_openai_request,
         "(on the inherited no-op) the model-name check, then the `/v1/score` rules of other_endpoints.py (no "
         "embedding overrides: they killed the scheduler; no text query with token-id items: a silent wrong score)."),
    Hook(_OPENAI + "serving_tokenize.OpenAIServingTokenize._validate_request", AFTER,
         admission.check_other_openai_request,
         "(on the inherited no-op) the model-name check, as on every OpenAI endpoint."),
    Hook(_OLLAMA + "handle_generate", AROUND, other_endpoints.ollama_request,
         "Ollama rules first (model name, options, unserved fields); SGLang's own ValueErrors become a 400 (were "
         "a 500), and a stream is run to its first chunk before the 200 is sent."),
    Hook(_OLLAMA + "handle_chat", AROUND, other_endpoints.ollama_request,
         "the same as handle_generate, and a 400 when the tokenizer has no chat template (was a 500)."),
    Hook(_OLLAMA + "get_show", AROUND, other_endpoints.ollama_show,
         "`/api/show` of a model this server does not serve is a 404 (SGLang described any name)."),
    Hook(_OLLAMA + "_stream_generate_response", AROUND, other_endpoints.ollama_generate_stream,
         "SGLang's `/api/generate` stream dropped the text of its final chunk (a streamed answer lost its last "
         "token); ours sends every delta and a `done_reason` of `length` or `stop`."),
    Hook(_OLLAMA + "_generate_generate_response", AROUND, other_endpoints.ollama_generate_once,
         "a plain `/api/generate` answer says why it ended (`length` or `stop`; SGLang always said `stop`)."),
    Hook(_OPENAI + "serving_tokenize.OpenAIServingTokenize._handle_non_streaming_request", AROUND,
         other_endpoints.tokenize_context,
         "`/v1/tokenize` reports the server's context length as `max_model_len` (SGLang: the tokenizer's "
         "model_max_length), and tokenizes a large text in a worker thread (SGLang: on the event loop)."),
    Hook("entrypoints.api_contract.generate_contract_error", AFTER, admission.check_generate_body,
         "`/generate` answers a non-None result with a 400 before streaming starts; we add the native "
         "endpoint's rules (ids, max_new_tokens >= 1, n, top_logprobs_num, text budget); `/vertex_generate` "
         "calls it with its own body, whose instances and parameters get the same rules."),
    Hook("entrypoints.http_server.get_global_state", READ, None,
         "the tokenizer manager (vocabulary, context) for the `/generate` rules."),
    Hook("managers.tokenizer_manager.TokenizerManager._validate_one_request", AFTER, admission.check_tokenized,
         "every generate request after tokenization, from every entry point: ids in range, non-empty, top "
         "logprobs <= vocab, top_k, logit bias, stop ids, text-only, return_routed_experts only with "
         "--enable-return-routed-experts (SGLang dropped it silently)."),
    Hook("managers.tokenizer_manager.TokenizerManager.abort_request", AROUND, aborts.abort_named,
         "an abort of a rid that is not live ends the requests SGLang derived from it (a batch's prompts, n > 1 "
         "samples); SGLang forwarded only a rid it holds a state for, so aborting those parents did nothing."),
    Hook("managers.io_struct.GenerateReqInput.regenerate_rid", AROUND, aborts.derived_sample_rid,
         "an n > 1 sample (and its warmup) is named `<prompt rid>-<32 hex>` instead of a bare uuid, so an abort "
         "of the request's rid can find it."),
    Hook("managers.tokenizer_manager.TokenizerManager._tokenize_texts", AROUND, admission.tokenize_texts,
         "refuse a text whose byte size proves it exceeds the context, and tokenize large texts in a worker "
         "thread so the event loop keeps serving other clients."),
    Hook("entrypoints.http_server._setup_and_run_http_server", BEFORE, error_handlers.add_error_handlers,
         "register our error handlers on the app: malformed requests (SGLang's handler echoes the endpoint's "
         "file path and line) and exceptions escaping body validation (Starlette's 500)."),
    Hook("entrypoints.http_server._setup_and_run_http_server", AROUND, info_endpoints.add_info_redaction,
         "our middleware on the app (Starlette's add_middleware, before uvicorn starts) rewrites the info endpoints' "
         "bodies: no API key, "
         "password or launch command (`/server_info` gave them, per scheduler too, to any user-key holder), and "
         "the model as the user passed it (`/model_info` showed our alias's generated directory)."),
    Hook(_CONTROL + "release_memory_occupation", AROUND, admin_endpoints.refuse_memory_occupation_on_cpu,
         "on our CPU platform `/release_memory_occupation` is a 400 in the front end (SGLang's scheduler "
         "synchronises the CUDA device there, which killed a CPU server)."),
    Hook(_CONTROL + "resume_memory_occupation", AROUND, admin_endpoints.refuse_memory_occupation_on_cpu,
         "the same for `/resume_memory_occupation`."),
    Hook(_CONTROL + "_execute_profile", AROUND, admin_endpoints.checked_profile,
         "`/start_profile` fields checked before the scheduler (an unknown activity list killed it), and its "
         "trace kept inside the profile directory (`output_dir` with `../` wrote anywhere); SGLang's refusals "
         "become 400s instead of 500s."),
    Hook(_CONTROL + "init_weights_update_group", AROUND, admin_endpoints.checked_weight_group,
         "a weight-update group that cannot form is a 400 (the scheduler blocked in its rendezvous)."),
    Hook("managers.tokenizer_manager.TokenizerManager._update_model_path_info", AROUND,
         weight_update.keep_served_name,
         "after a disk weight update SGLang served the model under the update directory's path (clients "
         "naming the model got 400); for our model the served name and path stay."),
    Hook("managers.tokenizer_manager.TokenizerManager.configure_logging", AROUND, admin_endpoints.checked_logging,
         "`/configure_logging` fields checked before SGLang stores them (a bad log level made every later "
         "request fail)."),
    Hook(_CONTROL + "start_expert_distribution_record", AROUND, admin_endpoints.refuse_expert_recording_when_off,
         "a 400 without a recorder mode (the scheduler's no-op recorder raised)."),
    Hook(_CONTROL + "stop_expert_distribution_record", AROUND, admin_endpoints.refuse_expert_recording_when_off,
         "the same."),
    Hook(_CONTROL + "dump_expert_distribution_record", AROUND, admin_endpoints.refuse_expert_recording_when_off,
         "the same."),
)

HOOKS = EVERY_PROCESS + FRONT_END


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


def apply(hook: Hook) -> None:
    """Install one row (a `read` row installs nothing)."""
    if hook.kind in (BEFORE, AFTER, AROUND):
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind.upper()])
    elif hook.kind == STEP:
        from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

        register_resolution_hook(hook.target.rsplit(".", 1)[1])(hook.fn)
    elif hook.kind == PROVIDER:
        from sglang.srt.arg_groups.model_override_base import register_model_override

        register_model_override(ARCHITECTURE)(hook.fn)
    elif hook.kind == SETUP:
        hook.fn()
    elif hook.kind != READ:
        raise ValueError(f"{hook.target}: unknown hook kind {hook.kind!r}")


def _front_end_process() -> bool:
    """The process that serves HTTP and owns the tokenizer manager (the launcher, or an Engine's process).
    SGLang's scheduler, detokenizer and DP controller are its multiprocessing children."""
    import multiprocessing

    return multiprocessing.parent_process() is None


def install() -> None:
    """Install every row. Called by the general plugin; SGLang's `load_plugins()` runs each plugin once per
    process (it guards itself) and then applies the HookRegistry hooks. Keeps no state of its own."""
    for hook in EVERY_PROCESS + (FRONT_END if _front_end_process() else ()):
        apply(hook)
