"""The released checkpoint's tensor names, shapes and dtypes, derived from a ModelConfig.

Names are DeepSeek-native (spec model 7.1, attention 10); the in-memory model uses the same names,
so `model.state_dict()` keys equal checkpoint keys. Dtypes are safetensors dtype strings:

| class                                   | dtype                      | scale                               |
|-----------------------------------------|----------------------------|-------------------------------------|
| dense linears (attn wq_a/wq_b/wkv/wo_a/ | F8_E4M3 [N, K]             | `<name>.scale` F8_E8M0              |
|   wo_b, shared expert, indexer wq_b,    |                            |   [ceil(N/32), ceil(K/32)]          |
|   Engram wkv)                           |                            |                                     |
| routed experts w1/w2/w3                 | I8 [N, K/2] (E2M1 x2, low  | `<name>.scale` F8_E8M0 [N, K/32]    |
|                                         |   nibble = even element)   |                                     |
| Engram table                            | F8_E4M3 [rows, head_dim]   | `embed.scale` F8_E8M0 [rows, hd/32] |
| mHC params, router bias, attention sink | F32                        |                                     |
| embedding, head, norms, compressor,     | BF16                       |                                     |
|   indexer wk/weights_proj, router, Engram q/k |                      |                                     |
| vision (with a vision tower): ViT / aligner linears (weight and bias), the span markers `image_*` |
|                                         | BF16                       |                                     |
| vision RMSNorm weights, VL router bias `gate.bias_vl` | F32          |                                     |
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv41.config import ModelConfig

# Tensors of the released checkpoint a config may not use (the vision tower and VL routing bias of a
# text-only config; DSpark stages when the config has no drafter). Skipped on load, never an
# "unexpected tensor" error. A name the schema lists is never ignored.
IGNORED_PREFIXES = ("mtp.", "vision.", "aligner.", "image_start", "image_end", "image_newline")
IGNORED_SUFFIXES = (".gate.bias_vl",)


def is_ignored(name: str) -> bool:
    return name.startswith(IGNORED_PREFIXES) or name.endswith(IGNORED_SUFFIXES)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    """safetensors dtype string: BF16, F32, F8_E4M3, F8_E8M0, I8."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def checkpoint_schema(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor a checkpoint for `cfg` must hold, in a deterministic order."""
    out: dict[str, TensorSpec] = {}
    blk = cfg.weight_block_size

    def add(name: str, shape: tuple[int, ...], dtype: str) -> None:
        out[name] = TensorSpec(name, tuple(int(s) for s in shape), dtype)

    def fp8(name: str, n: int, k: int) -> None:
        add(f"{name}.weight", (n, k), "F8_E4M3")
        add(f"{name}.scale", (_ceil(n, blk), _ceil(k, blk)), "F8_E8M0")

    def fp4(name: str, n: int, k: int) -> None:
        add(f"{name}.weight", (n, k // 2), "I8")
        add(f"{name}.scale", (n, k // 32), "F8_E8M0")

    H, a, c, m, hc = cfg.hidden_size, cfg.attention, cfg.compression, cfg.moe, cfg.hc
    D = a.head_dim
    add("embed.weight", (cfg.vocab_size, H), "BF16")

    def block(p: str, role, m, vl: bool = False) -> None:  # one decoder block's tensors under prefix p
        add(f"{p}.attn_norm.weight", (H,), "BF16")
        add(f"{p}.ffn_norm.weight", (H,), "BF16")
        for site in ("attn", "ffn"):
            add(f"{p}.hc_{site}_fn", (hc.mix_dim, hc.hc_mult * H), "F32")
            add(f"{p}.hc_{site}_base", (hc.mix_dim,), "F32")
            add(f"{p}.hc_{site}_scale", (3,), "F32")
        # attention
        fp8(f"{p}.attn.wq_a", a.q_lora_rank, H)
        add(f"{p}.attn.q_norm.weight", (a.q_lora_rank,), "BF16")
        fp8(f"{p}.attn.wq_b", a.n_heads * D, a.q_lora_rank)
        fp8(f"{p}.attn.wkv", D, H)
        add(f"{p}.attn.kv_norm.weight", (D,), "BF16")
        fp8(f"{p}.attn.wo_a", a.o_groups * a.o_lora_rank, a.n_heads * D // a.o_groups)
        fp8(f"{p}.attn.wo_b", H, a.o_groups * a.o_lora_rank)
        add(f"{p}.attn.attn_sink", (a.n_heads,), "F32")
        if role.is_kv_source:
            add(f"{p}.attn.compressor.wkv.weight", (D, H), "BF16")
            if role.compress_ratio > 1:
                add(f"{p}.attn.compressor.wgate.weight", (D, H), "BF16")
            add(f"{p}.attn.compressor.norm.weight", (D,), "BF16")
        if role.is_index_source:
            fp8(f"{p}.attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, a.q_lora_rank)
            add(f"{p}.attn.indexer.weights_proj.weight", (c.index_n_heads, H), "BF16")
            if role.is_kv_source:
                add(f"{p}.attn.indexer.wk.weight", (c.index_head_dim, D), "BF16")
                add(f"{p}.attn.indexer.k_norm.weight", (c.index_head_dim,), "BF16")
        # MoE
        add(f"{p}.ffn.gate.weight", (m.n_routed_experts, H), "BF16")
        add(f"{p}.ffn.gate.bias", (m.n_routed_experts,), "F32")
        if vl:
            add(f"{p}.ffn.gate.bias_vl", (m.n_routed_experts,), "F32")
        for j in range(m.n_routed_experts):
            fp4(f"{p}.ffn.experts.{j}.w1", m.moe_inter_dim, H)
            fp4(f"{p}.ffn.experts.{j}.w2", H, m.moe_inter_dim)
            fp4(f"{p}.ffn.experts.{j}.w3", m.moe_inter_dim, H)
        fp8(f"{p}.ffn.shared_experts.w1", m.moe_inter_dim, H)
        fp8(f"{p}.ffn.shared_experts.w2", H, m.moe_inter_dim)
        fp8(f"{p}.ffn.shared_experts.w3", m.moe_inter_dim, H)
        # Engram
        if role.has_engram:
            e = cfg.engram
            idx = e.layer_ids.index(role.layer_id)
            rows = e.num_embeddings[idx]
            add(f"{p}.engram.embed.weight", (rows, e.head_dim), "F8_E4M3")
            add(f"{p}.engram.embed.scale", (rows, e.head_dim // 32), "F8_E8M0")
            fp8(f"{p}.engram.wkv", (hc.hc_mult + 1) * H, e.n_hash_cols * e.head_dim)
            add(f"{p}.engram.q_weight", (hc.hc_mult, H), "BF16")
            add(f"{p}.engram.k_weight", (hc.hc_mult, H), "BF16")

    for role in cfg.layer_roles:
        block(f"layers.{role.layer_id}", role, m, vl=cfg.vision is not None)
    add("norm.weight", (H,), "BF16")
    add("head.weight", (cfg.vocab_size, H), "BF16")
    ds = cfg.dspark
    if ds is not None:  # DSpark stages: backbone blocks (window-only, the stages' experts) + their heads
        dm = cfg.draft_config.moe
        for k, role in enumerate(cfg.draft_roles):
            p = f"mtp.{k}"
            block(p, role, dm)
            if k == 0:
                fp8(f"{p}.main_proj", H, H * len(ds.target_layer_ids))
                add(f"{p}.main_norm.weight", (H,), "BF16")
            if k == ds.n_stages - 1:
                add(f"{p}.norm.weight", (H,), "BF16")
                add(f"{p}.markov_head.embed.weight", (cfg.vocab_size, ds.markov_rank), "BF16")
                add(f"{p}.markov_head.head.weight", (cfg.vocab_size, ds.markov_rank), "BF16")
                add(f"{p}.confidence_head.proj.weight", (1, H + ds.markov_rank), "BF16")
    if cfg.vision is not None:
        vision(cfg, add)
    return out


def vision(cfg: ModelConfig, add) -> None:
    """The ViT (`vision.*`), the aligner and the three span markers."""
    v, H = cfg.vision, cfg.hidden_size

    def linear(name: str, n: int, k: int, bias: bool = True) -> None:
        add(f"{name}.weight", (n, k), "BF16")
        if bias:
            add(f"{name}.bias", (n,), "BF16")

    linear("vision.patch_embed.proj", v.dim, v.patch_dim)
    for i in range(v.n_layers):
        p = f"vision.blocks.{i}"
        add(f"{p}.norm1.weight", (v.dim,), "F32")
        linear(f"{p}.attn.wqkv", 3 * v.dim, v.dim)
        linear(f"{p}.attn.wo", v.dim, v.dim)
        add(f"{p}.norm2.weight", (v.dim,), "F32")
        linear(f"{p}.mlp.w1", 2 * v.inter_dim, v.dim, bias=False)
        linear(f"{p}.mlp.w2", v.dim, v.inter_dim, bias=False)
    add("vision.norm.weight", (v.dim,), "F32")
    linear("aligner.w1", H, v.window_dim)
    linear("aligner.w2", H, H)
    for marker in ("image_start", "image_end", "image_newline"):
        add(marker, (H,), "BF16")
