"""CUDA graphs for DeepSeek-V4.1 on CUDA (sglang/model/cuda_graphs.py), on SGLang 0.5.23's real ServerArgs
and its real `handle_cuda_graph_config` step (no server launched, no model loaded: the model config is a
fixture, which SGLang's `model_config_of` hands back as it is). Oracles: the resolved `disable_cuda_graph` /
`cuda_graph_config` SGLang's ModelRunner reads to build its graph runners (always off for our model), and
the SGLANG_DSV41_DECODE_GRAPHS value the scheduler's model reads to build its own decode graphs."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from sglang_dsv41.sglang import hooks
from sglang_dsv41.sglang.model import cuda_graphs
from sglang_dsv41.sglang.model.server_args import ARCHITECTURE

STEP = "handle_cuda_graph_config"


def server_args(arch: str, device: str, **fields):
    """A fresh ServerArgs as the resolution pipeline sees it at the graph step: the raw input
    recorded, the model config known."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path="/unused", device=device, **fields)
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = []
    sa._model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch]))
    return sa


def resolve_graph_step(sa, monkeypatch):
    """SGLang's own step through its run_hook, with only our wrapper registered (the environment it
    writes is restored afterwards)."""
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.arg_groups.cuda_graph_hook import handle_cuda_graph_config
    from sglang.srt.arg_groups.overrides import resolving_view

    monkeypatch.setitem(resolution_hooks._HOOKS, STEP, [cuda_graphs.cuda_graphs_off_step])
    monkeypatch.setenv(cuda_graphs.DECODE_GRAPHS_ENV, "unset by the step")
    resolution_hooks.run_hook(handle_cuda_graph_config, sa)
    return resolving_view(sa)


def test_our_model_on_cuda_runs_its_own_decode_graphs(monkeypatch, caplog):
    sa = server_args(ARCHITECTURE, "cuda")
    with caplog.at_level(logging.INFO, logger=cuda_graphs.logger.name):
        cfg = resolve_graph_step(sa, monkeypatch)
    assert cfg.disable_cuda_graph is True
    assert cfg.cuda_graph_config.decode.backend == "disabled"
    assert cfg.cuda_graph_config.prefill.backend == "disabled"
    assert {("decode", "backend"), ("prefill", "backend")} <= sa._cuda_graph_config_locked
    assert os.environ[cuda_graphs.DECODE_GRAPHS_ENV] == "auto"  # SGLang's default decode graph: ours on
    ours = [r for r in caplog.records if r.name == cuda_graphs.logger.name]
    assert [r.getMessage() for r in ours] == [cuda_graphs.LOG_LINE.format(setting="auto")]


@pytest.mark.parametrize("arch, device", [("LlamaForCausalLM", "cuda"), (ARCHITECTURE, "cpu")])
def test_other_models_and_the_cpu_untouched(monkeypatch, caplog, arch, device):
    sa = server_args(arch, device)
    with caplog.at_level(logging.INFO, logger=cuda_graphs.logger.name):
        cfg = resolve_graph_step(sa, monkeypatch)
    assert cfg.disable_cuda_graph is False
    assert cfg.cuda_graph_config.decode.backend == "full"  # SGLang's default decode graph, as without us
    assert not [r for r in caplog.records if r.name == cuda_graphs.logger.name]
    assert not [src for src, _ in sa._resolved_overrides if src == cuda_graphs.SOURCE]


@pytest.mark.parametrize("fields, flag", [
    ({"enable_torch_compile": True}, "--enable-torch-compile"),
    ({"cuda_graph_max_bs_prefill": 64}, "--cuda-graph-max-bs-prefill"),
    ({"cuda_graph_bs_prefill": [1, 2, 4]}, "--cuda-graph-bs-prefill"),
    ({"cuda_graph_backend_decode": "breakable"}, "--cuda-graph-backend-decode"),
    ({"cuda_graph_backend_prefill": "breakable"}, "--cuda-graph-backend-prefill"),
    ({"cuda_graph_config": {"prefill": {"max_bs": 8}}}, "--cuda-graph-config"),
    ({"cuda_graph_config": {"decode": {"backend": "breakable"}}}, "--cuda-graph-config"),
    ({"debug_cuda_graph": True}, "--debug-cuda-graph"),
])
def test_capture_only_flags_rejected_on_cuda(monkeypatch, fields, flag):
    with pytest.raises(ValueError, match=f"^{flag}: .*remove it to serve DeepSeek-V4.1"):
        resolve_graph_step(server_args(ARCHITECTURE, "cuda", **fields), monkeypatch)
    # the same flags on the CPU, or for another model on CUDA, are SGLang's business
    resolve_graph_step(server_args(ARCHITECTURE, "cpu", **fields), monkeypatch)
    resolve_graph_step(server_args("LlamaForCausalLM", "cuda", **fields), monkeypatch)


