"""Every Triton kernel of dsv41_kernels is a dependent launch that waits before it reads (dependent_launch.py).

A kernel launched with `DEPENDENT` may start while the kernel before it still runs. It is correct only if
it reads the previous kernel's output after `wait()`, and if every program of it waits before it
completes (otherwise the kernel after it could overtake the one before it). The rule checked here on
the source: each `@triton.jit` `*_kernel` starts with `begin()` (wait, then release), except the kernels
listed in WAITS_LATER, which call `wait()` before their first read of the previous kernel's output in
each program that reads it; and each launch of a kernel passes `**DEPENDENT`. The GPU tests check the
bits (graph replay == eager, kernels == twins) with these launches.
"""

from __future__ import annotations

import ast
import pathlib

import dsv41_kernels

PACKAGE = pathlib.Path(dsv41_kernels.__file__).parent
WAITS_LATER = {"_mhc_enter_kernel"}
"""Role 0 computes the streams' statistic, then waits for the mix GEMM; role 1 reads only the streams,
weights and the previous site's pre, complete before the GEMM (which waited for them) released it."""


def _modules():
    return [(p, ast.parse(p.read_text())) for p in sorted(PACKAGE.glob("*.py"))]


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == "jit" for d in fn.decorator_list)


def _first_call(fn: ast.FunctionDef) -> str | None:
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value.func
            name = call.id if isinstance(call, ast.Name) else getattr(call, "attr", None)
            if name == "static_assert":
                continue
            return name
        return None
    return None


def _kernels():
    return [(p.name, fn) for p, tree in _modules() for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef) and fn.name.endswith("_kernel") and _is_jit(fn)]


def test_every_kernel_begins_by_waiting():
    kernels = _kernels()
    assert len(kernels) >= 40, [n for _, n in kernels]
    bad = [f"{mod}:{fn.name}" for mod, fn in kernels if fn.name not in WAITS_LATER and _first_call(fn) != "begin"]
    assert not bad, f"kernels that do not start with begin(): {bad}"


def test_kernels_that_wait_later_wait_and_release():
    for mod, fn in _kernels():
        if fn.name not in WAITS_LATER:
            continue
        calls = [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        assert "wait" in calls and "release" in calls, (mod, fn.name, calls)


def test_every_launch_is_dependent():
    launches, plain = 0, []
    for p, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")):
                launches += 1
                if not any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == "DEPENDENT"
                           for k in node.keywords):
                    plain.append(f"{p.name}:{node.lineno}:{node.func.value.id}")
    assert launches >= 40
    assert not plain, f"launches without **DEPENDENT: {plain}"
