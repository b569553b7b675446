"""`/abort_request` ends exactly the named request and the requests SGLang derived from it (hook functions).

SGLang 0.5.23's scheduler matches an abort by prefix (`req.rid.startswith(rid)`, for each of its queues), so
aborting `job-1` also ended `job-10` .. `job-19`. The prefix rule stands in for the requests it derives from one
rid, but in 0.5.23 only a batch's prompts are derived (`<rid>_<i>`, GenerateReqInput._normalize_rid); the samples
of `n > 1` got fresh `uuid4().hex` rids (`regenerate_rid`), and the tokenizer manager forwarded an abort only for a
rid it holds a state for, which a batch's or an `n > 1` request's own rid never is: aborting it did nothing.

Now: each `n > 1` sample (and its prefix warmup) is named `<prompt rid>-<32 hex>`; the front end turns an abort of
R into one abort per live request: R itself when it is live, else every live rid derived from R; the scheduler
aborts exactly the rid it is sent.
"""

from __future__ import annotations

import re
import uuid
from typing import Iterable

_DERIVED_SUFFIX = re.compile(r"(?:_\d+)?(?:-[0-9a-f]{32})?")


def derived_from(rid: str, parent: str) -> bool:
    """Whether `rid` is a request SGLang made from `parent`: `<parent>_<i>` (the i-th prompt of a batch) and
    `<parent>[_<i>]-<32 hex>` (an `n > 1` sample or its warmup, see derived_sample_rid)."""
    return rid != parent and rid.startswith(parent) and _DERIVED_SUFFIX.fullmatch(rid[len(parent):]) is not None


def abort_targets(rid: str, live: Iterable[str]) -> list[str]:
    """The live rids an abort of `rid` ends: itself when live, else the ones derived from it."""
    live = list(live)
    if rid in live:
        return [rid]
    return [r for r in live if derived_from(r, rid)]


def derived_sample_rid(original, obj, *args, **kwargs):
    """AROUND GenerateReqInput.regenerate_rid(self) -> str: SGLang calls it for each `n > 1` sample and the
    prefix warmup, on a copy of the prompt's request; the new rid keeps the prompt's as its prefix."""
    parent = obj.rid
    if not isinstance(parent, str):
        return original(obj, *args, **kwargs)
    obj.rid = f"{parent}-{uuid.uuid4().hex}"
    return obj.rid


def abort_named(original, tm, rid: str = "", abort_all: bool = False, *args, **kwargs):
    """AROUND TokenizerManager.abort_request(self, rid="", abort_all=False): one abort per target, each sent
    by SGLang's own method (which marks that request's state and tells the scheduler)."""
    if abort_all or not isinstance(rid, str) or not rid:
        return original(tm, rid, abort_all, *args, **kwargs)
    targets = abort_targets(rid, list(tm.rid_to_state)) or [rid]
    for target in targets:
        original(tm, target, abort_all, *args, **kwargs)
    return None


def _live_requests(scheduler) -> list:
    """Every request the scheduler holds where its abort_request looks: the waiting queue, the running and last
    batches (and overlap results), the chunked request and the grammar queue."""
    reqs = [*getattr(scheduler, "waiting_queue", ()), *scheduler.collect_inflight_reqs()]
    if getattr(scheduler, "chunked_req", None) is not None:
        reqs.append(scheduler.chunked_req)
    grammar = getattr(scheduler, "grammar_manager", None)
    reqs += list(getattr(grammar, "grammar_queue", ()) or ())
    return list({id(r): r for r in reqs}.values())


def abort_exactly(original, scheduler, recv_req, *args, **kwargs):
    """AROUND Scheduler.abort_request(self, recv_req: AbortReq). SGLang's own method does the abort; the requests
    its prefix test would also catch are renamed out of its way for the call (one character in front, taken
    back after; the scheduler loop is single-threaded and the call does not yield)."""
    target = getattr(recv_req, "rid", None)
    if getattr(recv_req, "abort_all", False) or not isinstance(target, str) or not target:
        return original(scheduler, recv_req, *args, **kwargs)
    others = [r for r in _live_requests(scheduler)
              if isinstance(r.rid, str) and r.rid != target and r.rid.startswith(target)]
    mark = "\x01" if target.startswith("\x00") else "\x00"
    saved = [(r, r.rid) for r in others]
    for r, rid in saved:
        r.rid = mark + rid
    try:
        return original(scheduler, recv_req, *args, **kwargs)
    finally:
        for r, rid in saved:
            r.rid = rid