@pytest.mark.parametrize("fields", [
    {"disable_cuda_graph": True},
    {"disable_decode_cuda_graph": True, "disable_prefill_cuda_graph": True},
    {"cuda_graph_backend_decode": "disabled"},
    {"cuda_graph_config": {"decode": {"backend": "disabled"}}},
])
def test_flags_that_turn_decode_graphs_off(monkeypatch, fields):
    cfg = resolve_graph_step(server_args(ARCHITECTURE, "cuda", **fields), monkeypatch)
    assert cfg.disable_cuda_graph is True and cfg.cuda_graph_config.decode.backend == "disabled"
    assert os.environ[cuda_graphs.DECODE_GRAPHS_ENV] == "off"


@pytest.mark.parametrize("fields, setting", [
    ({"cuda_graph_max_bs_decode": 64}, "max=64"),
    ({"cuda_graph_bs_decode": [8, 1, 2, 4]}, "1,2,4,8"),
    ({"cuda_graph_backend_decode": "full"}, "auto"),
    ({"cuda_graph_config": {"decode": {"max_bs": 8}}}, "max=8"),
    ({"disable_cuda_graph_padding": True}, "auto"),
])
def test_decode_flags_drive_our_graphs(monkeypatch, fields, setting):
    cfg = resolve_graph_step(server_args(ARCHITECTURE, "cuda", **fields), monkeypatch)
    assert cfg.disable_cuda_graph is True and cfg.cuda_graph_config.decode.backend == "disabled"  # SGLang's runner
    assert os.environ[cuda_graphs.DECODE_GRAPHS_ENV] == setting


def test_decode_graph_buckets():
    b = cuda_graphs.decode_graph_buckets
    assert b("off", 48, 8192) is None and b(None, 48, 8192) is None
    auto = b("auto", 48, 8448)
    assert auto.batch_sizes == (1, 2, 4, 8, 12, 16, 24, 32, 48)
    assert auto.capacities == (256, 512, 1024, 2048, 4096, 8192, 8448)
    assert b("auto", 1000, 256).batch_sizes[-1] == 256  # the default buckets stop at 256 requests
    assert b("max=10", 48, 256).batch_sizes == (1, 2, 4, 8, 10)
    assert b("max=100", 20, 256).batch_sizes == (1, 2, 4, 8, 12, 16, 20)  # no more than the request slots
    assert b("3,1,64", 48, 256).batch_sizes == (1, 3)
    for bad in ("max=0", "max=x", "1,0", "two", "1,,2"):
        with pytest.raises(ValueError, match=cuda_graphs.DECODE_GRAPHS_ENV):
            b(bad, 48, 256)


def test_capacity_buckets_are_the_decode_batch_capacities():
    """The adapter's per-step token-table width (decode_batch.decode_capacity) is the capacity bucket the
    graph set picks, so a replay runs the same width as the eager step would."""
    from sglang_dsv41.sglang.model.decode_batch import decode_capacity

    buckets = cuda_graphs.decode_graph_buckets("auto", 8, 5000)
    for longest in (1, 255, 256, 257, 1000, 4096, 4097, 5000):
        assert buckets.choose(1, longest)[1] == decode_capacity(longest, 5000)


def test_registered_on_sglangs_step(monkeypatch):
    """install registers the wrapper on the step SGLang's pipeline runs (the name must stay overridable)."""
    from sglang.srt.arg_groups import model_override_base, resolution_hooks

    assert STEP in resolution_hooks._OVERRIDABLE_HOOKS
    from sglang.srt.arg_groups.cuda_graph_hook import handle_cuda_graph_config

    (row,) = [h for h in hooks.HOOKS if h.target.endswith("." + STEP)]
    assert row.kind == hooks.STEP and hooks.resolve(row.target) is handle_cuda_graph_config
    monkeypatch.setattr(resolution_hooks, "_HOOKS", {})
    monkeypatch.setattr(model_override_base, "register_model_override", lambda arch: (lambda fn: fn))
    hooks.apply(row)
    assert resolution_hooks._HOOKS[STEP] == [cuda_graphs.cuda_graphs_off_step]
