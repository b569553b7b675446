"""The SGLang adapter without a server: every hook target still exists in the installed SGLang (fails
loudly when SGLang moves one), the architecture rewrite, aliases, V4.1 flag rules, the platform gate,
and the ForwardBatch -> Batch helpers. Oracles: SGLang 0.5.23's own objects and hand-built cases."""

from __future__ import annotations

import os

from types import SimpleNamespace

import pytest
import torch

from sglang_dsv41.sglang import hooks
from sglang_dsv41.sglang.model import cpu_host_alloc, registration
from sglang_dsv41.sglang.model.forward import TokenStore, plan_logits
from sglang_dsv41.sglang.model.server_args import (ARCHITECTURE, _flag_errors, resolve_decoder_replay, resolve_model_name,
                                             v41_defaults, validate_flags)


@pytest.mark.parametrize("hook", hooks.HOOKS, ids=lambda h: h.target.rsplit(".", 1)[-1])
def test_hook_target_exists(hook):
    assert hooks.resolve(hook.target) is not None, f"SGLang moved {hook.target}: {hook.why}"


def test_wrapped_resolution_steps_are_overridable():
    from sglang.srt.arg_groups.resolution_hooks import _OVERRIDABLE_HOOKS

    steps = {h.target.rsplit(".", 1)[1] for h in hooks.HOOKS if h.kind == hooks.STEP}
    assert steps == {"handle_model_source_paths", "handle_missing_default_values", "handle_cuda_graph_config",
                     "handle_platform_defaults", "handle_deterministic_inference"}
    assert steps <= _OVERRIDABLE_HOOKS


def test_architecture_kept_on_our_class():
    from sglang.srt.configs.deepseek_v41 import normalize_deepseek_v41_config

    raw = {"architectures": [ARCHITECTURE], "model_type": "deepseek_v41", "text_config": {"hidden_size": 8}}
    rewritten = normalize_deepseek_v41_config(raw)
    assert rewritten["architectures"] == ["DeepseekV4ForCausalLM"]  # SGLang's own rewrite, which we undo
    kept = registration.keep_v41_architecture(rewritten, raw)
    assert kept["architectures"] == [ARCHITECTURE] and kept["hidden_size"] == 8
    # a vision tower stays: SGLang serves images through our processor package
    vl = {**raw, "vision_config": {"num_hidden_layers": 32, "hidden_size": 1024}}
    kept = registration.keep_v41_architecture(normalize_deepseek_v41_config(vl), vl)
    assert kept["architectures"] == [ARCHITECTURE] and kept["vision_n_layers"] == 32 and kept["vision_dim"] == 1024
    other = {"architectures": ["DeepseekV4ForCausalLM"]}
    assert registration.keep_v41_architecture(dict(other), other)["architectures"] == ["DeepseekV4ForCausalLM"]


def test_entry_points_registered():
    from importlib.metadata import entry_points

    assert "sglang_dsv41.sglang.platform:activate" in {e.value for e in entry_points(group="sglang.srt.platforms")}
    assert "sglang_dsv41.sglang.plugin:register" in {e.value for e in entry_points(group="sglang.srt.plugins")}


def test_model_class_registered_from_external_package():
    from sglang.srt.models.registry import import_model_classes

    assert ARCHITECTURE in import_model_classes(registration.EXTERNAL_PACKAGE)


def test_platform_class_is_built_once_without_module_state():
    from sglang_dsv41.sglang import platform

    cls = platform.Dsv41CpuPlatform
    assert cls is platform.Dsv41CpuPlatform and cls.__name__ == "Dsv41CpuPlatform"
    assert "Dsv41CpuPlatform" not in vars(platform)  # memoized by the builder, not written into globals()


