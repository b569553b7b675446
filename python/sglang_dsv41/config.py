"""DeepSeek-V4.1 configuration: one frozen, typed record built once from the HF config.

Two inputs are accepted and normalised to the same `ModelConfig`:
  * the released HF `config.json` (top-level `model_type: deepseek_v41`, nested `text_config` /
    `vision_config`, top-level `quantization_config`), via `DeepseekV41Config`;
  * DeepSeek's `inference/config.json` naming (`dim`, `n_layers`, `kv_source_layers`, ...).

Everything the model needs per layer (compress ratio, RoPE kind, which KV source / index source /
candidate source a layer reads, Engram layers) is *derived* here as properties, never stored back.
Inconsistent configs raise `ConfigError` naming the offending field.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Mapping

from sglang_dsv41.engram_layout import EngramLayout

try:  # transformers >= 5 renamed the base class; keep both spellings working.
    from transformers import PreTrainedConfig as _HFConfigBase
except ImportError:  # pragma: no cover - transformers 4.x
    from transformers import PretrainedConfig as _HFConfigBase


class ConfigError(ValueError):
    """A config field is missing, out of range or inconsistent with another field."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"config field '{field_name}': {message}")
        self.field_name = field_name


# --------------------------------------------------------------------------------------------
# HF config class
# --------------------------------------------------------------------------------------------

# DeepSeek inference/config.json name -> HF name (only where they differ).
INFERENCE_TO_HF = {
    "dim": "hidden_size",
    "moe_inter_dim": "moe_intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_mtp_layers": "num_nextn_predict_layers",
    "n_heads": "num_attention_heads",
    "n_activated_experts": "num_experts_per_tok",
    "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor",
    "rope_head_dim": "qk_rope_head_dim",
    "norm_eps": "rms_norm_eps",
    "window_size": "sliding_window",
    "kv_source_layers": "kv_source_layer_ids",
    "index_source_layers": "index_source_layer_ids",
    "candidate_source_layer": "candidate_source_layer_id",
    "engram_pad_id": "engram_pad_token_id",
    "dspark_n_activated_experts": "dspark_num_experts_per_tok",
}
_INFERENCE_ROPE_KEYS = ("original_seq_len", "rope_factor", "beta_fast", "beta_slow")

# vision_config key -> flat name (copied only if the flat name is unset), as SGLang normalises it.
_VISION_FLAT = {
    "num_hidden_layers": "vision_n_layers",
    "hidden_size": "vision_dim",
    "num_attention_heads": "vision_n_heads",
    "intermediate_size": "vision_inter_dim",
    "patch_size": "vision_patch_size",
    "rope_theta": "vision_rope_theta",
    "downsample_ratio": "vision_downsample_ratio",
    "max_image_tokens": "vision_max_n_token",
    "min_pixels": "vision_min_pixels",
    "max_wh_ratio": "vision_max_wh_ratio",
}


