"""V4.1 server-arg defaults and the SGLang features V4.1 rejects (spec model 8.2).

Plain functions over any object with ServerArgs attribute names, so they test without SGLang. The
plugin registers `v41_overrides` with SGLang's per-architecture override registry (arg_resolution.py); it
returns the fields to default and raises `ValueError` naming the flag for an unsupported combination.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from sglang_dsv41.determinism import DETERMINISTIC_ENV, deterministic

ARCHITECTURE = "DeepseekV41ForCausalLM"

MODEL_ALIASES = {"deepseek-v4.1": "deepseek-ai/DeepSeek-V4.1-Flash"}
"""Hub names SGLang downloads as usual; embedded names (sglang_dsv41.embedded) are generated locally."""

CPU_BIND_VAR = "SGLANG_CPU_OMP_THREADS_BIND"
"""SGLang's per-rank CPU core lists ('|'-separated); required on the CPU with more than one rank."""

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


def is_dspark(cfg: Any) -> bool:
    """DSPARK requested (SGLang upper-cases the name after the provider has run)."""
    spec = getattr(cfg, "speculative_algorithm", None)
    return spec is not None and str(spec).upper() == "DSPARK"


RL_TARGET = "sglang_dsv41"
"""Our `--rl-on-policy-target` choice (rl_mode.add_rl_target adds it to SGLang's): the server computes what this
package's trainer computes (docs/rl.md "Starting a server for RL")."""
RL_FLAG = f"--rl-on-policy-target {RL_TARGET}"
RETURN_ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"
"""SGLang's switch for logprobs of the raw distribution (read once, when the scheduler imports its sampler)."""
MKL_CBWR_ENV, MKL_CBWR = "MKL_CBWR", "COMPATIBLE"
"""MKL's one code path on every CPU and shape (read once, at MKL's first call)."""


def is_rl_target(cfg: Any) -> bool:
    return getattr(cfg, "rl_on_policy_target", None) == RL_TARGET


def _flag_errors(cfg: Any, on_cpu: bool, model_cfg: Any = None) -> list[tuple[str, str]]:
    """(flag, why) for every requested feature V4.1 (or this implementation) cannot serve.
    `--enable-return-routed-experts` is served on every device (on CPU through cpu_host_alloc.py), except
    with DSPARK. `model_cfg`: our ModelConfig of the checkpoint, None when unknown."""
    spec = getattr(cfg, "speculative_algorithm", None)
    tp, ep = getattr(cfg, "tp_size", 1) or 1, getattr(cfg, "ep_size", 1) or 1
    total, page = getattr(cfg, "max_total_tokens", None), getattr(cfg, "page_size", None) or DEFAULT_PAGE_SIZE
    checks = [
        ("--max-total-tokens", f"must hold at least one page of {page} tokens, got {total}",
         total is not None and total < page),
        ("--enable-hisparse", "DeepSeek-V4.1 does not support HiSparse", bool(getattr(cfg, "enable_hisparse", False))),
        ("--pp-size", "DeepSeek-V4.1 does not support pipeline parallelism (pp > 1)", (getattr(cfg, "pp_size", 1) or 1) > 1),
        ("--enable-two-batch-overlap", "DeepSeek-V4.1 does not support two-batch overlap",
         bool(getattr(cfg, "enable_two_batch_overlap", False))),
        ("--speculative-algorithm", f"DeepSeek-V4.1 accepts only DSPARK speculative decoding, got {spec!r}",
         spec is not None and str(spec).upper() != "DSPARK"),
        ("--enable-unified-memory", "DeepSeek-V4.1 does not support the unified KV layout",
         bool(getattr(cfg, "enable_unified_memory", False))),
        # not implemented by sglang-dsv41 yet (each would silently compute something else)
        # --tp-size N / --ep-size N: parallel/ over SGLang's TP group (docs/parallel.md)
        ("--ep-size", f"must be 1 or --tp-size ({tp}): routed experts are split over every TP rank or none",
         ep not in (1, tp)),
        ("--enable-dp-attention", "data-parallel attention is not implemented by sglang-dsv41 yet (every TP rank "
         "must run the same batch)", bool(getattr(cfg, "enable_dp_attention", False)) and tp > 1),
        ("--tp-size", f"{tp} ranks on the CPU need {CPU_BIND_VAR} (one core list per rank, e.g. '0|1' for 2 ranks; "
         "SGLang binds each rank's threads to it)", on_cpu and tp > 1 and not os.environ.get(CPU_BIND_VAR)),
        ("--enable-hierarchical-cache", "HiCache is not implemented by sglang-dsv41 yet (our KV pools are not "
         "SGLang's, so its host copies would miss them)", bool(getattr(cfg, "enable_hierarchical_cache", False))),
        ("--disaggregation-mode", "PD disaggregation is not implemented by sglang-dsv41 yet (our KV pools are "
         "not transferred)", getattr(cfg, "disaggregation_mode", "null") not in (None, "null")),
        ("--enable-lora", "LoRA adapters are not implemented by sglang-dsv41 yet",
         bool(getattr(cfg, "enable_lora", False)) or bool(getattr(cfg, "lora_paths", None))),
        ("--expert-distribution-recorder-mode", "DeepSeek-V4.1's MoE does not report to SGLang's expert recorder "
         "(per-token routed experts: --enable-return-routed-experts)",
         getattr(cfg, "expert_distribution_recorder_mode", None) is not None),
        ("--enable-eplb", "EPLB needs SGLang's expert recorder, which DeepSeek-V4.1's MoE does not report to",
         bool(getattr(cfg, "enable_eplb", False))),
    ]
    dspark = _dspark_errors(cfg, model_cfg) if is_dspark(cfg) else []
    return [(flag, why) for flag, why, bad in checks if bad] + _rl_errors(cfg) + _replay_errors(cfg) + dspark


