"""Admission that cannot wedge, fair share for long requests, exact aborts, the checkpoint's context (issue 34,
items 3, 4, 6 and 10), on real SGLang servers and the tiny checkpoint.

Server 1: `--max-total-tokens 1024 --context-length 1024`, the shape of the old CPU default (context = KV pool),
so every request the tokenizer takes reaches the scheduler's own limits. Server 2: a copy of the checkpoint whose
config.json says `max_position_embeddings` 4096, started with no flag at all.

Oracles: each attack gets its answer within a deadline (a 4xx naming the limit, or the tokens it asked for), the
server stays up (launcher alive, no scheduler exception, a load query answered) and a greedy request gives the
same tokens as before the attack; orderings rather than timings (a short request ends while every long one is
still running); `finish_reason` of each aborted or surviving request. Fails without the fixes: the prompts wait
past the deadline, the short request waits for a long one to end, aborts take job-10 .. job-12 (or nothing for a
parent), and server 2 does not start."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time

import pytest
import requests

from launch import start_server, stop_server
from sglang_dsv41.sglang.pool_limits import footprint, ordinary_reserve, schedulable_tokens

POOL, PAGE = 1024, 64
LIMIT = schedulable_tokens(POOL, PAGE)  # 639: the most prompt + max_new_tokens one request can be scheduled with
DEADLINE_S = float(os.environ.get("DSV41_ADMISSION_DEADLINE_S", 240))
"""Liveness only: an answer (4xx or tokens) must come within this; generous for a loaded 2-core machine."""
PROBE = [5, 17, 300, 42]
ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}


def generate(server, ids, max_new, timeout=DEADLINE_S, **extra):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, **extra.pop("sp", {})},
            **extra}
    return requests.post(server.url + "/generate", json=body, timeout=timeout)


def greedy(server) -> list[int]:
    r = generate(server, PROBE, 6)
    assert r.status_code == 200, r.text[:300]
    return r.json()["output_ids"]


def message(r) -> str:
    body = r.json()
    err = body.get("error", body) if isinstance(body, dict) else body
    return err if isinstance(err, str) else json.dumps(err)


def alive(server) -> str | None:
    if server.proc.poll() is not None:
        return f"the launcher exited ({server.proc.returncode})"
    if "Scheduler hit an exception" in server.log_text():
        return "the scheduler hit an exception:\n" + server.log_text()[-3000:]
    if requests.get(server.url + "/health", timeout=30).status_code != 200:
        return "/health did not answer 200"
    if requests.get(server.url + "/v1/loads?include=core", timeout=DEADLINE_S).status_code != 200:
        return "the scheduler did not answer a load query"
    return None


def load(server) -> dict:
    return requests.get(server.url + "/v1/loads?include=core", timeout=DEADLINE_S).json()["loads"][0]


def wait_running(server, n: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while load(server)["num_running_reqs"] < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests running after {DEADLINE_S}s"
        time.sleep(0.2)


def prompt_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 1000) for _ in range(n)]


class InFlight:
    """Requests sent from threads; each records its reply and when it ended."""

    def __init__(self, server):
        self.server, self.replies, self.ended, self.threads = server, {}, {}, []

    def send(self, name, path, body):
        def run():
            r = requests.post(self.server.url + path, json=body, timeout=DEADLINE_S * 3)
            self.replies[name], self.ended[name] = r, time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self):
        for thread in self.threads:
            thread.join()
        return self.replies


# ---------------------------------------------------------------------------- server 1
@pytest.fixture(scope="class")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("admission") / "server.log"
    srv = start_server(tiny_dir, log, "--max-total-tokens", str(POOL), "--context-length", str(POOL), env=ENV)
    yield srv
    stop_server(srv.proc)


class TestOnePool:
    def test_limits(self, server):
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
        assert (info["max_total_num_tokens"], info["page_size"], info["context_length"]) == (POOL, PAGE, POOL)
        assert requests.get(server.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"] == POOL
        assert LIMIT == POOL - ordinary_reserve(POOL, PAGE) - (2 * PAGE + 1) == 639

    def test_prompts_near_the_pool_are_refused_not_hung(self, server):
        """Item 3. Prompts of pool - page .. pool - 7 tokens were never scheduled and held the queue; pool - 2 pages
        + 1 .. pool - page - 1 were answered with no token. Now each is a 400 naming the limit, within the
        deadline; a request of exactly the limit gets all it asked for."""
        before = greedy(server)
        for n, max_new in ((960, 1), (1017, 1), (897, 1), (959, 1), (LIMIT + 1, 1), (600, LIMIT - 600 + 1)):
            t0 = time.monotonic()
            r = generate(server, prompt_ids(n, n), max_new)
            assert r.status_code == 400, (n, r.status_code, r.text[:300])
            assert f"can schedule for one request, {LIMIT} tokens" in message(r), message(r)
            assert time.monotonic() - t0 < DEADLINE_S
            assert alive(server) is None
        r = generate(server, prompt_ids(600, 1), LIMIT - 600, sp={"ignore_eos": True})
        assert r.status_code == 200, r.text[:300]
        assert len(r.json()["output_ids"]) == LIMIT - 600 and r.json()["meta_info"]["finish_reason"]["type"] == "length"
        assert alive(server) is None and greedy(server) == before

    def test_short_request_is_not_starved_by_long_ones(self, server):
        """Item 4, at the scale of this pool: five fixed-length jobs (ignore_eos, footprint 289 > the reserve of 256
        slots) would take all the pool SGLang lets them (it admitted four and stopped its queue at the fifth, so
        the short request behind waited for a job to end). Two fit the long share at a time; a short request
        sent after them is answered while every job is still running, and every job then completes in full."""
        before = greedy(server)
        prompt, max_new = 130, 30
        assert footprint(prompt, max_new, PAGE) > ordinary_reserve(POOL, PAGE)
        jobs = InFlight(server)
        for i in range(5):
            jobs.send(f"long-{i}", "/generate", {"input_ids": prompt_ids(prompt, 100 + i), "rid": f"long-{i}",
                                                 "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}})
        wait_running(server, 1)
        t0 = time.monotonic()
        short = generate(server, PROBE, 6)
        answered = time.monotonic()
        assert short.status_code == 200 and short.json()["output_ids"] == before, short.text[:300]
        assert answered - t0 < DEADLINE_S
        assert not jobs.ended, f"jobs {sorted(jobs.ended)} ended before the short request"
        replies = jobs.join()
        for name, r in sorted(replies.items()):
            assert r.status_code == 200, (name, r.text[:300])
            assert len(r.json()["output_ids"]) == max_new and r.json()["meta_info"]["finish_reason"]["type"] == "length"
        assert alive(server) is None and greedy(server) == before

    def test_abort_ends_only_the_named_request(self, server):
        """Item 6: job-1 and job-10 .. job-12 run together; aborting job-1 ends it alone."""
        before = greedy(server)
        jobs = InFlight(server)
        for rid in ("job-1", "job-10", "job-11", "job-12"):
            jobs.send(rid, "/generate", {"input_ids": prompt_ids(8, len(rid)), "rid": rid,
                                         "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}})
        wait_running(server, 4)
        assert requests.post(server.url + "/abort_request", json={"rid": "job-1"}, timeout=30).status_code == 200
        replies = jobs.join()
        reasons = {rid: r.json()["meta_info"]["finish_reason"]["type"] for rid, r in replies.items()}
        assert reasons == {"job-1": "abort", "job-10": "length", "job-11": "length", "job-12": "length"}, reasons
        assert all(len(replies[r].json()["output_ids"]) == 30 for r in ("job-10", "job-11", "job-12"))
        assert alive(server) is None and greedy(server) == before

    def test_abort_of_a_parent_ends_its_samples(self, server):
        """Item 6: the rid of an n = 2 request (job-2) or of a batch (job-3) names no request of its own in SGLang;
        aborting it ends the requests SGLang made from it (it did nothing before), and nothing else (job-20 runs on)."""
        before = greedy(server)
        jobs = InFlight(server)
        sp = {"max_new_tokens": 30, "ignore_eos": True}
        jobs.send("job-2", "/generate", {"input_ids": prompt_ids(8, 2), "rid": "job-2",
                                         "sampling_params": {**sp, "n": 2}})
        jobs.send("job-3", "/generate", {"input_ids": [prompt_ids(8, 3), prompt_ids(8, 4)], "rid": "job-3",
                                         "sampling_params": sp})
        jobs.send("job-20", "/generate", {"input_ids": prompt_ids(8, 20), "rid": "job-20", "sampling_params": sp})
        wait_running(server, 5)
        for rid in ("job-2", "job-3"):
            assert requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=30).status_code == 200
        replies = jobs.join()
        for rid in ("job-2", "job-3"):
            samples = replies[rid].json()
            assert [x["meta_info"]["finish_reason"]["type"] for x in samples] == ["abort", "abort"], (rid, samples)
        other = replies["job-20"].json()
        assert other["meta_info"]["finish_reason"]["type"] == "length" and len(other["output_ids"]) == 30
        assert alive(server) is None and greedy(server) == before
        # Idle with the radix cache flushed, SGLang's strict check finds every token slot of every refused,
        # aborted and finished request back in the allocator.
        deadline = time.monotonic() + DEADLINE_S
        while "Cache flushed." not in requests.post(server.url + "/flush_cache", timeout=60).text:
            assert time.monotonic() < deadline, "the server did not become idle"
            time.sleep(1)
        time.sleep(3)  # several idle scheduler loops, each running the pool check
        assert "memory leak detected" not in server.log_text() and alive(server) is None


# ---------------------------------------------------------------------------- server 2
CHECKPOINT_CONTEXT = 4096


@pytest.fixture(scope="class")
def short_checkpoint(tiny_dir, tmp_path_factory):
    """The tiny checkpoint with `max_position_embeddings` 4096 (weights and tokenizer hard-linked: the loader
    refuses a symlink out of the checkpoint directory; config rewritten)."""
    out = tmp_path_factory.mktemp("ctx4096")
    for f in tiny_dir.iterdir():
        if f.name != "config.json":
            try:
                os.link(f, out / f.name)
            except OSError:
                shutil.copy2(f, out / f.name)
    config = json.loads((tiny_dir / "config.json").read_text())
    for section in (config, config.get("text_config", {})):
        if "max_position_embeddings" in section:
            section["max_position_embeddings"] = CHECKPOINT_CONTEXT
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="class")
def short_server(short_checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("ctx4096_log") / "server.log"
    srv = start_server(short_checkpoint, log, env=ENV)  # no flag: the CPU platform's defaults
    yield srv
    stop_server(srv.proc)


class TestCheckpointContext:
    def test_starts_with_the_checkpoint_context(self, short_server):
        """Item 10: the CPU platform's pool (32768 slots) would allow 28543 tokens; the checkpoint says 4096, and
        every advertised limit says 4096."""
        info = requests.get(short_server.url + "/get_server_info", timeout=30).json()
        served = requests.get(short_server.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"]
        pool, page = info["max_total_num_tokens"], info["page_size"]
        assert schedulable_tokens(pool, page) > CHECKPOINT_CONTEXT  # the checkpoint is what limits it
        assert info["context_length"] == served == CHECKPOINT_CONTEXT
        before = greedy(short_server)
        for n, max_new in ((CHECKPOINT_CONTEXT, 1), (CHECKPOINT_CONTEXT - 10, 11)):
            r = generate(short_server, prompt_ids(n, n), max_new)
            assert 400 <= r.status_code < 500 and str(CHECKPOINT_CONTEXT) in message(r), r.text[:300]
        assert alive(short_server) is None and greedy(short_server) == before
