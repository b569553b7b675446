"""Rules for SGLang's admin routes that could end the server from one request (hook adapters registered by
hooks.py; the routes are unauthenticated unless the server runs with `--admin-api-key`).

Profiling (`/start_profile`, `/stop_profile`): SGLang checks nothing in the front end. An unknown or empty
`activities` list reached the scheduler's torch profiler, which raised there ("No activities specified")
and took the server down; on our CPU platform SGLang's base platform raised NotImplementedError for the
profiler activity (fixed in platform.py). A `num_steps` below 1 or an `output_dir` that cannot hold the trace
would fail in the scheduler too (writing the trace to `/proc/x` ended it), and `output_dir: "/tmp/../etc"` (or a
`profile_prefix` with a `/`) wrote the trace anywhere the server may write. Now those are 400s naming the field
(`output_dir` must resolve inside SGLANG_TORCH_PROFILER_DIR, default /tmp; a relative one is taken inside it),
an OSError while the scheduler writes a trace is a refusal instead of its end, a second start while a profile
runs is refused (SGLang started a second profiler over the first), and SGLang's refusals ("not in
progress", "already in progress"), raised as a RuntimeError (a 500), are 400s.

Memory occupation (`/release_memory_occupation`, `/resume_memory_occupation`): the scheduler synchronises the
CUDA device there, which on our CPU platform raised and ended the server; there they are 400s.

Expert distribution (`/start|stop|dump_expert_distribution_record`): without `--expert-distribution-recorder-mode`
SGLang's no-op recorder raises in the scheduler and ended the server; then they are 400s. DeepSeek-V4.1 refuses
that flag (and `--enable-eplb`) at startup: its MoE does not report to SGLang's recorder.

Weight-update groups (`/init_weights_update_group`): the scheduler blocks in the group's rendezvous; an NCCL
group asked of the CPU server, or a trainer-hosted store that is not there, held it (health 503) until the
process-group timeout. Those are 400s now; a group this server hosts (rank_offset 0) still waits for the
trainer to join, as the protocol requires.

Logging (`/configure_logging`): SGLang stores the fields, then validates on use; an invalid
`log_requests_level` made every later request fail in the front end. Checked before anything is stored.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from sglang_dsv41.sglang.requests.validation import _is_int

logger = logging.getLogger(__name__)

PROFILER_ACTIVITIES = ("CPU", "GPU", "MEM", "CUDA_PROFILER", "RPD", "XPU")
"""The activity names SGLang's profiler manager acts on (others were dropped, and a list of only unknown
names reached torch's profiler empty)."""

MEMORY_OCCUPATION_ON_CPU = ("the CPU platform has no device memory to release or resume (SGLang's memory "
                            "occupation endpoints free GPU memory for colocated training)")


