"""Admission that cannot wedge, the long-request share, exact aborts and the context default (issue 34, items 3, 4,
6 and 10), without a server. Oracles: SGLang 0.5.23's own code, run on stand-ins for the objects around it:
its `Scheduler.init_req_max_new_tokens`, `PrefillAdder` over a real `PagedTokenToKVPoolAllocator` (the radix tree,
the running batch and the encoder-replay flag are stand-ins), its FCFS admission loop restated in `fcfs_pass`, its
`Scheduler.abort_request` matching, and its server-arg step `handle_platform_defaults` with our CPU platform."""

from __future__ import annotations

import copy
from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.sglang.pool_limits import (default_context, footprint, is_long, long_share, ordinary_reserve,
                                             per_request_overhead, pool_limit_error, schedulable_tokens)
from sglang_dsv41.sglang.requests import aborts, fair_share

PAGE = 64


# ---------------------------------------------------------------------------- SGLang's scheduler on stand-ins
class Tree:
    """The prefix cache as PrefillAdder reads it: nothing cached (the worst case: nothing to evict or share)."""
    buffer_pipeline = linker = None

    def __init__(self, disable=False):
        self.disable = disable

    def evictable_size(self):
        return 0

    full_evictable_size = evictable_size

    def supports_mamba(self):
        return False

    def supports_prefix_sharing(self):
        return True

    def lock(self, node):
        return None

    def unlock(self, lock):
        pass

    def discard_storage_prefetch_accounting(self, handle):
        pass

    def finish_storage_prefetch_admission(self, *args, **kwargs):
        pass


@pytest.fixture(autouse=True)
def no_encoder_replay(monkeypatch):
    from sglang.srt.managers.schedule_policy import PrefillAdder

    # The one read of the published server config on this path (encoder SWA replay off).
    monkeypatch.setattr(PrefillAdder, "_replay_len", lambda self, req, prefix_len: 0)


@pytest.fixture(autouse=True)
def rank_zero():
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_rank=0):  # Req.set_finish_with_abort logs on rank 0
        yield


def around(monkeypatch, cls, name, hook):
    """Install one of our AROUND hooks the way SGLang's HookRegistry does, for this test only."""
    original = getattr(cls, name)
    monkeypatch.setattr(cls, name, lambda self, *a, **k: hook(original, self, *a, **k))


def allocator(pool):
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(pool, PAGE, torch.int64, "cpu", None, False)


def scheduler(alloc, context):
    """The fields init_req_max_new_tokens reads, as SGLang's scheduler sets them (max_req_len = min(C, P) - 1)."""
    return SimpleNamespace(max_new_tokens_limit=None, max_req_len=min(context, alloc.size) - 1,
                           max_total_num_tokens=alloc.size, kv_shard_widening=1, page_size=PAGE,
                           token_to_kv_pool_allocator=alloc, sliding_window_size=None, chunked_prefill_size=256,
                           model_config=SimpleNamespace(context_len=context))


def new_req(prompt, max_new, ignore_eos=False, rid="r", sched=None):
    """A request as the scheduler holds it after `init_req_max_new_tokens` (SGLang's, plus our hooks if patched)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", [5 + i % 900 for i in range(prompt)]), SamplingParams(max_new_tokens=max_new,
                                                                                          ignore_eos=ignore_eos))
    if sched is not None:
        Scheduler.init_req_max_new_tokens(sched, req)
    req.prefix_len = 0
    req.refresh_fill_ids()
    return req


def adder(alloc, running=(), radix=True, chunk=256):
    from sglang.srt.managers.schedule_policy import PrefillAdder

    batch = SimpleNamespace(reqs=list(running))
    return PrefillAdder(PAGE, Tree(disable=not radix), alloc, batch, 1.0, 16384, chunk)


def fcfs_pass(add, queue):
    """SGLang's loop over the waiting queue (Scheduler._get_new_batch_prefill_raw): each request in order, stop at
    the first that is not CONTINUE."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    for req in queue:
        if add.add_one_req(req, has_chunked_req=False, truncation_align_size=None) != AddReqResult.CONTINUE:
            break
    return [r.rid for r in add.can_run_list]


