"""`--rl-on-policy-target sglang_dsv41` and `--enable-deterministic-inference` for DeepSeek-V4.1 through SGLang
0.5.23's real server-arg resolution (`ServerArgs.resolve_once`, no server started, no weights loaded), with our
rows installed through SGLang's own registries (resolution_harness.py); the runtime rows on hand-built objects.
Oracles: the resolving view the scheduler is built from, the environment the scheduler inherits, SGLang's own
parser and refusals, and the startup error naming the flag."""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace

import pytest
import resolution_harness

from sglang_dsv41.sglang import hooks
from sglang_dsv41.sglang.model import arg_resolution, registration, rl_mode
from sglang_dsv41.sglang.model.server_args import ARCHITECTURE, RL_TARGET, deterministic_env
from sglang_dsv41.sglang.platform import on_our_cpu_platform

RANDOM = "deepseek-v4.1-tiny-random"
ROWS = [h for h in hooks.EVERY_PROCESS if h.kind in (hooks.STEP, hooks.PROVIDER)
        or h.fn in (registration.keep_v41_architecture, arg_resolution.skip_attention_backend_check)]
"""What resolution runs of ours: the wrapped steps, the provider, the kept architecture name, the skipped
attention-backend rule."""
ENV = ("SGLANG_DSV41_DETERMINISTIC", "SGLANG_RETURN_ORIGINAL_LOGPROB", "MKL_CBWR")
"""What the flags set for the scheduler (test/conftest.py sets MKL_CBWR for the suite: removed here)."""
SGLANG_ENV = ("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "SGLANG_VLM_CACHE_SIZE_MB", "NCCL_ALGO")
"""What SGLang's own step writes; restored after each test."""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("embedded")


@pytest.fixture
def clean_env(monkeypatch, cache):
    monkeypatch.setenv("SGLANG_DSV41_CACHE", str(cache))
    for name in ENV + SGLANG_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def resolve(clean_env):
    """resolve(model, **fields) -> SGLang's resolving view of a CPU server."""
    if not on_our_cpu_platform():
        pytest.skip("our CPU platform is not SGLang's current platform here")
    resolution_harness.install(clean_env, ROWS)

    def run(model=RANDOM, **fields):
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.server_args import ServerArgs

        sa = ServerArgs(model_path=str(model), **fields)
        sa.resolve_once()
        return resolving_view(sa)

    return run


def _set_env() -> dict:
    import os

    return {name: os.environ.get(name) for name in ENV}


def test_rl_target_sets_everything_on_the_cpu(resolve, caplog):
    with caplog.at_level(logging.INFO, logger=arg_resolution.logger.name):
        cfg = resolve(rl_on_policy_target=RL_TARGET)
    assert cfg.device == "cpu" and cfg.rl_on_policy_target == RL_TARGET
    assert cfg.enable_deterministic_inference is True and cfg.enable_return_routed_experts is True
    assert cfg.enable_decoder_swa_bounded_replay is False and cfg.enable_encoder_swa_bounded_replay is False
    assert cfg.disable_radix_cache is False  # SGLang turned it off for torch_native; our attention keeps it
    assert cfg.sampling_backend == "pytorch" and cfg.attention_backend == "torch_native"
    assert _set_env() == {"SGLANG_DSV41_DETERMINISTIC": "1", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1",
                          "MKL_CBWR": "COMPATIBLE"}
    line = [r.getMessage() for r in caplog.records if "--rl-on-policy-target sglang_dsv41:" in r.getMessage()]
    assert line == ["sglang-dsv41: --rl-on-policy-target sglang_dsv41: SGLANG_DSV41_DETERMINISTIC=1, "
                    "SGLANG_RETURN_ORIGINAL_LOGPROB=1, MKL_CBWR=COMPATIBLE, enable_return_routed_experts=True, "
                    "disable_radix_cache=False"]


def test_rl_target_keeps_consistent_user_values(resolve, clean_env):
    clean_env.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "true")
    clean_env.setenv("MKL_CBWR", "COMPATIBLE")
    cfg = resolve(rl_on_policy_target=RL_TARGET, disable_radix_cache=True, enable_decoder_swa_bounded_replay=False)
    assert cfg.disable_radix_cache is True and cfg.enable_decoder_swa_bounded_replay is False
    assert _set_env() == {"SGLANG_DSV41_DETERMINISTIC": "1", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1",
                          "MKL_CBWR": "COMPATIBLE"}


