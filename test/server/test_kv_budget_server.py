"""SGLang's KV memory plan for our model (sglang/model/kv_budget.py), on a real server with the tiny checkpoint.

One server, started with `--max-total-tokens 8192` (a user cap below the CPU platform's default of
32768). Checked from its log and `/get_server_info`:
- SGLang's generic KV pool is `NoOpMHATokenToKVPool`: 0 B per token slot and at most
  `MAX_GENERIC_FIXED_BYTES` of placeholders in all (it was 5120 B per token slot for the tiny model);
- the token budget our configurator gave SGLang follows `token_budget` from our bytes per token slot,
  and the user's cap, which is smaller, is what SGLang uses (`max_total_num_tokens`);
- our pools were allocated at load (the startup report precedes SGLang's scheduler summary, before any
  forward), and greedy tokens equal the reference model's (oracle: teacher-forced `ReferenceModel`)."""

from __future__ import annotations

import re

import pytest
import requests

from launch import start_server, stop_server
from oracle import teacher_forced

USER_CAP = 8192
MAX_GENERIC_FIXED_BYTES = 1 << 20
"""Placeholders of the no-op pool: layers x page x heads x (head_dim + v_head_dim) x 2 B; tiny model:
10 x 64 x 1 x 256 x 2 = 327,680 B (the release config: 40 x 64 x 1 x 1024 x 2 = 5 MiB)."""
BUDGET = re.compile(r"sglang-dsv41 KV budget: available (\d+) B, fixed (\d+) B \((\d+) request slots x (\d+) B \+ "
                    r"generic pool placeholders (\d+) B; per token: ours ([\d.]+) B \+ generic pool (\d+) B\), "
                    r"([\d.]+) B per token slot, page (\d+) -> (\d+) token slots")


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("kv_budget") / "server.log"
    srv = start_server(tiny_dir, log, "--max-total-tokens", str(USER_CAP))
    yield srv
    stop_server(srv.proc)


def _max_total_num_tokens(server) -> int:
    info = requests.get(server.url + "/get_server_info", timeout=30).json()
    return int(info["max_total_num_tokens"])


def test_generic_pool_holds_no_bytes_per_token(server):
    log = server.log_text()
    m = re.search(r"SGLang generic KV pool \((\w+), never read\): ([\d.]+) B per token slot, (\d+) B fixed", log)
    assert m, "startup report without the generic pool line"
    assert m.group(1) == "NoOpMHATokenToKVPool"
    assert float(m.group(2)) == 0
    assert 0 < int(m.group(3)) <= MAX_GENERIC_FIXED_BYTES
    assert f"KV Cache skipped (no-op pool). Logical #tokens: {USER_CAP}" in log  # SGLang's own line


def test_budget_from_our_bytes_and_user_cap_wins(server, tiny_reference):
    from sglang_dsv41.runtime.pools import KVPools
    from sglang_dsv41.sglang.model.kv_budget import our_bytes_per_token, token_budget

    cfg = tiny_reference.cfg
    m = BUDGET.search(server.log_text())
    assert m, "no KV budget line in the server log"
    available, fixed, rows, per_req, placeholders = (int(m.group(i)) for i in range(1, 6))
    ours, generic, per_token, page, tokens = float(m.group(6)), int(m.group(7)), float(m.group(8)), int(m.group(9)), int(m.group(10))
    assert ours == our_bytes_per_token(cfg, window_rings=False) == KVPools.bytes_per_token(cfg)["total"] + 8 == 1608
    assert generic == 0 and per_token == ours
    assert rows == 64 + 1 and per_req == KVPools.bytes_per_request_slot(cfg) == 2048  # CPU default: 64 requests
    assert fixed == rows * per_req + placeholders and placeholders <= MAX_GENERIC_FIXED_BYTES
    assert page == 64
    assert tokens == token_budget(available, per_token, fixed, page)
    assert tokens > USER_CAP  # host memory buys more than the cap: the cap must be what wins
    assert _max_total_num_tokens(server) == min(tokens, USER_CAP) == USER_CAP
    # Before this budget, SGLang charged 5120 B of generic pool per token slot and our pools came on top.
    assert token_budget(available, 5120, 0, page) < tokens


def test_pools_allocated_at_load(server):
    log = server.log_text()
    report = log.index("DeepSeek-V4.1 (sglang-dsv41) serving report")
    assert report < log.index(f"max_total_num_tokens={USER_CAP}")  # SGLang's scheduler summary, before serving
    assert f"pools: {USER_CAP + 64} token slots (page 64), 65 request slots" in log


def test_greedy_equals_reference(server, tiny_reference):
    ids = list(range(5, 45))
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()["output_ids"]
    assert len(out) == 6
    assert out == teacher_forced(tiny_reference, ids, out)[0]