def served_alone(alloc, context, prompt, max_new, ignore_eos=False, radix=True):
    """(admitted on an idle pool, max_new_tokens SGLang kept)."""
    req = new_req(prompt, max_new, ignore_eos, sched=scheduler(alloc, context))
    if req.to_finish is not None:
        return None, req
    add = adder(alloc, radix=radix)
    fcfs_pass(add, [req])
    return any(r is req for r in add.can_run_list), req


# ---------------------------------------------------------------------------- item 3: the hang, root cause
def test_root_cause_prompts_near_the_pool_are_never_admitted():
    """Context = pool (the CPU platform's old default). SGLang clips max_new_tokens to P - ceil_p(prompt) - p - 1,
    floored at 0; PrefillAdder then needs prompt + p < P. Prompts of P - p .. P - 7 are never admitted (P - 6 and
    up are refused by max_req_input_len), P - 2p + 1 .. P - p - 1 are admitted with 0 new tokens. For P = 32768
    that is 32704 .. 32761, the range of the issue."""
    pool = 1024
    alloc = allocator(pool)
    never, empty = [], []
    for prompt in range(1, pool - 6):
        admitted, req = served_alone(alloc, pool, prompt, 1)
        if not admitted:
            never.append(prompt)
        elif req.sampling_params.max_new_tokens == 0:
            empty.append(prompt)
    assert never == list(range(pool - PAGE, pool - 6))
    assert empty == list(range(pool - 2 * PAGE + 1, pool - PAGE))