def flatten_hf_dict(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Released HF config (nested) or inference config (DeepSeek names) -> flat HF-named dict.

    Text-config keys are merged into the top level (top-level keys win); vision-config keys are
    copied to their flat `vision_*` names; DeepSeek inference names are renamed to HF names and the
    YaRN fields gathered into `rope_scaling`.
    """
    d = dict(raw)
    text = d.pop("text_config", None) or {}
    vision = d.pop("vision_config", None) or {}
    for k, v in text.items():
        if k != "model_type":
            d.setdefault(k, v)
    for k, flat in _VISION_FLAT.items():
        if k in vision and flat not in d:
            d[flat] = vision[k]
    if "dim" in d or "n_layers" in d:  # DeepSeek inference/config.json naming
        rope = {k: d.pop(k) for k in _INFERENCE_ROPE_KEYS if k in d}
        for src, dst in INFERENCE_TO_HF.items():
            if src in d:
                d.setdefault(dst, d.pop(src))
        if rope.get("original_seq_len", 0) > 0:
            d.setdefault(
                "rope_scaling",
                {
                    "type": "yarn",
                    "factor": rope.get("rope_factor", 1.0),
                    "beta_fast": rope.get("beta_fast", 32),
                    "beta_slow": rope.get("beta_slow", 1),
                    "original_max_position_embeddings": rope["original_seq_len"],
                },
            )
            d.setdefault("max_position_embeddings", int(rope["original_seq_len"] * rope.get("rope_factor", 1)))
        if d.get("expert_dtype") == "fp4":
            d.setdefault("routed_experts_quant_method", "mxfp4")
        d.setdefault("hidden_act", "silu")
    d["model_type"] = "deepseek_v41"
    return d


class DeepseekV41Config(_HFConfigBase):
    """transformers config for `model_type: deepseek_v41`.

    Accepts the released nested layout and DeepSeek's inference naming; stores the flat HF names as
    attributes. Use `ModelConfig.from_hf(cfg)` to get the typed runtime record.
    """

    model_type = "deepseek_v41"

    def __init__(self, **kwargs):
        flat = flatten_hf_dict(kwargs)
        flat.pop("model_type", None)
        flat.setdefault("architectures", ["DeepseekV41ForCausalLM"])
        flat.setdefault("tie_word_embeddings", False)
        # transformers 5 "standardises" rope_scaling into rope_parameters and drops it; V4.1's YaRN
        # block applies to compressed layers only, so keep it verbatim as our own attribute.
        rope_scaling = flat.pop("rope_scaling", None)
        super().__init__(**flat)
        self.rope_scaling = rope_scaling

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["rope_scaling"] = self.rope_scaling
        return d


# --------------------------------------------------------------------------------------------
# Typed runtime config
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeConfig:
    rope_head_dim: int
    """RoPE is applied to the last `rope_head_dim` dims of q, window KV, compressed KV, index q/k."""
    theta: float
    """Base for ratio-0 (window-only) layers; these never use YaRN."""
    compress_theta: float
    """Base for compressed (ratio 1/2) layers, with YaRN when `yarn_original_max_pos > 0`."""
    yarn_factor: float
    yarn_original_max_pos: int
    """0 disables YaRN."""
    beta_fast: float
    beta_slow: float
    max_position_embeddings: int


@dataclass(frozen=True)
class AttentionConfig:
    n_heads: int
    head_dim: int
    """Per-head and latent width D (K = V, MQA with one KV head)."""
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    window_size: int

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def heads_per_group(self) -> int:
        return self.n_heads // self.o_groups


@dataclass(frozen=True)
class CompressionConfig:
    compress_ratios: tuple[int, ...]
    """One entry per backbone layer (draft-stage entries are dropped): 0, 1 or 2."""
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int
    """-1 disables the two-level candidate scheme."""
    candidate_topk_blocks: int
    candidate_block_size: int

    @property
    def index_weight_scale(self) -> float:
        """Head-weight scale of the indexer: index_head_dim^-0.5 * index_n_heads^-0.5."""
        return self.index_head_dim**-0.5 * self.index_n_heads**-0.5


@dataclass(frozen=True)
class MoEConfig:
    n_routed_experts: int
    n_activated_experts: int
    moe_inter_dim: int
    n_shared_experts: int
    scoring_func: str
    norm_topk_prob: bool
    route_scale: float
    swiglu_limit: float
    """0 disables the SwiGLU clamp."""


@dataclass(frozen=True)
class HyperConnectionConfig:
    hc_mult: int
    sinkhorn_iters: int
    hc_eps: float

    @property
    def mix_dim(self) -> int:
        """Rows of hc_*_fn: pre (n) + post (n) + comb (n*n)."""
        return (2 + self.hc_mult) * self.hc_mult


@dataclass(frozen=True)
class EngramConfig:
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]
    max_ngram_size: int
    vocab_size: int
    """Prime search for each (n-gram size, head) starts above `vocab_size - 1`."""
    n_heads: int
    head_dim: int
    pad_token_id: int
    compressed_vocab_size: int

    @property
    def n_hash_cols(self) -> int:
        """Row ids per token per Engram layer: (max_ngram_size - 1) * n_heads."""
        return (self.max_ngram_size - 1) * self.n_heads

    @property
    def layout(self) -> EngramLayout:
        return EngramLayout.build(len(self.layer_ids), self.max_ngram_size, self.n_heads, self.vocab_size)


@dataclass(frozen=True)
class DSparkConfig:
    """The DSpark drafter shipped in the checkpoint (`mtp.<k>.*`, shared/spec/dspark.md): `n_stages`
    window-only blocks drafting `block_size` (gamma) positions per step from the mean residual stream
    captured before each of `target_layer_ids`."""

    n_stages: int
    """num_nextn_predict_layers; stage k has layer id num_hidden_layers + k."""
    block_size: int
    """gamma (dspark_block_size): positions drafted per step; a verify has gamma + 1 rows."""
    noise_token_id: int
    target_layer_ids: tuple[int, ...]
    markov_rank: int
    n_routed_experts: int
    """The stages' MoE (dspark_n_routed_experts; 0 in the config means the backbone's count)."""
    n_activated_experts: int

    @property
    def verify_rows(self) -> int:
        return self.block_size + 1


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower (spec model 6.4): a ViT over patch_size x patch_size pixel patches (2D RoPE,
    full attention), then an aligner that folds downsample_ratio x downsample_ratio patch windows into
    one LLM position. Built when vision_n_layers > 0."""

    n_layers: int
    dim: int = 1024
    n_heads: int = 16
    inter_dim: int = 2816
    patch_size: int = 14
    rope_theta: float = 10000.0
    downsample_ratio: int = 3
    max_n_token: int = 1024
    """most LLM positions one image may take (its span, markers included); larger images are shrunk."""
    min_pixels: int = 544 * 544
    """smaller images are scaled up to this many pixels first."""
    max_wh_ratio: int | None = None

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def rope_dim(self) -> int:
        """rotated pairs per head: half for the patch row, half for the column (head_dim / 2)."""
        return self.head_dim // 2

    @property
    def patch_dim(self) -> int:
        return 3 * self.patch_size ** 2

    @property
    def window_dim(self) -> int:
        """aligner input: one downsample window of ViT features, channel-major."""
        return self.dim * self.downsample_ratio ** 2