@pytest.mark.parametrize("front_end", [True, False])
def test_install_registers_request_validation_only_in_the_front_end(monkeypatch, front_end):
    """install() keeps no state of its own; the request-validation hooks (which import the HTTP server)
    are registered only where the HTTP server and tokenizer manager run. Oracle: SGLang's registries
    after install(), with every registry swapped for an empty copy."""
    from sglang.srt.arg_groups import choices, model_override_base, resolution_hooks
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

    registered, providers = {}, []
    targets = [c for c in choices.RL_ON_POLICY_TARGET_CHOICES if c != "sglang_dsv41"]
    monkeypatch.setattr(choices, "RL_ON_POLICY_TARGET_CHOICES", targets)
    monkeypatch.setattr(choices, "add_rl_on_policy_target_choices", targets.extend)
    monkeypatch.setattr(HookRegistry, "register", lambda target, fn, kind: registered.setdefault(target, (kind, fn)))
    monkeypatch.setattr(resolution_hooks, "_HOOKS", {})
    monkeypatch.setattr(model_override_base, "register_model_override", lambda arch: providers.append(arch) or (lambda fn: fn))
    monkeypatch.setattr(ModelRegistry, "models", {k: v for k, v in ModelRegistry.models.items() if k != ARCHITECTURE})
    monkeypatch.setitem(common.ALLOC_MEMORY_FUNCS, "cpu", common.ALLOC_MEMORY_FUNCS.default_factory())
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "sglang_dsv41.sglang.model")  # registry imported: direct
    monkeypatch.setattr(hooks, "_front_end_process", lambda: front_end)
    hooks.install()

    from sglang.srt.plugins.hook_registry import HookType

    validate = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
    assert (validate in registered) == front_end
    assert registered.get("sglang.srt.managers.utils.validate_input_length", (None,))[0] is HookType.AFTER
    assert (("sglang.srt.entrypoints.http_server._setup_and_run_http_server" in registered) == front_end)
    assert set(resolution_hooks._HOOKS) == {"handle_model_source_paths", "handle_missing_default_values",
                                            "handle_cuda_graph_config", "handle_platform_defaults",
                                            "handle_deterministic_inference"}
    assert providers == [ARCHITECTURE]
    assert ModelRegistry.models[ARCHITECTURE] is DeepseekV41ForCausalLM
    assert common.ALLOC_MEMORY_FUNCS["cpu"] is cpu_host_alloc.alloc_host_unpinned
    assert targets[-1] == "sglang_dsv41" and targets.count("sglang_dsv41") == 1
    assert "_installed" not in vars(hooks)


def test_every_row_is_installable():
    """Each row names a known kind and carries our function, except `read` rows, which install nothing."""
    for hook in hooks.HOOKS:
        assert hook.kind in hooks.KINDS, hook.target
        assert (hook.fn is None) == (hook.kind == hooks.READ), hook.target
    assert len({(h.target, h.kind) for h in hooks.HOOKS}) == len(hooks.HOOKS)  # one row per hook


def test_platform_never_claims_a_cuda_machine(monkeypatch):
    from sglang_dsv41.sglang import platform

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert platform.activate() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    assert platform.activate() == "sglang_dsv41.sglang.platform:Dsv41CpuPlatform"


def test_aliases(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DSV41_CACHE", str(tmp_path))
    assert resolve_model_name("deepseek-v4.1") == ("deepseek-ai/DeepSeek-V4.1-Flash", "deepseek-v4.1")
    assert resolve_model_name("/some/dir") == ("/some/dir", None)
    from sglang_dsv41.tiny import GENERATOR_VERSION

    path, served = resolve_model_name("deepseek-v4.1-tiny-random")
    cached = tmp_path / f"deepseek-v4.1-tiny-random-g{GENERATOR_VERSION}"
    assert served == "deepseek-v4.1-tiny-random" and (cached / "config.json").exists()
    assert path == str(cached)
    from sglang_dsv41.embedded import ASSETS

    path, served = resolve_model_name("deepseek-v4.1-tiny")  # the trained default shipped in the package
    assert served == "deepseek-v4.1-tiny" and path == str(ASSETS / "deepseek-v4.1-tiny")


@pytest.mark.parametrize("field, value, flag", [
    ("enable_hisparse", True, "--enable-hisparse"),
    ("pp_size", 2, "--pp-size"),
    ("enable_two_batch_overlap", True, "--enable-two-batch-overlap"),
    ("speculative_algorithm", "EAGLE", "--speculative-algorithm"),
    ("speculative_algorithm", "ngram", "--speculative-algorithm"),
    ("enable_unified_memory", True, "--enable-unified-memory"),
    ("ep_size", 4, "--ep-size"),  # without --tp-size 4 (docs/parallel.md: 1 or the TP size)
    ("enable_hierarchical_cache", True, "--enable-hierarchical-cache"),
    ("disaggregation_mode", "prefill", "--disaggregation-mode"),
    ("enable_lora", True, "--enable-lora"),
    ("lora_paths", ["a=/x"], "--enable-lora"),
    ("expert_distribution_recorder_mode", "stat", "--expert-distribution-recorder-mode"),
    ("enable_eplb", True, "--enable-eplb"),
    ("max_total_tokens", 0, "--max-total-tokens"),
    ("max_total_tokens", -5, "--max-total-tokens"),
    ("max_total_tokens", 63, "--max-total-tokens"),  # less than one page of the default 64
])
def test_rejected_flags_name_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        validate_flags(SimpleNamespace(**{field: value}), on_cpu=True)


def test_max_total_tokens_of_one_page_or_more_is_accepted():
    assert _flag_errors(SimpleNamespace(max_total_tokens=64), on_cpu=True) == []
    assert _flag_errors(SimpleNamespace(max_total_tokens=10**12), on_cpu=True) == []  # the memory budget caps it


def test_bad_deterministic_value_fails_at_startup(monkeypatch):
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "sometimes")
    with pytest.raises(ValueError, match="SGLANG_DSV41_DETERMINISTIC='sometimes'"):
        validate_flags(SimpleNamespace(), on_cpu=True)