def output_dir_error(path: Any, shown: Any = None) -> str | None:
    """An output directory the scheduler can write a trace into: created here if missing (as the profiler
    would at stop) and a file written and removed in it, so that `/proc/x`, a file, or a read-only place is a
    400 now rather than an OSError in the scheduler later. Messages quote `shown` (what the client sent), by
    default `path`."""
    if path is None:
        return None
    shown = path if shown is None else shown
    if not isinstance(path, str) or not path or "\x00" in path:
        return f"output_dir: expected a directory path, got {path!r}"[:200]
    try:
        where = os.path.abspath(os.path.expanduser(path))
        os.makedirs(where, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        return f"output_dir: the server cannot write files into {shown!r} ({e.strerror or type(e).__name__})"[:300]
    return None


PROFILE_DIR_VAR = "SGLANG_TORCH_PROFILER_DIR"
"""SGLang's profile directory (default /tmp): where a trace goes without `output_dir`, and the directory every
`output_dir` must resolve inside."""


def profile_root() -> str:
    """The profile directory as the scheduler sees it (it inherits the launcher's environment), symlinks resolved."""
    return os.path.realpath(os.path.expanduser(os.environ.get(PROFILE_DIR_VAR) or "/tmp"))


def confined_output_dir(path: Any, root: str) -> tuple[str | None, str | None]:
    """-> (the directory SGLang should write into, None) or (None, error). A relative `output_dir` is taken inside
    the profile directory; whatever the form, the resolved directory (`..` and symlinks followed) must be the
    profile directory or below it. The error names the field but not the server's directory."""
    if not isinstance(path, str) or not path or "\x00" in path:
        return None, f"output_dir: expected a directory path, got {path!r}"[:200]
    where = os.path.realpath(os.path.join(root, os.path.expanduser(path)))
    if os.path.commonpath([where, root]) != root:
        return None, (f"output_dir: {path!r} resolves outside the server's profile directory ({PROFILE_DIR_VAR}); "
                      "send a path inside it, or a relative one, which is taken inside it")[:300]
    return where, None


def file_part_error(value: Any, field: str) -> str | None:
    """`profile_prefix` / `profile_id` become part of the trace's file name: a plain name, no path."""
    if value is None:
        return None
    if not isinstance(value, str) or "\x00" in value or "/" in value or (os.altsep and os.altsep in value):
        return f"{field}: expected a file-name part without '/', got {str(value)[:64]!r}"[:200]
    return None


def profile_request_error(req: Any, cpu_platform: bool, root: str | None = None) -> str | None:
    """A START_PROFILE ProfileReq: activities, steps, file-name parts and output directory (confined to `root`,
    by default `profile_root()`)."""
    acts = getattr(req, "activities", None)
    if acts is not None:
        allowed = ("CPU",) if cpu_platform else PROFILER_ACTIVITIES
        if not isinstance(acts, list) or not acts:
            return f"activities: expected a non-empty list of {', '.join(allowed)}"
        for a in acts:
            if a not in allowed:
                where = " (the CPU platform profiles the CPU only)" if cpu_platform else ""
                return f"activities: {a!r} is not one of {', '.join(allowed)}{where}"[:200]
    for name, low in (("num_steps", 1), ("start_step", 0)):
        v = getattr(req, name, None)
        if v is not None and (not _is_int(v) or v < low):
            return f"{name}: expected an integer >= {low}, got {v!r}"[:200]
    for name in ("profile_prefix", "profile_id"):
        error = file_part_error(getattr(req, name, None), name)
        if error:
            return error
    path = getattr(req, "output_dir", None)
    if path is None:
        return None
    where, error = confined_output_dir(path, root or profile_root())
    return error or output_dir_error(where, shown=path)


async def checked_profile(original, tm, req, *args, **kwargs):
    """AROUND hook on `async TokenizerControlMixin._execute_profile(self, req)` (both profile routes)."""
    from fastapi import HTTPException
    from sglang.srt.managers.io_struct import ProfileReqType

    from sglang_dsv41.sglang.platform import on_our_cpu_platform

    if req.req_type == ProfileReqType.START_PROFILE:
        error = profile_request_error(req, on_our_cpu_platform())
        if error:
            raise HTTPException(status_code=400, detail=error)
        if req.output_dir is not None:  # the directory checked above, so a relative path lands inside the root too
            req.output_dir, _ = confined_output_dir(req.output_dir, profile_root())
    try:
        return await original(tm, req, *args, **kwargs)
    except RuntimeError as e:  # the scheduler's refusal (result.success False), e.g. "not in progress"
        raise HTTPException(status_code=400, detail=str(e)[:500]) from None


def one_profile_at_a_time(original, manager, recv_req, *args, **kwargs):
    """AROUND hook on `SchedulerProfilerManager._profile(self, recv_req)` (scheduler process): a start while a
    profile runs is refused. SGLang ignores its own "already in progress" answer on that path and starts a
    second torch profiler over the first (the stop then took over a minute on the tiny CPU server)."""
    from sglang.srt.managers.io_struct import ProfileReqOutput, ProfileReqType

    if recv_req.req_type == ProfileReqType.START_PROFILE and getattr(manager, "profile_in_progress", False):
        return ProfileReqOutput(success=False, message="Profiling is already in progress. Call /stop_profile first.")
    return original(manager, recv_req, *args, **kwargs)


def stop_profile_keeping_scheduler(original, manager, *args, **kwargs):
    """AROUND hook on `SchedulerProfilerManager._stop_profile(self, stage=None)` (scheduler process): an OSError
    writing the trace (the directory vanished, the disk is full) becomes a refusal with its reason, which the
    route answers with a 400, instead of an exception that ends the scheduler; also on the automatic stop
    after `num_steps`."""
    from sglang.srt.managers.io_struct import ProfileReqOutput

    try:
        return original(manager, *args, **kwargs)
    except OSError as e:
        logger.warning("profile trace not written: %s", e)
        return ProfileReqOutput(success=False, message=f"the profile trace could not be written: {e}"[:300])


EXPERT_RECORDING = ("expert distribution recording is off (SGLang's recorder needs --expert-distribution-recorder-mode, "
                    "which DeepSeek-V4.1 refuses: its MoE does not report to the recorder; per-token routed experts "
                    "come from --enable-return-routed-experts)")


async def refuse_expert_recording_when_off(original, tm, *args, **kwargs):
    """AROUND hook on `async TokenizerControlMixin.start / stop / dump_expert_distribution_record(self)`: without a
    recorder mode the scheduler's no-op recorder raises on each of them, which ended the server (any model).
    Then a 400 before the scheduler sees the request."""
    from fastapi import HTTPException

    if getattr(tm.server_args, "expert_distribution_recorder_mode", None) is None:
        raise HTTPException(status_code=400, detail=EXPERT_RECORDING)
    return await original(tm, *args, **kwargs)


def weight_group_error(obj: Any, tp_size: int, cpu_platform: bool) -> str | None:
    """An InitWeightsUpdateGroupReqInput this server can act on without blocking its scheduler on a group that
    cannot form: a backend the device has (NCCL needs a GPU), a world of at least 2 with this server's ranks
    (rank_offset .. rank_offset + tp_size - 1) inside it, a valid port, and, when the trainer hosts the
    group's store (rank_offset > 0), a store that answers a TCP connection now."""
    import socket

    backend = getattr(obj, "backend", "nccl")
    if cpu_platform and backend != "gloo":
        return f"backend: {backend!r} is not available on the CPU platform; a CPU server joins a weight-update group with 'gloo'"[:200]
    ws, ro, port = obj.world_size, obj.rank_offset, obj.master_port
    if not _is_int(ws) or ws < 2:
        return f"world_size: expected an integer >= 2 (the trainer and this server), got {ws!r}"[:200]
    if not _is_int(ro) or ro < 0 or ro + tp_size > ws:
        return f"rank_offset: this server's {tp_size} rank(s) from {ro!r} do not fit a world of {ws}"[:200]
    if not _is_int(port) or not 1 <= port <= 65535:
        return f"master_port: expected 1 .. 65535, got {port!r}"[:200]
    if ro > 0:
        try:
            socket.create_connection((obj.master_address, port), timeout=2).close()
        except (OSError, ValueError) as e:
            return (f"master_address: nothing answers at {obj.master_address}:{port} ({getattr(e, 'strerror', None) or e}); "
                    "start the trainer's side of the group first")[:300]
    return None


async def checked_weight_group(original, tm, obj, *args, **kwargs):
    """AROUND hook on `async TokenizerControlMixin.init_weights_update_group(self, obj, request)` -> (False, why)
    (the route's 400) for a group that cannot form: the scheduler otherwise blocks in the group's rendezvous
    (an NCCL group on the CPU server, or a master that does not exist, held it until the process timeout)."""
    from sglang_dsv41.sglang.platform import on_our_cpu_platform

    error = weight_group_error(obj, getattr(tm.server_args, "tp_size", 1) or 1, on_our_cpu_platform())
    if error:
        return False, error
    return await original(tm, obj, *args, **kwargs)


def logging_request_error(obj: Any) -> str | None:
    """A ConfigureLoggingReq SGLang's request logger and `logging` accept. SGLang stores the fields first and
    validates on use: a `log_requests_level` of 99 was stored, then every later request's log raised in the
    front end (health 503, then no answer at all)."""
    level = getattr(obj, "log_requests_level", None)
    if level is not None and (not _is_int(level) or level not in (0, 1, 2, 3)):
        return f"log_requests_level: expected 0, 1, 2 or 3, got {level!r}"[:200]
    fmt = getattr(obj, "log_requests_format", None)
    if fmt is not None and fmt not in ("text", "json"):
        return f"log_requests_format: expected 'text' or 'json', got {fmt!r}"[:200]
    name = getattr(obj, "log_level", None)
    if name is not None and (not isinstance(name, str) or not isinstance(logging.getLevelName(name.upper()), int)):
        return f"log_level: expected a logging level name (debug, info, warning, error, critical), got {name!r}"[:200]
    threshold = getattr(obj, "dump_requests_threshold", None)
    if threshold is not None and (not _is_int(threshold) or threshold < 1):
        return f"dump_requests_threshold: expected an integer >= 1, got {threshold!r}"[:200]
    for field in ("dump_requests_folder", "crash_dump_folder"):
        error = output_dir_error(getattr(obj, field, None))
        if error:
            return error.replace("output_dir", field, 1)
    return None


def checked_logging(original, tm, obj, *args, **kwargs):
    """AROUND hook on `TokenizerManager.configure_logging(self, obj)`: a 400 before anything is stored."""
    from fastapi import HTTPException

    error = logging_request_error(obj)
    if error:
        raise HTTPException(status_code=400, detail=error)
    return original(tm, obj, *args, **kwargs)


async def refuse_memory_occupation_on_cpu(original, tm, obj, *args, **kwargs):
    """AROUND hook on `async TokenizerControlMixin.release_memory_occupation / resume_memory_occupation(self,
    obj, request)`: on our CPU platform a ValueError, which the route answers with a 400, before the scheduler
    sees the request. Elsewhere SGLang's own."""
    from sglang_dsv41.sglang.platform import on_our_cpu_platform

    if on_our_cpu_platform():
        raise ValueError(MEMORY_OCCUPATION_ON_CPU)
    return await original(tm, obj, *args, **kwargs)


__all__ = ["EXPERT_RECORDING", "MEMORY_OCCUPATION_ON_CPU", "PROFILER_ACTIVITIES", "PROFILE_DIR_VAR", "checked_profile",
           "confined_output_dir", "file_part_error", "output_dir_error", "profile_root",
           "one_profile_at_a_time", "profile_request_error", "refuse_expert_recording_when_off",
           "refuse_memory_occupation_on_cpu", "checked_weight_group", "weight_group_error", "checked_logging",
           "logging_request_error",
           "stop_profile_keeping_scheduler"]