def test_deterministic_inference_alone(resolve):
    """Our batch-invariant numerics only: no RL settings, the usual decoder replay, the radix cache kept."""
    cfg = resolve(enable_deterministic_inference=True)
    assert cfg.enable_deterministic_inference is True and cfg.rl_on_policy_target is None
    assert cfg.enable_return_routed_experts is False and cfg.enable_decoder_swa_bounded_replay is True
    assert cfg.disable_radix_cache is False and cfg.sampling_backend == "pytorch"
    assert _set_env() == {"SGLANG_DSV41_DETERMINISTIC": "1", "SGLANG_RETURN_ORIGINAL_LOGPROB": None, "MKL_CBWR": None}


def test_without_the_flags_nothing_changes(resolve):
    cfg = resolve()
    assert cfg.enable_deterministic_inference is False and cfg.enable_return_routed_experts is False
    assert cfg.enable_decoder_swa_bounded_replay is True and cfg.disable_radix_cache is False
    assert _set_env() == {name: None for name in ENV}


def test_cpu_server_sleeps_when_idle(resolve):
    """Our CPU platform turns SGLang's --sleep-on-idle on (an idle scheduler otherwise spins a core), with or
    without the flag, and the device is cpu."""
    for fields in ({}, {"sleep_on_idle": True}):
        cfg = resolve(**fields)
        assert cfg.device == "cpu" and cfg.sleep_on_idle is True, fields


RL = {"rl_on_policy_target": RL_TARGET}
DET = {"enable_deterministic_inference": True}
REFUSED = [
    ({"rl_on_policy_target": "fsdp"}, {}, "--rl-on-policy-target: 'fsdp' tunes SGLang layers DeepSeek-V4.1 does not "
     "run (its trainer's target is sglang_dsv41); remove it to serve DeepSeek-V4.1"),
    ({**RL, "speculative_algorithm": "DSPARK"}, {}, "--speculative-algorithm: DSPARK is not served with "
     "--rl-on-policy-target sglang_dsv41 (it returns no routed experts, which the trainer replays); remove it to "
     "serve DeepSeek-V4.1"),
    ({**RL, "enable_decoder_swa_bounded_replay": True}, {}, "--enable-decoder-swa-bounded-replay: is not served with "
     "--rl-on-policy-target sglang_dsv41 (prefill runs every layer on every row, as the trainer's forward does); "
     "remove it to serve DeepSeek-V4.1"),
    ({**RL, "enable_encoder_swa_bounded_replay": True}, {}, "--enable-encoder-swa-bounded-replay: is not served with "
     "--rl-on-policy-target sglang_dsv41 (its prefix-hit replay is not checked against the trainer's forward); "
     "remove it to serve DeepSeek-V4.1"),
    (RL, {"SGLANG_DSV41_DETERMINISTIC": "0"}, "SGLANG_DSV41_DETERMINISTIC='0': contradicts --rl-on-policy-target "
     "sglang_dsv41, which sets SGLANG_DSV41_DETERMINISTIC=1; unset it"),
    (DET, {"SGLANG_DSV41_DETERMINISTIC": "off"}, "SGLANG_DSV41_DETERMINISTIC='off': contradicts "
     "--enable-deterministic-inference, which sets SGLANG_DSV41_DETERMINISTIC=1; unset it"),
    (RL, {"SGLANG_RETURN_ORIGINAL_LOGPROB": "0"}, "SGLANG_RETURN_ORIGINAL_LOGPROB='0': contradicts "
     "--rl-on-policy-target sglang_dsv41, which sets SGLANG_RETURN_ORIGINAL_LOGPROB=1; unset it"),
    (RL, {"MKL_CBWR": "AUTO"}, "MKL_CBWR='AUTO': contradicts --rl-on-policy-target sglang_dsv41, which sets "
     "MKL_CBWR=COMPATIBLE; unset it"),
]


