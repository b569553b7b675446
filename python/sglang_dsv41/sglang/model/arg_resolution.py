"""The steps of SGLang's server-arg resolution we wrap, and the per-architecture provider of our model: they
read SGLang's resolving view and apply server_args.py's rules (aliases, the CPU device, V4.1 defaults and
rejected flags)."""

from __future__ import annotations

import logging

from sglang_dsv41.sglang.model.server_args import resolve_model_name, v41_defaults, validate_flags
from sglang_dsv41.sglang.platform import on_our_cpu_platform

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


def v41_overrides(server_args, hf_config) -> dict:
    """Provider registered for DeepseekV41ForCausalLM."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    on_cpu = cfg.device == "cpu"
    validate_flags(cfg, on_cpu)
    raw = dict(getattr(server_args, "_raw_input", None) or {})
    return v41_defaults(cfg, raw, on_cpu)
