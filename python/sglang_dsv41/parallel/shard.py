"""Sharding as a transformation of a built model: `shard(model, plan, comm)`.

The model is built as for one process (`DeepseekV41(cfg)`, on the meta device or with its weights);
`shard` swaps the modules that split for their parallel versions (parallel/tp.py, parallel/ep.py),
narrows the attention's head / group counts, and, if the model holds weights, keeps only this
rank's slice of each. The layers' code is unchanged: the attention reads its head and group counts
from `n_heads` / `o_groups` and the shapes of its tensors; the KV (window, compressed, index keys) is
MQA-shaped and replicated, so the paged pools and the reference KV work as they are.

`tensor_shards(cfg, plan)` says, for every checkpoint tensor, which part this rank holds (rows or
columns [lo, hi), the whole tensor, or nothing) and under which name; the loader reads exactly that
part from the safetensors file (`parallel/load.py`). Apply `shard` before the kernels numerics policy (`numerics.apply_numerics`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang_dsv41.config import ModelConfig
from sglang_dsv41.engram_host.table import shard_range
from sglang_dsv41.layers.engram import EngramTable
from sglang_dsv41.layers.linear import FP8Linear
from sglang_dsv41.layers.transformer import DeepseekV41
from sglang_dsv41.parallel.collectives import Collectives
from sglang_dsv41.parallel.ep import ParallelMoE
from sglang_dsv41.parallel.mesh import ParallelPlan
from sglang_dsv41.parallel.tp import GatherFP8Linear, ShardedEngramTable, VocabParallelEmbedding, VocabParallelHead


@dataclass(frozen=True)
class TensorShard:
    """This rank's part of one checkpoint tensor."""

    name: str
    """The model's name for it on this rank (experts are renumbered from 0 on each rank)."""
    dim: int | None = None
    """None: the whole tensor; 0: rows [lo, hi); 1: columns [lo, hi) (unused by the V4.1 plans: every
    split is by rows, so each rank's part of a tensor is one contiguous byte range)."""
    lo: int = 0
    hi: int = 0

    @property
    def index(self) -> tuple[slice, ...] | None:
        """The safetensors `get_slice` index, or None for the whole tensor."""
        if self.dim is None:
            return None
        return (slice(self.lo, self.hi),) if self.dim == 0 else (slice(None), slice(self.lo, self.hi))

    def take(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.dim is None else t.narrow(self.dim, self.lo, self.hi - self.lo)


def tensor_shards(cfg: ModelConfig, plan: ParallelPlan) -> dict[str, TensorShard | None]:
    """checkpoint name -> this rank's TensorShard, or None when the rank holds none of it
    (another rank's routed experts). Names absent from the result are replicated whole."""
    out: dict[str, TensorShard | None] = {}
    blk = cfg.weight_block_size

    def rows(name: str, lo: int, hi: int, scale: bool = False) -> None:
        out[f"{name}.weight"] = TensorShard(f"{name}.weight", 0, lo, hi)
        if scale:
            out[f"{name}.scale"] = TensorShard(f"{name}.scale", 0, lo // blk, -(-hi // blk))

    a, m = cfg.attention, cfg.moe
    if plan.tp > 1:
        vlo, vhi = plan.vocab(cfg)
        rows("embed", vlo, vhi)
        rows("head", vlo, vhi)
    for role in cfg.layer_roles:
        p = f"layers.{role.layer_id}"
        if plan.tp > 1:
            hlo, hhi = plan.heads(cfg)
            glo, ghi = plan.groups(cfg)
            rows(f"{p}.attn.wq_b", hlo * a.head_dim, hhi * a.head_dim, scale=True)
            out[f"{p}.attn.attn_sink"] = TensorShard(f"{p}.attn.attn_sink", 0, hlo, hhi)
            rows(f"{p}.attn.wo_a", glo * a.o_lora_rank, ghi * a.o_lora_rank, scale=True)
            clo, chi = plan.hidden(cfg)
            rows(f"{p}.attn.wo_b", clo, chi, scale=True)
            ilo, ihi = plan.shared_inter(cfg)
            rows(f"{p}.ffn.shared_experts.w1", ilo, ihi, scale=True)
            rows(f"{p}.ffn.shared_experts.w3", ilo, ihi, scale=True)
            rows(f"{p}.ffn.shared_experts.w2", clo, chi, scale=True)
            if role.has_engram:
                e = cfg.engram
                lo, hi = shard_range(e, e.layer_ids.index(role.layer_id), plan.tp_rank, plan.tp)
                out[f"{p}.engram.embed.weight"] = TensorShard(f"{p}.engram.embed.weight", 0, lo, hi)
                out[f"{p}.engram.embed.scale"] = TensorShard(f"{p}.engram.embed.scale", 0, lo, hi)
        if plan.ep > 1:
            elo, ehi = plan.experts(cfg)
            for j in range(m.n_routed_experts):
                for w in ("w1", "w2", "w3"):
                    for t in ("weight", "scale"):
                        name = f"{p}.ffn.experts.{j}.{w}.{t}"
                        out[name] = TensorShard(f"{p}.ffn.experts.{j - elo}.{w}.{t}") if elo <= j < ehi else None
    return out


def take_shards(tensors: dict[str, torch.Tensor], shards: dict[str, TensorShard | None]) -> dict[str, torch.Tensor]:
    """Whole checkpoint tensors (any subset, e.g. an engine's weight stream or a weight update) ->
    this rank's parts under this rank's names (views; another rank's experts are dropped)."""
    out = {}
    for name, t in tensors.items():
        s = shards.get(name, TensorShard(name))
        if s is not None:
            out[s.name] = s.take(t)
    return out


def _restructure(model: DeepseekV41, plan: ParallelPlan, comm: Collectives) -> None:
    """Swap modules for this rank's shapes (new parameters on the meta device)."""
    cfg = model.cfg
    a, H, blk = cfg.attention, cfg.hidden_size, cfg.weight_block_size
    with torch.device("meta"):
        if plan.tp > 1:
            vlo, vhi = plan.vocab(cfg)
            width = -(-cfg.vocab_size // plan.tp)
            model.embed = VocabParallelEmbedding(vlo, vhi, H, comm)
            model.head = VocabParallelHead(vlo, vhi, width, cfg.vocab_size, H, comm)
        for layer in model.layers:
            attn = layer.attn
            if plan.tp > 1:
                heads, groups = a.n_heads // plan.tp, a.o_groups // plan.tp
                attn.n_heads, attn.o_groups = heads, groups
                attn.wq_b = FP8Linear(a.q_lora_rank, heads * a.head_dim, blk)
                attn.wo_a = FP8Linear(a.n_heads * a.head_dim // a.o_groups, groups * a.o_lora_rank, blk)
                attn.wo_b = GatherFP8Linear(a.o_groups * a.o_lora_rank, H // plan.tp, blk, comm)
                attn.attn_sink = nn.Parameter(torch.zeros(heads, dtype=torch.float32), requires_grad=False)
                if layer.engram is not None and type(layer.engram.embed) is EngramTable:
                    e = cfg.engram
                    lo, hi = shard_range(e, e.layer_ids.index(layer.role.layer_id), plan.tp_rank, plan.tp)
                    layer.engram.embed = ShardedEngramTable(lo, hi, e.head_dim, comm)
            if plan.tp > 1 or plan.ep > 1:
                layer.ffn = ParallelMoE(cfg, plan, comm)


def shard(model: DeepseekV41, plan: ParallelPlan, comm: Collectives) -> DeepseekV41:
    """Transform `model` in place into this rank's part of `plan` (checked against the config);
    a model with weights keeps only this rank's slices (the same values, no copy of a whole tensor
    survives). Returns the model. Engram tables already placed in host memory (engram_host) are
    left alone: their `per_rank` layout is sharded by their own group."""
    plan.check(model.cfg)
    if plan.is_single:
        return model
    full = model.state_dict()
    meta = any(t.is_meta for t in full.values())
    specs = tensor_shards(model.cfg, plan)
    _restructure(model, plan, comm)
    if meta:
        return model
    local = {}  # parts of split tensors are copies (the whole tensors go with `full`); replicated ones are kept
    for name, t in full.items():
        s = specs.get(name, TensorShard(name))
        if s is not None:
            local[s.name] = t if s.dim is None else s.take(t).clone()
    model.load_state_dict(local, strict=True, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return model