@pytest.mark.parametrize("ignore_eos, radix", [(False, True), (True, True), (True, False), (False, False)])
def test_every_request_within_the_overhead_is_admitted_in_full(ignore_eos, radix):
    """prompt + max_new_tokens <= P - (2p + 1): admitted on an idle pool with max_new_tokens intact, on each of
    PrefillAdder's paths (ignore_eos without a radix cache has its own check); P - 2p is not always."""
    pool = 1024
    alloc = allocator(pool)
    limit = pool - per_request_overhead(PAGE)
    for prompt in [*range(1, 70), *range(limit - 140, limit)]:
        for total in (prompt + 1, (prompt + limit) // 2, limit):
            if total <= prompt:
                continue
            admitted, req = served_alone(alloc, 2 * pool, prompt, total - prompt, ignore_eos, radix)
            assert admitted and req.sampling_params.max_new_tokens == total - prompt, (prompt, total)
    if ignore_eos and not radix:  # the bound is tight: one token more, a prompt one past a page boundary
        admitted, req = served_alone(alloc, 2 * pool, limit - 190, 191, ignore_eos, radix)  # 705 = 11 pages + 1
        assert not admitted


def test_refused_with_the_limit_instead(monkeypatch):
    """With our hook on init_req_max_new_tokens, every prompt SGLang would have wedged or answered empty is
    refused (aborted alone, 400) naming the limit, and the requests within it are left as SGLang made them."""
    from sglang.srt.managers.scheduler import Scheduler

    around(monkeypatch, Scheduler, "init_req_max_new_tokens", fair_share.check_schedulable)
    pool = 1024
    alloc, limit = allocator(pool), schedulable_tokens(pool, PAGE)
    sched = scheduler(alloc, pool)
    for prompt in (limit + 1, pool - 2 * PAGE + 1, pool - PAGE, pool - 7):
        req = new_req(prompt, 1, sched=sched)
        assert req.to_finish is not None and req.to_finish.status_code == 400
        assert f"can schedule for one request, {limit} tokens ({pool} token slots" in req.to_finish.message
    ok = new_req(limit - 10, 10, sched=sched)
    assert ok.to_finish is None and ok.sampling_params.max_new_tokens == 10
    unset = new_req(100, None, sched=sched)  # as many as fit: the context clip, then the pool's
    assert unset.to_finish is None and unset.sampling_params.max_new_tokens == limit - 100
    scoring = new_req(limit, 0, sched=sched)  # prefill-only (SGLang's /v1/score) within the limit
    assert scoring.to_finish is None


def test_limits():
    assert (ordinary_reserve(32768, 64), schedulable_tokens(32768, 64)) == (4096, 32768 - 4096 - 129)
    assert (ordinary_reserve(1024, 64), schedulable_tokens(1024, 64)) == (256, 639)
    assert ordinary_reserve(384, 64) == 0 and schedulable_tokens(384, 64) == 384 - 129  # too small to keep one
    assert long_share(1024, 64) == footprint(639, 0, 64) == 768
    assert default_context(32768, 64, 1 << 20, 1 << 20) == 28543
    assert default_context(32768, 64, 4096, 1 << 20) == 4096  # the checkpoint's context wins where lower
    assert default_context(1000, 64, 1 << 20, 1 << 20) == schedulable_tokens(960, 64)  # whole pages
    with pytest.raises(ValueError, match="--max-total-tokens 128: .* cannot schedule any request"):
        default_context(128, 64, 1 << 20, 1 << 20)
    assert pool_limit_error(600, 39, 1024, 64, 1024) is None
    assert "600 + 40 = 640 tokens" in pool_limit_error(600, 40, 1024, 64, 1024)
    assert is_long(10, 200, True, 1024, 64) and not is_long(10, 200, False, 1024, 64)
    assert not is_long(10, 256 - 129 - 10, True, 1024, 64)


# ---------------------------------------------------------------------------- item 4: starvation
def long_jobs(n, prompt, max_new, sched):
    return [new_req(prompt, max_new, ignore_eos=True, rid=f"long-{i}", sched=sched) for i in range(n)]


def test_root_cause_long_requests_are_over_admitted_then_block_the_queue():
    """SGLang alone, pool 32768: eight requests asking 28,000 new tokens (ignore_eos) are each charged at most
    4096 future tokens, so seven are admitted at once (together they need 196,000 slots); the eighth stops the
    FCFS pass and the short request behind it waits."""
    pool = 32768
    alloc = allocator(pool)
    sched = scheduler(alloc, pool)
    queue = [*long_jobs(8, 10, 28000, sched), new_req(5, 8, rid="short", sched=sched)]
    admitted = fcfs_pass(adder(alloc, chunk=4096), queue)
    assert admitted == [f"long-{i}" for i in range(7)]


def test_long_requests_share_the_pool_and_short_ones_go_ahead(monkeypatch):
    """With our hooks: one 28,000-token job fits the long share (32768 - 4096), the others wait without stopping
    the queue, and the short request is admitted in the same pass. Once the job runs (its KV allocated), it is
    charged its whole remaining output, so the next pass admits no second job and still admits short ones."""
    from sglang.srt.managers.schedule_policy import PrefillAdder

    for name, hook in (("add_one_req", fair_share.share_long_requests),
                       ("add_chunked_req", fair_share.charge_long_chunk),
                       ("_get_running_request_total_token_offset", fair_share.charge_long_running)):
        around(monkeypatch, PrefillAdder, name, hook)
    pool = 32768
    alloc = allocator(pool)
    sched = scheduler(alloc, schedulable_tokens(pool, PAGE))
    jobs = long_jobs(8, 10, 28000, sched)
    short = [new_req(5, 8, rid=f"short-{i}", sched=sched) for i in range(3)]
    first = adder(alloc, chunk=4096)
    assert fcfs_pass(first, [*jobs, short[0]]) == ["long-0", "short-0"]
    # this pass's budget holds the job's whole output, not SGLang's 4096
    assert first.rem_total_tokens <= pool - footprint(10, 28000, PAGE) + per_request_overhead(PAGE)

    running = jobs[0]
    alloc.alloc(64)  # its prompt's page
    running.output_ids.extend([7] * 100)  # 100 tokens into its 28,000
    second = adder(alloc, running=[running], chunk=4096)
    assert second.rem_total_tokens <= pool - 64 - (28000 - 100)
    assert fcfs_pass(second, [*jobs[1:], *short[1:]]) == ["short-1", "short-2"]


def test_ordinary_requests_untouched(monkeypatch):
    """Requests without ignore_eos, or within the reserve, go through SGLang's own admission: the same pass with
    and without our hooks."""
    from sglang.srt.managers.schedule_policy import PrefillAdder

    pool = 4096
    alloc = allocator(pool)
    sched = scheduler(alloc, pool)

    def queue():
        return [*(new_req(50, 600, rid=f"chat-{i}", sched=sched) for i in range(6)),
                *(new_req(20, 40, ignore_eos=True, rid=f"job-{i}", sched=sched) for i in range(6))]

    plain = fcfs_pass(adder(alloc, chunk=4096), queue())
    for name, hook in (("add_one_req", fair_share.share_long_requests),
                       ("_get_running_request_total_token_offset", fair_share.charge_long_running)):
        around(monkeypatch, PrefillAdder, name, hook)
    assert fcfs_pass(adder(alloc, chunk=4096), queue()) == plain and len(plain) > 1


# ---------------------------------------------------------------------------- item 6: aborts
def test_derived_rids():
    hexes = "0123456789abcdef" * 2
    assert aborts.derived_from("job-1_0", "job-1") and aborts.derived_from(f"job-1_3-{hexes}", "job-1")
    assert aborts.derived_from(f"job-1-{hexes}", "job-1")
    for rid in ("job-10", "job-1", "job-1_", "job-1_x", f"job-1_0-{hexes}0", "job-1-abc"):
        assert not aborts.derived_from(rid, "job-1"), rid
    live = ["job-1", "job-10", "job-11", "job-1_0"]
    assert aborts.abort_targets("job-1", live) == ["job-1"]
    assert aborts.abort_targets("job-2", ["job-2_0", f"job-2_0-{hexes}", "job-20"]) == ["job-2_0", f"job-2_0-{hexes}"]
    assert aborts.abort_targets("gone", live) == []


def test_n_samples_are_named_after_their_request(monkeypatch):
    """SGLang's n > 1 path copies the prompt's request and calls regenerate_rid on it for the warmup and for each
    sample: the rid now keeps the prompt's rid in front."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    around(monkeypatch, GenerateReqInput, "regenerate_rid", aborts.derived_sample_rid)
    obj = GenerateReqInput(text="hi", rid="job-2", sampling_params={"n": 2, "max_new_tokens": 4})
    obj.normalize_batch_and_arguments()
    prompt = obj[0]
    assert prompt.rid == "job-2_0"
    samples = {copy.copy(prompt).regenerate_rid() for _ in range(2)}  # as SGLang does, on copies
    assert len(samples) == 2 and all(aborts.derived_from(s, "job-2") for s in samples)


def test_front_end_sends_one_abort_per_target():
    sent = []
    tm = SimpleNamespace(rid_to_state={"job-1": 0, "job-10": 0, "job-3_0": 0, "job-3_1": 0})

    def original(tm, rid="", abort_all=False):
        sent.append((rid, abort_all))

    aborts.abort_named(original, tm, "job-1")
    aborts.abort_named(original, tm, rid="job-3")
    aborts.abort_named(original, tm, abort_all=True)
    aborts.abort_named(original, tm, "unknown")
    assert sent == [("job-1", False), ("job-3_0", False), ("job-3_1", False), ("", True), ("unknown", False)]


def test_scheduler_aborts_exactly_the_named_rid(monkeypatch):
    """SGLang's own Scheduler.abort_request over a waiting queue and a running batch: without our hook aborting
    job-1 also takes job-10 and job-12; with it, only job-1 (queued or running), and abort_all still takes all."""
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    monkeypatch.setattr(scheduler_module, "_make_abort_req", lambda req, finished_reason=None: req.rid)
    Scheduler = scheduler_module.Scheduler

    def fixture():
        waiting = [new_req(3, 4, rid=r) for r in ("job-1", "job-10", "x")]
        running = [new_req(3, 4, rid=r) for r in ("job-12", "job-1x")]
        sent = []
        stub = SimpleNamespace(
            chunked_req=None, mm_receiver=None, waiting_queue=list(waiting), dllm_config=None,
            disaggregation_mode=scheduler_module.DisaggregationMode.NULL,
            grammar_manager=SimpleNamespace(grammar_queue=[], abort_requests=lambda recv: None),
            beam_coordinator=SimpleNamespace(retire_group=lambda req: None),
            _release_aborted_request=lambda req: None, send_abort_output=lambda out, req: sent.append(out),
            collect_inflight_reqs=lambda: set(running))
        return stub, sent, running

    def aborted(stub, sent, running):
        return sorted(sent + [r.rid for r in running if isinstance(r.to_finish, FINISH_ABORT)])

    stub, sent, running = fixture()
    Scheduler.abort_request(stub, AbortReq(rid="job-1"))
    assert aborted(stub, sent, running) == ["job-1", "job-10", "job-12", "job-1x"]  # SGLang's prefix match

    around(monkeypatch, Scheduler, "abort_request", aborts.abort_exactly)
    stub, sent, running = fixture()
    Scheduler.abort_request(stub, AbortReq(rid="job-1"))
    assert aborted(stub, sent, running) == ["job-1"]
    assert [r.rid for r in stub.waiting_queue] == ["job-10", "x"] and [r.rid for r in running] == ["job-12", "job-1x"]
    Scheduler.abort_request(stub, AbortReq(rid="job-12"))
    assert aborted(stub, sent, running) == ["job-1", "job-12"]
    stub, sent, running = fixture()
    Scheduler.abort_request(stub, AbortReq(abort_all=True))
    assert len(aborted(stub, sent, running)) == 5


# ---------------------------------------------------------------------------- item 10: the context default
def resolved_context(monkeypatch, checkpoint_context, **fields):
    """SGLang's handle_platform_defaults (our CPU platform's defaults) through its run_hook, with our step; the
    model config is a fixture, which SGLang's model_config_of hands back as it is."""
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.platform_hook import handle_platform_defaults
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv41.sglang.model import arg_resolution
    from sglang_dsv41.sglang.model.server_args import ARCHITECTURE
    from sglang_dsv41.sglang.platform import on_our_cpu_platform

    if not on_our_cpu_platform():
        pytest.skip("our CPU platform is not SGLang's current platform here")
    sa = ServerArgs(model_path="/unused", device="cpu", **fields)
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = []
    sa._model_config = SimpleNamespace(
        hf_config=SimpleNamespace(architectures=[ARCHITECTURE]),
        hf_text_config=SimpleNamespace(max_position_embeddings=checkpoint_context,
                                       rope_scaling={"type": "yarn", "factor": 16,
                                                     "original_max_position_embeddings": 65536}))
    monkeypatch.setitem(resolution_hooks._HOOKS, "handle_platform_defaults", [arg_resolution.context_step])
    resolution_hooks.run_hook(handle_platform_defaults, sa)
    return resolving_view(sa).context_length


@pytest.mark.parametrize("checkpoint, fields, expected", [
    (1 << 20, {}, 28543),  # the pool's schedulable length (32768 slots)
    (4096, {}, 4096),  # the checkpoint says less: it wins (SGLang refused to start)
    (1 << 20, {"max_total_tokens": 1024}, 639),
    (1 << 20, {"max_total_tokens": 1024, "page_size": 16}, 1024 - 128 - 33),
    (4096, {"context_length": 2048}, 2048),  # given by hand: untouched
])
def test_context_default(monkeypatch, checkpoint, fields, expected):
    assert resolved_context(monkeypatch, checkpoint, **fields) == expected


def test_a_pool_too_small_for_any_request_fails_at_startup(monkeypatch):
    with pytest.raises(ValueError, match="--max-total-tokens 128"):
        resolved_context(monkeypatch, 1 << 20, max_total_tokens=128)
