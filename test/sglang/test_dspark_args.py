"""`--speculative-algorithm DSPARK` for DeepSeek-V4.1 through SGLang 0.5.23's real server-arg resolution
(`ServerArgs.resolve_once`, no server started, no weights loaded), with our resolution rows installed through
SGLang's own registries (HookRegistry, resolution hooks, model override providers) for one test at a time.
Oracles: the resolving view the scheduler is built from, and the startup error naming the flag."""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace

import pytest
import resolution_harness

from sglang_dsv41.sglang import hooks
from sglang_dsv41.sglang.model import arg_resolution, registration
from sglang_dsv41.sglang.model.server_args import ARCHITECTURE, _dspark_errors
from sglang_dsv41.sglang.platform import on_our_cpu_platform

RANDOM = "deepseek-v4.1-tiny-random"  # 2 draft stages, gamma 5
TRAINED = "deepseek-v4.1-tiny"  # the trained 1-stage drafter, gamma 5
GAMMA = 5
ROWS = [h for h in hooks.EVERY_PROCESS if h.kind in (hooks.STEP, hooks.PROVIDER)
        or h.fn in (registration.keep_v41_architecture, registration.language_model_only, arg_resolution.dspark_step)]
"""What resolution runs of ours: the wrapped steps, the provider, the kept architecture name, --language-model-only
for our class, the DSPARK row."""


def install(monkeypatch, rows=ROWS) -> None:
    resolution_harness.install(monkeypatch, rows)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("embedded")


@pytest.fixture
def resolve(monkeypatch, cache):
    """resolve(model, **fields) -> SGLang's resolving view of a CPU server with DSPARK."""
    if not on_our_cpu_platform():
        pytest.skip("our CPU platform is not SGLang's current platform here")
    monkeypatch.setenv("SGLANG_DSV41_CACHE", str(cache))
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    install(monkeypatch)

    def run(model=RANDOM, **fields):
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.server_args import ServerArgs

        fields = {"device": "cpu", "speculative_algorithm": "DSPARK", **fields}
        sa = ServerArgs(model_path=str(model), **fields)
        sa.resolve_once()
        return resolving_view(sa)

    return run


@pytest.fixture
def no_drafter(tmp_path):
    """A checkpoint dir whose config has no drafter (dspark_block_size 0) but still dspark_* keys, which SGLang's
    "bundles a draft" test accepts. Only config.json: resolution reads no weights."""
    from sglang_dsv41.embedded import resolve_model_path

    raw = json.loads((resolve_model_path(TRAINED) / "config.json").read_text())
    text = raw.get("text_config", raw)
    text["dspark_block_size"] = 0
    assert text.get("dspark_noise_token_id") is not None
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


@pytest.mark.parametrize("model, name, device", [(RANDOM, "DSPARK", "cpu"), (TRAINED, "dspark", None)])
def test_dspark_resolves_on_the_cpu(resolve, model, name, device, caplog):
    """`--device cpu`, or none (the platform's): accepted, with gamma from the checkpoint's drafter."""
    with caplog.at_level(logging.INFO, logger=arg_resolution.logger.name):
        cfg = resolve(model, speculative_algorithm=name, device=device)
    assert cfg.device == "cpu" and cfg.speculative_algorithm == "DSPARK"
    assert cfg.speculative_num_draft_tokens == GAMMA + 1 and cfg.speculative_dspark_block_size == GAMMA
    assert cfg.speculative_num_steps == 1 and cfg.speculative_eagle_topk == 1
    assert cfg.disable_overlap_schedule is True
    assert cfg.speculative_draft_model_path == cfg.model_path  # the drafter ships in the checkpoint
    assert cfg.max_running_requests == resolve(model, speculative_algorithm=None).max_running_requests  # the platform's
    assert any("without the overlap scheduler" in r.getMessage() for r in caplog.records)


