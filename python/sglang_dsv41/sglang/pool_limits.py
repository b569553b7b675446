"""What one request may hold of SGLang's KV pool, and the share long fixed-length requests get (plain functions).

For a pool of P token slots in pages of p, SGLang 0.5.23's scheduler works like this on an idle pool:
- `Scheduler.init_req_max_new_tokens` clips max_new_tokens to `P - ceil_p(prompt) - p - 1` (the allocator's
  `max_new_tokens_for_memory`) and never below 0;
- `PrefillAdder.add_one_req` admits a request only when `prompt + min(max_new, 4096) + p < P` (one page per
  request for allocation rounding; `prompt` before chunking);
- with ignore_eos and no radix cache (`add_one_req_ignore_eos`), also `P - ceil_p(prompt) - p - max_new > 1`.
So a prompt of P - p .. P - 7 tokens (P - 7: the scheduler's own prompt limit, `max_req_input_len` - 1) was clipped
to 0 new tokens and still never admitted: it waited at the head of the FCFS queue forever and every later request
behind it. A prompt of P - 2p + 1 .. P - p - 1 was admitted and answered with 0 tokens. Every request with
prompt + max_new_tokens <= P - 2p - 1 is admitted on an idle pool with its max_new_tokens intact, on every path,
and P - 2p is not always (`test/sglang/test_admission.py` runs SGLang's own PrefillAdder over the range).

Long fixed-length requests (ignore_eos, more than the reserve below) starved everyone else: SGLang charges a
running request at most 4096 future tokens (`CLIP_MAX_NEW_TOKENS`), so it admits more of them than the pool can
finish, retracts one when the pool runs out, and the FCFS queue stops at the first request that does not fit.
The fair share: R = max(P // 8, 4 pages) slots are never promised to long requests; together they may hold at
most P - R (each charged its whole footprint), a long request that does not fit that share waits without blocking
the queue, and every other request is admitted by SGLang's own rules in what the long ones do not hold.
"""

from __future__ import annotations

ORDINARY_RESERVE_FRACTION = 8
"""One eighth of the pool is never promised to long requests."""
ORDINARY_RESERVE_MIN_PAGES = 4


def per_request_overhead(page: int) -> int:
    """Slots SGLang may need for a request beyond prompt + max_new_tokens: rounding the prompt up to whole pages
    (p - 1), the page PrefillAdder keeps per request (p), and the one slot of spare its ignore_eos check wants
    (+ 2)."""
    return 2 * page + 1


def footprint(prompt: int, max_new: int, page: int) -> int:
    """The pool slots a request may hold by its end, SGLang's per-request reserve included."""
    return prompt + max_new + per_request_overhead(page)


def ordinary_reserve(pool: int, page: int) -> int:
    """R: slots never promised to long requests. 0 where the pool is too small to keep it (a request of one token
    plus its overhead would not fit beside it)."""
    reserve = max(pool // ORDINARY_RESERVE_FRACTION, ORDINARY_RESERVE_MIN_PAGES * page)
    return reserve if pool - reserve > per_request_overhead(page) else 0


def long_share(pool: int, page: int) -> int:
    """P - R: what long requests may hold together (footprints)."""
    return pool - ordinary_reserve(pool, page)


def schedulable_tokens(pool: int, page: int) -> int:
    """The most prompt + max_new_tokens one request can always be scheduled with: its footprint fits the long
    share (so it also fits an idle pool, on every path of SGLang's admission). <= 0 when the pool cannot serve one
    token."""
    return long_share(pool, page) - per_request_overhead(page)


def is_long(prompt: int, max_new: int, ignore_eos: bool, pool: int, page: int) -> bool:
    """A fixed-length request (ignore_eos: it will hold exactly its footprint) bigger than the reserve. Requests
    without ignore_eos keep SGLang's estimate (they are expected to stop at EOS)."""
    return bool(ignore_eos) and footprint(prompt, max_new, page) > ordinary_reserve(pool, page)


def default_context(pool_tokens: int, page: int, checkpoint_context: int, ceiling: int) -> int:
    """The context length a server gets when none is given: what the pool can always schedule for one request,
    never above the checkpoint's own context (its config.json) nor `ceiling`. `pool_tokens` is the token cap the
    pool will be sized to (SGLang aligns it down to whole pages)."""
    pool = pool_tokens // page * page
    limit = schedulable_tokens(pool, page)
    if limit < 1:
        raise ValueError(f"--max-total-tokens {pool_tokens}: a KV pool of {pool} token slots in pages of {page} "
                         f"cannot schedule any request (one request needs its tokens plus "
                         f"{per_request_overhead(page)} slots); give at least {2 * per_request_overhead(page)}")
    return min(limit, checkpoint_context, ceiling)


def pool_limit_error(prompt: int, max_new: int, pool: int, page: int, context: int) -> str | None:
    """A request the pool can never schedule in full (only reachable when the context length is above what the
    pool can schedule: a --context-length given by hand, or a pool sized smaller than planned)."""
    limit = schedulable_tokens(pool, page)
    if prompt + max_new <= limit:
        return None
    reserve = ordinary_reserve(pool, page)
    kept = f", less {reserve} kept for short requests" if reserve else ""
    return (f"prompt + max_new_tokens: {prompt} + {max_new} = {prompt + max_new} tokens is more than this server's "
            f"KV pool can schedule for one request, {limit} tokens ({pool} token slots{kept}, less "
            f"{per_request_overhead(page)} of SGLang's per-request reserve); the context length is {context}")
