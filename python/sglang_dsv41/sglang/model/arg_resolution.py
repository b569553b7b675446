"""The steps of SGLang's server-arg resolution we wrap, and the per-architecture provider of our model: they
read SGLang's resolving view and apply server_args.py's rules (aliases, the CPU device, V4.1 defaults and
rejected flags)."""

from __future__ import annotations

import logging
import os

from sglang_dsv41.sglang.model.server_args import (ARCHITECTURE, DEFAULT_PAGE_SIZE, RL_FLAG, deterministic_env,
                                                   is_dspark, is_rl_target, resolve_model_name, v41_defaults,
                                                   validate_flags)
from sglang_dsv41.sglang.platform import on_our_cpu_platform
from sglang_dsv41.sglang.pool_limits import default_context

logger = logging.getLogger(__name__)


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
    (SGLang's get_device() knows no device when CUDA is absent and its CPU engine is off), and an idle
    scheduler waits for its next request (SGLang's --sleep-on-idle: a zmq poll that wakes on the
    request) instead of spinning: on a CPU server the spin takes a core the forward needs."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    view = resolving_view(server_args)
    if on_our_cpu_platform():
        if view.device is None:
            declare_resolution(server_args, "sglang_dsv41.cpu_device", device="cpu")
        if not view.sleep_on_idle:
            declare_resolution(server_args, "sglang_dsv41.cpu_idle", sleep_on_idle=True)
    previous(server_args)


def context_step(server_args, previous) -> None:
    """Wrapper of SGLang's handle_platform_defaults (our CPU platform's defaults: `max_total_tokens`, and
    `context_length` = min(that, V4.1's 1M) when unset). When the user gave no --context-length, the context
    becomes what the pool can always schedule for one request (pool_limits.default_context), and never more than
    the checkpoint's own context: SGLang refuses a context above the one it derives from config.json, so a
    checkpoint saying 4096 did not start. The checkpoint's context is read before the platform runs, while the
    context is still unset (SGLang's ModelConfig, memoized for the rest of the resolution, raises on a larger one)."""
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.utils.hf_transformers import get_context_length

    ours = resolving_view(server_args).context_length is None and on_our_cpu_platform()
    model_config = model_config_of(server_args) if ours else None
    previous(server_args)
    if model_config is None:
        return
    cfg = resolving_view(server_args)
    checkpoint = get_context_length(model_config.hf_text_config)
    page = cfg.page_size or (DEFAULT_PAGE_SIZE if model_config.hf_config.architectures == [ARCHITECTURE] else 1)
    current = cfg.context_length if cfg.context_length is not None else checkpoint
    context = default_context(cfg.max_total_tokens, page, checkpoint, current)
    if context != cfg.context_length:
        logger.info("sglang-dsv41: context length %d (KV pool %s tokens in pages of %d, checkpoint %d)", context,
                    cfg.max_total_tokens, page, checkpoint)
        declare_resolution(server_args, "sglang_dsv41.context_length", context_length=context)


def checkpoint_config(path: str, hf_config):
    """Our ModelConfig of the checkpoint: its config.json when `path` is a directory (the embedded aliases are
    directories by now), else SGLang's parsed HF config (a hub id); None when neither can be read."""
    from sglang_dsv41.config import ModelConfig

    try:
        return ModelConfig.from_pretrained(path) if os.path.isdir(path) else ModelConfig.from_hf(hf_config)
    except (OSError, ValueError, TypeError, KeyError) as e:
        logger.warning("sglang-dsv41: cannot read the model config of %s (%s)", path, e)
        return None


def v41_overrides(server_args, hf_config) -> dict:
    """Provider registered for DeepseekV41ForCausalLM."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    on_cpu = cfg.device == "cpu"
    validate_flags(cfg, on_cpu, checkpoint_config(cfg.model_path, hf_config) if is_dspark(cfg) else None)
    raw = dict(getattr(server_args, "_raw_input", None) or {})
    return v41_defaults(cfg, raw, on_cpu)


def _serves_v41(server_args) -> bool:
    from sglang.srt.arg_groups.model_override_base import model_config_of

    return model_config_of(server_args).hf_config.architectures == [ARCHITECTURE]


def deterministic_step(server_args, previous) -> None:
    """Wrapper of SGLang's handle_deterministic_inference, for our model with --enable-deterministic-inference or
    our RL target (SGLang turns the former on for any target). SGLang's step runs (pytorch sampling, no all-reduce
    fusion; its attention-backend rule is skipped for our model by `skip_attention_backend_check`), then:
      - the radix cache stays as it was: SGLang turns it off for attention backends it has not checked, and our
        attention is our own, whose prefix hits are exact;
      - the environment the scheduler inherits (server_args.deterministic_env): our batch-invariant numerics, and
        for the RL target SGLang's raw logprobs and MKL's one CPU code path;
      - for the RL target, routed experts are returned (full prefill was declared by the provider, which runs
        earlier). Our target on another architecture is refused here: the provider runs only for ours."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    rl = is_rl_target(cfg)
    if not (rl or cfg.enable_deterministic_inference) or not _serves_v41(server_args):
        if rl:
            from sglang.srt.arg_groups.model_override_base import model_config_of

            raise ValueError(f"{RL_FLAG}: serves {ARCHITECTURE} only, not "
                             f"{model_config_of(server_args).hf_config.architectures}; remove it for this model")
        return previous(server_args)
    env = deterministic_env(rl, cfg.device == "cpu", os.environ)
    radix = cfg.disable_radix_cache
    previous(server_args)
    fields = {"enable_return_routed_experts": True} if rl else {}
    if resolving_view(server_args).disable_radix_cache != radix:
        fields["disable_radix_cache"] = radix
    if fields:
        declare_resolution(server_args, "sglang_dsv41.deterministic", **fields)
    os.environ.update(env)
    logger.info("sglang-dsv41: %s: %s", RL_FLAG if rl else "--enable-deterministic-inference",
                ", ".join([f"{k}={v}" for k, v in env.items()] + [f"{k}={v}" for k, v in fields.items()]))


