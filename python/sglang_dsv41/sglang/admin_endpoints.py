"""Rules for SGLang's admin routes that could end the server from one request (hook adapters registered by
hooks.py; the routes are unauthenticated unless the server runs with `--admin-api-key`).

Profiling (`/start_profile`, `/stop_profile`): SGLang checks nothing in the front end. An unknown or empty
`activities` list reached the scheduler's torch profiler, which raised there ("No activities specified")
and took the server down; on our CPU platform SGLang's base platform raised NotImplementedError for the
profiler activity (fixed in platform.py). A `num_steps` below 1 or an `output_dir` that cannot hold the trace
would fail in the scheduler too (writing the trace to `/proc/x` ended it). Now those are 400s naming the
field, an OSError while the scheduler writes a trace is a refusal instead of its end, a second start while
a profile runs is refused (SGLang started a second profiler over the first), and SGLang's refusals ("not in
progress", "already in progress"), raised as a RuntimeError (a 500), are 400s.

Memory occupation (`/release_memory_occupation`, `/resume_memory_occupation`): the scheduler synchronises the
CUDA device there, which on our CPU platform raised and ended the server; there they are 400s.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

logger = logging.getLogger(__name__)

PROFILER_ACTIVITIES = ("CPU", "GPU", "MEM", "CUDA_PROFILER", "RPD", "XPU")
"""The activity names SGLang's profiler manager acts on (others were dropped, and a list of only unknown
names reached torch's profiler empty)."""

MEMORY_OCCUPATION_ON_CPU = ("the CPU platform has no device memory to release or resume (SGLang's memory "
                            "occupation endpoints free GPU memory for colocated training)")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def output_dir_error(path: Any) -> str | None:
    """An output directory the scheduler can write a trace into: created here if missing (as the profiler
    would at stop) and a file written and removed in it, so that `/proc/x`, a file, or a read-only place is a
    400 now rather than an OSError in the scheduler later."""
    if path is None:
        return None
    if not isinstance(path, str) or not path or "\x00" in path:
        return f"output_dir: expected a directory path, got {path!r}"[:200]
    try:
        where = os.path.abspath(os.path.expanduser(path))
        os.makedirs(where, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        return f"output_dir: the server cannot write a trace to {path!r} ({e.strerror or type(e).__name__})"[:300]
    return None


def profile_request_error(req: Any, cpu_platform: bool) -> str | None:
    """A START_PROFILE ProfileReq: activities, steps and output directory."""
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
    return output_dir_error(getattr(req, "output_dir", None))


async def checked_profile(original, tm, req, *args, **kwargs):
    """AROUND hook on `async TokenizerControlMixin._execute_profile(self, req)` (both profile routes)."""
    from fastapi import HTTPException
    from sglang.srt.managers.io_struct import ProfileReqType

    from sglang_dsv41.sglang.hooks import _on_our_cpu_platform

    if req.req_type == ProfileReqType.START_PROFILE:
        error = profile_request_error(req, _on_our_cpu_platform())
        if error:
            raise HTTPException(status_code=400, detail=error)
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


async def refuse_memory_occupation_on_cpu(original, tm, obj, *args, **kwargs):
    """AROUND hook on `async TokenizerControlMixin.release_memory_occupation / resume_memory_occupation(self,
    obj, request)`: on our CPU platform a ValueError, which the route answers with a 400, before the scheduler
    sees the request. Elsewhere SGLang's own."""
    from sglang_dsv41.sglang.hooks import _on_our_cpu_platform

    if _on_our_cpu_platform():
        raise ValueError(MEMORY_OCCUPATION_ON_CPU)
    return await original(tm, obj, *args, **kwargs)


__all__ = ["MEMORY_OCCUPATION_ON_CPU", "PROFILER_ACTIVITIES", "checked_profile", "output_dir_error",
           "one_profile_at_a_time", "profile_request_error", "refuse_memory_occupation_on_cpu",
           "stop_profile_keeping_scheduler"]
