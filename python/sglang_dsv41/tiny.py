"""Deterministic random DeepSeek-V4.1 checkpoints in the released layout, for tests and benchmarks.

    python -m sglang_dsv41.tiny --preset tiny|small|bench --out DIR [--seed 0] [--device cpu]

Each preset keeps every structural feature of the 40-layer release in fewer layers: window-only
first layers (one with an Engram), a ratio-2 block with two KV+index sources and their consumers
(the second source carries an Engram, as layer 14 does), a ratio-1 block that starts at the
candidate source, later index sources that consume candidates, sinks, and YaRN on compressed layers.
`tiny`/`small` shrink widths so top-k and candidate blocks drop positions at a few hundred tokens;
`bench` keeps the real attention widths (64 x 512 heads, hidden 5120, q_lora 1280, indexer 32 x 128,
window 128, top-512, 2048 x 8 candidates) with fewer experts and small Engram tables.

Weights are N(0, 1/fan_in) quantized into the checkpoint formats. Two explicit gains lower the
numeric noise floor of these random models (shared/guides/numerics.md): residual-writing
projections (wo_b, expert w2, Engram wkv) are scaled by RESIDUAL_GAIN and the head by HEAD_GAIN.
Every tensor draws from its own generator seeded by (seed, name), so the bytes are reproducible.
"""

from __future__ import annotations

import argparse
import functools
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sglang_dsv41.checkpoint.io import write_checkpoint
from sglang_dsv41.checkpoint.schema import checkpoint_schema
from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_layout import EngramLayout
from sglang_dsv41.quant import fp32_pow2_to_e8m0, mxfp8_quant, quant_fp8_weight, quant_mxfp4
from sglang_dsv41.tokenizer.tiny_tokenizer import save_tiny_tokenizer
from sglang_dsv41.tokenizer.token_map import build_compressed_token_map

GENERATOR_VERSION = 3
"""Bumped whenever the bytes a preset produces change (cached embedded checkpoints are keyed by it).
3: DSpark stages (`mtp.*`) and their config fields added; every backbone tensor as in 2."""
BACKBONE_SINCE = 2
"""The oldest generator version whose backbone tensors (everything but `mtp.*`) equal this one's."""
RESIDUAL_GAIN = 0.5
HEAD_GAIN = 2.0
_RESIDUAL_WRITERS = (".attn.wo_b.", ".w2.", ".engram.wkv.")


@dataclass(frozen=True)
class Preset:
    hidden: int
    n_heads: int
    head_dim: int
    q_lora: int
    o_lora: int
    o_groups: int
    index_heads: int
    index_dim: int
    index_topk: int
    cand_blocks: int
    cand_block_size: int
    experts: int
    top_k: int
    inter: int
    ratio2_layers: int
    """Layers 2 .. 2+ratio2_layers-1 have ratio 2; KV sources at their start and middle."""
    ratio1_layers: int
    """The remaining layers have ratio 1; the first is the candidate source, every 2nd after it an index source."""
    engram_heads: int
    engram_ngram: int
    engram_dim: int
    engram_vocab: int
    tokenizer_vocab: int = 1024
    single_digits: bool = False
    """The tokenizer puts every digit in its own token (`build_tiny_tokenizer(single_digits=True)`)."""
    release_layout: bool = False
    """True: the released 40-layer roles (ratio 2 on 2-19, ratio 1 on 20-39, KV sources 2/8/14/20,
    index sources 2/8/14/20/24/28/32/36, candidates from 20, Engram on 1 and 14); the ratio2 / ratio1
    counts must then be 18 / 20."""
    draft_stages: int = 2
    """DSpark stages (`mtp.<k>.*`): gamma 5, targets the last three layers, half the experts."""
    markov_rank: int = 32
    vision_layers: int = 0
    """ViT blocks of the vision tower (0: text only); patch 14, downsample 3 as released."""
    vision_dim: int = 64
    vision_heads: int = 4
    vision_inter: int = 96
    vision_max_tokens: int = 64
    """most LLM positions per image (the release: 1024)."""
    vision_min_pixels: int = 84 * 84