def skip_attention_backend_check(original, view) -> dict:
    """AROUND hook on SGLang's `_deterministic_attention_backend(view)` pass: for our model nothing (its SGLang
    attention backend is a placeholder; our attention is batch-invariant in deterministic mode, determinism.py).
    SGLang's pass refuses the CPU platform's torch_native and picks fa3 / triton / flashinfer on CUDA."""
    return {} if _serves_v41(view) else original(view)


DSPARK_MAX_RUNNING = 48
"""SGLang's DSPARK default batch cap, applied on CUDA when --max-running-requests is unset (the CPU platform has
already set its own)."""


def dspark_step(original, algo, server_args) -> None:
    """AROUND hook on SGLang's `SpeculativeAlgorithm.handle_server_args(self, server_args)`: for our model with
    DSPARK it declares what SGLang's `_handle_dspark` would (that one refuses the CPU and falls back to gamma 7),
    with gamma from the checkpoint's drafter; anything else goes to SGLang. The flags we refuse were refused by
    the provider (v41_overrides), which runs earlier."""
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.speculative.ragged_verify import read_ragged_verify_mode

    if not algo.is_dspark() or model_config_of(server_args).hf_config.architectures != [ARCHITECTURE]:
        return original(algo, server_args)
    read_ragged_verify_mode()  # SGLang validates the env for every algorithm here
    cfg = resolving_view(server_args)
    fields = dspark_fields(cfg, checkpoint_config(cfg.model_path, model_config_of(server_args).hf_config))
    if not cfg.disable_overlap_schedule:
        logger.info("sglang-dsv41: DSPARK runs without the overlap scheduler (the worker runs synchronously)")
    declare_resolution(server_args, "sglang_dsv41.dspark", **fields)


def dspark_fields(cfg, model_cfg) -> dict:
    """The server-arg fields DSPARK resolves to for our checkpoint (`cfg`: the resolving view)."""
    if model_cfg is None or model_cfg.dspark is None:  # the provider refused a checkpoint without a drafter
        raise ValueError(f"--speculative-algorithm: cannot read the DSpark drafter of {cfg.model_path}; remove it "
                         "to serve DeepSeek-V4.1")
    gamma = model_cfg.dspark.block_size
    fields = dict(speculative_draft_model_path=cfg.model_path, speculative_draft_model_revision=cfg.revision,
                  speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=gamma + 1,
                  speculative_dspark_block_size=gamma, disable_overlap_schedule=True)
    if cfg.max_running_requests is None and cfg.device != "cpu":
        fields["max_running_requests"] = DSPARK_MAX_RUNNING
    return fields