@pytest.mark.parametrize("fields, env, message", REFUSED, ids=[f"refused-{i}" for i in range(len(REFUSED))])
def test_refused_at_startup_naming_the_flag(resolve, clean_env, fields, env, message):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        resolve(**fields)


def _llama_dir(tmp_path):
    """A checkpoint dir of another architecture (only config.json: resolution reads no weights)."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_other_architectures(resolve, tmp_path):
    """Our target serves our model only; --enable-deterministic-inference on another model keeps SGLang's own
    rules (which refuse the CPU platform's attention backend)."""
    model = _llama_dir(tmp_path)
    with pytest.raises(ValueError, match=r"^--rl-on-policy-target sglang_dsv41: serves DeepseekV41ForCausalLM only, "
                                         r"not \['LlamaForCausalLM'\]; remove it for this model$"):
        resolve(model, **RL)
    with pytest.raises(ValueError, match="attention backends are supported for deterministic inference, but you "
                                         "explicitly specified 'torch_native'"):
        resolve(model, **DET)
    assert _set_env() == {name: None for name in ENV}


def test_cuda_sets_no_mkl_path(clean_env, cache):
    """On CUDA (SGLang's step alone over a config naming our architecture): the target's settings without
    MKL_CBWR, no attention backend picked for our model, the radix cache kept."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.attention_hook import handle_deterministic_inference
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.server_args import ServerArgs

    from sglang_dsv41.embedded import resolve_model_path

    resolution_harness.install(clean_env, [h for h in ROWS if h.fn in (arg_resolution.deterministic_step,
                                                                      arg_resolution.skip_attention_backend_check)])
    sa = ServerArgs(model_path=str(resolve_model_path(RANDOM)), device="cuda", rl_on_policy_target=RL_TARGET)
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = []
    sa._model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=[ARCHITECTURE]))
    run_hook(handle_deterministic_inference, sa)
    cfg = resolving_view(sa)
    assert cfg.enable_deterministic_inference is True and cfg.enable_return_routed_experts is True
    assert cfg.attention_backend is None and cfg.disable_radix_cache is False
    assert _set_env() == {"SGLANG_DSV41_DETERMINISTIC": "1", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1", "MKL_CBWR": None}


def test_deterministic_env_values():
    """The plain rule: accepted spellings are kept consistent, anything else names the variable."""
    assert deterministic_env(False, True, {}) == {"SGLANG_DSV41_DETERMINISTIC": "1"}
    assert deterministic_env(True, False, {"SGLANG_DSV41_DETERMINISTIC": "yes"}) == {
        "SGLANG_DSV41_DETERMINISTIC": "1", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}
    with pytest.raises(ValueError, match="^SGLANG_DSV41_DETERMINISTIC='sometimes': expected one of"):
        deterministic_env(False, True, {"SGLANG_DSV41_DETERMINISTIC": "sometimes"})
    with pytest.raises(ValueError, match="^MKL_CBWR='compatible': contradicts"):
        deterministic_env(True, True, {"MKL_CBWR": "compatible"})  # MKL reads the upper-case name only


@pytest.fixture
def sglang_choices():
    """SGLang's choice list, restored after the test (the setup row extends it in place)."""
    from sglang.srt.arg_groups.choices import RL_ON_POLICY_TARGET_CHOICES

    saved = list(RL_ON_POLICY_TARGET_CHOICES)
    RL_ON_POLICY_TARGET_CHOICES[:] = [c for c in saved if c != RL_TARGET]
    yield RL_ON_POLICY_TARGET_CHOICES
    RL_ON_POLICY_TARGET_CHOICES[:] = saved


def test_parser_accepts_the_target_after_the_setup_row(sglang_choices, capsys):
    from sglang.srt.server_args import prepare_server_args

    argv = ["--model-path", "m", "--rl-on-policy-target", RL_TARGET]
    with pytest.raises(SystemExit):
        prepare_server_args(argv)
    assert "argument --rl-on-policy-target: invalid choice: 'sglang_dsv41'" in capsys.readouterr().err
    (row,) = [h for h in hooks.EVERY_PROCESS if h.fn is rl_mode.add_rl_target]
    hooks.apply(row)
    hooks.apply(row)  # once per process in a server; twice adds nothing
    assert sglang_choices.count(RL_TARGET) == 1 and "fsdp" in sglang_choices
    assert prepare_server_args(argv).rl_on_policy_target == RL_TARGET


@pytest.mark.parametrize("target, kept", [(RL_TARGET, False), ("fsdp", True), (None, False)])
def test_sampler_keeps_fp32_for_our_target_only(target, kept):
    """The AFTER row on Sampler.__init__: SGLang's bf16 log-softmax sampling stays on for its own targets."""
    sampler = SimpleNamespace(rl_on_policy_target=target, use_log_softmax_logprob=target is not None)
    rl_mode.keep_fp32_sampling(None, sampler)
    assert sampler.use_log_softmax_logprob is kept
    assert sampler.rl_on_policy_target == (target if kept else None)


def test_batch_invariant_mode_skipped_for_our_model_only(monkeypatch):
    """For our model SGLang's method (which on the CPU raises: no accelerator) is not run; others get it."""
    import sglang.srt.runtime_context as runtime_context
    from sglang.srt.batch_invariant_ops.batch_invariant_ops import is_batch_invariant_mode_enabled
    from sglang.srt.model_executor.model_runner import ModelRunner

    from sglang_dsv41.sglang.model.deepseek_v41 import DeepseekV41ForCausalLM

    on = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=True))
    monkeypatch.setattr(runtime_context, "get_exec", lambda: on)
    ours = SimpleNamespace(model=object.__new__(DeepseekV41ForCausalLM))
    assert rl_mode.skip_batch_invariant_mode(ModelRunner.maybe_enable_batch_invariant_mode, ours) is None
    assert not is_batch_invariant_mode_enabled()
    calls = []
    other = SimpleNamespace(model=object())
    rl_mode.skip_batch_invariant_mode(calls.append, other)
    assert calls == [other]


def test_internal_state_reports_the_scheduler_settings(monkeypatch):
    import torch
    from sglang.srt.layers import sampler

    monkeypatch.setattr(sampler, "SGLANG_RETURN_ORIGINAL_LOGPROB", True)
    monkeypatch.setenv("SGLANG_DSV41_DETERMINISTIC", "1")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    result = SimpleNamespace(internal_state={"tp_size": 1})
    assert rl_mode.report_rl_state(result, None, None) is result
    assert result.internal_state == {"tp_size": 1, "dsv41": {
        "deterministic": True, "return_original_logprob": True, "mkl_cbwr": "COMPATIBLE",
        "aten_cpu_capability": "default", "torch_threads": torch.get_num_threads()}}
    monkeypatch.delenv("SGLANG_DSV41_DETERMINISTIC")
    monkeypatch.delenv("MKL_CBWR")
    monkeypatch.setattr(sampler, "SGLANG_RETURN_ORIGINAL_LOGPROB", False)
    state = rl_mode.rl_state()
    assert (state["deterministic"], state["return_original_logprob"], state["mkl_cbwr"]) == (False, False, None)
