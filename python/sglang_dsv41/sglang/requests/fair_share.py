"""Scheduler admission that cannot wedge (hook functions; the numbers are pool_limits.py's).

- `check_schedulable`, around `Scheduler.init_req_max_new_tokens`: a request whose prompt + max_new_tokens the
  pool can never schedule is aborted alone with a 400 naming the limit (SGLang clipped it to 0 new tokens and
  then either never admitted it, blocking the queue, or answered it empty). An unset max_new_tokens is clipped
  to what the pool can schedule, as SGLang clips it to the context.
- `share_long_requests`, `charge_long_chunk`, `charge_long_running`, around `PrefillAdder`: long fixed-length
  requests (pool_limits.is_long) are charged their whole remaining output instead of SGLang's clipped estimate,
  hold at most the long share together, and one that does not fit the share waits without stopping the queue.
Ordinary requests go through SGLang's code untouched.
"""

from __future__ import annotations

from sglang_dsv41.sglang.pool_limits import footprint, is_long, long_share, pool_limit_error, schedulable_tokens


def _pool(allocator) -> tuple[int, int]:
    return int(allocator.size), int(allocator.page_size)


def _long(req, pool: int, page: int) -> bool:
    sp = req.sampling_params
    return is_long(len(req.origin_input_ids), sp.max_new_tokens, sp.ignore_eos, pool, page)


def _remaining(req) -> int:
    return max(req.sampling_params.max_new_tokens - len(req.output_ids), 0)


def _clip_max_new(sp, limit: int) -> None:
    sp.max_new_tokens = limit
    if sp.min_new_tokens > limit:  # as SGLang keeps it after its own clip
        sp.min_new_tokens = limit


def check_schedulable(original, scheduler, req, *args, **kwargs):
    """AROUND Scheduler.init_req_max_new_tokens(self, req): SGLang clips max_new_tokens to the context and the
    pool; then we refuse (Req.set_finish_with_abort, as SGLang's own refusals there) what the pool cannot hold."""
    requested = req.sampling_params.max_new_tokens
    result = original(scheduler, req, *args, **kwargs)
    if req.to_finish is not None:  # refused already (SGLang set the prompt to one token)
        return result
    pool, page = _pool(scheduler.token_to_kv_pool_allocator)
    prompt, sp = len(req.origin_input_ids), req.sampling_params
    if requested is None:  # unset: as many as fit
        room = schedulable_tokens(pool, page) - prompt
        if 1 <= room < sp.max_new_tokens:
            _clip_max_new(sp, room)
        asked = sp.max_new_tokens if room >= 1 else 1
    else:  # SGLang's own context clip (max_req_len - prompt - 1) is not ours to refuse
        asked = max(0, min(requested, int(scheduler.max_req_len) - prompt - 1))
    error = pool_limit_error(prompt, asked, pool, page, int(scheduler.model_config.context_len))
    if error:
        req.set_finish_with_abort(error)
    return result


def _charge(adder, tokens: int) -> None:
    """Add `tokens` future tokens to this pass's budget (PrefillBudget.reserve charges a page per call: taken
    back through its extra_tokens)."""
    if tokens > 0:
        adder.memory_budget.reserve(0, tokens, extra_tokens=-adder.page_size)


def _sglang_charged(adder, req) -> int:
    """The future tokens SGLang's PrefillAdder charged when it admitted `req` in this pass: none for a chunk that
    does not finish the prompt, else max_new_tokens up to its CLIP_MAX_NEW_TOKENS."""
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    if adder.new_chunked_req is req or req.extend_end < len(req.full_untruncated_fill_ids):
        return 0
    return min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS)


def _held_by_long(adder, pool: int, page: int) -> int:
    running = adder.running_batch.reqs if adder.running_batch is not None else []
    held = {id(r): r for r in [*running, *adder.can_run_list] if _long(r, pool, page)}
    return sum(footprint(len(r.origin_input_ids), r.sampling_params.max_new_tokens, page) for r in held.values())


def share_long_requests(original, adder, req, *args, **kwargs):
    """AROUND PrefillAdder.add_one_req(self, req, has_chunked_req, truncation_align_size) -> AddReqResult."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    pool, page = _pool(adder.token_to_kv_pool_allocator)
    if not _long(req, pool, page):
        return original(adder, req, *args, **kwargs)
    need = footprint(len(req.origin_input_ids), req.sampling_params.max_new_tokens, page)
    if _held_by_long(adder, pool, page) + need > long_share(pool, page):
        return AddReqResult.CONTINUE  # not admitted: it waits for a long request to end; the queue goes on
    result = original(adder, req, *args, **kwargs)
    if any(r is req for r in adder.can_run_list):
        _charge(adder, _remaining(req) - _sglang_charged(adder, req))
    return result


def charge_long_chunk(original, adder, req, *args, **kwargs):
    """AROUND PrefillAdder.add_chunked_req(self, req): the next chunk of a long request's prompt is charged its
    whole output too (SGLang charges none until the last chunk)."""
    result = original(adder, req, *args, **kwargs)
    pool, page = _pool(adder.token_to_kv_pool_allocator)
    if any(r is req for r in adder.can_run_list) and _long(req, pool, page):
        _charge(adder, _remaining(req) - _sglang_charged(adder, req))
    return result


def charge_long_running(original, adder, req, *args, **kwargs):
    """AROUND PrefillAdder._get_running_request_total_token_offset(self, req): a running long request's future
    is all of its remaining output (SGLang: at most CLIP_MAX_NEW_TOKENS, so it admitted more than the pool holds)."""
    pool, page = _pool(adder.token_to_kv_pool_allocator)
    if _long(req, pool, page):
        return _remaining(req)
    return original(adder, req, *args, **kwargs)