PRESETS = {
    "tiny": Preset(256, 4, 128, 128, 64, 2, 4, 128, 32, 16, 4, 8, 2, 128, 4, 4, 2, 3, 64, 2003),
    "small": Preset(512, 8, 256, 256, 128, 4, 8, 128, 64, 32, 8, 16, 4, 256, 6, 4, 4, 4, 128, 8009),
    # `tiny` at hidden 128 (2 heads, q_lora 64, indexer 2 x 64, Engram dim 64); about 5.7 MB in the
    # released layout
    # `tiny` with a 2-block vision tower (hidden 64, 4 heads), images up to 64 positions
    "tiny-vision": Preset(256, 4, 128, 128, 64, 2, 4, 128, 32, 16, 4, 8, 2, 128, 4, 4, 2, 3, 64, 2003, vision_layers=2),
    "mini": Preset(128, 2, 128, 64, 64, 2, 2, 64, 16, 8, 4, 8, 2, 128, 4, 4, 2, 3, 64, 503),
    # `mini` with one token per digit: the starting point of the trained default `deepseek-v4.1-tiny`
    # (arithmetic is far easier to learn when '312' is '3','1','2' rather than '3','12')
    "mini-digits": Preset(128, 2, 128, 64, 64, 2, 2, 64, 16, 8, 4, 8, 2, 128, 4, 4, 2, 3, 64, 503, single_digits=True),
    "bench": Preset(5120, 64, 512, 1280, 1024, 8, 32, 128, 512, 2048, 8, 16, 6, 2304, 6, 6, 8, 4, 256, 65521,
                    draft_stages=3, markov_rank=256),
    # the released layer roles and attention widths; 16 experts (top-6) so it fits one H200
    # `bench` with the released vision tower (32 ViT blocks, hidden 1024, 16 heads, up to 1024 positions)
    "bench-vision": Preset(5120, 64, 512, 1280, 1024, 8, 32, 128, 512, 2048, 8, 16, 6, 2304, 6, 6, 8, 4, 256, 65521,
                           draft_stages=3, markov_rank=256, vision_layers=32, vision_dim=1024, vision_heads=16,
                           vision_inter=2816, vision_max_tokens=1024, vision_min_pixels=544 * 544),
    "release": Preset(5120, 64, 512, 1280, 1024, 8, 32, 128, 512, 2048, 8, 16, 6, 2304, 18, 20, 8, 4, 256, 65521,
                      release_layout=True, draft_stages=3, markov_rank=256),
}


def _layout(p: Preset) -> tuple[list[int], list[int], list[int], int, list[int]]:
    """-> (compress_ratios, kv_sources, index_sources, candidate_source, engram_layers)."""
    if p.release_layout:
        if (p.ratio2_layers, p.ratio1_layers) != (18, 20):
            raise ValueError("the release layout has 18 ratio-2 and 20 ratio-1 layers")
        return [0, 0] + [2] * 18 + [1] * 20, [2, 8, 14, 20], [2, 8, 14, 20, 24, 28, 32, 36], 20, [1, 14]
    r2_start, r1_start = 2, 2 + p.ratio2_layers
    num_layers = r1_start + p.ratio1_layers
    ratios = [0, 0] + [2] * p.ratio2_layers + [1] * p.ratio1_layers
    r2_second = r2_start + p.ratio2_layers // 2
    kv = [r2_start, r2_second, r1_start]
    index = kv + list(range(r1_start + 2, num_layers, 2))
    return ratios, kv, sorted(index), r1_start, [1, r2_second]


