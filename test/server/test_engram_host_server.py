"""One real SGLang server with `SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1` (default layout `shared`): the
Engram tables are streamed into host memory, the model's tables are swapped for the host modules with the
prefetch attached, and the served numbers equal the default placement's. Oracle: `ReferenceModel`
teacher-forced on the server's tokens (the default placement: tables as model parameters). The paged
runtime equals the reference bit for bit on CPU and the host table reads the same rows, so greedy tokens and
the sampled tokens' logprobs (log_softmax of our fp32 logits) must be exactly equal here. Input logprobs go
through SGLang's own input-logprob processor, whose log-sum-exp rounds differently from the oracle's
`log_softmax` whatever the placement; they get test_numerics.py's tolerance."""

from __future__ import annotations

import pytest
import requests
import torch

from launch import start_server, stop_server
from oracle import teacher_forced

LOGPROB_ATOL = 1e-5
"""Input logprobs only (as test_numerics.py)."""


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("engram_host") / "server.log"
    srv = start_server(tiny_dir, log, "--chunked-prefill-size", "64",
                       env={"SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "1"})
    yield srv
    stop_server(srv.proc)


def test_startup_report_shows_moved_bytes_and_kv_gain(server):
    log = server.log_text()
    assert "Engram host table (SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1, layout shared, rank 0 of 1)" in log
    line = next(x for x in log.splitlines() if "device memory freed" in x)
    freed = int(line.split("):", 1)[1].split(" B ")[0])
    per_token = float(line.rsplit(" at ", 1)[1].split(" B ")[0])
    gained = int(line.split(" = ", 1)[1].split(" more KV tokens")[0])
    assert freed > 0 and gained == int(freed // per_token)


def test_logprobs_bit_equal_to_default_placement(server, tiny_reference):
    g = torch.Generator().manual_seed(21)
    ids = torch.randint(3, 1023, (70,), generator=g).tolist()  # two prefill chunks (64 + 6)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0}
    r = requests.post(server.url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    meta = out["meta_info"]
    toks, lps, in_lps = teacher_forced(tiny_reference, ids, out["output_ids"])
    assert out["output_ids"] == toks
    assert [x[0] for x in meta["output_token_logprobs"]] == lps
    got_in = [x[0] for x in meta["input_token_logprobs"][1:]]
    assert len(got_in) == len(in_lps) and max(abs(a - b) for a, b in zip(got_in, in_lps)) <= LOGPROB_ATOL


def test_adapter_applies_the_kernel_op_table_on_cuda_only(tiny_dir):
    """The model class's kernel step (`apply_kernels`, called in load_weights after the token map and before
    the prefetch attaches): on CUDA every kernel slot, the host tables' gather and the Engram hash / gate
    included, is the op table's op; elsewhere the layers keep their torch defaults. Runs on this CPU model:
    setting the slots allocates nothing on a device."""
    pytest.importorskip("triton")
    from sglang_dsv41.engram_host import HostEngramTable
    from sglang_dsv41.engram_host.loader import load_model_host_tables
    from sglang_dsv41.numerics import slotted as _slotted
    from sglang_dsv41.sglang.model.deepseek_v41 import apply_kernels

    model, _ = load_model_host_tables(tiny_dir, "shared", progress=False)
    assert apply_kernels(model, torch.device("cpu")) is None
    slotted = list(_slotted(model))
    assert all(attr not in m.__dict__ for m in slotted for attr in type(m).numerics_slots)
    table = apply_kernels(model, torch.device("cuda"))
    assert {"engram_gather", "engram_gate", "engram_hash"} <= set(table.names())
    for m in slotted:
        for attr, slot in type(m).numerics_slots.items():
            if slot.kernel is not None:
                assert m.__dict__.get(attr) is getattr(table, slot.kernel), (type(m).__name__, attr)
    hosts = [m for m in model.modules() if isinstance(m, HostEngramTable)]
    assert hosts and all(m.gather is table.engram_gather for m in hosts)
    assert model.hasher.window_hash is table.engram_hash
    assert all(layer.engram.gate is table.engram_gate for layer in model.layers if layer.engram is not None)