@dataclass(frozen=True)
class LayerRole:
    """What one backbone layer does in the cross-layer sharing scheme (spec attention 0.2, 5)."""

    layer_id: int
    compress_ratio: int
    rope_kind: str
    """'plain' (rope_theta, no YaRN) for ratio 0, 'yarn' (compress_rope_theta + YaRN) otherwise."""
    kv_source: int | None
    """Layer whose compressed KV + index keys this layer reads (itself for a KV source)."""
    index_source: int | None
    """Layer whose top-k selection this layer attends with (itself for an index source)."""
    candidate_source: int | None
    """For index sources after the candidate source: the layer whose candidate blocks restrict it."""
    is_candidate_source: bool
    has_engram: bool

    @property
    def is_kv_source(self) -> bool:
        return self.kv_source == self.layer_id

    @property
    def is_index_source(self) -> bool:
        return self.index_source == self.layer_id

    @property
    def uses_candidates(self) -> bool:
        return self.candidate_source is not None

    def describe(self) -> str:
        if self.compress_ratio == 0:
            what = "window only"
        else:
            parts = []
            parts.append("KV source" if self.is_kv_source else f"reads KV of {self.kv_source}")
            if self.is_index_source:
                parts.append("index source")
            else:
                parts.append(f"top-k of {self.index_source}")
            if self.is_candidate_source:
                parts.append("candidate source")
            if self.uses_candidates:
                parts.append(f"restricted to candidates of {self.candidate_source}")
            what = ", ".join(parts)
        engram = " + Engram" if self.has_engram else ""
        return f"layer {self.layer_id:>2}  ratio {self.compress_ratio}  rope {self.rope_kind:<5} {what}{engram}"