def hf_config(p: Preset, vocab: int, compressed_vocab: int) -> dict:
    """A config.json shaped like the released one (nested text/vision configs)."""
    ratios, kv, index, cand, engram = _layout(p)
    rows = EngramLayout.build(len(engram), p.engram_ngram, p.engram_heads, p.engram_vocab).num_embeddings
    text = {
        "model_type": "deepseek_v41_text",
        "vocab_size": vocab,
        "hidden_size": p.hidden,
        "num_hidden_layers": len(ratios),
        "num_attention_heads": p.n_heads,
        "num_key_value_heads": 1,
        "head_dim": p.head_dim,
        "qk_rope_head_dim": 64,
        "q_lora_rank": p.q_lora,
        "o_lora_rank": p.o_lora,
        "o_groups": p.o_groups,
        "sliding_window": 128,
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 65536},
        "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-20,
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "tie_word_embeddings": False,
        "compress_ratios": ratios + [0] * p.draft_stages,
        "kv_source_layer_ids": kv,
        "index_source_layer_ids": index,
        "index_n_heads": p.index_heads,
        "index_head_dim": p.index_dim,
        "index_topk": p.index_topk,
        "candidate_source_layer_id": cand,
        "candidate_topk_blocks": p.cand_blocks,
        "candidate_block_size": p.cand_block_size,
        "n_routed_experts": p.experts,
        "num_experts_per_tok": p.top_k,
        "moe_intermediate_size": p.inter,
        "n_shared_experts": 1,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "engram_layer_ids": engram,
        "engram_num_embeddings": list(rows),
        "engram_max_ngram_size": p.engram_ngram,
        "engram_n_heads": p.engram_heads,
        "engram_head_dim": p.engram_dim,
        "engram_vocab_size": p.engram_vocab,
        "engram_pad_token_id": 2,
        "engram_compressed_vocab_size": compressed_vocab,
        "num_nextn_predict_layers": p.draft_stages,
        "dspark_block_size": 5 if p.draft_stages else 0,
        "dspark_noise_token_id": vocab - 2,
        "dspark_target_layer_ids": list(range(max(0, len(ratios) - 3), len(ratios))),
        "dspark_markov_rank": p.markov_rank,
        "dspark_n_routed_experts": max(1, p.experts // 2),
        "dspark_num_experts_per_tok": max(1, p.top_k // 2),
        "image_token_id": vocab - 1,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "text_config": text,
        "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": p.vision_layers,
                          **({"hidden_size": p.vision_dim, "num_attention_heads": p.vision_heads,
                              "intermediate_size": p.vision_inter, "patch_size": 14, "rope_theta": 10000.0,
                              "downsample_ratio": 3, "max_image_tokens": p.vision_max_tokens,
                              "min_pixels": p.vision_min_pixels} if p.vision_layers else {})},
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                "routed_experts_quant_method": "mxfp4"},
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
    }


def _normal_fn(name: str, shape: tuple[int, ...], std: float, seed: int, device: str, mean: float = 0.0,
            fast: bool = False) -> torch.Tensor:
    """N(mean, std^2) fp32 from NumPy's PCG64 stream: the same bytes on every machine and device
    (torch's own CPU normal sampler changes with the SIMD width, and CUDA's with the device).
    `fast` draws from torch's generator on `device` instead: seconds instead of minutes for the
    40-layer `release` preset, reproducible only on the same device and torch (speed benchmarks)."""
    if fast:
        g = torch.Generator(device=device).manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32) * std + mean
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    x = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(device)
    return x * std + mean


def random_tensors(cfg: ModelConfig, seed: int = 0, device: str = "cpu", fast: bool = False) -> dict[str, torch.Tensor]:
    """One tensor per schema entry, in checkpoint dtypes (quantized where the release is)."""
    schema = checkpoint_schema(cfg)
    out: dict[str, torch.Tensor] = {}
    _normal = functools.partial(_normal_fn, fast=fast)
    for name, spec in schema.items():
        if name.endswith(".scale") and name[: -len(".scale")] + ".weight" in schema:
            continue  # produced together with its weight
        shape = spec.shape
        gain = RESIDUAL_GAIN if any(w in name for w in _RESIDUAL_WRITERS) else 1.0
        if name.startswith(("vision.", "aligner.", "image_")):
            out[name] = _vision_tensor(name, shape, seed, device, _normal)
        elif spec.dtype == "F8_E4M3" and ".engram.embed." not in name:
            w = _normal(name, shape, gain / shape[1] ** 0.5, seed, device)
            out[name], out[name[: -len(".weight")] + ".scale"] = quant_fp8_weight(w, cfg.weight_block_size)
        elif spec.dtype == "I8":  # routed experts: logical [N, 2 * packed]
            w = _normal(name, (shape[0], shape[1] * 2), gain / (shape[1] * 2) ** 0.5, seed, device)
            packed, out[name[: -len(".weight")] + ".scale"] = quant_mxfp4(w)
            out[name] = packed.view(torch.int8)
        elif ".engram.embed." in name:  # table rows: quantized like MXFP8 activations, per 32
            w = _normal(name, shape, 1.0, seed, device)
            out[name], out[name[: -len(".weight")] + ".scale"] = quant_fp8_weight_rows(w)
        elif name.endswith("norm.weight") or name.endswith(("q_weight", "k_weight")):
            out[name] = _normal(name, shape, 0.1, seed, device, mean=1.0).to(torch.bfloat16)
        elif name.endswith("attn_sink"):
            out[name] = _normal(name, shape, 1.0, seed, device)
        elif ".hc_" in name:
            if name.endswith("_fn"):
                out[name] = _normal(name, shape, 0.5 / shape[1] ** 0.5, seed, device)
            elif name.endswith("_base"):
                out[name] = _normal(name, shape, 0.5, seed, device)
            else:
                out[name] = _normal(name, shape, 0.2, seed, device, mean=1.0)
        elif name.endswith(("gate.bias", "gate.bias_vl")):
            out[name] = _normal(name, shape, 0.05, seed, device)

        elif name == "embed.weight":
            out[name] = _normal(name, shape, 1.0, seed, device).to(torch.bfloat16)
        elif name == "head.weight":
            out[name] = _normal(name, shape, HEAD_GAIN / shape[1] ** 0.5, seed, device).to(torch.bfloat16)
        else:  # remaining bf16 matrices: router, compressor, indexer wk / weights_proj
            out[name] = _normal(name, shape, 1.0 / shape[1] ** 0.5, seed, device).to(torch.bfloat16)
    return out


