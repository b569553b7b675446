"""SGLang's CUDA graphs for DeepSeek-V4.1 on CUDA (sglang/model/cuda_graphs.py), on SGLang 0.5.23's real
ServerArgs and its real `handle_cuda_graph_config` step (no server launched, no model loaded: the model
config is a fixture, which SGLang's `model_config_of` hands back as it is). Oracle: the resolved
`disable_cuda_graph` / `cuda_graph_config` SGLang's ModelRunner reads to build its graph runners."""

from __future__ import annotations

import logging
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
    """SGLang's own step through its run_hook, with only our wrapper registered."""
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.arg_groups.cuda_graph_hook import handle_cuda_graph_config
    from sglang.srt.arg_groups.overrides import resolving_view

    monkeypatch.setitem(resolution_hooks._HOOKS, STEP, [cuda_graphs.cuda_graphs_off_step])
    resolution_hooks.run_hook(handle_cuda_graph_config, sa)
    return resolving_view(sa)


def test_our_model_on_cuda_runs_without_graphs(monkeypatch, caplog):
    sa = server_args(ARCHITECTURE, "cuda")
    with caplog.at_level(logging.INFO, logger=cuda_graphs.logger.name):
        cfg = resolve_graph_step(sa, monkeypatch)
    assert cfg.disable_cuda_graph is True
    assert cfg.cuda_graph_config.decode.backend == "disabled"
    assert cfg.cuda_graph_config.prefill.backend == "disabled"
    assert {("decode", "backend"), ("prefill", "backend")} <= sa._cuda_graph_config_locked
    ours = [r for r in caplog.records if r.name == cuda_graphs.logger.name]
    assert [r.getMessage() for r in ours] == [cuda_graphs.LOG_LINE]
    assert "sglang_dsv41.runtime.driver" in cuda_graphs.LOG_LINE and "CUDA graphs disabled" in cuda_graphs.LOG_LINE


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
    ({"cuda_graph_max_bs_decode": 64}, "--cuda-graph-max-bs-decode"),
    ({"cuda_graph_bs_decode": [1, 2, 4]}, "--cuda-graph-bs-decode"),
    ({"cuda_graph_backend_decode": "full"}, "--cuda-graph-backend-decode"),
    ({"cuda_graph_backend_prefill": "breakable"}, "--cuda-graph-backend-prefill"),
    ({"cuda_graph_config": {"decode": {"max_bs": 8}}}, "--cuda-graph-config"),
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
    {"disable_cuda_graph_padding": True},
])
def test_flags_that_agree_are_accepted(monkeypatch, fields):
    cfg = resolve_graph_step(server_args(ARCHITECTURE, "cuda", **fields), monkeypatch)
    assert cfg.disable_cuda_graph is True and cfg.cuda_graph_config.decode.backend == "disabled"


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
