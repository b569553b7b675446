"""CPU: the package import graph (project issue 8, "kernels as a transformation").

- The engine-agnostic core (`sglang_dsv41.layers` and all its submodules, `reference`, `config`,
  `quant`) imports no kernel package (`dsv41_kernels*`) and not SGLang itself (`sglang`, `sglang.*`).
- The kernel package (`dsv41_kernels` and every module in it, Triton modules included when Triton
  is installed) imports nothing from `sglang_dsv41.layers`, and of `sglang_dsv41` only the pure core
  modules in KERNEL_MAY_IMPORT (storage formats, the fixed-order reductions, the shared math that the
  layers import too): a twin that needs layer math imports it from `shared_math`, never copies it.
Each half runs in a fresh interpreter (`python -c`) so that no other test's imports count. Oracle:
`sys.modules` after the imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KERNEL_MAY_IMPORT = {"sglang_dsv41", "sglang_dsv41.determinism", "sglang_dsv41.quant", "sglang_dsv41.quant.fp4",
                     "sglang_dsv41.quant.fp8", "sglang_dsv41.quant.layouts", "sglang_dsv41.reduction",
                     "sglang_dsv41.shared_math"}

_PRELUDE = f"""
import importlib, json, pkgutil, sys
sys.path[:0] = [{str(ROOT / "python")!r}, {str(ROOT / "sgl-kernel")!r}]
def walk(name):
    mod = importlib.import_module(name)
    names = [name]
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
        names.append(info.name)
    return names
"""

_CORE = _PRELUDE + """
imported = []
for name in ("sglang_dsv41.layers", "sglang_dsv41.reference", "sglang_dsv41.config", "sglang_dsv41.quant"):
    imported += walk(name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("dsv41_kernels", "sglang"))
print(json.dumps({"imported": imported, "bad": bad}))
"""

_KERNELS = _PRELUDE + """
import importlib.util
have_triton = importlib.util.find_spec("triton") is not None
imported = walk("dsv41_kernels") if have_triton else []
if not have_triton:  # the Triton modules cannot import; every other module must
    pkg = importlib.import_module("dsv41_kernels")
    for info in pkgutil.iter_modules(pkg.__path__, "dsv41_kernels."):
        if not (info.name.endswith("_triton") or info.name.endswith("triton_numerics")):
            importlib.import_module(info.name)
            imported.append(info.name)
core = sorted(m for m in sys.modules if m.split(".")[0] == "sglang_dsv41")
print(json.dumps({"imported": imported, "core": core}))
"""


def _run(code: str) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_core_imports_no_kernels_and_no_sglang():
    out = _run(_CORE)
    assert "sglang_dsv41.layers.sparse_attention" in out["imported"] and "sglang_dsv41.quant.fp8" in out["imported"]
    assert out["bad"] == [], f"the core imported {out['bad']}"


def test_kernel_package_imports_no_layers():
    out = _run(_KERNELS)
    assert {"dsv41_kernels.ops", "dsv41_kernels.registry", "dsv41_kernels.attention"} <= set(out["imported"])
    assert "sglang_dsv41.shared_math" in out["core"]
    layers = [m for m in out["core"] if m == "sglang_dsv41.layers" or m.startswith("sglang_dsv41.layers.")]
    assert layers == [], f"dsv41_kernels imported {layers}"
    assert set(out["core"]) <= KERNEL_MAY_IMPORT, f"dsv41_kernels imported {sorted(set(out['core']) - KERNEL_MAY_IMPORT)}"


def test_shared_math_imports_only_reduction_and_determinism():
    """`shared_math` is imported by layers and kernels alike: it must stay a leaf of the core."""
    out = _run(_PRELUDE + """
import sglang_dsv41.shared_math
print(json.dumps({"core": sorted(m for m in sys.modules if m.split(".")[0] == "sglang_dsv41")}))
""")
    assert out["core"] == ["sglang_dsv41", "sglang_dsv41.determinism", "sglang_dsv41.reduction", "sglang_dsv41.shared_math"], out["core"]
