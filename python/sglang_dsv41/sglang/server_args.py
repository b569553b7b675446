"""V4.1 server-arg defaults and the SGLang features V4.1 rejects (spec model 8.2).

Plain functions over any object with ServerArgs attribute names, so they test without SGLang. The
plugin registers `v41_overrides` with SGLang's per-architecture override registry (hooks.py); it
returns the fields to default and raises `ValueError` naming the flag for an unsupported combination.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURE = "DeepseekV41ForCausalLM"

MODEL_ALIASES = {"deepseek-v4.1": "deepseek-ai/DeepSeek-V4.1-Flash"}
"""Hub names SGLang downloads as usual; embedded names (sglang_dsv41.embedded) are generated locally."""

DEFAULT_PAGE_SIZE = 64
"""Even (a ratio-2 pair shares `slot // 2`) and a multiple of 2 so pages align compressed slots."""


def resolve_model_name(name: str) -> tuple[str, str | None]:
    """-> (path SGLang should load, served name or None). Embedded aliases become their generated
    checkpoint dir (served under the alias); `deepseek-v4.1` becomes the released hub id."""
    from sglang_dsv41.embedded import EMBEDDED_MODELS, resolve_model_path

    if name in EMBEDDED_MODELS:
        return str(resolve_model_path(name)), name
    if name in MODEL_ALIASES:
        return MODEL_ALIASES[name], name
    return name, None


def _flag_errors(cfg: Any, on_cpu: bool) -> list[tuple[str, str]]:
    """(flag, why) for every requested feature V4.1 (or this implementation) cannot serve.
    `--enable-return-routed-experts` is served on every device (on CPU through hooks.py's host allocator)."""
    spec = getattr(cfg, "speculative_algorithm", None)
    checks = [
        ("--enable-hisparse", "DeepSeek-V4.1 does not support HiSparse", bool(getattr(cfg, "enable_hisparse", False))),
        ("--pp-size", "DeepSeek-V4.1 does not support pipeline parallelism (pp > 1)", (getattr(cfg, "pp_size", 1) or 1) > 1),
        ("--enable-two-batch-overlap", "DeepSeek-V4.1 does not support two-batch overlap",
         bool(getattr(cfg, "enable_two_batch_overlap", False))),
        ("--speculative-algorithm", f"DeepSeek-V4.1 accepts only DSPARK speculative decoding, got {spec!r}",
         spec is not None and str(spec).upper() != "DSPARK"),
        ("--speculative-algorithm", "the DSPARK draft is not implemented by sglang-dsv41 yet",
         spec is not None and str(spec).upper() == "DSPARK"),
        ("--enable-encoder-swa-bounded-replay", "encoder SWA bounded replay needs CUDA (not available on CPU)",
         on_cpu and bool(getattr(cfg, "enable_encoder_swa_bounded_replay", False))),
        ("--enable-encoder-swa-bounded-replay", "encoder SWA bounded replay is not implemented by sglang-dsv41 yet "
         "(window KV is kept per token slot instead, so prefix hits are exact)",
         not on_cpu and bool(getattr(cfg, "enable_encoder_swa_bounded_replay", False))),
        ("--enable-decoder-swa-bounded-replay", "decoder SWA bounded replay is not implemented by sglang-dsv41 yet "
         "(prefill always runs every layer on every row)", bool(getattr(cfg, "enable_decoder_swa_bounded_replay", False))),
        ("--enable-unified-memory", "DeepSeek-V4.1 does not support the unified KV layout",
         bool(getattr(cfg, "enable_unified_memory", False))),
    ]
    return [(flag, why) for flag, why, bad in checks if bad]


def validate_flags(cfg: Any, on_cpu: bool) -> None:
    """Raise ValueError naming the first unsupported flag."""
    errors = _flag_errors(cfg, on_cpu)
    if errors:
        flag, why = errors[0]
        raise ValueError(f"{flag}: {why}; remove it to serve DeepSeek-V4.1")


def v41_defaults(cfg: Any, raw: dict, on_cpu: bool) -> dict:
    """Fields to default for V4.1 (`raw` = what the user passed; only unset ones are touched).

    Only fields SGLang lets a model override declare (its "resolvable" set) can go here: the page
    size. Chunked prefill needs nothing: SGLang already defaults `chunked_prefill_size` (4096 on CPU,
    by memory size on GPUs) and the runtime is exact for any chunk size."""
    out: dict = {}
    page = raw.get("page_size")
    if page is None:
        out["page_size"] = DEFAULT_PAGE_SIZE
    elif page % 2:
        raise ValueError(f"--page-size: DeepSeek-V4.1 needs an even page size (ratio-2 pairs share a compressed slot), got {page}")
    return out
