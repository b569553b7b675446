"""The steps of SGLang's server-arg resolution we wrap, and the per-architecture provider of our model: they
read SGLang's resolving view and apply server_args.py's rules (aliases, the CPU device, V4.1 defaults and
rejected flags)."""

from __future__ import annotations

import logging

from sglang_dsv41.sglang.model.server_args import (ARCHITECTURE, DEFAULT_PAGE_SIZE, resolve_model_name, v41_defaults,
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
    (SGLang's get_device() knows no device when CUDA is absent and its CPU engine is off)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    if resolving_view(server_args).device is None and on_our_cpu_platform():
        declare_resolution(server_args, "sglang_dsv41.cpu_device", device="cpu")
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


def v41_overrides(server_args, hf_config) -> dict:
    """Provider registered for DeepseekV41ForCausalLM."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    on_cpu = cfg.device == "cpu"
    validate_flags(cfg, on_cpu)
    raw = dict(getattr(server_args, "_raw_input", None) or {})
    return v41_defaults(cfg, raw, on_cpu)