@dataclass(frozen=True)
class ModelConfig:
    """The one typed, frozen description of a DeepSeek-V4.1 checkpoint. Build with `from_hf`."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    rms_norm_eps: float
    attention: AttentionConfig
    rope: RopeConfig
    compression: CompressionConfig
    moe: MoEConfig
    hc: HyperConnectionConfig
    engram: EngramConfig | None
    num_draft_layers: int = 0
    dspark: DSparkConfig | None = None
    """None: no drafter (dspark_block_size 0 or no stages); its `mtp.*` tensors are then not read."""
    image_token_id: int = 129264
    """every position of an image span carries this id; the span's rows take the vision embeddings."""
    vision: VisionConfig | None = None
    """None: text only (vision_n_layers 0); the checkpoint's vision tensors are then not read."""
    weight_block_size: int = 32
    """FP8 dense weights carry one UE8M0 scale per weight_block_size x weight_block_size block."""
    expert_format: str = "mxfp4"
    """'mxfp4' (E2M1 x2 per byte + E8M0 per 32) or 'fp8' (converted checkpoints)."""
    eos_token_ids: tuple[int, ...] = field(default=(1,))

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_hf(cls, cfg: Any) -> "ModelConfig":
        """From a `DeepseekV41Config`, any HF config object, or a raw (nested or flat) dict."""
        raw = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        d = flatten_hf_dict(raw)
        return cls._from_flat(d)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read `config.json` from a checkpoint directory (or a path to the json itself)."""
        p = os.fspath(path)
        if os.path.isdir(p):
            p = os.path.join(p, "config.json")
        with open(p) as f:
            return cls.from_hf(json.load(f))

    @classmethod
    def _from_flat(cls, d: dict[str, Any]) -> "ModelConfig":
        def req(name: str) -> Any:
            if name not in d or d[name] is None:
                raise ConfigError(name, "required but missing")
            return d[name]

        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError("hidden_act", f"must be 'silu', found {act!r}")
        qc = d.get("quantization_config") or {}
        block = 32
        if qc:
            if qc.get("quant_method", "fp8") != "fp8":
                raise ConfigError("quantization_config.quant_method", f"must be 'fp8', found {qc.get('quant_method')!r}")
            wbs = list(qc.get("weight_block_size", [32, 32]))
            if len(wbs) != 2 or wbs[0] != wbs[1]:
                raise ConfigError("quantization_config.weight_block_size", f"must be square, found {wbs}")
            block = int(wbs[0])
            if qc.get("scale_fmt", "ue8m0") != "ue8m0":
                raise ConfigError("quantization_config.scale_fmt", f"must be 'ue8m0', found {qc.get('scale_fmt')!r}")

        num_layers = int(req("num_hidden_layers"))
        ratios = tuple(int(r) for r in req("compress_ratios"))
        if len(ratios) < num_layers:
            raise ConfigError("compress_ratios", f"has {len(ratios)} entries, fewer than num_hidden_layers={num_layers}")
        rs = d.get("rope_scaling") or {}
        if rs and rs.get("type", rs.get("rope_type", "yarn")) != "yarn":
            raise ConfigError("rope_scaling.type", f"only 'yarn' is supported, found {rs.get('type')!r}")
        head_dim = int(req("head_dim"))
        rope = RopeConfig(
            rope_head_dim=int(req("qk_rope_head_dim")),
            theta=float(d.get("rope_theta", 10000.0)),
            compress_theta=float(d.get("compress_rope_theta", 160000.0)),
            yarn_factor=float(rs.get("factor", 1.0)),
            yarn_original_max_pos=int(rs.get("original_max_position_embeddings", 0)),
            beta_fast=float(rs.get("beta_fast", 32)),
            beta_slow=float(rs.get("beta_slow", 1)),
            max_position_embeddings=int(d.get("max_position_embeddings", 65536)),
        )
        attention = AttentionConfig(
            n_heads=int(req("num_attention_heads")),
            head_dim=head_dim,
            q_lora_rank=int(req("q_lora_rank")),
            o_lora_rank=int(req("o_lora_rank")),
            o_groups=int(req("o_groups")),
            window_size=int(d.get("sliding_window") or d.get("window_size") or 128),
        )
        compression = CompressionConfig(
            compress_ratios=ratios[:num_layers],
            kv_source_layer_ids=tuple(int(x) for x in d.get("kv_source_layer_ids", ())),
            index_source_layer_ids=tuple(int(x) for x in d.get("index_source_layer_ids", ())),
            index_n_heads=int(d.get("index_n_heads", 0)),
            index_head_dim=int(d.get("index_head_dim", 0)),
            index_topk=int(d.get("index_topk", 0)),
            candidate_source_layer_id=int(d.get("candidate_source_layer_id", -1)),
            candidate_topk_blocks=int(d.get("candidate_topk_blocks", 0)),
            candidate_block_size=int(d.get("candidate_block_size", 0)),
        )
        moe = MoEConfig(
            n_routed_experts=int(req("n_routed_experts")),
            n_activated_experts=int(req("num_experts_per_tok")),
            moe_inter_dim=int(req("moe_intermediate_size")),
            n_shared_experts=int(d.get("n_shared_experts", 1)),
            scoring_func=str(d.get("scoring_func", "sqrtsoftplus")),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            route_scale=float(d.get("routed_scaling_factor", 1.0)),
            swiglu_limit=float(d.get("swiglu_limit") or 0.0),
        )
        hc = HyperConnectionConfig(
            hc_mult=int(d.get("hc_mult", 4)),
            sinkhorn_iters=int(d.get("hc_sinkhorn_iters", 20)),
            hc_eps=float(d.get("hc_eps", 1e-6)),
        )
        engram = None
        if d.get("engram_layer_ids"):
            engram = EngramConfig(
                layer_ids=tuple(int(x) for x in d["engram_layer_ids"]),
                num_embeddings=tuple(int(x) for x in d.get("engram_num_embeddings", ())),
                max_ngram_size=int(d.get("engram_max_ngram_size", 1)),
                vocab_size=int(d.get("engram_vocab_size", 0)),
                n_heads=int(d.get("engram_n_heads", 0)),
                head_dim=int(d.get("engram_head_dim", 0)),
                pad_token_id=int(d.get("engram_pad_token_id", 2)),
                compressed_vocab_size=int(d.get("engram_compressed_vocab_size", 0)),
            )
        n_stages = int(d.get("num_nextn_predict_layers", 0) or 0)
        dspark = None
        if int(d.get("dspark_block_size", 0) or 0) > 0 and n_stages > 0:
            dspark = DSparkConfig(
                n_stages=n_stages,
                block_size=int(d["dspark_block_size"]),
                noise_token_id=int(d.get("dspark_noise_token_id", 0)),
                target_layer_ids=tuple(int(x) for x in d.get("dspark_target_layer_ids", ())),
                markov_rank=int(d.get("dspark_markov_rank", 256)),
                n_routed_experts=int(d.get("dspark_n_routed_experts", 0) or 0) or moe.n_routed_experts,
                n_activated_experts=int(d.get("dspark_num_experts_per_tok", 0) or 0) or moe.n_activated_experts,
            )
            extra = ratios[num_layers:num_layers + n_stages]
            if any(extra):
                raise ConfigError("compress_ratios", f"DSpark stages are window-only (ratio 0), found {list(extra)}")
        eos = d.get("eos_token_id", 1)
        eos_ids = tuple(int(x) for x in (eos if isinstance(eos, (list, tuple)) else [eos]))
        fmt = str(d.get("routed_experts_quant_method", "mxfp4")).lower()
        cfg = cls(
            vocab_size=int(req("vocab_size")),
            hidden_size=int(req("hidden_size")),
            num_layers=num_layers,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            attention=attention,
            rope=rope,
            compression=compression,
            moe=moe,
            hc=hc,
            engram=engram,
            num_draft_layers=n_stages,
            dspark=dspark,
            image_token_id=int(d.get("image_token_id", 129264)),
            vision=_vision_config(d),
            weight_block_size=block,
            expert_format="fp8" if fmt in ("fp8", "f8_e4m3") else "mxfp4",
            eos_token_ids=eos_ids,
        )
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of the record (for logs and tests)."""

        def conv(v: Any) -> Any:
            if hasattr(v, "__dataclass_fields__"):
                return {f.name: conv(getattr(v, f.name)) for f in fields(v)}
            return v

        return conv(self)

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise ConfigError (naming the field) on any inconsistency. Called by from_hf."""
        a, c, m, r = self.attention, self.compression, self.moe, self.rope
        blk = self.weight_block_size

        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ConfigError(name, msg)

        need(self.hidden_size % blk == 0, "hidden_size", f"{self.hidden_size} is not a multiple of the {blk}-wide FP8 block")
        need(a.head_dim % 32 == 0, "head_dim", f"{a.head_dim} must be a multiple of 32 (FP8/FP4 scale groups)")
        need(0 < r.rope_head_dim <= a.head_dim and r.rope_head_dim % 2 == 0, "qk_rope_head_dim",
             f"{r.rope_head_dim} must be even and at most head_dim={a.head_dim}")
        need(a.n_heads % a.o_groups == 0, "o_groups", f"num_attention_heads={a.n_heads} is not divisible by o_groups={a.o_groups}")
        need(a.window_size > 0, "sliding_window", "must be positive")
        need(m.moe_inter_dim % 32 == 0, "moe_intermediate_size", f"{m.moe_inter_dim} must be a multiple of 32")
        need(m.scoring_func == "sqrtsoftplus", "scoring_func", f"V4.1 routes with 'sqrtsoftplus', found {m.scoring_func!r}")
        need(0 < m.n_activated_experts <= m.n_routed_experts, "num_experts_per_tok",
             f"{m.n_activated_experts} must be in 1..n_routed_experts={m.n_routed_experts}")
        need(m.n_shared_experts == 1, "n_shared_experts", f"V4.1 has exactly one shared expert, found {m.n_shared_experts}")
        need(self.hc.hc_mult >= 1 and self.hc.sinkhorn_iters >= 1, "hc_mult", "hc_mult and hc_sinkhorn_iters must be >= 1")

        L = self.num_layers
        for i, ratio in enumerate(c.compress_ratios):
            need(ratio in (0, 1, 2), "compress_ratios",
                 f"layer {i} has ratio {ratio}; V4.1 layers use 0, 1 or 2 (4/128 are V4 ratios)")
        for name, ids in (("kv_source_layer_ids", c.kv_source_layer_ids), ("index_source_layer_ids", c.index_source_layer_ids)):
            need(list(ids) == sorted(set(ids)), name, f"{list(ids)} must be strictly increasing")
            for l in ids:
                need(0 <= l < L, name, f"layer {l} is outside 0..{L - 1}")
                need(c.compress_ratios[l] != 0, name, f"layer {l} has compress ratio 0 and cannot be a source")
        for l, ratio in enumerate(c.compress_ratios):
            if ratio == 0:
                continue
            need(_nearest_same_ratio(c.kv_source_layer_ids, l, c.compress_ratios) is not None, "kv_source_layer_ids",
                 f"compressed layer {l} (ratio {ratio}) has no earlier KV source of the same ratio")
            need(_nearest_same_ratio(c.index_source_layer_ids, l, c.compress_ratios) is not None, "index_source_layer_ids",
                 f"compressed layer {l} (ratio {ratio}) has no earlier index source of the same ratio")
        for l in c.index_source_layer_ids:
            need(_nearest_same_ratio(c.kv_source_layer_ids, l, c.compress_ratios) is not None, "index_source_layer_ids",
                 f"index source {l} has no KV source (of its ratio) at or before it to read index keys from")
        if any(c.compress_ratios):
            need(c.index_n_heads > 0 and c.index_head_dim % 32 == 0 and c.index_head_dim >= r.rope_head_dim,
                 "index_head_dim", f"{c.index_head_dim} must be a positive multiple of 32 and >= qk_rope_head_dim")
            need(c.index_topk > 0, "index_topk", "must be positive when any layer compresses")
            max_compressed = r.max_position_embeddings // max(1, min(x for x in c.compress_ratios if x))
            need(c.index_topk <= max_compressed, "index_topk",
                 f"{c.index_topk} exceeds the {max_compressed} compressed positions the pools can hold")
        cs = c.candidate_source_layer_id
        if cs >= 0:
            need(cs in c.index_source_layer_ids, "candidate_source_layer_id", f"layer {cs} is not an index source")
            need(c.candidate_topk_blocks > 0 and c.candidate_block_size > 0, "candidate_topk_blocks",
                 "candidate_topk_blocks and candidate_block_size must be positive with a candidate source")
            need(c.candidate_topk_blocks * c.candidate_block_size >= c.index_topk, "index_topk",
                 f"{c.index_topk} is larger than the candidate pool can hold "
                 f"({c.candidate_topk_blocks} blocks x {c.candidate_block_size} positions)")
        elif cs != -1:
            raise ConfigError("candidate_source_layer_id", f"must be -1 or a layer id, found {cs}")

        v = self.vision
        if v is not None:
            need(v.n_heads > 0 and v.dim % v.n_heads == 0 and v.head_dim % 4 == 0, "vision_config.num_attention_heads",
                 f"hidden_size {v.dim} must split into heads of a multiple of 4 channels (2D RoPE halves)")
            need(min(v.inter_dim, v.patch_size, v.downsample_ratio, v.min_pixels) > 0, "vision_config",
                 "intermediate_size, patch_size, downsample_ratio and min_pixels must be positive")
            need(v.max_n_token >= 4, "vision_config.max_image_tokens", f"{v.max_n_token}: an image takes at least 4 positions")
            need(0 <= self.image_token_id < self.vocab_size, "image_token_id", f"{self.image_token_id} is outside the vocabulary")
        e = self.engram
        if e is not None:
            for l in e.layer_ids:
                need(0 <= l < L, "engram_layer_ids", f"layer {l} is outside 0..{L - 1}")
            need(e.max_ngram_size >= 2 and e.n_heads > 0, "engram_max_ngram_size", "Engram needs n-grams of size >= 2 and >= 1 head")
            need(e.head_dim % 32 == 0 and e.head_dim > 0, "engram_head_dim", f"{e.head_dim} must be a positive multiple of 32")
            need(e.compressed_vocab_size > 0, "engram_compressed_vocab_size", "must be positive with Engram layers")
            need(len(e.num_embeddings) == len(e.layer_ids), "engram_num_embeddings",
                 f"{len(e.num_embeddings)} entries for {len(e.layer_ids)} Engram layers")
            expected = e.layout.num_embeddings
            need(tuple(e.num_embeddings) == expected, "engram_num_embeddings",
                 f"{list(e.num_embeddings)} does not match the prime layout rule, which gives {list(expected)} "
                 f"for engram_vocab_size={e.vocab_size}, engram_n_heads={e.n_heads}, engram_max_ngram_size={e.max_ngram_size}")

        ds = self.dspark
        if ds is not None:
            need(len(ds.target_layer_ids) > 0 and list(ds.target_layer_ids) == sorted(set(ds.target_layer_ids))
                 and all(0 <= l < L for l in ds.target_layer_ids), "dspark_target_layer_ids",
                 f"{list(ds.target_layer_ids)} must be a non-empty increasing list of layers in 0..{L - 1}")
            need(0 <= ds.noise_token_id < self.vocab_size, "dspark_noise_token_id",
                 f"{ds.noise_token_id} is outside the vocabulary 0..{self.vocab_size - 1}")
            need(ds.markov_rank > 0, "dspark_markov_rank", "must be positive")
            need(0 < ds.n_activated_experts <= ds.n_routed_experts, "dspark_num_experts_per_tok",
                 f"{ds.n_activated_experts} must be in 1..dspark_n_routed_experts={ds.n_routed_experts}")

    def text_only(self) -> "ModelConfig":
        """This config without its vision tower (the checkpoint's vision tensors are then not read)."""
        return replace(self, vision=None)

    # ---------------------------------------------------------------- derived values
    @cached_property
    def draft_config(self) -> "ModelConfig":
        """The config a DSpark stage is built from: this one with the stages' expert counts, no vision."""
        ds = self.dspark
        if ds is None:
            raise ConfigError("dspark_block_size", "the checkpoint has no DSpark drafter")
        moe = replace(self.moe, n_routed_experts=ds.n_routed_experts, n_activated_experts=ds.n_activated_experts)
        return replace(self, moe=moe, vision=None)  # the stages route every token with the plain bias

    @property
    def draft_roles(self) -> tuple[LayerRole, ...]:
        """One window-only role per DSpark stage (layer ids num_layers + k, plain RoPE, no Engram)."""
        n = self.dspark.n_stages if self.dspark is not None else 0
        return tuple(LayerRole(self.num_layers + k, 0, "plain", None, None, None, False, False) for k in range(n))

    @property
    def nope_head_dim(self) -> int:
        return self.attention.head_dim - self.rope.rope_head_dim

    @cached_property
    def layer_roles(self) -> tuple[LayerRole, ...]:
        c = self.compression
        ratios = c.compress_ratios
        engram_ids = set(self.engram.layer_ids) if self.engram else set()
        roles = []
        for l in range(self.num_layers):
            r = ratios[l]
            kv_src = idx_src = cand = None
            if r:
                kv_src = _nearest_same_ratio(c.kv_source_layer_ids, l, ratios)
                idx_src = _nearest_same_ratio(c.index_source_layer_ids, l, ratios)
                cs = c.candidate_source_layer_id
                if idx_src == l and 0 <= cs < l:
                    cand = cs
            roles.append(
                LayerRole(
                    layer_id=l,
                    compress_ratio=r,
                    rope_kind="yarn" if (r and self.rope.yarn_original_max_pos > 0) else "plain",
                    kv_source=kv_src,
                    index_source=idx_src,
                    candidate_source=cand,
                    is_candidate_source=(l == c.candidate_source_layer_id),
                    has_engram=l in engram_ids,
                )
            )
        return tuple(roles)

    @property
    def kv_source_layers(self) -> tuple[int, ...]:
        return self.compression.kv_source_layer_ids

    @property
    def late_layer_start(self) -> int:
        """First layer of the decoder tail (decoder SWA bounded replay): the last KV source."""
        return max(self.compression.kv_source_layer_ids) if self.compression.kv_source_layer_ids else self.num_layers

    def check_decoder_tail_replay(self) -> None:
        """Preconditions of decoder SWA bounded replay (spec attention 5/7.2); raises ConfigError."""
        c = self.compression
        if not c.kv_source_layer_ids:
            raise ConfigError("kv_source_layer_ids", "decoder tail replay needs at least one KV source")
        s = self.late_layer_start
        if s not in c.index_source_layer_ids:
            raise ConfigError("index_source_layer_ids", f"decoder tail replay needs the last KV source {s} to be an index source")
        if c.candidate_source_layer_id not in (-1, s):
            raise ConfigError("candidate_source_layer_id", f"decoder tail replay needs the candidate source to be -1 or {s}")
        if any(r not in (0, 1) for r in c.compress_ratios[s + 1:]):
            raise ConfigError("compress_ratios", f"decoder tail replay needs layers after {s} to have ratio 0 or 1")
        if self.engram and s in self.engram.layer_ids:
            raise ConfigError("engram_layer_ids", f"decoder tail replay needs the last KV source {s} to carry no Engram")

    @property
    def window_kv_bytes_per_token(self) -> int:
        """FP8 window KV: head_dim e4m3 bytes + one UE8M0 byte per 32 (V41 layout, 528 B at D=512)."""
        return self.attention.head_dim + self.attention.head_dim // 32

    @property
    def compressed_kv_bytes_per_entry(self) -> int:
        """FP4 compressed KV: head_dim/2 packed e2m1 bytes + one e4m3 scale per 16 (288 B at D=512)."""
        return self.attention.head_dim // 2 + self.attention.head_dim // 16

    @property
    def index_key_bytes_per_entry(self) -> int:
        """FP4 index key: index_head_dim/2 packed bytes + one UE8M0 byte per 32 (68 B at 128)."""
        d = self.compression.index_head_dim
        return d // 2 + d // 32

    @property
    def compressed_bytes_per_token(self) -> float:
        """Global (prefix-cacheable) KV per context token: sum over KV sources of
        (compressed entry + index key) / ratio. 890 B for V4.1-Flash."""
        per = self.compressed_kv_bytes_per_entry + self.index_key_bytes_per_entry
        return sum(per / self.compression.compress_ratios[l] for l in self.compression.kv_source_layer_ids)


def _vision_config(d: dict) -> VisionConfig | None:
    """The flat vision_* keys (vision_config copied there by `_flatten`) -> VisionConfig, None without layers."""
    n = int(d.get("vision_n_layers", 0) or 0)
    if n <= 0:
        return None
    defaults = VisionConfig(n)
    get = lambda key, cast, default: default if d.get(key) is None else cast(d[key])  # noqa: E731
    return VisionConfig(
        n_layers=n,
        dim=get("vision_dim", int, defaults.dim),
        n_heads=get("vision_n_heads", int, defaults.n_heads),
        inter_dim=get("vision_inter_dim", int, defaults.inter_dim),
        patch_size=get("vision_patch_size", int, defaults.patch_size),
        rope_theta=get("vision_rope_theta", float, defaults.rope_theta),
        downsample_ratio=get("vision_downsample_ratio", int, defaults.downsample_ratio),
        max_n_token=get("vision_max_n_token", int, defaults.max_n_token),
        min_pixels=get("vision_min_pixels", int, defaults.min_pixels),
        max_wh_ratio=get("vision_max_wh_ratio", int, None),
    )


def _nearest_same_ratio(sources: tuple[int, ...], layer: int, ratios: tuple[int, ...]) -> int | None:
    best = None
    for s in sources:
        if s <= layer and ratios[s] == ratios[layer]:
            best = s
    return best