def _vision_tensor(name: str, shape: tuple[int, ...], seed: int, device: str, normal) -> torch.Tensor:
    """Vision tower tensors: fp32 norm weights near 1, bf16 matrices N(0, 1/fan_in), bf16 biases and span
    markers (the markers like token embeddings, N(0, 1))."""
    if name.endswith("norm.weight") or name.endswith(("norm1.weight", "norm2.weight")):
        return normal(name, shape, 0.1, seed, device, mean=1.0)
    if name.endswith(".bias"):
        return normal(name, shape, 0.02, seed, device).to(torch.bfloat16)
    if len(shape) == 1:  # image_start / image_end / image_newline
        return normal(name, shape, 1.0, seed, device).to(torch.bfloat16)
    return normal(name, shape, 1.0 / shape[1] ** 0.5, seed, device).to(torch.bfloat16)


def quant_fp8_weight_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Engram rows [R, d] -> (e4m3 [R, d], e8m0 [R, d/32]): a 1 x 32 block per scale."""
    q, s = mxfp8_quant(w)
    return q, fp32_pow2_to_e8m0(s)


def write_tiny_checkpoint(out_dir: str | Path, preset: str = "tiny", seed: int = 0, device: str = "cpu") -> Path:
    """Write config.json, tokenizer files and safetensors shards for `preset` into out_dir."""
    p = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_tiny_tokenizer(out, vocab_size=p.tokenizer_vocab, single_digits=p.single_digits,
                        image_token=p.vision_layers > 0)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    _, n_classes = build_compressed_token_map(tok)
    vocab = -(-tok.get_vocab_size(with_added_tokens=True) // 64) * 64
    raw = hf_config(p, vocab, n_classes)
    cfg = ModelConfig.from_hf(raw)
    write_checkpoint(out, random_tensors(cfg, seed, device), cfg)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return out


def random_model(preset: str, workdir: str | Path, device: str = "cpu", seed: int = 0, fast: bool = True):
    """A `DeepseekV41` of `preset` with random weights built in memory (no safetensors written; only
    config.json and the tokenizer go to `workdir`): how speed benchmarks get the 40-layer `release`
    preset without minutes of sampling and writing. `fast=False` gives the checkpoint's exact bytes."""
    from sglang_dsv41.layers.transformer import DeepseekV41
    from sglang_dsv41.tokenizer.token_map import token_map_tensor

    p, out = PRESETS[preset], Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    save_tiny_tokenizer(out, vocab_size=p.tokenizer_vocab, single_digits=p.single_digits,
                        image_token=p.vision_layers > 0)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    _, n_classes = build_compressed_token_map(tok)
    raw = hf_config(p, -(-tok.get_vocab_size(with_added_tokens=True) // 64) * 64, n_classes)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    cfg = ModelConfig.from_hf(raw)
    with torch.device("meta"):
        model = DeepseekV41(cfg)
    model.load_state_dict(random_tensors(cfg, seed, device, fast=fast), strict=True, assign=True)
    for prm in model.parameters():
        prm.requires_grad_(False)
    model.set_token_map(token_map_tensor(str(out), device=device))
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="where to draw and quantize weights (cuda is faster for bench)")
    a = ap.parse_args(argv)
    path = write_tiny_checkpoint(a.out, a.preset, a.seed, a.device)
    print(f"wrote {a.preset} checkpoint to {path}")


if __name__ == "__main__":
    main()
