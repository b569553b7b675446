"""Config tests. Oracle: the released V4.1-Flash values and layer-role table (spec attention 0.2,
model 1.3 and 5.2.3), written out by hand here."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from sglang_dsv41.config import ConfigError, DeepseekV41Config, ModelConfig

RATIOS = [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0]

# The released HF config.json (nested, as published), attention/MoE/Engram fields per the spec.
RELEASED_HF = {
    "architectures": ["DeepseekV41ForCausalLM"],
    "model_type": "deepseek_v41",
    "text_config": {
        "model_type": "deepseek_v41_text",
        "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "sliding_window": 128,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 65536},
        "max_position_embeddings": 1048576, "rms_norm_eps": 1e-20, "hidden_act": "silu",
        "swiglu_limit": 10.0, "compress_ratios": RATIOS,
        "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512,
        "candidate_source_layer_id": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
        "n_routed_experts": 384, "num_experts_per_tok": 6, "moe_intermediate_size": 2304,
        "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
        "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_head_dim": 256,
        "engram_vocab_size": 16000000, "engram_pad_token_id": 2, "engram_compressed_vocab_size": 99092,
        "num_nextn_predict_layers": 3, "image_token_id": 129264,
        "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39],
        "dspark_markov_rank": 256, "dspark_n_routed_experts": 128, "dspark_num_experts_per_tok": 3,
    },
    "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 32, "hidden_size": 1024,
                      "num_attention_heads": 16, "intermediate_size": 2816, "patch_size": 14},
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [32, 32], "scale_fmt": "ue8m0"},
}

# DeepSeek's inference/config.json naming for the same model.
RELEASED_INFERENCE = {
    "vocab_size": 129280, "dim": 5120, "moe_inter_dim": 2304, "n_layers": 40, "n_mtp_layers": 3,
    "n_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1, "n_activated_experts": 6,
    "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 10.0, "q_lora_rank": 1280,
    "head_dim": 512, "rope_head_dim": 64, "norm_eps": 1e-20, "o_groups": 8, "o_lora_rank": 1024,
    "window_size": 128, "kv_source_layers": [2, 8, 14, 20], "index_source_layers": [2, 8, 14, 20, 24, 28, 32, 36],
    "original_seq_len": 65536, "rope_theta": 10000, "rope_factor": 16, "beta_fast": 32, "beta_slow": 1,
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "candidate_source_layer": 20,
    "candidate_topk_blocks": 2048, "candidate_block_size": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "engram_layer_ids": [1, 14], "engram_vocab_size": 16000000,
    "engram_num_embeddings": [384006168, 384016682], "engram_max_ngram_size": 4, "engram_pad_id": 2,
    "engram_compressed_vocab_size": 99092, "dtype": "fp8", "expert_dtype": "fp4",
    "compress_rope_theta": 160000, "compress_ratios": RATIOS, "vision_n_layers": 32,
    "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256, "dspark_n_routed_experts": 128, "dspark_n_activated_experts": 3,
    "image_token_id": 129264, "engram_n_heads": 8, "engram_head_dim": 256,
}


@pytest.fixture(scope="module")
def flash() -> ModelConfig:
    return ModelConfig.from_hf(RELEASED_HF)


def expected_roles():
    """Hand-written spec attention 0.2 table: layer -> (ratio, kv_source, index_source, cand_src, is_cand, engram)."""
    t = {0: (0, None, None, None, False, False), 1: (0, None, None, None, False, True)}
    for l in range(2, 20):
        src = 2 if l < 8 else 8 if l < 14 else 14
        t[l] = (2, src, src, None, False, l == 14)
    for l in range(20, 40):
        idx = 20 if l < 24 else l - (l % 4)
        cand = 20 if l in (24, 28, 32, 36) else None
        t[l] = (1, 20, idx, cand, l == 20, False)
    return t


def test_released_layer_role_table(flash):
    got = {
        r.layer_id: (r.compress_ratio, r.kv_source, r.index_source, r.candidate_source, r.is_candidate_source, r.has_engram)
        for r in flash.layer_roles
    }
    assert got == expected_roles()
    assert [r.layer_id for r in flash.layer_roles if r.is_kv_source] == [2, 8, 14, 20]
    assert [r.layer_id for r in flash.layer_roles if r.is_index_source] == [2, 8, 14, 20, 24, 28, 32, 36]
    assert [r.rope_kind for r in flash.layer_roles] == ["plain"] * 2 + ["yarn"] * 38
    assert flash.late_layer_start == 20
    flash.check_decoder_tail_replay()


def test_released_values(flash):
    assert flash.rms_norm_eps == 1e-20 and flash.moe.swiglu_limit == 10.0
    assert flash.moe.route_scale == 1.5 and flash.moe.n_activated_experts == 6
    assert flash.num_layers == 40 and len(flash.compression.compress_ratios) == 40
    assert flash.num_draft_layers == 3 and flash.vision.n_layers == 32
    v = flash.vision  # vision_config keys not in the file keep the released defaults (spec model 6.4)
    assert (v.dim, v.n_heads, v.inter_dim, v.patch_size, v.downsample_ratio) == (1024, 16, 2816, 14, 3)
    assert (v.head_dim, v.rope_dim, v.window_dim, v.max_n_token, v.min_pixels) == (64, 32, 9216, 1024, 544 * 544)
    assert flash.nope_head_dim == 448 and flash.attention.softmax_scale == 512**-0.5
    assert abs(flash.compression.index_weight_scale - 1 / 64) < 1e-17  # exactly 1/64 once in fp32
    assert flash.engram.n_hash_cols == 24
    # 288 B FP4 latent + 68 B index key per compressed entry; ratio-2 sources halve it.
    assert flash.compressed_kv_bytes_per_entry == 288 and flash.index_key_bytes_per_entry == 68
    assert flash.compressed_bytes_per_token == 890
    assert flash.window_kv_bytes_per_token == 528
    ds = flash.dspark  # DSpark: 3 window-only stages (layers 40-42) with 128 experts, top-3
    assert (ds.n_stages, ds.block_size, ds.verify_rows, ds.noise_token_id) == (3, 5, 6, 128799)
    assert ds.target_layer_ids == (37, 38, 39) and ds.markov_rank == 256
    assert [r.layer_id for r in flash.draft_roles] == [40, 41, 42]
    assert all(r.compress_ratio == 0 and r.rope_kind == "plain" and not r.has_engram for r in flash.draft_roles)
    assert (flash.draft_config.moe.n_routed_experts, flash.draft_config.moe.n_activated_experts) == (128, 3)
    assert flash.draft_config.moe.moe_inter_dim == flash.moe.moe_inter_dim and flash.moe.n_routed_experts == 384


def test_engram_prime_rule(flash):
    assert flash.engram.layout.num_embeddings == (384006168, 384016682)
    primes = flash.engram.layout.flat_primes(0)
    assert len(primes) == 24 and primes[0] > 16_000_000 - 1 and len(set(primes)) == 24


def test_inference_naming_and_hf_class_agree(flash):
    assert ModelConfig.from_hf(RELEASED_INFERENCE) == flash
    hf = DeepseekV41Config(**copy.deepcopy(RELEASED_HF))
    assert hf.model_type == "deepseek_v41" and hf.hidden_size == 5120 and hf.vision_n_layers == 32
    assert not hasattr(hf, "text_config") or hf.text_config is None
    assert ModelConfig.from_hf(hf) == flash


def test_frozen(flash):
    with pytest.raises(dataclasses.FrozenInstanceError):
        flash.hidden_size = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        flash.attention.n_heads = 1


def _bad(**text_overrides):
    raw = copy.deepcopy(RELEASED_HF)
    raw["text_config"].update(text_overrides)
    return raw


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"kv_source_layer_ids": [8, 14, 20]}, "kv_source_layer_ids", "no earlier KV source"),
        ({"index_source_layer_ids": [8, 14, 20]}, "index_source_layer_ids", "no earlier index source"),
        ({"engram_num_embeddings": [384006168, 384016683]}, "engram_num_embeddings", "prime layout rule"),
        ({"engram_vocab_size": 15000000}, "engram_num_embeddings", "prime layout rule"),
        ({"index_topk": 20000}, "index_topk", "candidate pool"),
        ({"compress_ratios": [0, 0, 4] + RATIOS[3:]}, "compress_ratios", "V4 ratios"),
        ({"hidden_act": "gelu"}, "hidden_act", "silu"),
        ({"candidate_source_layer_id": 21}, "candidate_source_layer_id", "not an index source"),
        ({"o_groups": 7}, "o_groups", "not divisible"),
        ({"compress_ratios": RATIOS[:30]}, "compress_ratios", "fewer than num_hidden_layers"),
        ({"engram_layer_ids": [1, 40]}, "engram_layer_ids", "outside"),
        ({"dspark_target_layer_ids": [37, 40]}, "dspark_target_layer_ids", "0..39"),
        ({"dspark_noise_token_id": 129280}, "dspark_noise_token_id", "outside the vocabulary"),
        ({"dspark_num_experts_per_tok": 129}, "dspark_num_experts_per_tok", "1..dspark_n_routed_experts=128"),
        ({"compress_ratios": RATIOS[:40] + [0, 2, 0]}, "compress_ratios", "window-only"),
    ],
)
def test_bad_configs_name_the_field(overrides, field, words):
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_hf(_bad(**overrides))
    assert e.value.field_name == field
    assert words in str(e.value) and field in str(e.value)


def test_missing_required_field():
    raw = copy.deepcopy(RELEASED_HF)
    del raw["text_config"]["num_hidden_layers"]
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        ModelConfig.from_hf(raw)


def test_tail_replay_preconditions():
    cfg = ModelConfig.from_hf(_bad(engram_layer_ids=[1, 20], engram_num_embeddings=[384006168, 384016682]))
    with pytest.raises(ConfigError, match="carry no Engram"):
        cfg.check_decoder_tail_replay()


def test_quantization_config_checked():
    raw = copy.deepcopy(RELEASED_HF)
    raw["quantization_config"]["weight_block_size"] = [128, 64]
    with pytest.raises(ConfigError, match="weight_block_size"):
        ModelConfig.from_hf(raw)


def test_presets_keep_the_release_structure():
    from sglang_dsv41.tiny import PRESETS, hf_config

    for name in PRESETS:
        cfg = ModelConfig.from_hf(hf_config(PRESETS[name], vocab=1024, compressed_vocab=860))
        roles = cfg.layer_roles
        cfg.check_decoder_tail_replay()
        assert [r.compress_ratio for r in roles[:2]] == [0, 0] and roles[1].has_engram
        kv2 = [r.layer_id for r in roles if r.is_kv_source and r.compress_ratio == 2]
        assert len(kv2) == (3 if name == "release" else 2) and roles[kv2[-1]].has_engram  # as 14 does
        assert any(r.compress_ratio == 2 and not r.is_kv_source for r in roles)
        first_r1 = next(r for r in roles if r.compress_ratio == 1)
        assert first_r1.is_candidate_source and first_r1.is_kv_source and first_r1.is_index_source
        assert any(r.uses_candidates for r in roles) and cfg.rope.yarn_original_max_pos == 65536
    bench = ModelConfig.from_hf(hf_config(PRESETS["bench"], vocab=1024, compressed_vocab=860))
    a, c = bench.attention, bench.compression
    assert (bench.hidden_size, a.n_heads, a.head_dim, a.q_lora_rank, a.window_size) == (5120, 64, 512, 1280, 128)
    assert (c.index_n_heads, c.index_head_dim, c.index_topk) == (32, 128, 512)
    assert (c.candidate_topk_blocks, c.candidate_block_size) == (2048, 8)
    assert bench.compressed_bytes_per_token == (288 + 68) / 1 + 2 * (288 + 68) / 2
    release = ModelConfig.from_hf(hf_config(PRESETS["release"], vocab=1024, compressed_vocab=860))
    roles = release.layer_roles
    assert [r.layer_id for r in roles if r.is_kv_source] == [2, 8, 14, 20]
    assert [r.layer_id for r in roles if r.is_index_source] == [2, 8, 14, 20, 24, 28, 32, 36]
    assert [r.layer_id for r in roles if r.has_engram] == [1, 14] and release.num_layers == 40
    assert release.compressed_bytes_per_token == 890 and release.late_layer_start == 20