def _rl_errors(cfg: Any) -> list[tuple[str, str]]:
    """(flag, why) for `--rl-on-policy-target`: SGLang's own targets (fsdp) tune SGLang layers our model does not
    run; ours refuses what would make the server compute something the trainer's forward does not."""
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    target = get("rl_on_policy_target")
    if target is None:
        return []
    if target != RL_TARGET:
        return [("--rl-on-policy-target", f"{target!r} tunes SGLang layers DeepSeek-V4.1 does not run (its trainer's "
                 f"target is {RL_TARGET})")]
    checks = [
        ("--speculative-algorithm", f"DSPARK is not served with {RL_FLAG} (it returns no routed experts, which the "
         "trainer replays)", is_dspark(cfg)),
        (ENCODER, f"is not served with {RL_FLAG} (its prefix-hit replay is not checked against the trainer's forward)",
         bool(get("enable_encoder_swa_bounded_replay", False))),
        (DECODER, f"is not served with {RL_FLAG} (prefill runs every layer on every row, as the trainer's forward "
         "does)", get("enable_decoder_swa_bounded_replay") is True),
    ]
    return [(flag, why) for flag, why, bad in checks if bad]


def deterministic_env(rl: bool, on_cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables `--enable-deterministic-inference` sets in the launcher for our model (the scheduler, spawned
    later, inherits them): our batch-invariant numerics; with `rl` (our RL target) also SGLang's raw logprobs and,
    on the CPU, MKL's one code path. Raises ValueError naming a variable the user set to another value."""
    flag = RL_FLAG if rl else "--enable-deterministic-inference"
    out = {DETERMINISTIC_ENV: "1"}
    if rl:
        out[RETURN_ORIGINAL_LOGPROB_ENV] = "1"
        if on_cpu:
            out[MKL_CBWR_ENV] = MKL_CBWR
    accepted = {DETERMINISTIC_ENV: lambda v: deterministic({DETERMINISTIC_ENV: v}),
                RETURN_ORIGINAL_LOGPROB_ENV: lambda v: v.lower() in ("1", "true"),  # SGLang's get_bool_env_var
                MKL_CBWR_ENV: lambda v: v == MKL_CBWR}
    for name, value in out.items():
        given = environ.get(name)
        if given is not None and not accepted[name](given):
            raise ValueError(f"{name}={given!r}: contradicts {flag}, which sets {name}={value}; unset it")
    return out


ENCODER = "--enable-encoder-swa-bounded-replay"
DECODER = "--enable-decoder-swa-bounded-replay"
REPLAY_WINDOW = 128
"""Tokens a bounded replay recomputes (spec attention 7): the released sliding window."""


def _replay_errors(cfg: Any) -> list[tuple[str, str]]:
    """(flag, why) for SWA bounded-replay combinations that cannot work (spec attention 7.1 / 7.2)."""
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    out: list[tuple[str, str]] = []
    if get("enable_encoder_swa_bounded_replay", False):
        page = get("page_size") or DEFAULT_PAGE_SIZE
        chunk = get("chunked_prefill_size")
        need = REPLAY_WINDOW + page
        checks = [
            ("--enable-mixed-chunk", "mixed prefill/decode batches", get("enable_mixed_chunk", False)),
            ("--enable-lora", "LoRA", get("enable_lora", False)),
            ("--enable-session-radix-cache", "radix sessions", get("enable_session_radix_cache", False)),
            ("--disaggregation-mode", "PD decode (decode receives the window from prefill and never replays)",
             get("disaggregation_mode") == "decode"),
            ("--chunked-prefill-size", f"a chunked prefill size below {need} tokens ({REPLAY_WINDOW} replay tokens plus "
             f"one page of {page}); got {chunk}", chunk is not None and 0 < chunk < need),
            ("--max-running-requests", "--max-running-requests <= 0",
             get("max_running_requests") is not None and get("max_running_requests") <= 0),
        ]
        out += [(flag, f"{ENCODER} does not support {what} yet") for flag, what, bad in checks if bad]
    if get("enable_decoder_swa_bounded_replay") is True and get("enable_return_hidden_states", False):
        out.append((DECODER, "cannot be combined with --enable-return-hidden-states (every prompt row's hidden "
                             "state is returned, so there is no tail to keep); disable one of them"))
    return out


RAGGED_VERIFY_VAR = "SGLANG_RAGGED_VERIFY_MODE"
_NO_DRAFT_RUNNER = ("the drafter is the checkpoint's own mtp.* stages, run by the target model (there is no draft "
                    "model runner)")
_LOSSLESS_ONLY = "only lossless chain rejection sampling is implemented for DSPARK"
_REJECTED_ROWS = "is not implemented with DSPARK (the verify's rejected draft rows would be reported too)"


def _dspark_errors(cfg: Any, model_cfg: Any) -> list[tuple[str, str]]:
    """(flag, why) for DSPARK combinations sglang-dsv41 cannot serve. `model_cfg` None (config unreadable):
    the checks that need the checkpoint's drafter are skipped."""
    get = lambda name, default=None: getattr(cfg, name, default)  # noqa: E731
    out = _dspark_checkpoint_errors(cfg, model_cfg) if model_cfg is not None else []
    mode = os.environ.get(RAGGED_VERIFY_VAR, "static")
    checks = [
        ("--tp-size", f"DSPARK over {get('tp_size')} ranks is not implemented by sglang-dsv41 yet (parallel/ shards no "
         "mtp.* stage, and draft and accept sampling would have to agree across ranks)", (get("tp_size", 1) or 1) > 1),
        ("--enable-dp-attention", "DSPARK with data-parallel attention (--attn-dp-size > 1) is not implemented by "
         "sglang-dsv41", bool(get("enable_dp_attention", False)) or (get("attn_dp_size", 1) or 1) > 1),
        ("--enable-encoder-swa-bounded-replay", "DSPARK with encoder SWA bounded replay is not implemented by "
         "sglang-dsv41 yet (a verify writes past the forward's end, which the request windows follow)",
         bool(get("enable_encoder_swa_bounded_replay", False))),
        ("--enable-mixed-chunk", "DSPARK with mixed prefill/decode batches is not implemented by sglang-dsv41 yet "
         "(running speculative rows would join a prefill as 1-token extend rows)",
         bool(get("enable_mixed_chunk", False))),
        ("--speculative-draft-model-path", f"{_NO_DRAFT_RUNNER}; a draft path other than --model-path "
         f"({get('model_path')}) cannot be served, got {get('speculative_draft_model_path')}",
         not _same_checkpoint(get("speculative_draft_model_path"), get("model_path"))),
        ("--speculative-use-block-verification", _LOSSLESS_ONLY,
         bool(get("speculative_use_block_verification", False))),
        ("--speculative-accept-threshold-single", f"{_LOSSLESS_ONLY}; a threshold other than 1.0 is lossy, got "
         f"{get('speculative_accept_threshold_single')}", get("speculative_accept_threshold_single", 1.0) != 1.0),
        ("--speculative-accept-threshold-acc", f"{_LOSSLESS_ONLY}; a threshold other than 1.0 is lossy, got "
         f"{get('speculative_accept_threshold_acc')}", get("speculative_accept_threshold_acc", 1.0) != 1.0),
        ("--speculative-adaptive", "DSPARK verifies every one of gamma + 1 rows each step; adaptive step counts are "
         "not implemented", bool(get("speculative_adaptive", False))),
        (RAGGED_VERIFY_VAR, f"only 'static' is implemented (every gamma + 1 row verified), got {mode!r}",
         mode != "static"),
        ("--speculative-dspark-sps-table-path", "the ragged-verify budget is not implemented by sglang-dsv41 "
         "(every gamma + 1 row is verified)", get("speculative_dspark_sps_table_path") is not None),
        ("--speculative-dspark-confidence-sts-path", "the confidence head drives no verify budget in sglang-dsv41 "
         "(every gamma + 1 row is verified)", get("speculative_dspark_confidence_sts_path") is not None),
        ("--speculative-dspark-align-verify-tokens-to-graph-tier", "sglang-dsv41 verifies every gamma + 1 row and "
         "captures no CUDA graph tiers", bool(get("speculative_dspark_align_verify_tokens_to_graph_tier", False))),
        ("--enable-return-routed-experts", _REJECTED_ROWS, bool(get("enable_return_routed_experts", False))),
        ("--enable-return-hidden-states", _REJECTED_ROWS, bool(get("enable_return_hidden_states", False))),
    ]
    ignored = [("--speculative-draft-attention-backend", "speculative_draft_attention_backend"),
               ("--speculative-draft-load-format", "speculative_draft_load_format"),
               ("--speculative-moe-runner-backend", "speculative_moe_runner_backend"),
               ("--speculative-token-map", "speculative_token_map")]
    checks += [(flag, f"{_NO_DRAFT_RUNNER}, so it would be ignored", get(name) is not None) for flag, name in ignored]
    return out + [(flag, why) for flag, why, bad in checks if bad]


def _dspark_checkpoint_errors(cfg: Any, model_cfg: Any) -> list[tuple[str, str]]:
    """The checkpoint's drafter: present, no vision tower served beside it, and the block size the flags ask for."""
    if model_cfg.dspark is None:
        return [("--speculative-algorithm", "this checkpoint has no DSpark drafter (no mtp.* stages, or "
                 "dspark_block_size 0)")]
    if model_cfg.vision is not None and not getattr(cfg, "language_model_only", False):
        return [("--speculative-algorithm", "DSPARK with image input is not verified by sglang-dsv41 yet (a DSPARK "
                 "server's prefill of an image prompt does not equal the reference, docs/dspark.md); add "
                 "--language-model-only to serve this checkpoint's text model with DSPARK")]
    gamma = model_cfg.dspark.block_size
    block = getattr(cfg, "speculative_dspark_block_size", None)
    tokens = getattr(cfg, "speculative_num_draft_tokens", None)
    page = getattr(cfg, "page_size", None)
    checks = [
        ("--speculative-dspark-block-size", f"the checkpoint's drafter drafts gamma = {gamma} tokens per step, got "
         f"{block}", block is not None and block != gamma),
        ("--speculative-num-draft-tokens", f"must be gamma + 1 = {gamma + 1} for the checkpoint's drafter, got "
         f"{tokens}", tokens is not None and tokens != gamma + 1),
        # SGLang allocates each request up to ceil_page(committed + 2 (gamma + 1)) slots; the per-request overhead
        # our admission counts (pool_limits.per_request_overhead: two pages and one slot) covers it when p >= 2 gamma
        ("--page-size", f"with DSPARK a page must hold at least 2 x gamma = {2 * gamma} tokens (SGLang reserves "
         f"2 (gamma + 1) slots ahead of every request), got {page}", page is not None and page < 2 * gamma),
    ]
    return [(flag, why) for flag, why, bad in checks if bad]


def _same_checkpoint(draft: str | None, model: str | None) -> bool:
    """No draft path, or the model's own (the same directory spelled differently counts)."""
    if draft is None or draft == model:
        return True
    try:
        return model is not None and os.path.samefile(draft, model)
    except OSError:
        return False


def resolve_decoder_replay(cfg: Any, raw: dict) -> bool | None:
    """The tri-state decoder flag: an explicit --[no-]enable-decoder-swa-bounded-replay wins (None is
    returned: nothing to declare; an explicit on with our RL target is refused by `_rl_errors`); otherwise on,
    unless every prompt row's hidden state is asked for or our RL target wants full prefill.
    Our runtime supports it on every device (CPU included) for any chunk size and page size."""
    if raw.get("enable_decoder_swa_bounded_replay") is not None:
        return None
    return not (bool(getattr(cfg, "enable_return_hidden_states", False)) or is_rl_target(cfg))


def validate_flags(cfg: Any, on_cpu: bool, model_cfg: Any = None) -> None:
    """Raise ValueError naming the first unsupported flag (or a bad SGLANG_DSV41_DETERMINISTIC value).
    `model_cfg`: our ModelConfig of the checkpoint (needed for the DSPARK drafter checks), None when unknown."""
    deterministic()
    errors = _flag_errors(cfg, on_cpu, model_cfg)
    if errors:
        flag, why = errors[0]
        raise ValueError(f"{flag}: {why}; remove it to serve DeepSeek-V4.1")


def v41_defaults(cfg: Any, raw: dict, on_cpu: bool) -> dict:
    """Fields to default for V4.1 (`raw` = what the user passed; only unset ones are touched).

    Only fields SGLang lets a model override declare (its "resolvable" set) can go here: the page
    size and the tri-state decoder SWA bounded replay flag. Chunked prefill needs nothing: SGLang already defaults `chunked_prefill_size` (4096 on CPU,
    by memory size on GPUs) and the runtime is exact for any chunk size."""
    out: dict = {}
    decoder = resolve_decoder_replay(cfg, raw) if cfg is not None else None
    if decoder is not None:
        out["enable_decoder_swa_bounded_replay"] = decoder
    page = raw.get("page_size")
    if page is None:
        out["page_size"] = DEFAULT_PAGE_SIZE
    elif page % 2:
        raise ValueError(f"--page-size: DeepSeek-V4.1 needs an even page size (ratio-2 pairs share a compressed slot), got {page}")
    return out


@dataclass(frozen=True)
class ReplayModes:
    """The resolved SWA bounded-replay flags, as the model process sees them."""

    decoder: bool
    encoder: bool


def swa_replay_modes() -> ReplayModes:
    """Read the resolved flags from SGLang's published config (scheduler / model process)."""
    from sglang.srt.runtime_context import get_exec

    f = get_exec().features
    return ReplayModes(decoder=bool(f.enable_decoder_swa_bounded_replay),
                       encoder=bool(f.enable_encoder_swa_bounded_replay))
