"""CPU: the Engram host table (issue 12, docs/engram.md).

Oracles: the default placement (the checkpoint's table as model parameters) for logits, bit for bit
(both placements read the same rows and run the same math); the checkpoint tensors themselves for
rows assembled from simulated ranks; the allowed-value lists for the variables' errors.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_dsv41.checkpoint.io import CheckpointError
from sglang_dsv41.engram_host import (ENABLE_ENV, LAYOUT_ENV, EngramHostTables, EngramPrefetch, HostEngramTable,
                                      HostTableSettings, HostTableSettingsError, RankGroup, shard_range,
                                      table_tensor_names)
from sglang_dsv41.engram_host.loader import TableSink, load_model_host_tables, stream_from_checkpoint
from sglang_dsv41.layers.engram import gather_rows
from sglang_dsv41.runtime.driver import Driver, Sequence


# ------------------------------------------------------------------ variables
def test_settings_values():
    assert HostTableSettings.from_env({}) == HostTableSettings(False, "shared")
    assert HostTableSettings.from_env({ENABLE_ENV: "1"}) == HostTableSettings(True, "shared")
    assert HostTableSettings.from_env({ENABLE_ENV: "true", LAYOUT_ENV: "per_rank"}) == HostTableSettings(True, "per_rank")
    assert HostTableSettings.from_env({ENABLE_ENV: "0", LAYOUT_ENV: "shared"}) == HostTableSettings(False, "shared")


@pytest.mark.parametrize("env, names", [
    ({ENABLE_ENV: "1", LAYOUT_ENV: "sharded"}, [LAYOUT_ENV, "'sharded'", "shared, per_rank"]),
    ({ENABLE_ENV: "0", LAYOUT_ENV: "per-rank"}, [LAYOUT_ENV, "'per-rank'", "shared, per_rank"]),
    ({ENABLE_ENV: "2"}, [ENABLE_ENV, "'2'", "1, 0"]),
])
def test_invalid_values_name_the_variable(env, names):
    with pytest.raises(HostTableSettingsError) as e:
        HostTableSettings.from_env(env)
    for n in names:
        assert n in str(e.value)


def test_sglang_model_refuses_a_bad_layout_at_construction(tiny_model, monkeypatch):
    from sglang_dsv41.sglang.model.engram_host import EngramHostPlacement

    monkeypatch.setenv(ENABLE_ENV, "1")
    monkeypatch.setenv(LAYOUT_ENV, "numa")
    with pytest.raises(HostTableSettingsError, match=LAYOUT_ENV):
        EngramHostPlacement.from_env(tiny_model.cfg, torch.device("cpu"))
    monkeypatch.setenv(LAYOUT_ENV, "per_rank")
    assert EngramHostPlacement.from_env(tiny_model.cfg, torch.device("cpu")).settings.layout == "per_rank"


# ------------------------------------------------------------------ logits
def _prefill_and_decode(model, ids: list[int], decode: int = 1) -> torch.Tensor:
    drv = Driver(model, 512, 1, page_size=64, device=model.embed.weight.device)
    seq = Sequence(0, list(ids), len(ids))
    out = [drv.step([seq], [len(ids)], all_logits=True).logits]
    for _ in range(decode):  # decode: the n-gram history crosses forwards
        seq.tokens.append(int(out[-1][-1].argmax()))
        seq.prefill_len += 1
        out.append(drv.step([seq], [1]).logits)
    return torch.cat(out)


@pytest.fixture(scope="module")
def prompt(tiny_model) -> list[int]:
    g = torch.Generator().manual_seed(12)
    return torch.randint(3, tiny_model.cfg.vocab_size - 1, (24,), generator=g).tolist()


@pytest.fixture(scope="module")
def default_logits(tiny_model, prompt) -> torch.Tensor:
    return _prefill_and_decode(tiny_model, prompt)


@pytest.mark.parametrize("layout", ["shared", "per_rank"])
def test_logits_bit_equal_to_default_placement(tiny_dir, tiny_model, prompt, default_logits, layout):
    model, tables = load_model_host_tables(tiny_dir, layout, progress=False)
    # nothing of the tables is a model parameter: they live in the mapping only
    names = set(table_tensor_names(model))
    assert not names & set(model.state_dict())
    hosts = [m for m in model.modules() if isinstance(m, HostEngramTable)]
    assert len(hosts) == len(model.cfg.engram.layer_ids)
    lo, hi = tables.region.address, tables.region.address + tables.region.nbytes
    assert all(lo <= m.host_weight.data_ptr() < hi and lo <= m.host_scale.data_ptr() < hi for m in hosts)
    cov = tables.coverage
    assert cov.mapped_bytes == tables.mapped_bytes and 0 <= cov.huge_bytes <= cov.mapped_bytes
    if layout == "shared":  # every layer's rows staged at step start (the prefetch) in this run
        pre = EngramPrefetch(hosts, 256, "cpu").attach(model)
    assert torch.equal(_prefill_and_decode(model, prompt), default_logits)
    if layout == "shared":
        assert not pre.pending  # every staged layer was taken by its Engram layer


def test_prefetch_staging_equals_inline_gather(tiny_dir, tiny_model):
    model, _ = load_model_host_tables(tiny_dir, "shared", progress=False)
    hosts = [m for m in model.modules() if isinstance(m, HostEngramTable)]
    pre = EngramPrefetch(hosts, 64, "cpu").attach(model)
    ids = torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(3))
    rows = model.hasher.hash_sequence(ids)  # issues the staging through the wrapped slot
    assert sorted(pre.pending) == [m.k for m in hosts]
    for m in hosts:
        inline = m.lookup(rows[:, m.k])
        staged = pre.take(m.k, rows[:, m.k])
        assert staged is not None and torch.equal(staged.view(torch.int16), inline.view(torch.int16))
        want = gather_rows(tiny_model.layers[m.tables.sections[m.k].layer_id].engram.embed.weight,
                           tiny_model.layers[m.tables.sections[m.k].layer_id].engram.embed.scale, rows[:, m.k])
        assert torch.equal(inline.view(torch.int16), want.view(torch.int16))
    assert pre.take(hosts[0].k, rows[:, hosts[0].k]) is None  # taken once; a second call gathers inline
    big = model.hasher.hash_sequence(torch.randint(3, 1000, (65,)))  # more rows than staged: inline
    assert not pre.pending and big.size(0) == 65
    pre.detach(model)
    assert "window_hash" not in model.hasher.__dict__ and all(m.prefetch is None for m in hosts)


# ------------------------------------------------------------------ simulated ranks
def test_shard_ranges_partition_every_table(tiny_model):
    e = tiny_model.cfg.engram
    for size in (1, 2, 3, 4):
        for k in range(len(e.layer_ids)):
            ranges = [shard_range(e, k, r, size) for r in range(size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == e.num_embeddings[k]
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            if e.n_hash_cols % size == 0:  # whole (n-gram size, head) segments
                assert {r[0] for r in ranges} <= set(e.layout.offsets[k])


def test_per_rank_two_ranks_reassemble_the_rows(tiny_dir, tiny_model):
    cfg, e = tiny_model.cfg, tiny_model.cfg.engram
    tables = []
    for rank in range(2):
        t = EngramHostTables(cfg, "per_rank", RankGroup(rank, 2))
        stream_from_checkpoint(tiny_dir, t, progress=False)
        t.finish_load()
        tables.append(t)
    assert sum(t.device_bytes_freed for t in tables) == sum(r * (e.head_dim + e.head_dim // 32) for r in e.num_embeddings)
    ids = torch.randint(0, min(e.num_embeddings), (50, e.n_hash_cols), generator=torch.Generator().manual_seed(5))
    for k, lid in enumerate(e.layer_ids):
        parts = [HostEngramTable(t, k).lookup(ids) for t in tables]
        owners = [(p.view(torch.int16) != 0).any(-1) for p in parts]
        assert not (owners[0] & owners[1]).any()  # one rank per row
        summed = parts[0].view(torch.int32) + parts[1].view(torch.int32)  # the all-reduce's integer sum
        table = tiny_model.layers[lid].engram.embed
        want = gather_rows(table.weight, table.scale, ids)
        assert torch.equal(summed.view(torch.bfloat16).view(torch.int16), want.view(torch.int16))


def test_shared_two_ranks_map_one_copy(tiny_dir, tiny_model):
    cfg = tiny_model.cfg
    r0 = EngramHostTables(cfg, "shared", RankGroup(0, 2))
    r1 = EngramHostTables(cfg, "shared", RankGroup(1, 2, broadcast=lambda _: r0.region.handle))
    for t in (r0, r1):  # each rank writes only its own shard
        stream_from_checkpoint(tiny_dir, t, progress=False)
    for k, lid in enumerate(cfg.engram.layer_ids):
        table = tiny_model.layers[lid].engram.embed
        for t in (r0, r1):  # both mappings see every row: the same pages
            assert torch.equal(t.weight(k).view(torch.uint8), table.weight.view(torch.uint8))
            assert torch.equal(t.scale(k).view(torch.uint8), table.scale.view(torch.uint8))
    assert r0.mapped_bytes == r1.mapped_bytes
    assert os.path.realpath(f"/proc/{os.getpid()}/fd/{r0.region.handle[1]}").startswith("/memfd:")


# ------------------------------------------------------------------ bad tables
def test_table_rows_not_matching_the_config_name_the_tensor(tiny_model):
    cfg, e = tiny_model.cfg, tiny_model.cfg.engram
    name = f"layers.{e.layer_ids[1]}.engram.embed.weight"
    sink = TableSink(EngramHostTables(cfg, "per_rank"), "model-00001-of-00001.safetensors", progress=False)
    bad = torch.zeros(e.num_embeddings[1] - 7, e.head_dim, dtype=torch.float8_e4m3fn)
    with pytest.raises(CheckpointError) as err:
        list(sink.filter([("embed.weight", torch.zeros(1)), (name, bad)]))
    msg = str(err.value)
    assert name in msg and "engram_num_embeddings[1]" in msg and str(e.num_embeddings[1] - 7) in msg
    narrow = torch.zeros(e.num_embeddings[1], e.head_dim // 2, dtype=torch.float8_e4m3fn)
    with pytest.raises(CheckpointError, match="expected width"):
        list(TableSink(EngramHostTables(cfg, "per_rank"), progress=False).filter([(name, narrow)]))


# ------------------------------------------------------------------ CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned host table read by the GPU gather)")
@pytest.mark.parametrize("layout", ["shared", "per_rank"])
def test_cuda_host_table_with_prefetch_equals_device_tables(tiny_dir, prompt, layout):
    from sglang_dsv41.checkpoint.loader import load_model
    from sglang_dsv41.numerics import NumericsPolicy, apply_numerics
    from sglang_dsv41.runtime.kernels import kernel_table

    table = kernel_table("cuda")
    dev_model = apply_numerics(load_model(tiny_dir, device="cuda", progress=False), NumericsPolicy.kernels(table))
    model, tables = load_model_host_tables(tiny_dir, layout, device="cuda", progress=False)
    apply_numerics(model, NumericsPolicy.kernels(table))
    hosts = [m for m in model.modules() if isinstance(m, HostEngramTable)]
    assert all(m.host_weight.is_pinned() and m.host_weight.device.type == "cpu" for m in hosts)
    pre = EngramPrefetch(hosts, 256, "cuda").attach(model)
    want = _prefill_and_decode(dev_model, prompt, decode=2)
    assert torch.equal(_prefill_and_decode(model, prompt, decode=2), want)
    assert not pre.pending
    # a decode-sized Engram step (hash + every Engram layer, prefetch on the side stream) in a CUDA graph
    ids = torch.randint(3, 1000, (8,), device="cuda")
    hist = torch.randint(3, 1000, (8, model.cfg.engram.max_ngram_size - 1), device="cuda")
    start, lens = torch.full((8,), 40, device="cuda"), torch.ones(8, dtype=torch.long, device="cuda")
    streams = torch.randn(8, model.cfg.hc.hc_mult, model.cfg.hidden_size, device="cuda").to(torch.bfloat16)

    def step():
        rows = model.hasher.hash_packed(ids, lens, start, hist)
        out = streams
        for m in hosts:
            out = model.layers[tables.sections[m.k].layer_id].engram(out, rows[:, m.k])
        return out

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    ids.copy_(torch.randint(3, 1000, (8,), device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static.view(torch.int16), step().view(torch.int16))