def test_matching_flags_are_accepted(resolve, cache):
    cfg = resolve(RANDOM, speculative_dspark_block_size=GAMMA, speculative_num_draft_tokens=GAMMA + 1,
                  speculative_num_steps=1, speculative_eagle_topk=1, disable_overlap_schedule=True,
                  max_running_requests=8, speculative_accept_threshold_single=1.0)
    assert cfg.speculative_num_draft_tokens == GAMMA + 1 and cfg.max_running_requests == 8
    again = resolve(cfg.model_path, speculative_draft_model_path=cfg.model_path)  # the model's own dir
    assert again.speculative_draft_model_path == cfg.model_path


REFUSED = [
    ({"tp_size": 2}, {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}, "--tp-size", "DSPARK over 2 ranks"),
    ({"enable_encoder_swa_bounded_replay": True}, {}, "--enable-encoder-swa-bounded-replay", "DSPARK"),
    ({"enable_mixed_chunk": True}, {}, "--enable-mixed-chunk", "DSPARK"),
    ({"speculative_draft_model_path": "/elsewhere"}, {}, "--speculative-draft-model-path", "/elsewhere"),
    ({"speculative_dspark_block_size": 4}, {}, "--speculative-dspark-block-size", "gamma = 5 .*got 4"),
    ({"speculative_num_draft_tokens": 8}, {}, "--speculative-num-draft-tokens", "gamma \\+ 1 = 6.*got 8"),
    ({"page_size": 4}, {}, "--page-size", "2 x gamma = 10 .*got 4"),
    ({"speculative_use_block_verification": True}, {}, "--speculative-use-block-verification", "lossless"),
    ({"speculative_accept_threshold_single": 0.5}, {}, "--speculative-accept-threshold-single", "lossy"),
    ({"speculative_accept_threshold_acc": 0.5}, {}, "--speculative-accept-threshold-acc", "lossy"),
    ({"speculative_adaptive": True}, {}, "--speculative-adaptive", "adaptive"),
    ({}, {"SGLANG_RAGGED_VERIFY_MODE": "compact"}, "SGLANG_RAGGED_VERIFY_MODE", "'compact'"),
    ({}, {"SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}, "SGLANG_RAGGED_VERIFY_MODE", "'cap-accept'"),
    ({"speculative_dspark_sps_table_path": "/sps.json"}, {}, "--speculative-dspark-sps-table-path", "verify budget"),
    ({"speculative_dspark_confidence_sts_path": "/sts.json"}, {}, "--speculative-dspark-confidence-sts-path",
     "confidence head"),
    ({"speculative_dspark_align_verify_tokens_to_graph_tier": True}, {},
     "--speculative-dspark-align-verify-tokens-to-graph-tier", "graph tiers"),
    ({"speculative_draft_attention_backend": "triton"}, {}, "--speculative-draft-attention-backend", "ignored"),
    ({"speculative_draft_load_format": "dummy"}, {}, "--speculative-draft-load-format", "ignored"),
    ({"speculative_moe_runner_backend": "triton"}, {}, "--speculative-moe-runner-backend", "ignored"),
    ({"speculative_token_map": "/map.pt"}, {}, "--speculative-token-map", "ignored"),
    ({"enable_return_routed_experts": True}, {}, "--enable-return-routed-experts", "rejected draft rows"),
    ({"enable_return_hidden_states": True}, {}, "--enable-return-hidden-states", "rejected draft rows"),
    ({"attn_dp_size": 2}, {}, "--enable-dp-attention", "data-parallel attention"),
    ({"enable_dp_attention": True, "dp_size": 2}, {}, "--enable-dp-attention", "data-parallel attention"),
]


@pytest.mark.parametrize("fields, env, flag, why", REFUSED, ids=[c[2] + "-" + str(i) for i, c in enumerate(REFUSED)])
def test_refused_at_startup_naming_the_flag(resolve, monkeypatch, fields, env, flag, why):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{re.escape(flag)}: .*{why}.*; remove it to serve DeepSeek-V4.1$"):
        resolve(RANDOM, **fields)


def test_checkpoint_without_a_drafter_refused(resolve, no_drafter):
    with pytest.raises(ValueError, match="^--speculative-algorithm: this checkpoint has no DSpark drafter"):
        resolve(no_drafter)
    assert resolve(no_drafter, speculative_algorithm=None).speculative_algorithm is None  # served without DSPARK


@pytest.fixture(scope="module")
def vision_checkpoint(tmp_path_factory):
    """tiny-vision: a drafter (2 stages, gamma 5) and a vision tower."""
    from sglang_dsv41.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_vision") / "ckpt", "tiny-vision", seed=0)


def test_vision_tower_beside_the_drafter_refused(resolve, vision_checkpoint):
    """A DSPARK server's prefill of an image prompt does not equal the reference (docs/dspark.md): a startup
    error naming the flag and --language-model-only, which serves the same checkpoint's text model with DSPARK."""
    with pytest.raises(ValueError, match="^--speculative-algorithm: DSPARK with image input is not verified.*"
                       "add --language-model-only"):
        resolve(vision_checkpoint)
    assert resolve(vision_checkpoint, language_model_only=True).speculative_algorithm == "DSPARK"
    assert resolve(vision_checkpoint, speculative_algorithm=None).speculative_algorithm is None


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN", "NGRAM", "dflash"])
def test_other_algorithms_still_refused(resolve, algorithm):
    with pytest.raises(ValueError, match=f"^--speculative-algorithm: DeepSeek-V4.1 accepts only DSPARK .*{algorithm}"):
        resolve(RANDOM, speculative_algorithm=algorithm)


def test_unreadable_config_skips_the_checkpoint_checks():
    """The provider hands None when the config cannot be read: only the checks over flags remain."""
    cfg = SimpleNamespace(speculative_dspark_block_size=3, speculative_num_draft_tokens=9, model_path="/m")
    assert _dspark_errors(cfg, None) == []
    assert arg_resolution.checkpoint_config("/no/such/dir", hf_config=None) is None


def speculative_step(monkeypatch, arch: str, device: str, model_path: str, **fields):
    """SGLang's handle_speculative_decoding alone (as the pipeline runs it, with the DSPARK row installed), over a
    model config fixture that names `arch`."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import ServerArgs

    install(monkeypatch, [h for h in ROWS if h.fn is arg_resolution.dspark_step])
    sa = ServerArgs(model_path=model_path, device=device, speculative_algorithm="DSPARK", **fields)
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = []
    sa._model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch]))
    run_hook(handle_speculative_decoding, sa)
    return resolving_view(sa)


def test_cuda_gets_sglangs_batch_cap(monkeypatch, cache):
    """On CUDA the same fields, plus SGLang's DSPARK default of 48 running requests when unset."""
    from sglang_dsv41.embedded import resolve_model_path

    monkeypatch.setenv("SGLANG_DSV41_CACHE", str(cache))
    path = str(resolve_model_path(RANDOM))
    cfg = speculative_step(monkeypatch, ARCHITECTURE, "cuda", path)
    assert (cfg.speculative_num_draft_tokens, cfg.speculative_dspark_block_size) == (GAMMA + 1, GAMMA)
    assert cfg.speculative_num_steps == cfg.speculative_eagle_topk == 1 and cfg.disable_overlap_schedule is True
    assert cfg.max_running_requests == arg_resolution.DSPARK_MAX_RUNNING
    assert speculative_step(monkeypatch, ARCHITECTURE, "cuda", path, max_running_requests=4).max_running_requests == 4


def test_other_models_keep_sglangs_handler(monkeypatch, cache):
    """Another architecture goes to SGLang's _handle_dspark, which refuses the CPU."""
    from sglang_dsv41.embedded import resolve_model_path

    monkeypatch.setenv("SGLANG_DSV41_CACHE", str(cache))
    with pytest.raises(ValueError, match="DSpark speculative decoding only supports CUDA"):
        speculative_step(monkeypatch, "LlamaForCausalLM", "cpu", str(resolve_model_path(RANDOM)))


def test_row_is_on_sglangs_dispatcher():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    (row,) = [h for h in hooks.EVERY_PROCESS if h.fn is arg_resolution.dspark_step]
    assert row.kind == hooks.AROUND and hooks.resolve(row.target) is SpeculativeAlgorithm.handle_server_args
