"""Which rank holds which part of the model: the parallel plan of one process group.

All collectives run on ONE process group of `world` ranks (SGLang's TP group, or torchrun's world).
Two degrees, each 1 (replicated) or `world` (split over every rank):

    tp   attention heads + wo_a groups (wo_b by output rows), the shared expert's intermediate dim,
         the embedding and lm head vocabulary, Engram table rows (spec model 5.5 `shard_range`)
    ep   routed experts: rank r holds experts [r*E/ep, (r+1)*E/ep), whole (never split inside)

`--tp N --ep N` is SGLang's usual V4.1 launch (TP attention + EP MoE); `--tp N` alone keeps every
routed expert on every rank; `--tp 1 --ep N` (attention replicated) exists for tests. Replicated on
every rank in every plan: wq_a, wkv, norms, the compressor, the indexer (spec attention 1.6: top-k
then needs no cross-rank reduction), mHC parameters and streams, the router, Engram wkv / q / k.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_dsv41.config import ModelConfig


class ParallelError(ValueError):
    """A parallel plan that cannot run this model; the message names the flag."""


DRIVER_FLAGS = {"tp": "--tp", "ep": "--ep"}
SGLANG_FLAGS = {"tp": "--tp-size", "ep": "--ep-size"}


def even_range(n: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi) of `rank`'s part when n items are cut in `size` parts of ceil(n/size) (the last may
    be shorter; every rank pads to ceil(n/size) where a collective needs equal sizes)."""
    per = -(-n // size)
    return min(n, rank * per), min(n, (rank + 1) * per)


@dataclass(frozen=True)
class ParallelPlan:
    world: int = 1
    rank: int = 0
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ParallelError(f"rank {self.rank} outside a world of {self.world}")

    @property
    def is_single(self) -> bool:
        return self.tp == 1 and self.ep == 1

    def check(self, cfg: ModelConfig, flags: dict[str, str] = DRIVER_FLAGS) -> "ParallelPlan":
        """Raise ParallelError naming the flag if this plan cannot split `cfg`; returns self."""
        a, m, blk = cfg.attention, cfg.moe, cfg.weight_block_size
        tp, ep, w = self.tp, self.ep, self.world

        def need(cond: bool, which: str, why: str) -> None:
            if not cond:
                raise ParallelError(f"{flags[which]} {getattr(self, which)}: {why}")

        need(tp in (1, w), "tp", f"must be 1 or the number of ranks ({w}); a partly split attention is not implemented")
        need(ep in (1, w), "ep", f"must be 1 or the number of ranks ({w}); a partly split expert set is not implemented")
        need(a.n_heads % tp == 0, "tp", f"does not divide num_attention_heads={a.n_heads}")
        need(a.o_groups % tp == 0, "tp", f"does not divide o_groups={a.o_groups} (wo_a groups are whole per rank)")
        need((a.n_heads // tp) * a.head_dim % blk == 0 and a.o_lora_rank % blk == 0, "tp",
             f"a rank's wq_b rows / wo_a rows must be whole {blk}-row FP8 scale blocks")
        split = w if (tp > 1 or ep > 1) else 1
        need(cfg.hidden_size % (split * blk) == 0, "tp" if tp > 1 else "ep",
             f"hidden_size={cfg.hidden_size} must split into whole {blk}-row FP8 blocks (the output columns of "
             "wo_b, the shared expert's w2 and the MoE combine are split over the ranks)")
        need(m.moe_inter_dim % (tp * blk) == 0, "tp",
             f"the shared expert's moe_intermediate_size={m.moe_inter_dim} must split into whole {blk}-wide FP8 blocks")
        need(m.n_routed_experts % ep == 0, "ep", f"does not divide n_routed_experts={m.n_routed_experts}")
        return self

    # ---------------------------------------------------------------- what this rank holds
    @property
    def tp_rank(self) -> int:
        return self.rank if self.tp > 1 else 0

    @property
    def ep_rank(self) -> int:
        return self.rank if self.ep > 1 else 0

    def heads(self, cfg: ModelConfig) -> tuple[int, int]:
        """Query heads [lo, hi) (and sink entries) of this rank."""
        h = cfg.attention.n_heads // self.tp
        return self.tp_rank * h, (self.tp_rank + 1) * h

    def groups(self, cfg: ModelConfig) -> tuple[int, int]:
        """wo_a groups [lo, hi); group g is heads g*hpg .. (g+1)*hpg - 1, so groups follow heads."""
        g = cfg.attention.o_groups // self.tp
        return self.tp_rank * g, (self.tp_rank + 1) * g

    def experts(self, cfg: ModelConfig) -> tuple[int, int]:
        """Routed experts [lo, hi) of this rank."""
        e = cfg.moe.n_routed_experts // self.ep
        return self.ep_rank * e, (self.ep_rank + 1) * e

    def shared_inter(self, cfg: ModelConfig) -> tuple[int, int]:
        """The shared expert's intermediate columns [lo, hi)."""
        i = cfg.moe.moe_inter_dim // self.tp
        return self.tp_rank * i, (self.tp_rank + 1) * i

    def hidden(self, cfg: ModelConfig) -> tuple[int, int]:
        """Output columns [lo, hi) of wo_b, the shared expert's w2 and the MoE combine (split over
        every rank whenever anything is split)."""
        split = self.world if (self.tp > 1 or self.ep > 1) else 1
        c = cfg.hidden_size // split
        r = self.rank if split > 1 else 0
        return r * c, (r + 1) * c

    def vocab(self, cfg: ModelConfig) -> tuple[int, int]:
        """Embedding / lm head rows [lo, hi) (ceil split)."""
        return even_range(cfg.vocab_size, self.tp_rank, self.tp)

    def describe(self, cfg: ModelConfig) -> str:
        hl, hh = self.heads(cfg)
        el, eh = self.experts(cfg)
        vl, vh = self.vocab(cfg)
        return (f"rank {self.rank}/{self.world}: tp={self.tp} ep={self.ep}; heads {hl}-{hh - 1}, "
                f"experts {el}-{eh - 1}, vocab rows {vl}-{vh - 1}")
