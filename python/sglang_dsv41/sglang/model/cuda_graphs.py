"""CUDA graphs for DeepSeek-V4.1 on CUDA: SGLang's graph runners off, our decode graphs on
(docs/sglang.md "CUDA graphs").

SGLang's runners cannot drive our forward: its breakable prefill graph would replay the capture
batch's host-read shapes (forward.build_batch), and its decode runner keys graphs on batch size only
(our step's token table has a capacity, which must fall back to eager past the captured one) and pads
rows our runtime must tell apart. So the adapter captures decode itself: every pure-decode forward
goes through the engine-agnostic `runtime.decode_graphs.DecodeGraphSet` (graphs keyed by batch bucket
and capacity bucket, padding rows that store nothing, eager fallback), fed by decode_batch.py.

`cuda_graphs_off_step` wraps SGLang's resolution step `handle_cuda_graph_config`. For our architecture
on a CUDA device, after SGLang's step:
- SGLang's decode settings drive our graphs: its resolved decode backend `full` (the default) turns
  them on, `disabled` (`--disable-cuda-graph`, `--disable-decode-cuda-graph`,
  `--cuda-graph-backend-decode disabled`) off; `--cuda-graph-bs-decode` gives the batch buckets,
  `--cuda-graph-max-bs-decode` caps the default ones (`--cuda-graph-config '{"decode": ...}'` alike).
  The result goes to the scheduler in SGLANG_DSV41_DECODE_GRAPHS (`decode_graph_setting`), which
  the model reads at load (`decode_graph_set`).
- Both of SGLang's phases are declared disabled (its runners never capture our model), one log line.
- Flags that only act through SGLang's runners are refused naming the flag (`graph_flag_errors`):
  prefill graph settings, a `breakable` decode backend, torch.compile, graph debugging / profiling.
Other architectures and other devices (our CPU platform has no graph capture) are left as SGLang
resolves them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sglang_dsv41.sglang.model.server_args import ARCHITECTURE

logger = logging.getLogger(__name__)

SOURCE = "sglang_dsv41.cuda_graphs_off"
"""Name of our declaration in SGLang's resolution record."""

DECODE_GRAPHS_ENV = "SGLANG_DSV41_DECODE_GRAPHS"
"""Our decode graphs, as the resolution step decided them for the scheduler it starts: 'off', 'auto'
(the default batch buckets up to the request slots), 'max=N' (the default buckets up to N) or a
comma-separated list of batch sizes. Unset (a model built outside `launch_server`): 'off'."""

LOG_LINE = (f"sglang-dsv41: SGLang's CUDA graph runners disabled for {ARCHITECTURE} on CUDA (its prefill graph "
            "would replay host-read shapes; its decode runner has no capacity buckets or padding mask); pure "
            "decode replays the model's own graphs (batch x capacity buckets, eager fallback): {setting}; "
            "docs/sglang.md 'CUDA graphs'")

