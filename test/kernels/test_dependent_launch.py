"""Kernels launched DEPENDENT wait before they read the kernel before them (dependent_launch.py).

A kernel launched with `**DEPENDENT` may start while the kernel before it still runs. It is correct only
if it reads that kernel's output after `wait()`, and if it waits in at least one program before it
completes (so that the kernel after it cannot overtake the one before it). Checked on the source: every
`*_kernel[grid](..., **DEPENDENT)` launch in dsv41_kernels names a `@triton.jit` kernel that calls
`wait()`, and every kernel that calls `wait()` is launched DEPENDENT (else its wait is dead code). The
bits under these launches are checked on the GPU (test_mhc_gpu.py: the fused site entry == the kernels
in sequence, and under graph capture).
"""

from __future__ import annotations

import ast
import pathlib

import dsv41_kernels

PACKAGE = pathlib.Path(dsv41_kernels.__file__).parent


def _trees():
    return [(p.name, ast.parse(p.read_text())) for p in sorted(PACKAGE.glob("*.py"))]


def _kernel_waits() -> dict[str, bool]:
    """@triton.jit *_kernel name -> whether its body calls wait()."""
    out = {}
    for _, tree in _trees():
        for fn in ast.walk(tree):
            if (isinstance(fn, ast.FunctionDef) and fn.name.endswith("_kernel")
                    and any(isinstance(d, ast.Attribute) and d.attr == "jit" for d in fn.decorator_list)):
                out[fn.name] = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "wait"
                                   for n in ast.walk(fn))
    return out


def _launches() -> list[tuple[str, bool]]:
    """(kernel name, launched with **DEPENDENT) of every `name[grid](...)` launch in the package."""
    out = []
    for _, tree in _trees():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")):
                dep = any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == "DEPENDENT"
                          for k in node.keywords)
                out.append((node.func.value.id, dep))
    return out


def test_dependent_launches_wait():
    waits, launches = _kernel_waits(), _launches()
    assert len(waits) >= 40 and len(launches) >= 40, (len(waits), len(launches))
    dependent = {name for name, dep in launches if dep}
    assert dependent, "no kernel is launched DEPENDENT (dependent_launch.py names its users)"
    assert not [n for n in dependent if not waits[n]], "launched DEPENDENT without a wait()"


def test_kernels_that_wait_are_dependent():
    waits, launches = _kernel_waits(), _launches()
    plain = {name for name, dep in launches if not dep}
    assert not [n for n, w in waits.items() if w and n in plain], "wait() in a kernel launched plainly"


def test_switch_values():
    """SGLANG_DSV41_DEPENDENT_LAUNCH: unset / on values enable, off values disable, anything else is an error
    naming the variable (not a silent default)."""
    import pytest

    from dsv41_kernels.dependent_launch import enabled

    assert enabled({}) and enabled({"SGLANG_DSV41_DEPENDENT_LAUNCH": " On "})
    assert not enabled({"SGLANG_DSV41_DEPENDENT_LAUNCH": "0"}) and not enabled({"SGLANG_DSV41_DEPENDENT_LAUNCH": "off"})
    for bad in ("", "2", "maybe", "x" * 1000):
        with pytest.raises(ValueError, match="SGLANG_DSV41_DEPENDENT_LAUNCH"):
            enabled({"SGLANG_DSV41_DEPENDENT_LAUNCH": bad})
