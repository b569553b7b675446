"""SGLang's CUDA graphs are off for DeepSeek-V4.1 on CUDA (docs/sglang.md "CUDA graphs").

The adapter's extend / prefill forward (forward.build_batch; decode under encoder SWA replay too) reads
batch lengths on the host and sizes tensors from them (the token table is as wide as the longest
request), so SGLang's breakable prefill graph (on by default on CUDA) would fail at capture or replay
the capture batch's shapes. Its pure-decode forward is fixed-shape and host-sync-free
(decode_batch.py), but nothing connects it to SGLang's decode graph runner yet: its token-table
capacity is chosen per step from host lengths (a graph would keep the capture's; the runner keys
graphs on batch size only and cannot fall back to eager for longer contexts), the runner's padding rows
are not told apart (`Batch.real_rows` is not passed), and which slots SGLang's warm-up and capture
batches write is unchecked. The capture-safe decode step in use is the engine-agnostic one
(runtime/graph.py `DecodeGraph`), used by the offline driver.

`cuda_graphs_off_step` wraps SGLang's resolution step `handle_cuda_graph_config`: for our
architecture on a CUDA device it rejects flags that only act through graph capture (each would
silently do nothing) and declares both phases disabled (one log line). Other architectures and
other devices (our CPU platform has no graph capture at all) are left as SGLang resolves them.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_dsv41.sglang.model.server_args import ARCHITECTURE

logger = logging.getLogger(__name__)

SOURCE = "sglang_dsv41.cuda_graphs_off"
"""Name of our declaration in SGLang's resolution record."""

OFFLINE_DECODE = "python -m sglang_dsv41.runtime.driver (one CUDA graph per batch size, runtime/graph.py)"

LOG_LINE = (f"sglang-dsv41: CUDA graphs disabled for {ARCHITECTURE} on CUDA (decode and prefill): the adapter's "
            "prefill forward sizes tensors from batch lengths read on the host, and its fixed-shape decode forward "
            "is not wired into SGLang's decode graph runner (per-step capacity, padding rows, capture batches), so "
            "a captured graph would fail or replay the capture batch's shapes; graph-captured decode today: "
            f"{OFFLINE_DECODE}; docs/sglang.md 'CUDA graphs'")

# ServerArgs fields (unset value) whose only effect is on graph capture: asked for, they would be
# silently ignored with graphs off. Flags that turn graphs off (--disable-cuda-graph,
# --disable-{decode,prefill}-cuda-graph, a backend of 'disabled') are accepted.
CAPTURE_ONLY_FIELDS = {
    "enable_torch_compile": (False, "torch.compile runs only inside SGLang's graph runners"),
    "cuda_graph_max_bs_decode": (None, "sizes the decode CUDA graph"),
    "cuda_graph_max_bs_prefill": (None, "sizes the prefill CUDA graph"),
    "cuda_graph_bs_decode": (None, "sizes the decode CUDA graph"),
    "cuda_graph_bs_prefill": (None, "sizes the prefill CUDA graph"),
    "cuda_graph_max_seq_len_prefill": (None, "sizes the prefill CUDA graph"),
    "cuda_graph_prefill_max_context": (None, "sizes the prefill CUDA graph"),
    "debug_cuda_graph": (False, "debugs CUDA-graph capture"),
    "enable_profile_cuda_graph": (False, "profiles CUDA-graph capture"),
}


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def graph_flag_errors(raw: dict) -> list[tuple[str, str]]:
    """(flag, why) for every graph flag the user passed (`raw`: field -> value as given) that cannot
    take effect for DeepSeek-V4.1 on CUDA."""
    why_off = "SGLang's CUDA graphs are disabled for DeepSeek-V4.1 (the adapter's forward is not wired for capture)"
    out = []
    for phase in ("decode", "prefill"):
        backend = raw.get(f"cuda_graph_backend_{phase}")
        if backend not in (None, "disabled"):
            out.append((f"--cuda-graph-backend-{phase}", f"{backend!r} asks for a {phase} CUDA graph, but {why_off}"))
    config = raw.get("cuda_graph_config")
    config = config.to_dict() if hasattr(config, "to_dict") else (config or {})
    for phase, settings in config.items():
        asked = {k: v for k, v in (settings or {}).items() if not (k == "backend" and v == "disabled")}
        if asked:
            out.append(("--cuda-graph-config", f"{phase} settings {asked} configure a CUDA graph, but {why_off}"))
    for field, (unset, what) in CAPTURE_ONLY_FIELDS.items():
        value = raw.get(field, unset)
        if value != unset:
            out.append((_flag(field), f"{what} ({value!r} asked), but {why_off}"))
    return out


def _on_cuda(device: Any) -> bool:
    return device is not None and str(device).split(":", 1)[0] == "cuda"


def _is_ours(server_args) -> bool:
    from sglang.srt.arg_groups.overrides import model_config_of

    archs = getattr(model_config_of(server_args).hf_config, "architectures", None) or []
    return ARCHITECTURE in archs


def cuda_graphs_off_step(server_args, previous) -> None:
    """Wrapper of SGLang's `handle_cuda_graph_config` (resolution step; the device is resolved by then)."""
    previous(server_args)
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    cfg = resolving_view(server_args)
    if not _on_cuda(cfg.device) or not _is_ours(server_args):
        return
    errors = graph_flag_errors(dict(getattr(server_args, "_raw_input", None) or {}))
    if errors:
        flag, why = errors[0]
        raise ValueError(f"{flag}: {why}; remove it to serve DeepSeek-V4.1 (graph-captured decode: {OFFLINE_DECODE})")
    config = cfg.cuda_graph_config
    for phase in Phase.ALL:
        config = with_phase(config, phase, backend=Backend.DISABLED)
    declare_resolution(server_args, SOURCE, disable_cuda_graph=True, cuda_graph_config=config)
    # SGLang's later cascades (e.g. the prefill-CP breakable default) re-enable a phase unless its
    # backend is marked as an explicit choice; ours is one.
    locked = getattr(server_args, "_cuda_graph_config_locked", None)
    if locked is not None:
        locked.update((phase, "backend") for phase in Phase.ALL)
    logger.warning(LOG_LINE)