ENC = "--enable-encoder-swa-bounded-replay"


@pytest.mark.parametrize("extra, flag", [
    ({"enable_mixed_chunk": True}, "--enable-mixed-chunk"),
    ({"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
    ({"chunked_prefill_size": 191, "page_size": 64}, "--chunked-prefill-size"),
    ({"chunked_prefill_size": 383, "page_size": 256}, "--chunked-prefill-size"),
    ({"max_running_requests": 0}, "--max-running-requests"),
])
def test_encoder_replay_rejected_combinations(extra, flag):
    """Spec attention 7.1: each combination fails at startup naming both flags."""
    with pytest.raises(ValueError, match=f"^{flag}: {ENC} does not support"):
        validate_flags(SimpleNamespace(enable_encoder_swa_bounded_replay=True, **extra), on_cpu=True)
    assert _flag_errors(SimpleNamespace(enable_encoder_swa_bounded_replay=False, **extra), on_cpu=True) == []


def test_replay_flags_accepted_and_resolved():
    ok = SimpleNamespace(enable_encoder_swa_bounded_replay=True, enable_decoder_swa_bounded_replay=True,
                         chunked_prefill_size=192, page_size=64, max_running_requests=8)
    assert _flag_errors(ok, on_cpu=True) == [] and _flag_errors(ok, on_cpu=False) == []
    with pytest.raises(ValueError, match="--enable-decoder-swa-bounded-replay: cannot be combined with --enable-return-hidden"):
        validate_flags(SimpleNamespace(enable_decoder_swa_bounded_replay=True, enable_return_hidden_states=True), True)
    # tri-state: unset -> on (off when every prompt row's hidden state is returned); explicit wins
    assert resolve_decoder_replay(SimpleNamespace(), {}) is True
    assert resolve_decoder_replay(SimpleNamespace(enable_return_hidden_states=True), {}) is False
    assert resolve_decoder_replay(SimpleNamespace(), {"enable_decoder_swa_bounded_replay": False}) is None
    assert v41_defaults(SimpleNamespace(), {}, on_cpu=True) == {"page_size": 64, "enable_decoder_swa_bounded_replay": True}
    assert v41_defaults(SimpleNamespace(), {"enable_decoder_swa_bounded_replay": False}, on_cpu=True) == {"page_size": 64}


@pytest.mark.parametrize("on_cpu", [True, False])
def test_return_routed_experts_accepted(on_cpu):
    """The flag is served on every device: it raises no error, while a rejected flag next to it still does."""
    assert _flag_errors(SimpleNamespace(enable_return_routed_experts=True), on_cpu) == []
    both = SimpleNamespace(enable_return_routed_experts=True, enable_hisparse=True)
    assert [flag for flag, _ in _flag_errors(both, on_cpu)] == ["--enable-hisparse"]
    with pytest.raises(ValueError, match="--enable-hisparse"):
        validate_flags(both, on_cpu=on_cpu)


def test_routed_experts_capturer_on_cpu(monkeypatch):
    """SGLang's own capturer with device "cpu": host cache allocation (the old CUDA crash), capture,
    both readbacks (inline and the overlap scheduler's deferred finalize) and get_topk by token slot."""
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.state_capturer.base import BaseTopkCapturer

    # Start from what SGLang does alone: "cpu" resolves to its cudaHostRegister default.
    monkeypatch.setitem(common.ALLOC_MEMORY_FUNCS, "cpu", common.ALLOC_MEMORY_FUNCS.default_factory())
    cpu_host_alloc.add_cpu_allocator()
    assert common.ALLOC_MEMORY_FUNCS["cpu"] is cpu_host_alloc.alloc_host_unpinned

    cap = BaseTopkCapturer(num_tokens=16, max_batch_size=4, num_layers=3, topk_size=2, device="cpu", name="t")
    ids = torch.arange(18, dtype=torch.int32).reshape(3, 3, 2)  # [layer, token, k]
    slots = torch.tensor([5, 9, 2])
    fb = SimpleNamespace(out_cache_loc=slots, out_cache_loc_virtual=None)
    for layer in range(3):
        cap.capture(layer, ids[layer])
    cap.on_forward_end(fb, can_run_graph=False, cuda_graph_batch=None)
    pool = SimpleNamespace(req_to_token=torch.tensor([[5, 9, 2, 7, 0]]))
    assert torch.equal(cap.get_topk(0, seqlen=4, req_to_token_pool=pool), ids.transpose(0, 1))

    for layer in range(3):
        cap.capture(layer, ids[layer][:1] + 100)
    out = cap.on_forward_end(SimpleNamespace(out_cache_loc=torch.tensor([7]), out_cache_loc_virtual=None),
                             can_run_graph=False, cuda_graph_batch=None, no_copy_to_cpu=True)
    out.map_device_tensors(lambda t: t.cpu())
    out.finalize()
    assert torch.equal(cap.get_topk(0, seqlen=5, req_to_token_pool=pool, start_len=3), ids[:, :1].transpose(0, 1) + 100)
    cap.destroy()


def test_defaults():
    assert _flag_errors(SimpleNamespace(pp_size=1, enable_decoder_swa_bounded_replay=None), on_cpu=True) == []
    assert v41_defaults(None, {}, on_cpu=True) == {"page_size": 64}
    assert v41_defaults(None, {"page_size": 256}, on_cpu=False) == {}
    with pytest.raises(ValueError, match="--page-size"):
        v41_defaults(None, {"page_size": 63}, on_cpu=True)


def test_plan_logits_follows_sglang_pruning():
    # SGLang's example: extend lens [4, 5, 6], logprob starts [0, 5, 3].
    p = plan_logits([4, 5, 6], [0, 5, 3], "cpu")
    assert p.rows.tolist() == [0, 1, 2, 3, 8, 12, 13, 14]
    assert p.sample_indices == [3, 4, 7] and p.input_logprob_indices == [0, 1, 2, 3, 5, 6, 7]
    assert p.token_to_seq_idx == [0, 0, 0, 0, 1, 2, 2, 2]
    assert plan_logits([4, 5, 6], None, "cpu").rows.tolist() == [3, 8, 14]


def test_token_store_history_reads_shared_prefix_slots():
    store = TokenStore(16, "cpu")
    store.write(torch.tensor([4, 5, 6, 7]), torch.tensor([11, 12, 13, 14]))
    table = torch.tensor([[4, 5, 6, 7, 8], [4, 5, 9, 10, 11]])  # request 1 shares request 0's first 2 slots
    hist = store.history(table, torch.tensor([4, 2]), 3)
    assert hist.tolist() == [[12, 13, 14], [0, 11, 12]]


def test_processor_package_registers_our_image_processor(monkeypatch):
    from sglang.srt.managers import multimodal_processor as mp

    monkeypatch.delenv("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", raising=False)
    registration.use_model_package()
    assert os.environ["SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"] == registration.PROCESSOR_PACKAGE
    monkeypatch.setattr(mp, "PROCESSOR_MAPPING", {})
    mp.import_processors(registration.PROCESSOR_PACKAGE, overwrite=True)  # what SGLang's tokenizer manager runs
    assert [(m.__name__, p.__name__) for m, p in mp.PROCESSOR_MAPPING.items()] == [
        (ARCHITECTURE, "DeepseekV41ImageInput")]
