"""The numerics policy: how each op family of a built model runs, applied as ONE transformation.

A layer that can run a piece of math more than one way declares it as a slot: a class attribute
holding the exact (serving order, pure torch) function, and an entry in `numerics_slots`
(`{attribute: Slot(family, kernel=op name, train=fn, fast=fn)}`). `apply_numerics(model, policy)`
sets each slot on the instance to the implementation the policy's mode of that family selects, or
removes the instance attribute when that is the class default:

| mode     | what a slot gets                                                                   |
|----------|------------------------------------------------------------------------------------|
| EXACT    | the class default: the serving order, pure torch (bit for bit the reference)        |
| KERNEL   | the op of that name from `policy.table` (dsv41_kernels OpTable: Triton on CUDA,    |
|          |   twin elsewhere); slots without an op keep the default                            |
| TRAIN    | the straight-through form (`Slot.train`): the exact value, STE gradients            |
| FAST     | the plain batched form (`Slot.fast`: plain reductions and GEMMs, one masked        |
|          |   softmax, dense experts), else the TRAIN form, else the default                   |

Families: gemm (FP8 / W4A8 linears), fp32_gemm (head, router, mHC mix, compressor), norm (RMSNorm
and the Engram gate's mean squares), mhc (gates, collapse, expand), moe (routed experts, combine),
attention (the dense KV's attention formulation), rope, indexer (top-k, candidates), quant (window /
compressed KV and indexer roundings), engram (table gather, n-gram hash).

The policy object is frozen; named constructors: `NumericsPolicy.exact()`, `.kernels(table)`,
`.train(fast=False)`. Applying `exact()` after any other policy restores every class default (bit for
bit the serving forward). TRAIN / FAST need a trainable model (`train.trainable.make_trainable`:
master weights) and set `model.numerics`; nothing else is stored. This module imports no layer and
no kernel package: the table is any object with the ops as attributes.

Per-call waste removals that a policy turns on (same bits): `Module.apply_numerics(policy,
shared)` hooks (MoE expert stacking and kept `wo_a` under kernels, one device RoPE position table per
kind on CUDA when `policy.rope_table`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Callable


class Mode(enum.Enum):
    EXACT = "exact"
    KERNEL = "kernel"
    TRAIN = "train"
    FAST = "fast"


@dataclass(frozen=True)
class Slot:
    """One replaceable piece of math of a layer: its op family and its non-default forms."""

    family: str
    kernel: str | None = None
    """op name in the table (KERNEL)."""
    train: Callable | None = None
    """straight-through form (TRAIN; FAST falls back to it)."""
    fast: Callable | None = None
    """plain batched form (FAST)."""


FAMILIES = ("gemm", "fp32_gemm", "norm", "mhc", "moe", "attention", "rope", "indexer", "quant", "engram")


@dataclass(frozen=True)
class NumericsPolicy:
    gemm: Mode = Mode.EXACT
    fp32_gemm: Mode = Mode.EXACT
    norm: Mode = Mode.EXACT
    mhc: Mode = Mode.EXACT
    moe: Mode = Mode.EXACT
    attention: Mode = Mode.EXACT
    rope: Mode = Mode.EXACT
    indexer: Mode = Mode.EXACT
    quant: Mode = Mode.EXACT
    engram: Mode = Mode.EXACT
    table: Any = None
    """the op table of KERNEL modes (None: no family may be KERNEL)."""
    rope_table: bool = False
    """CUDA: RoPE rows gathered from one device table per kind (no host sync per layer)."""

    def __post_init__(self):
        kernel = [f for f in FAMILIES if getattr(self, f) is Mode.KERNEL]
        if kernel and self.table is None:
            raise ValueError(f"families {kernel} run kernels but the policy has no op table")

    @staticmethod
    def exact() -> "NumericsPolicy":
        """The serving order in pure torch (the class defaults)."""
        return NumericsPolicy()

    @staticmethod
    def kernels(table: Any) -> "NumericsPolicy":
        """Every slot that has an op runs `table`'s op; the rest keep the exact default."""
        return NumericsPolicy(**{f: Mode.KERNEL for f in FAMILIES}, table=table, rope_table=True)

    @staticmethod
    def train(fast: bool = False) -> "NumericsPolicy":
        """Trainable model: every rounding straight-through with the exact value (fast=False: the
        serving order, so the forward equals serving bit for bit), or the plain batched forms of the
        GEMMs, reductions, mHC, experts and attention (fast=True; same roundings)."""
        base = NumericsPolicy(gemm=Mode.TRAIN, moe=Mode.TRAIN, quant=Mode.TRAIN, rope_table=True)
        if not fast:
            return base
        return replace(base, **{f: Mode.FAST for f in ("gemm", "fp32_gemm", "norm", "mhc", "moe", "attention")})

    @property
    def trains(self) -> bool:
        return any(getattr(self, f) in (Mode.TRAIN, Mode.FAST) for f in FAMILIES)

    @property
    def is_fast(self) -> bool:
        return any(getattr(self, f) is Mode.FAST for f in FAMILIES)

    def describe(self) -> str:
        return ", ".join(f"{f}={getattr(self, f).value}" for f in FAMILIES)


def resolve(slot: Slot, mode: Mode, table: Any) -> Callable | None:
    """The implementation `mode` selects for `slot`; None = the class default."""
    if mode is Mode.KERNEL:
        return getattr(table, slot.kernel) if slot.kernel is not None else None
    if mode is Mode.FAST and slot.fast is not None:
        return slot.fast
    if mode in (Mode.FAST, Mode.TRAIN):
        return slot.train
    return None


def slotted(model) -> list:
    """Every object of `model` that declares numerics slots (modules, and the Engram hasher)."""
    out = [m for m in model.modules() if getattr(type(m), "numerics_slots", None)]
    hasher = getattr(model, "hasher", None)
    if hasher is not None:
        out.append(hasher)
    return out


def apply_numerics(model, policy: NumericsPolicy):
    """Set every slot of `model` to what `policy` selects (idempotent; `exact()` restores the class
    defaults) and run the modules' `apply_numerics(policy, shared)` hooks. Returns the model.
    Apply after loading (the Engram hasher exists once the token map is set) and, for TRAIN / FAST,
    after `make_trainable`."""
    trainable = getattr(model, "trainable", False)
    if policy.trains and not trainable:
        raise ValueError("a training policy needs a trainable model (train.trainable.make_trainable)")
    if trainable and policy.table is not None:
        raise ValueError("kernels read serving weights: a trainable model (master weights) runs exact, train or fast")
    for m in slotted(model):
        for attr, slot in type(m).numerics_slots.items():
            impl = resolve(slot, getattr(policy, slot.family), policy.table)
            if impl is None:
                m.__dict__.pop(attr, None)
            else:
                setattr(m, attr, impl)
    shared: dict = {}
    for m in model.modules():
        hook = getattr(m, "apply_numerics", None)
        if hook is not None and m is not model:
            hook(policy, shared)
    model.__dict__["numerics"] = policy
    return model


def numerics_of(model) -> NumericsPolicy:
    """The policy last applied to `model` (exact if none was)."""
    return model.__dict__.get("numerics") or NumericsPolicy.exact()