# ServerArgs fields (unset value) whose only effect is on SGLang's graph runners: asked for, they would
# be silently ignored. The decode sizes (--cuda-graph-{max-bs,bs}-decode) drive our graphs; flags that
# turn graphs off (--disable-cuda-graph, --disable-{decode,prefill}-cuda-graph, a backend of
# 'disabled') are accepted.
CAPTURE_ONLY_FIELDS = {
    "enable_torch_compile": (False, "torch.compile runs only inside SGLang's graph runners"),
    "cuda_graph_max_bs_prefill": (None, "sizes the prefill CUDA graph"),
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
    why_off = ("SGLang's CUDA graph runners are disabled for DeepSeek-V4.1 (its decode graphs are the model's own: "
               "a full graph of the step, sized by --cuda-graph-bs-decode / --cuda-graph-max-bs-decode)")
    out = []
    decode = raw.get("cuda_graph_backend_decode")
    if decode not in (None, "disabled", "full"):
        out.append(("--cuda-graph-backend-decode", f"{decode!r} is not a backend of the model's decode graphs (full or "
                                                   f"disabled): {why_off}"))
    prefill = raw.get("cuda_graph_backend_prefill")
    if prefill not in (None, "disabled"):
        out.append(("--cuda-graph-backend-prefill", f"{prefill!r} asks for a prefill CUDA graph, but {why_off}"))
    config = raw.get("cuda_graph_config")
    config = config.to_dict() if hasattr(config, "to_dict") else (config or {})
    for phase, settings in config.items():
        settings = settings or {}
        if phase == "decode":
            asked = {k: v for k, v in settings.items() if k not in ("max_bs", "bs") and not (k == "backend" and v in ("disabled", "full"))}
        else:
            asked = {k: v for k, v in settings.items() if not (k == "backend" and v == "disabled")}
        if asked:
            out.append(("--cuda-graph-config", f"{phase} settings {asked} configure SGLang's CUDA graph runner, but {why_off}"))
    for field, (unset, what) in CAPTURE_ONLY_FIELDS.items():
        value = raw.get(field, unset)
        if value != unset:
            out.append((_flag(field), f"{what} ({value!r} asked), but {why_off}"))
    return out


def decode_graph_setting(decode) -> str:
    """SGLang's resolved decode phase config (backend, bs, max_bs) -> the DECODE_GRAPHS_ENV value."""
    if decode.backend == "disabled":
        return "off"
    if decode.bs:
        sizes = sorted({int(b) for b in decode.bs})
        if sizes[0] < 1:
            raise ValueError(f"--cuda-graph-bs-decode: batch sizes must be >= 1, got {list(decode.bs)}")
        return ",".join(str(b) for b in sizes)
    if decode.max_bs is not None:
        if int(decode.max_bs) < 1:
            raise ValueError(f"--cuda-graph-max-bs-decode must be >= 1, got {decode.max_bs}")
        return f"max={int(decode.max_bs)}"
    return "auto"


def decode_graph_buckets(setting: str | None, num_req_slots: int, table_width: int):
    """A DECODE_GRAPHS_ENV value -> `GraphBuckets` for pools of `num_req_slots` request slots and a
    token table `table_width` wide (capacities: powers of two from 256 up to it), or None for 'off'.
    'auto': the default batch buckets up to min(request slots, 256); 'max=N': up to min(N, request
    slots); a list: its sizes that fit the request slots (no step has more requests)."""
    from sglang_dsv41.runtime.decode_graphs import BATCH_BUCKETS, GraphBuckets

    value = (setting or "off").strip().lower()
    if value in ("off", "0", ""):
        return None
    bad = ValueError(f"{DECODE_GRAPHS_ENV}={setting!r}: expected off, auto, max=N or batch sizes like 1,2,4,8 (N >= 1)")
    try:
        if value == "auto":
            return GraphBuckets.default(min(num_req_slots, BATCH_BUCKETS[-1]), table_width)
        if value.startswith("max="):
            top = int(value[4:])
            if top < 1:
                raise bad
            return GraphBuckets.default(min(top, num_req_slots), table_width)
        sizes = sorted({int(x) for x in value.split(",")})
    except ValueError:
        raise bad from None
    if sizes[0] < 1:
        raise bad
    kept = tuple(b for b in sizes if b <= num_req_slots) or (num_req_slots,)
    return GraphBuckets.default(kept[-1], table_width, batch_sizes=kept)


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
        raise ValueError(f"{flag}: {why}; remove it to serve DeepSeek-V4.1")
    config = cfg.cuda_graph_config
    setting = decode_graph_setting(config.decode)
    os.environ[DECODE_GRAPHS_ENV] = setting  # the scheduler process reads it at model load
    for phase in Phase.ALL:
        config = with_phase(config, phase, backend=Backend.DISABLED)
    declare_resolution(server_args, SOURCE, disable_cuda_graph=True, cuda_graph_config=config)
    # SGLang's later cascades (e.g. the prefill-CP breakable default) re-enable a phase unless its
    # backend is marked as an explicit choice; ours is one.
    locked = getattr(server_args, "_cuda_graph_config_locked", None)
    if locked is not None:
        locked.update((phase, "backend") for phase in Phase.ALL)
    logger.warning(LOG_LINE.format(setting=setting))
