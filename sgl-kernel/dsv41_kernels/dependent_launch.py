"""Programmatic dependent launch (Hopper): a kernel starts while the kernel before it still runs.

A kernel launched with `DEPENDENT` (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, also inside a
CUDA graph) may start once every program of the kernel before it has called `release()` (or exited);
until it calls `wait()` it may read only what was complete before that kernel started, and write only
memory that kernel does not touch. `wait()` returns when the kernel before it has completed, its writes
visible. Both are no-ops for a kernel launched without the attribute, and under TRITON_INTERPRET=1
(sequential launches; `DEPENDENT` is then empty), or with SGLANG_DSV41_DEPENDENT_LAUNCH=0 (read once at
import: every kernel then launches plainly, for A/B timing and for debugging).

Users: `_fp32_gemm_kernel` releases at its start; `_mhc_enter_kernel` (launched DEPENDENT right after the
mix GEMM) runs the collapse, norm and the gates' statistic before its `wait()`, the fold and the gates after.
What it can gain is the overlap of work that reads nothing of the kernel before: launching every kernel
DEPENDENT with a wait at its start (commit cb2404d) left the `bench` decode step at batch 8 the same and made
batch 64 4% slower on an H100 (benchmark/results/2026-12-06-h100-pdl-wkv.md).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from dsv41_kernels.triton_numerics import INTERPRET

ENV = "SGLANG_DSV41_DEPENDENT_LAUNCH"


def enabled(environ=None) -> bool:
    """Whether kernels launch DEPENDENT: unset or 1/true/yes/on (default), 0/false/no/off plain; any other
    value raises ValueError naming the variable."""
    raw = (os.environ if environ is None else environ).get(ENV, "1").strip().lower()
    if raw not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(f"{ENV}={raw!r}: expected 1, true, yes, on (default) or 0, false, no, off")
    return raw in ("1", "true", "yes", "on")


ENABLED = not INTERPRET and enabled()
"""Whether kernels launch DEPENDENT (read once at import, like INTERPRET)."""

DEPENDENT = {"launch_pdl": True} if ENABLED else {}
"""Launch options of a kernel that may start before the one before it has finished."""

_GDC = tl.constexpr(ENABLED)


@triton.jit
def release():
    """Let the next kernel, if launched DEPENDENT, start (once every program has released or exited)."""
    if _GDC:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait():
    """Block until the kernel before this one has completed and its writes are visible."""
    if _GDC:
        tl.extra.cuda.gdc_wait()


__all__ = ["DEPENDENT", "ENABLED", "ENV", "enabled", "release", "wait"]
